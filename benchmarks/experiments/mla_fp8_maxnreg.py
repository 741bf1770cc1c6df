"""Experiment: the fp8 MLA split kernel with its registers capped (Triton's `maxnreg`).

ncu (`h200-ncu-mla-fp8-d44983a.txt`) shows the fp8 split kernel latency-bound at two warps per
scheduler: 204-212 registers a thread leave room for two 4-warp programs per SM. Capping them
at 168 (a few spilled) fits three; this times that against the shipped launch, planned for
three programs per SM, as CUDA-graph replays (the split launcher swapped for one that passes
`maxnreg`; host cost is not timed).

    python benchmarks/experiments/mla_fp8_maxnreg.py
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

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
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig as C  # noqa: E402


class CappedLauncher:
    """Launches the fp8 split kernel through Triton with a register cap."""

    def __init__(self, maxnreg: int | None) -> None:
        self.maxnreg = maxnreg

    def launch(self, grid, args, *, num_warps, num_stages):
        extra = {"maxnreg": self.maxnreg} if self.maxnreg else {}
        return M._mla_decode_split_fp8_kernel[grid](
            *args, num_warps=num_warps, num_stages=num_stages, **extra
        )


RUNS = [
    ("shipped", None, C(16, 32, 4, 5, 2, 128)),
    ("cap168", 168, C(16, 32, 4, 5, 3, 128)),
    ("cap160", 160, C(16, 32, 4, 5, 3, 128)),
    ("cap168", 168, C(16, 32, 4, 5, 2, 128)),
    ("w8", None, C(16, 32, 8, 6, 2, 128)),
]
CASES = [(64, 32768), (8, 131072), (256, 4096), (64, 4096), (256, 32768)]


def main() -> None:
    copy = copy_roofline_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    caches = Caches("cuda")
    shipped = M._SPLIT_FP8_LAUNCHER
    for batch, ctx in CASES:
        case = Case(f"h16 fp8 B={batch} ctx={ctx // 1024}k", 16, batch, ctx, True)
        x = make_inputs(case, caches)
        ref = None
        for name, cap, cfg in RUNS:
            M._SPLIT_FP8_LAUNCHER = CappedLauncher(cap)
            compiled: list = []
            fn = ours_fn(case, x, config=cfg, compiled=compiled)
            fn()
            out = fn.out.float().clone()
            ref = out if ref is None else ref
            us = graph_us(fn)
            h = compiled[0]
            gbps = kv_bytes(case) / us / 1e3
            print(
                f"{case.name}: {name:8s} w{cfg.num_warps} cps{cfg.ctas_per_sm} "
                f"splits={fn.splits:3d} {us:7.1f} us {gbps:6.0f} GB/s {gbps / copy:.3f} of copy "
                f"regs={h.n_regs} spills={h.n_spills} max|diff|={(out - ref).abs().max():.4f}",
                flush=True,
            )
        M._SPLIT_FP8_LAUNCHER = shipped
        del x


if __name__ == "__main__":
    main()
