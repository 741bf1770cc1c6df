"""fp8-KV decode launch configs across batch sizes (H200 experiment for `select_config`).

fp8 decode reads half the bytes of bf16 but ran at 0.53-0.62 of copy (ncu: 220 registers per
thread, two programs per SM). This times tile / warps / stages / split variants of the fp8
config on CUDA-graph replays, with each variant's registers, spills and shared memory; the
5-stage (double-buffered) tile and one wave of splits came from it. Qwen3-8B shapes (32 q /
8 KV heads, head 128); the shipped config is timed first in every case. `--splits` also tries
1.5x and 2x the planned split count (three and four programs per SM instead of two), and
unsplit launches two and four splits; `--few` times only the first few variants.

    python benchmarks/experiments/attn_fp8_decode_configs.py [--splits] [--few]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from vllm_blackwell_ext.kernels.paged_attention_configs import MAX_SPLITS

from benchmarks.bench_paged_attention import (
    HKV,
    Case,
    Inputs,
    figure,
    graph_us,
    ours_fn,
)
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import (
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)

# (keys per tile, warps, stages); the shipped config is timed first in every case.
VARIANTS = (
    (128, 4, 3), (128, 4, 5), (128, 4, 6), (64, 4, 6),
    (128, 4, 2), (128, 4, 4), (128, 8, 3), (128, 8, 4),
    (64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 8, 3), (64, 2, 4),
    (32, 4, 4), (32, 2, 4), (256, 8, 2), (256, 8, 3),
)  # fmt: skip
CASES = ((1, 32768), (8, 32768), (64, 32768), (256, 8192), (1, 131072))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", action="store_true", help="also 1.5x and 2x the planned splits")
    ap.add_argument("--few", action="store_true", help="only the first four variants")
    args = ap.parse_args()
    variants = VARIANTS[:4] if args.few else VARIANTS
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    ws = SplitKVWorkspace.for_device(32, HKV, 128, "cuda")
    for b, ctx in CASES:
        c = Case(f"decode fp8 B={b} ctx={ctx // 1024}k", b, ctx, 1, fp8=True)
        x = Inputs(c)
        plan = plan_split_kv(b, 1, ctx, HKV, device_info(x.q.device), kv_elem=1)
        shipped = launch_config(x.q, x.k, x.v, 1, split_kv=plan > 1)
        # Unsplit launches also try two splits: more, smaller programs for the last wave.
        splits_tried = {plan, max(1, plan // 2)} | ({2} if plan == 1 else set())
        if args.splits:
            more = {plan * 3 // 2, plan * 2} if plan > 1 else {2, 4}
            splits_tried |= {min(s, MAX_SPLITS) for s in more}
        splits_tried = sorted(splits_tried)
        seen = set()
        for tile, warps, stages in ((shipped.tile_n, shipped.num_warps, shipped.num_stages),
                                    *variants):  # fmt: skip
            if (tile, warps, stages) in seen:
                continue
            seen.add((tile, warps, stages))
            cfg = replace(shipped, tile_n=tile, num_warps=warps, num_stages=stages)
            for splits in splits_tried:
                handles: list = []
                try:
                    fn = ours_fn(c, x, ws, config=cfg, num_splits=splits, compiled=handles)
                    us = graph_us(fn, 10, 40)
                except Exception as e:  # out of shared memory and the like
                    print(f"{c.name}: tile={tile} w={warps} st={stages} splits={splits}: "
                          f"failed {type(e).__name__}", flush=True)  # fmt: skip
                    break
                h = handles[0]
                gbps = figure(c, us)
                print(f"{c.name}: tile={tile} w={warps} st={stages} splits={splits}: "
                      f"{us:.1f} us {gbps:.0f} GB/s {gbps / roof:.3f} of copy "
                      f"regs={h.n_regs} spills={h.n_spills} smem={h.metadata.shared}",
                      flush=True)  # fmt: skip
        del x


if __name__ == "__main__":
    main()
