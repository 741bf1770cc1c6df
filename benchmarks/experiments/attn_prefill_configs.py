"""Prefill tiles and loop structure of the paged kernel (H200 experiment behind its config).

Times, on CUDA-graph replays with the benchmark's own inputs, the causal prefill cases under
tile shapes (query rows x keys x warps x stages) with `unmasked_interior` (interior tiles in a
loop without masks) off and on, beside torch SDPA on the same values; and the decode and verify
cases with `unmasked_interior` off and on, to decide which take it.

`benchmarks/results/h200-attn-prefill-configs.txt` also has a `heavy` column: a launch order
walking the longest causal query blocks first, measured at e3c94ef and dropped (with unmasked
interiors it lost 0.6-2%).

    python benchmarks/experiments/attn_prefill_configs.py [--only SUBSTR] [--interior on]

`--only` keeps the cases whose name holds SUBSTR; `--interior on` times unmasked interiors
only (the shipped prefill choice), halving the sweep.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks import bench_paged_attention as pa
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import (
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)

PREFILL = (
    pa.Case("prefill causal B=1 L=8k", 1, 8192, 8192, metric="TFLOP/s"),
    pa.Case("prefill causal B=4 L=4k", 4, 4096, 4096, metric="TFLOP/s"),
    pa.Case("prefill chunk 2k after 14k ctx B=1", 1, 16384, 2048, metric="TFLOP/s"),
)
# (block_m, tile_n, warps, stages), each with unmasked interiors off and on.
TILES = (
    (128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (128, 32, 8, 3),
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 4, 3),
)  # fmt: skip
DECODE = (
    pa.Case("decode bf16 B=1 ctx=32k", 1, 32768, 1),
    pa.Case("decode bf16 B=8 ctx=32k", 8, 32768, 1),
    pa.Case("decode bf16 B=64 ctx=32k", 64, 32768, 1),
    pa.Case("decode fp8 B=8 ctx=32k", 8, 32768, 1, fp8=True),
    pa.Case("decode fp8 B=64 ctx=32k", 64, 32768, 1, fp8=True),
    pa.Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16),
    pa.Case("verify causal q=16 B=8 ctx=32k", 8, 32768, 16),
    pa.Case("draft non-causal W=2048 q=16 B=1 ctx=4k", 1, 4096, 16, False, window=2048),
)


def timed(c: pa.Case, x: pa.Inputs, ws: SplitKVWorkspace, cfg, splits: int, tag: str) -> None:
    handles: list = []
    fn = pa.ours_fn(c, x, ws, config=cfg, num_splits=splits, compiled=handles)
    us = pa.graph_us(fn, 10, 40)
    h = handles[0]
    print(
        f"{c.name}: m={cfg.block_m} n={cfg.tile_n} w={cfg.num_warps} st={cfg.num_stages} "
        f"unmasked={int(cfg.unmasked_interior)} {tag}: "
        f"{us:.1f} us {pa.figure(c, us):.1f} {c.metric} regs={h.n_regs} "
        f"smem={h.metadata.shared}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--interior", choices=("both", "on"), default="both")
    args = ap.parse_args()
    interiors = (False, True) if args.interior == "both" else (True,)
    ws = SplitKVWorkspace.for_device(pa.HQ, pa.HKV, pa.D, "cuda")
    info = device_info("cuda")
    for c in PREFILL:
        if args.only not in c.name:
            continue
        x = pa.Inputs(c)
        sdpa = pa.sdpa_fn(c, x)
        if sdpa is not None:
            print(f"{c.name}: sdpa {pa.figure(c, pa.graph_us(sdpa, 10, 40)):.1f} TFLOP/s")
        shipped = launch_config(x.q, x.k, x.v, c.q_len)
        timed(c, x, ws, shipped, 1, "shipped")
        for m, n, w, st in TILES:
            cfg = replace(
                shipped, block_m=m, block_q=m // (pa.HQ // pa.HKV), tile_n=n, num_warps=w,
                num_stages=st,
            )  # fmt: skip
            for unmasked in interiors:
                cfg = replace(cfg, unmasked_interior=unmasked)
                try:
                    timed(c, x, ws, cfg, 1, "")
                except Exception as e:  # out of shared memory: say so and go on
                    print(f"{c.name}: m={m} n={n} w={w} st={st}: {type(e).__name__}: {e}")
        del x
    for c in DECODE:
        if args.only not in c.name:
            continue
        x = pa.Inputs(c)
        plan = plan_split_kv(
            c.batch * c.q_len, c.q_len, c.ctx, pa.HKV, info, kv_elem=1 if c.fp8 else 2
        )
        shipped = launch_config(x.q, x.k, x.v, c.q_len, split_kv=plan > 1)
        for unmasked in (False, True):
            timed(c, x, ws, replace(shipped, unmasked_interior=unmasked), plan, f"splits={plan}")
        del x


if __name__ == "__main__":
    main()
