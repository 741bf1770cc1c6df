"""Which row tiles of BWX_MLA's decode gain from TMA-read key tiles, beside the table's.

The product kernel reads 64-key tiles through TMA on Hopper for 64-row bf16 tiles only
(`MLA_DECODE_TMA_CONFIGS`). This times, with the product's `mla_decode` and a forced config,
TMA variants of the 16-, 32- and 64-row tiles against the table's choice on the benchmark's own
cases (`bench_mla_decode.py`: same inputs, split plan, CUDA-graph replays), beside the copy
roofline and matmul rate measured in the same run, and checks each output against the
table's. fp8 caches too: a TMA config sends them through the 16-bit kernel, each tile widened
to bf16 (the table's fp8 entries use the fp8 kernel, which gathers 16-bit pairs).

    python benchmarks/experiments/mla_tma_row_tiles.py [--only SUBSTR]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks import bench_mla_decode as mb
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig

C = MlaDecodeConfig
# (block_m, block_n, warps, stages, programs per SM): all with TMA-read key tiles.
VARIANTS = [
    C(16, 64, 4, 3, 2, tma=True), C(16, 64, 4, 4, 2, tma=True), C(16, 64, 8, 3, 2, tma=True),
    C(32, 64, 4, 3, 2, tma=True), C(32, 64, 8, 3, 1, tma=True), C(32, 64, 8, 2, 1, tma=True),
    C(64, 64, 8, 2, 1, tma=True),
]  # fmt: skip
CASES = (
    "h16 bf16 B=64 ctx=32k", "h16 bf16 B=8 ctx=32k", "h16 bf16 B=1 ctx=128k",
    "h32 bf16 B=64 ctx=32k", "h16 bf16 q_len=4 B=64 ctx=32k", "h128 bf16 B=64 ctx=32k",
    "h16 fp8 B=64 ctx=32k", "h32 fp8 B=64 ctx=32k", "h16 fp8 q_len=4 B=64 ctx=32k",
    "h128 fp8 B=64 ctx=32k",
)  # fmt: skip


def main() -> None:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    copy = copy_roofline_gbps("cuda")
    matmul = mb.matmul_tflops()
    print(f"# {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s, matmul {matmul:.0f} TFLOP/s")
    caches = mb.Caches("cuda")
    by_name = {c.name: c for c in mb.cases()}
    for name in [n for n in CASES if only in n]:
        case = by_name[name]
        x = mb.make_inputs(case, caches)
        bound = matmul if case.metric == "TFLOP/s" else copy
        table = mb.ours_fn(case, x)
        us = mb.graph_us(table)
        ref = table.out.float().clone()
        print(
            f"{name}: table {table.cfg} splits={table.splits}: {us:.1f} us "
            f"{mb.figure(case, us):.1f} {case.metric} ({mb.figure(case, us) / bound:.3f})",
            flush=True,
        )
        rows = case.heads * case.q_len
        for cfg in VARIANTS:
            if cfg.block_m > max(rows, 16):
                continue
            try:
                fn = mb.ours_fn(case, x, config=cfg)
                t = mb.graph_us(fn)
            except Exception as e:  # a variant that does not compile or fit: say so
                print(f"  {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            diff = (fn.out.float() - ref).abs().max().item()
            print(
                f"  m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                f"cta{cfg.ctas_per_sm} splits={fn.splits}: {t:.1f} us "
                f"{mb.figure(case, t):.1f} {case.metric} ({mb.figure(case, t) / bound:.3f}) "
                f"table/this {us / t:.3f} max|diff| {diff:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
