"""Profile the cases that missed their goals under Nsight Compute, one kernel launch each.

Run on the GPU machine (no vLLM needed):

    ncu --profile-from-start off --clock-control none \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 benchmarks/profile_ncu.py [--family mla|paged] \
        [--only TEXT]

Each case is built with its benchmark's own input builder and planner, launched once to
compile, then once more between cudaProfilerStart/Stop so ncu records only that launch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks import bench_mla_decode as mla_bench
from benchmarks import bench_paged_attention as pa_bench
from vllm_blackwell_ext.kernels.paged_attention import SplitKVWorkspace

# Rows short of their performance goals, one launch each.
MLA_CASES = (
    "h16 fp8 B=64 ctx=32k",
    "h32 fp8 B=64 ctx=32k",
    "h32 bf16 B=64 ctx=32k",
    "h128 bf16 B=64 ctx=32k",
    "h128 fp8 B=64 ctx=32k",
    "h16 bf16 B=1 ctx=128k",
    "h16 fp8 q_len=4 B=64 ctx=32k",
)
PAGED_CASES = (
    "decode bf16 B=1 ctx=32k",
    "verify causal q=16 B=1 ctx=8k",
    "prefill causal B=4 L=4k",
    "prefill chunk 2k after 14k ctx B=1 page=128",
)


def profile_once(name: str, fn) -> None:
    fn()  # compile and warm up outside the profiled range
    torch.cuda.synchronize()
    print(f"== {name}", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="profile_ncu.py", description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("mla", "paged"), default=None, help="only these cases")
    ap.add_argument("--only", default="", help="only cases whose name contains this")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_ncu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.family in (None, "mla"):
        caches = mla_bench.Caches("cuda")
        by_name = {c.name: c for c in mla_bench.cases()}
        for name in (n for n in MLA_CASES if args.only in n):
            case = by_name[name]
            fn = mla_bench.ours_fn(case, mla_bench.make_inputs(case, caches))
            profile_once(f"mla {name}", fn)
    if args.family == "mla":
        return 0
    ws = SplitKVWorkspace.for_device(32, 8, 128, torch.device("cuda"))
    by_name = {c.name: c for c in pa_bench.cases()}
    for name in (n for n in PAGED_CASES if args.only in n):
        case = by_name[name]
        profile_once(f"paged {name}", pa_bench.ours_fn(case, pa_bench.Inputs(case), ws))
    return 0


if __name__ == "__main__":
    sys.exit(main())
