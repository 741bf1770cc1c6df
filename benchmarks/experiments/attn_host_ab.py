"""Host time of one eager `paged_attention` call: this checkout against another revision's kernels.

Host times move by 1.5x between device-machine draws and by tens of percent between runs on
one machine, so two revisions are compared in one process, interleaved: rounds alternate the
two, each round times a burst of calls without synchronising (the GPU drained before it), and
the table gives the best and the median burst of each. Contexts are short so that the GPU keeps
up with the host and the launch queue never fills. Also times the launch-cache steps alone.

    mkdir -p /tmp/ab/kernels_old && git archive REV src/vllm_blackwell_ext/kernels \\
        | tar -x --strip-components=3 -C /tmp/ab/kernels_old
    python benchmarks/experiments/attn_host_ab.py --old /tmp/ab/kernels_old
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks.bench_paged_attention import Case, Inputs
from vllm_blackwell_ext.kernels import launch_cache
from vllm_blackwell_ext.kernels import paged_attention as new_pa

ROUNDS = 15
BURST = 50
CASES = [
    Case("decode bf16 B=64 ctx=1k", 64, 1024, 1),
    Case("decode fp8 B=64 ctx=1k", 64, 1024, 1, fp8=True),
    Case("verify q=16 B=1 ctx=8k (split + merge)", 1, 8192, 16),
    Case("mixed 256-token chunk + 63 decodes ctx=1k", 64, 1024, 1, prefill=256),
]


def load_old(path: Path):
    sys.path.insert(0, str(path.parent))
    return importlib.import_module(f"{path.name}.paged_attention")


def call_of(pa, c: Case, x: Inputs):
    ws = pa.SplitKVWorkspace.for_device(32, 8, 128, "cuda")

    def fn() -> None:
        pa.paged_attention(
            x.q, x.k, x.v, x.out, x.cu, x.seq_lens, x.block_table,
            max_seqlen_q=x.max_seqlen_q, max_seqlen_k=c.ctx, softmax_scale=0.088,
            causal=True, k_scale=x.k_scale, v_scale=x.v_scale, workspace=ws, check_inputs=False,
        )  # fmt: skip

    return fn


def burst_us(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(BURST):
        fn()
    return (time.perf_counter() - t0) / BURST * 1e6


def steps_us() -> None:
    """The launch-cache steps alone, per call."""
    x = torch.zeros(1024, device="cuda")
    tensors = (x,) * 13

    def timeit(fn, n: int = 20000) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    print(f"  hook check               {timeit(launch_cache._launch_hooks_registered):6.2f} us")
    print(f"  13 x data_ptr            {timeit(lambda: [t.data_ptr() for t in tensors]):6.2f} us")
    print(
        "  13 x (dtype, device)     "
        f"{timeit(lambda: tuple([(t.dtype, t.get_device()) for t in tensors])):6.2f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="a copy of another revision's kernels")
    args = ap.parse_args()
    old_pa = load_old(args.old.resolve())
    print("| case | new best | old best | new median | old median | new/old (median) |")
    print("|---|---|---|---|---|---|")
    for c in CASES:
        x = Inputs(c)
        fns = {"new": call_of(new_pa, c, x), "old": call_of(old_pa, c, x)}
        for fn in fns.values():
            fn()  # compile, and fill each launch cache
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for k, fn in fns.items():
                times[k].append(burst_us(fn))
        torch.cuda.synchronize()
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {c.name} | {best['new']:.1f} | {best['old']:.1f} | {med['new']:.1f} | "
            f"{med['old']:.1f} | {med['new'] / med['old']:.2f} |",
            flush=True,
        )
        del x
    steps_us()


if __name__ == "__main__":
    main()
