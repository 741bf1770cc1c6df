"""Experiment: variants of the MLA decode split kernel, timed against the shipped one.

Each variant takes the shipped kernel's arguments and is launched through the package's host
code (`mla_decode`, its split launcher swapped), timed as `bench_mla_decode.py` times it, in
the same process as the shipped kernel, and checked against the fp32 reference first.

- `qloop` / `qint`: the shipped source with q read inside the key loop (all chunks ahead of
  the first dot / each just ahead of its own), its address made loop-dependent so it is not
  hoisted. Expected to free registers; it did not (`h200-mla-split-variants.txt`): Triton
  already keeps q in shared memory and reloads it per tile.
- `pairs`: `mla_pairs_kernel.py`, the fp8 tile read once as 16-bit pairs of columns.

    python benchmarks/experiments/mla_split_variants.py [--only qloop|pairs]
"""

import argparse
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src"), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
from mla_pairs_kernel import _mla_split_pairs  # noqa: E402

from benchmarks.bench_mla_decode import (  # noqa: E402
    Caches,
    Case,
    graph_us,
    kv_bytes,
    make_inputs,
    ours_fn,
)
from benchmarks.harness import copy_roofline_gbps  # noqa: E402
from vllm_blackwell_ext.kernels import mla_decode as M  # noqa: E402
from vllm_blackwell_ext.kernels.launch_cache import CachedLauncher  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig as C  # noqa: E402
from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference  # noqa: E402

_HOISTED = [
    "    q0 = tl.load(Q + q_row[:, None] + offs_c[None, :], mask=qm, other=0.0)\n",
    "    q1 = tl.load(Q + q_row[:, None] + DC + offs_c[None, :], mask=qm, other=0.0)\n",
    "    q2 = tl.load(Q + q_row[:, None] + 2 * DC + offs_c[None, :], mask=qm, other=0.0)\n",
    "    q3 = tl.load(Q + q_row[:, None] + 3 * DC + offs_c[None, :], mask=qm, other=0.0)\n",
    "    qp = tl.load(Q + q_row[:, None] + R + offs_p[None, :], mask=qm, other=0.0)\n",
    "    q0 = (q0.to(tl.float32) * q_mul).to(DOT_DTYPE)\n",
    "    q1 = (q1.to(tl.float32) * q_mul).to(DOT_DTYPE)\n",
    "    q2 = (q2.to(tl.float32) * q_mul).to(DOT_DTYPE)\n",
    "    q3 = (q3.to(tl.float32) * q_mul).to(DOT_DTYPE)\n",
    "    qp = (qp.to(tl.float32) * q_mul).to(DOT_DTYPE)\n",
]
_FIRST_DOT = "        s = tl.dot(q0, tl.trans(k0))\n"
_DOTS = [
    _FIRST_DOT,
    "        s = tl.dot(q1, tl.trans(k1), s)\n",
    "        s = tl.dot(q2, tl.trans(k2), s)\n",
    "        s = tl.dot(q3, tl.trans(k3), s)\n",
    "        s = tl.dot(qp, tl.trans(kr), s)\n",
]


def _name(interleave: bool) -> str:
    return "_mla_split_q_interleaved" if interleave else "_mla_split_q_in_loop"


def _in_loop_source(interleave: bool) -> str:
    """The package kernel with q read in the loop: all chunks ahead of the first dot, or
    (`interleave`) each chunk just ahead of its own dot."""
    src = inspect.getsource(M._mla_decode_split_kernel.fn)
    for line in _HOISTED:
        assert src.count(line) == 1, line
        src = src.replace(line, "")
    moved = ["    " + line.replace("Q + q_row[:, None]", "qz") for line in _HOISTED]
    # min(n0, 0) is 0 at run time (n0 >= 0) but not to the compiler: q stays in the loop.
    qz = "        qz = Q + tl.minimum(n0, 0) + q_row[:, None]\n"
    src = src.replace(_FIRST_DOT, qz + _FIRST_DOT)
    for i, dot in enumerate(_DOTS):
        assert src.count(dot) == 1, dot
        if interleave:
            src = src.replace(dot, moved[i] + moved[i + 5] + dot)
        elif i == 0:
            src = src.replace(dot, "".join(moved) + dot)
    src = src.replace("def _mla_decode_split_kernel(", f"def {_name(interleave)}(")
    header = (
        "import triton\nimport triton.language as tl\n"
        "from vllm_blackwell_ext.kernels.mla_decode import _store_rows\n\n"
    )
    return header + src


def _load_variant(interleave: bool):
    path = Path(tempfile.mkdtemp()) / f"{_name(interleave)}.py"
    path.write_text(_in_loop_source(interleave))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, _name(interleave))


H16, H32 = 16, 32
# (case, [(kernel, config or None for the table's)])
QLOOP_PLAN = [
    (Case("h16 fp8 B=64 32k", H16, 64, 32768, True), [
        ("cur", None), ("qloop", C(16, 64, 8, 3, 1, 128, True)),
        ("qloop", C(16, 64, 4, 3, 2, 128, True)), ("qloop", C(16, 64, 4, 2, 2, 128, True)),
        ("qloop", C(16, 64, 8, 2, 2, 128, True)), ("qloop", C(16, 64, 4, 3, 2, 128, False)),
        ("qloop", C(16, 128, 8, 2, 1, 128, True)), ("qloop", C(16, 32, 4, 4, 2, 128, True)),
        ("qint", C(16, 64, 8, 3, 1, 128, True)), ("qint", C(16, 64, 4, 3, 2, 128, True)),
        ("qint", C(16, 64, 4, 2, 2, 128, True))]),
    (Case("h16 fp8 B=8 128k", 16, 8, 131072, True), [
        ("cur", None), ("qloop", C(16, 64, 4, 3, 2, 128, True)),
        ("qint", C(16, 64, 4, 3, 2, 128, True)), ("qloop", C(16, 64, 4, 2, 2, 128, True))]),
    (Case("h16 fp8 B=1 128k", 16, 1, 131072, True), [
        ("cur", None), ("qloop", C(16, 64, 4, 3, 2, 128, True)),
        ("qint", C(16, 64, 4, 3, 2, 128, True))]),
    (Case("h16 bf16 B=64 32k", H16, 64, 32768), [
        ("cur", None), ("qloop", C(16, 64, 4, 3, 2, 128)), ("qloop", C(16, 64, 4, 3, 3, 128)),
        ("qint", C(16, 64, 4, 3, 2, 128))]),
    (Case("h32 bf16 B=64 32k", 32, 64, 32768), [
        ("cur", None), ("qloop", C(32, 64, 8, 3, 1, 128)), ("qloop", C(32, 64, 4, 3, 2, 128)),
        ("qloop", C(32, 32, 4, 3, 2, 128)), ("qint", C(32, 64, 8, 3, 1, 128))]),
    (Case("h32 fp8 B=64 32k", 32, 64, 32768, True), [
        ("cur", None), ("qloop", C(32, 64, 8, 3, 1, 128, True)),
        ("qloop", C(32, 64, 4, 3, 2, 128, True)), ("qint", C(32, 64, 8, 3, 1, 128, True))]),
    (Case("h128 bf16 B=64 32k", 128, 64, 32768), [
        ("cur", None), ("cur", C(64, 64, 8, 1, 1, 128)), ("qloop", C(64, 32, 8, 2, 1, 128))]),
    (Case("h16 bf16 q_len=4 B=64 32k", H16, 64, 32768, q_len=4), [
        ("cur", None), ("qloop", C(32, 64, 8, 3, 1, 128)), ("qloop", C(64, 32, 8, 2, 1, 128))]),
]  # fmt: skip

_FP8_16 = [
    C(16, 64, 8, 5, 1, 128),
    C(16, 32, 4, 5, 2, 128),
    C(16, 32, 8, 6, 2, 128),
    C(16, 32, 8, 6, 1, 128),
    C(16, 128, 8, 4, 1, 128),
]
_FP8_16_RUNS = [("cur", None), *(("pairs", c) for c in _FP8_16)]
_FP8_WIDE = [C(32, 64, 8, 5, 1, 128), C(16, 32, 8, 6, 2, 128), C(32, 32, 4, 5, 2, 128)]
_FP8_WIDE_RUNS = [("cur", None), *(("pairs", c) for c in _FP8_WIDE)]
PAIRS_PLAN = [
    (Case("h16 fp8 B=64 32k", H16, 64, 32768, True), _FP8_16_RUNS),
    (Case("h16 fp8 B=8 128k", H16, 8, 131072, True), _FP8_16_RUNS),
    (Case("h16 fp8 B=8 32k", H16, 8, 32768, True), _FP8_16_RUNS),
    (Case("h16 fp8 B=1 128k", H16, 1, 131072, True), _FP8_16_RUNS),
    (Case("h16 fp8 B=1 32k", H16, 1, 32768, True), _FP8_16_RUNS),
    (Case("h16 fp8 B=256 4k", H16, 256, 4096, True), _FP8_16_RUNS),
    (Case("h32 fp8 B=64 32k", H32, 64, 32768, True), _FP8_WIDE_RUNS),
    (Case("h16 fp8 q_len=4 B=64 32k", H16, 64, 32768, True, q_len=4), _FP8_WIDE_RUNS),
    (Case("h128 fp8 B=64 32k", 128, 64, 32768, True), _FP8_WIDE_RUNS),
]  # fmt: skip


def check(kernels: dict, dev: str) -> None:
    """Each variant against the fp32 reference: 3 requests (1, 77 and 1000 keys), fp8 cache."""
    g = torch.Generator(device=dev).manual_seed(0)
    ctxs = [1, 77, 1000]
    pages = 3 * 16 + 4
    kv = (torch.randn(pages, 64, 576, device=dev, generator=g) * 8).to(torch.float8_e4m3fn)
    bt = torch.randperm(pages, device=dev)[: 3 * 16].view(3, 16).to(torch.int32)
    seq = torch.tensor(ctxs, device=dev, dtype=torch.int32)
    q = torch.randn(3, 16, 576, device=dev, generator=g).to(torch.bfloat16)
    ks = torch.tensor([0.125], device=dev)
    ref_o, ref_l = mla_decode_reference(
        q.cpu(), kv.cpu(), bt.cpu(), seq.cpu(), softmax_scale=576**-0.5, kv_lora_rank=512,
        k_scale=ks.cpu(),
    )  # fmt: skip
    shipped = M._SPLIT_LAUNCHER
    for name, launcher in kernels.items():
        M._SPLIT_LAUNCHER = launcher
        for splits in (1, 3):
            out = torch.empty(3, 16, 512, device=dev, dtype=torch.bfloat16)
            lse = torch.empty(3, 16, device=dev)
            M.mla_decode(
                q, kv, bt, seq, out, softmax_scale=576**-0.5, kv_lora_rank=512, k_scale=ks,
                lse_out=lse, num_splits=splits, config=C(16, 64, 4, 2, 1, 128),
            )  # fmt: skip
            eo = (out.float().cpu() - ref_o).abs().max().item()
            el = (lse.cpu() - ref_l)[torch.isfinite(ref_l)].abs().max().item()
            print(f"check {name:6s} splits={splits}: max|out err|={eo:.4f} max|lse err|={el:.5f}")
    M._SPLIT_LAUNCHER = shipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("qloop", "pairs"), default=None)
    args = ap.parse_args()
    dev = "cuda"
    shipped = M._SPLIT_LAUNCHER
    launchers = {
        "cur": shipped,
        "qloop": CachedLauncher(_load_variant(False)),
        "qint": CachedLauncher(_load_variant(True)),
        "pairs": CachedLauncher(_mla_split_pairs),
    }
    check(launchers, dev)
    plan = {"qloop": QLOOP_PLAN, "pairs": PAIRS_PLAN}
    plan = [row for key in ((args.only,) if args.only else plan) for row in plan[key]]
    copy = copy_roofline_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    caches = Caches(dev)
    for case, runs in plan:
        x = make_inputs(case, caches)
        nbytes = kv_bytes(case)
        ref = None
        for kernel, cfg in runs:
            M._SPLIT_LAUNCHER = launchers[kernel]
            compiled: list = []
            try:
                fn = ours_fn(case, x, config=cfg, compiled=compiled)
                fn()
                torch.cuda.synchronize()
                us = graph_us(fn)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{case.name}: {kernel} {cfg} FAILED {repr(e)[:300]}", flush=True)
                continue
            out = fn.out.float()
            ref = out if ref is None else ref
            h = compiled[0]  # None under the interpreter
            c = fn.cfg
            print(
                f"{case.name}: {kernel:5s} m{c.block_m} n{c.block_n} w{c.num_warps} "
                f"s{c.num_stages} cps{c.ctas_per_sm} reload={int(c.reload_v)} "
                f"splits={fn.splits:3d} {us:8.1f} us {nbytes / us / 1e3:6.0f} GB/s "
                f"{nbytes / us / 1e3 / copy:.3f} of copy  max|diff vs cur|="
                f"{(out - ref).abs().max().item():.4f} regs={getattr(h, 'n_regs', '-')} "
                f"spills={getattr(h, 'n_spills', '-')} "
                f"smem={getattr(getattr(h, 'metadata', None), 'shared', '-')}",
                flush=True,
            )
        M._SPLIT_LAUNCHER = shipped
        del x


if __name__ == "__main__":
    main()
