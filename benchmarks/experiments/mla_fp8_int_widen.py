"""fp8 MLA decode of 16- and 32-row tiles with the P @ V operand widened in integer ops.

The fp8 pair kernel (`_mla_decode_split_fp8_kernel`) widens each e4m3 column pair twice, for
the score dot and for P @ V, with `cvt.rn.f16x2.e4m3x2`: offline sm90 SASS of the 16-row
entry holds 174 `F2FP` per thread, all on the conversion pipe, while at the H200's copy rate
each SM must widen ~16 bytes per clock (twice). `int_widen` entries widen the P @ V operand
with a byte permute and three logic / shift ops instead (`fp8_pairs`' scaled mode: 110 `F2FP`
left, 187 registers instead of 217); `INT_WIDEN_BOTH` widens the score operand that way too
(no convert left, the factor restored on the fp32 scores). This times the table's entries
and the same entries at both levels, on the same values and split plans, as CUDA-graph
replays, beside the copy roofline of the same run.

    python benchmarks/experiments/mla_fp8_int_widen.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton

from benchmarks import bench_mla_decode as bench
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.mla_decode_configs import (
    INT_WIDEN_BOTH,
    INT_WIDEN_VALUES,
    MlaDecodeConfig,
)

CASES = (
    bench.Case("h16 fp8 B=1 ctx=128k", 16, 1, 131072, True),
    bench.Case("h16 fp8 B=8 ctx=32k", 16, 8, 32768, True),
    bench.Case("h16 fp8 B=64 ctx=32k", 16, 64, 32768, True),
    bench.Case("h16 fp8 B=64 ctx=128k", 16, 64, 131072, True),
    bench.Case("h16 fp8 B=256 ctx=4k", 16, 256, 4096, True),
    bench.Case("h32 fp8 B=64 ctx=32k", 32, 64, 32768, True),
)


def _three_ways(cfg: MlaDecodeConfig) -> dict[str, MlaDecodeConfig]:
    return {
        "table": cfg,
        "int_widen values": dataclasses.replace(cfg, int_widen=INT_WIDEN_VALUES),
        "int_widen both": dataclasses.replace(cfg, int_widen=INT_WIDEN_BOTH),
    }


def main() -> None:
    gpu = torch.cuda.get_device_name()
    copy = copy_roofline_gbps("cuda")
    print(f"# torch {torch.__version__}, triton {triton.__version__}, {gpu}; copy {copy:.0f} GB/s")
    bench.compare_configs(CASES, _three_ways, copy)


if __name__ == "__main__":
    main()
