"""Fresh prefill with its diagonal tiles inside the pipelined loop, and 64-row tiles two to an SM.

The shipped `fresh_prefill` kernel runs a program's fully visible key tiles in a loop whose K/V
copies are asked for stages ahead, then its diagonal tile (the causal mask) after the loop,
unpipelined: that tile's copy and its wgmma wait are exposed once per program, besides the
program's own start (query load, pipeline fill) and end (output store), which nothing overlaps
at one 8-warp program per SM. Per program that is a fixed cost against a number of key tiles
that halves with the prompt, which fits the H200 table's 0.952x cuDNN at causal 8k against
0.884x at 4 x 4k (the same FLOPs). `FreshPrefillConfig.diag_in_loop` runs the diagonal tiles
in the pipelined loop, masked under a branch (offline sm90, Triton 3.7.1: 221 registers at
head 128 instead of 255, one loop body). 64-row tiles on 4 warps with 64-key tiles fit two
programs per SM (208 registers, 96 KiB of shared memory at three stages), so one program's
start and end overlap the other's loop.

This times, in one process on the same values, as CUDA-graph replays against cuDNN's SDPA
(Qwen3-8B shapes): the device's config, then the variants.

    python benchmarks/experiments/fresh_prefill_diag.py [--only SUBSTR]
    python benchmarks/experiments/fresh_prefill_diag.py --compile-only [--capability 90]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks.experiments import fresh_prefill_skew
from vllm_blackwell_ext.kernels.fresh_prefill import FreshPrefillConfig as C

CONFIGS: tuple[C | None, ...] = (
    None,
    C(128, 128, 8, 3, diag_in_loop=True),
    C(128, 64, 8, 3, diag_in_loop=True),
    C(128, 64, 8, 4, diag_in_loop=True),
    C(64, 64, 4, 3, diag_in_loop=True),
    C(64, 64, 4, 2, diag_in_loop=True),
    C(64, 128, 4, 2, diag_in_loop=True),
)

if __name__ == "__main__":
    fresh_prefill_skew.main(__doc__, CONFIGS)
