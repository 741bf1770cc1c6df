"""Query-block size and split count of short verify / draft launches (H200 experiment).

A 16-token verify block of one request over 8k keys ran at 0.28 of copy: one 64-row program
per KV head (16 tokens x 4 heads, ~200 registers, two per SM) split 32 ways, whose 32 x 64
fp32 partial rows the merge then reads back. This times smaller query blocks per program
(4 or 8 tokens: more, lighter programs that re-read the same K/V from L2) against fewer splits
(fewer partials to write and merge), over tile shapes, on CUDA-graph replays with the
benchmark's own inputs. The shipped config and split plan are timed first in every case.

Result (`benchmarks/results/h200-attn-verify-blocks.txt`): the shipped 16-token block with 32
splits stayed the fastest at 8k (27.7 us; 4- and 8-token blocks and fewer splits were slower),
so the plan is unchanged; what remains at 8k is the fixed cost of two launches and the partials.

    python benchmarks/experiments/attn_verify_blocks.py [--only SUBSTR] [--readahead]

`--readahead` times instead the shipped 16-token block with the block table read one tile
ahead (`AttnConfig.prefetch_pages`) and without, over pipeline depths and split counts: the
read-ahead frees the stage the indirection held, so fewer stages might fit two programs per SM.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks import bench_paged_attention as pa
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import (
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)

CASES = (
    pa.Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16),
    pa.Case("verify causal q=8 B=1 ctx=8k", 1, 8192, 8),
    pa.Case("draft non-causal q=16 B=1 ctx=8k", 1, 8192, 16, False),
    pa.Case("verify causal q=16 B=1 ctx=128k", 1, 131072, 16),
    pa.Case("verify causal q=16 B=8 ctx=32k", 8, 32768, 16),
    pa.Case("draft non-causal W=2048 q=16 B=1 ctx=4k", 1, 4096, 16, False, window=2048),
)
BLOCK_TOKENS = (4, 8, 16)  # query tokens per program (x 4 GQA heads = rows)
TILES = ((32, 4, 5), (64, 4, 5), (64, 4, 3))  # (keys per tile, warps, stages)
SPLITS = (4, 8, 16, 32)
READAHEAD_TILES = ((64, 4, 3), (64, 4, 4), (64, 4, 5), (32, 4, 3), (32, 4, 5))
READAHEAD_SPLITS = (32, 64)


def variants(shipped, plan: int, c: pa.Case, readahead: bool) -> list:
    """(config, splits, tag) to time, the shipped choice first."""
    todo = [(shipped, plan, "shipped")]
    if readahead:
        for tile, warps, stages in READAHEAD_TILES:
            for prefetch in (False, True):
                cfg = replace(
                    shipped, tile_n=tile, num_warps=warps, num_stages=stages,
                    prefetch_pages=prefetch,
                )  # fmt: skip
                todo += [(cfg, s, f"readahead={int(prefetch)}") for s in READAHEAD_SPLITS]
        return todo
    gqa = pa.HQ // pa.HKV
    for tokens in BLOCK_TOKENS:
        if tokens > c.q_len:
            continue
        for tile, warps, stages in TILES:
            cfg = replace(
                shipped, block_m=tokens * gqa, block_q=tokens, tile_n=tile,
                num_warps=warps, num_stages=stages,
            )  # fmt: skip
            todo += [(cfg, s, "") for s in SPLITS]
    return todo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--readahead", action="store_true")
    args = ap.parse_args()
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    ws = SplitKVWorkspace.allocate(256, pa.HQ, pa.D, max_splits=64, device="cuda")
    for c in CASES:
        if args.only not in c.name:
            continue
        x = pa.Inputs(c)
        plan = plan_split_kv(c.batch * c.q_len, c.q_len, c.ctx, pa.HKV, device_info("cuda"))
        shipped = launch_config(x.q, x.k, x.v, c.q_len, split_kv=plan > 1)
        for cfg, splits, tag in variants(shipped, plan, c, args.readahead):
            handles: list = []
            fn = pa.ours_fn(c, x, ws, config=cfg, num_splits=splits, compiled=handles)
            us = pa.graph_us(fn, 10, 40)
            h = handles[0]
            frac = f"{pa.figure(c, us) / roof:.3f} of copy" if c.metric == "GB/s" else ""
            print(
                f"{c.name}: tokens={cfg.block_q} m={cfg.block_m} n={cfg.tile_n} "
                f"w={cfg.num_warps} st={cfg.num_stages} splits={splits} {tag}: {us:.1f} us "
                f"{frac} regs={h.n_regs} smem={h.metadata.shared}",
                flush=True,
            )
        del x


if __name__ == "__main__":
    main()
