"""bf16 decode launch configs across batch sizes (H200 experiment for `select_config`).

The sweep in `bench_paged_attention.py --sweep` found single-request decode faster with
32-key tiles and fewer splits; this checks whether that holds from B=1 to B=64 before the
config table changes. CUDA-graph replays, Qwen3-8B shapes.

    python benchmarks/experiments/attn_decode_tiles.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks.bench_paged_attention import (
    HKV,
    Case,
    Inputs,
    figure,
    graph_us,
    ours_fn,
)
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import (
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)


def main() -> None:
    ws = SplitKVWorkspace.for_device(32, HKV, 128, "cuda")
    for b, ctx in ((1, 32768), (1, 131072), (8, 32768), (64, 32768)):
        c = Case(f"decode bf16 B={b} ctx={ctx // 1024}k", b, ctx, 1)
        x = Inputs(c)
        base = launch_config(x.q, x.k, x.v, 1)  # unsplit choice; the variants set the tile
        plan = plan_split_kv(b, 1, ctx, HKV, device_info(x.q.device))
        for tile, warps, stages in ((64, 4, 3), (32, 4, 3), (32, 4, 4), (32, 2, 3), (64, 2, 3)):
            cfg = replace(base, tile_n=tile, num_warps=warps, num_stages=stages)
            for splits in sorted({plan, max(1, plan // 2)}, reverse=True):
                us = graph_us(ours_fn(c, x, ws, config=cfg, num_splits=splits), 10, 40)
                print(f"{c.name}: tile={tile} w={warps} st={stages} splits={splits}: "
                      f"{us:.1f} us {figure(c, us):.0f} GB/s", flush=True)  # fmt: skip
        del x


if __name__ == "__main__":
    main()
