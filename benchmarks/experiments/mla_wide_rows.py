"""Experiment: launch configs of the 64-row tile (128 heads; 16 heads x 4 query tokens), bf16.

The sm90 entry (64 rows, 32 keys, 8 warps, 2 stages) is compute-bound at 128 heads; a q-in-loop
sweep (`h200-mla-split-variants.txt`) saw 64-key tiles at 1 stage run 1.17x faster there. This
times that and neighbours on both shapes the entry serves, as CUDA-graph replays.

    python benchmarks/experiments/mla_wide_rows.py
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks.bench_mla_decode import (  # noqa: E402
    Caches,
    Case,
    graph_us,
    make_inputs,
    ours_fn,
)
from vllm_blackwell_ext.kernels.mla_decode import mla_decode_flops  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig as C  # noqa: E402

CONFIGS = [
    C(64, 32, 8, 2, 1, 128),
    C(64, 64, 8, 1, 1, 128),
    C(64, 16, 8, 3, 1, 128),
    C(64, 16, 8, 4, 1, 128),
    C(32, 64, 8, 3, 1, 128),
]
CASES = [
    Case("h128 bf16 B=64 ctx=32k", 128, 64, 32768),
    Case("h16 bf16 q_len=4 B=64 ctx=32k", 16, 64, 32768, q_len=4),
    Case("h64 bf16 B=64 ctx=32k", 64, 64, 32768),
]


def main() -> None:
    caches = Caches("cuda")
    for case in CASES:
        x = make_inputs(case, caches)
        flops = mla_decode_flops(case.batch * case.q_len, case.heads, case.ctx, 512)
        ref = None
        for cfg in CONFIGS:
            compiled: list = []
            fn = ours_fn(case, x, config=cfg, compiled=compiled)
            fn()
            out = fn.out.float().clone()
            ref = out if ref is None else ref
            us = graph_us(fn)
            h = compiled[0]
            print(
                f"{case.name}: m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                f"splits={fn.splits} {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s "
                f"regs={h.n_regs} spills={h.n_spills} max|diff|={(out - ref).abs().max():.4f}",
                flush=True,
            )
        del x


if __name__ == "__main__":
    main()
