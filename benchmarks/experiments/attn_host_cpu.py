"""Host time of one `paged_attention` call's Python, measured on a CPU machine (no GPU).

`benchmarks/experiments/attn_host_profile.py` times the whole eager call on a GPU machine; this
splits off what does not need one: the call's own Python with the kernel launch stubbed out, and
the cached launcher's per-call path (`kernels/launch_cache.py`: addresses, the specialisation
key, the handle lookup) with the compiled handle's C launcher stubbed out, then the parts of
that key one by one. B=64 decode over 32k keys, Qwen3-8B shapes, bf16 and fp8 caches.

    python benchmarks/experiments/attn_host_cpu.py       (not under TRITON_INTERPRET)
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from vllm_blackwell_ext.kernels import paged_attention as pa
from vllm_blackwell_ext.kernels.launch_cache import CachedLauncher, _launch_hooks_registered

B, CTX, HQ, HKV, D, PAGE = 64, 32768, 32, 8, 128, 16
N = 20000


def per_call_us(fn, n: int = N) -> float:
    fn()
    return min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6


class _Recorder:
    """Stands in for a launcher: keeps the last launch's grid, arguments and options."""

    def __init__(self) -> None:
        self.last: tuple | None = None

    def launch(self, grid, args, **options):
        self.last = (grid, args, options)


class _StubHandle:
    """A compiled handle whose C launcher does nothing."""

    function = 0
    packed_metadata = None

    def run(self, *args) -> None:
        pass


def report(fp8: bool, kernel, recorder: _Recorder) -> None:
    """The figures of one cache dtype (the attention launcher is `recorder` meanwhile)."""
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kv = torch.empty(B * 4, HKV, PAGE, 2 * D, dtype=kv_dtype)
    k, v = kv.transpose(1, 2).split(D, dim=-1)
    block_table = torch.zeros(B, CTX // PAGE, dtype=torch.int32)
    q = torch.randn(B, HQ, D, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    cu = torch.arange(B + 1, dtype=torch.int32)
    seq_lens = torch.full((B,), CTX, dtype=torch.int32)
    k_scale, v_scale = (torch.tensor([0.7]), torch.tensor([0.9])) if fp8 else (None, None)
    ws = pa.SplitKVWorkspace.for_device(HQ, HKV, D, device="cpu")

    def call() -> None:
        pa.paged_attention(
            q, k, v, out, cu, seq_lens, block_table, max_seqlen_q=1, max_seqlen_k=CTX,
            softmax_scale=D**-0.5, k_scale=k_scale, v_scale=v_scale, workspace=ws,
            check_inputs=False,
        )  # fmt: skip

    print(f"== decode {'fp8' if fp8 else 'bf16'} B={B} ctx={CTX // 1024}k", flush=True)
    print(f"  paged_attention, launch stubbed     {per_call_us(call):6.2f} us", flush=True)
    grid, args, options = recorder.last
    launcher = CachedLauncher(kernel)
    launcher._classify(args)
    tensors = launcher._tensors(args)
    ptrs = [t.data_ptr() for t in tensors]
    opts = (options["num_warps"], options["num_stages"], options.get("max_registers", 0))
    key = launcher._key(tensors, ptrs, args, opts)
    launcher._handles[key] = _StubHandle()
    launcher._current_stream = lambda device: 0
    parts = {
        "  cached launch, C launcher stubbed": lambda: launcher.launch(grid, args, **options),
        f"  {len(tensors)} data_ptr() calls": lambda: [t.data_ptr() for t in tensors],
        "  specialisation key": lambda: launcher._key(tensors, ptrs, args, opts),
        "    (dtype, device) per tensor": lambda: tuple(
            [(t.dtype, t.get_device()) for t in tensors]
        ),
        "    16-byte alignment per pointer": lambda: tuple([p & 15 == 0 for p in ptrs]),
        "  key hash and lookup": lambda: launcher._handles.get(key),
        "  addresses into the arguments": lambda: launcher._with_addresses(args, ptrs),
        "  launch-hook check": _launch_hooks_registered,
    }
    for label, fn in parts.items():
        print(f"{label:38s}{per_call_us(fn):6.2f} us", flush=True)


def main() -> None:
    real_launcher, real_merge = pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER
    recorder = _Recorder()
    pa._ATTN_LAUNCHER = pa._MERGE_LAUNCHER = recorder  # type: ignore[assignment]
    try:
        for fp8 in (False, True):
            report(fp8, real_launcher.kernel, recorder)
    finally:
        pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER = real_launcher, real_merge


if __name__ == "__main__":
    main()
