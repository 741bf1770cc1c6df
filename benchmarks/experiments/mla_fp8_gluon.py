"""fp8 MLA decode of 64-row tiles through the Gluon kernel against the Triton kernel of the entry.

An fp8 e4m3 cache's 64-row TMA tiles (128 heads; 16 heads x 4 query tokens) ran in the
16-bit Triton kernel, each tile widened to bf16 in registers, where Triton computes every score
tile in both warp groups (ncu, H100 kit: 237 registers, tensor pipe 33 %, 202 TFLOP/s at 128
heads). The Gluon kernel now takes them: each tile lands in fp8 stages through TMA, is widened
into one bf16 tile in shared memory, then runs the bf16 schedule (`mla_decode_gluon`). This
times both on the same values and split plan, as CUDA-graph replays, with the bf16 cache's
Gluon run beside them.

    python benchmarks/experiments/mla_fp8_gluon.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton

from benchmarks import bench_mla_decode as bench

CASES = (
    bench.Case("h128 fp8 B=64 ctx=32k", 128, 64, 32768, True, metric="TFLOP/s"),
    bench.Case("h16 fp8 q_len=4 B=64 ctx=32k", 16, 64, 32768, True, q_len=4),
    bench.Case("h128 bf16 B=64 ctx=32k", 128, 64, 32768, False, metric="TFLOP/s"),
    bench.Case("h16 bf16 q_len=4 B=64 ctx=32k", 16, 64, 32768, False, q_len=4),
)


def main() -> None:
    gpu = torch.cuda.get_device_name()
    matmul = bench.matmul_tflops()
    print(f"# torch {torch.__version__}, triton {triton.__version__}, {gpu}; matmul {matmul:.0f}")
    bench.compare_configs(CASES, lambda cfg: {"gluon": cfg, "triton": replace(cfg, gluon=False)})


if __name__ == "__main__":
    main()
