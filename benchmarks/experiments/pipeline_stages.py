"""Pipeline depth behind the block-table indirection (H200 experiment for both config tables).

Triton pipelines a paged kernel's K/V tiles one level behind the block-table load that
addresses them, so `num_stages` 3 and 4 give the tiles one shared-memory buffer and 5-6 give
two (Triton 3.6, read from the compiled kernels' shared memory). This times 5- and 7-stage
variants of the shipped bf16 decode / verify configs of the paged kernel and of the h16 MLA
decode configs, beside the shipped ones, on CUDA-graph replays with the benchmarks' own
inputs and split plans.

    python benchmarks/experiments/pipeline_stages.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks import bench_mla_decode as mla
from benchmarks import bench_paged_attention as pa
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import (
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)

PAGED = (
    (pa.Case("decode bf16 B=1 ctx=32k", 1, 32768, 1), ((32, 4, 5), (32, 4, 7), (64, 4, 5))),
    (pa.Case("decode bf16 B=1 ctx=128k", 1, 131072, 1), ((32, 4, 5), (32, 4, 7))),
    (pa.Case("decode bf16 B=8 ctx=32k", 8, 32768, 1), ((32, 4, 5), (32, 4, 7), (64, 4, 5))),
    (pa.Case("decode bf16 B=64 ctx=32k", 64, 32768, 1), ((64, 4, 5), (32, 4, 5))),
    (pa.Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16), ((64, 4, 5), (32, 4, 5), (32, 4, 3))),
    (pa.Case("verify causal q=8 B=1 ctx=8k", 1, 8192, 8), ((64, 4, 5), (32, 4, 5))),
    (pa.Case("verify causal q=16 B=8 ctx=32k", 8, 32768, 16), ((64, 4, 5), (32, 4, 5))),
)  # fmt: skip
MLA_CASES = ("B=1 ctx=128k", "B=8 ctx=32k", "B=64 ctx=4k", "B=64 ctx=32k", "B=256 ctx=4k")
# (block_n, warps, stages, ctas_per_sm, reload_v) per KV dtype, besides the shipped entry.
MLA_VARIANTS = {
    False: ((32, 4, 5, 2, False), (32, 4, 7, 1, False), (64, 4, 5, 1, False)),
    True: ((64, 8, 5, 1, True), (32, 8, 5, 1, True), (32, 8, 7, 1, True)),
}


def paged(roof: float) -> None:
    ws = SplitKVWorkspace.for_device(pa.HQ, pa.HKV, pa.D, "cuda")
    for c, variants in PAGED:
        x = pa.Inputs(c)
        plan = plan_split_kv(c.batch * c.q_len, c.q_len, c.ctx, pa.HKV, device_info("cuda"))
        shipped = launch_config(x.q, x.k, x.v, c.q_len, split_kv=plan > 1)
        todo = [(shipped, "shipped")]
        todo += [
            (replace(shipped, tile_n=t, num_warps=w, num_stages=s), "") for t, w, s in variants
        ]
        for cfg, tag in todo:
            for splits in sorted({plan, max(1, plan // 2)}, reverse=True):
                handles: list = []
                fn = pa.ours_fn(c, x, ws, config=cfg, num_splits=splits, compiled=handles)
                us = pa.graph_us(fn, 10, 40)
                h = handles[0]
                print(f"{c.name}: tile={cfg.tile_n} w={cfg.num_warps} st={cfg.num_stages} "
                      f"splits={splits} {tag}: {us:.1f} us {pa.figure(c, us) / roof:.3f} of copy "
                      f"regs={h.n_regs} smem={h.metadata.shared}", flush=True)  # fmt: skip
        del x


def mla_decode(roof: float) -> None:
    caches = mla.Caches("cuda")
    by_name = {c.name: c for c in mla.cases()}
    for fp8 in (False, True):
        kv = "fp8" if fp8 else "bf16"
        for case in MLA_CASES:
            c = by_name[f"h16 {kv} {case}"]
            x = mla.make_inputs(c, caches)
            shipped = mla.ours_fn(c, x).cfg
            todo = [shipped] + [
                replace(shipped, block_n=n, num_warps=w, num_stages=s, ctas_per_sm=k, reload_v=r)
                for n, w, s, k, r in MLA_VARIANTS[fp8]
            ]
            for cfg in todo:
                handles: list = []
                try:
                    fn = mla.ours_fn(c, x, config=cfg, compiled=handles)
                    us = mla.graph_us(fn)
                except Exception as e:  # out of shared memory and the like
                    print(f"{c.name}: {cfg}: failed {type(e).__name__}", flush=True)
                    continue
                h = handles[0]
                tag = "shipped" if cfg == shipped else ""
                print(f"{c.name}: n={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages} "
                      f"cps={cfg.ctas_per_sm} reload={cfg.reload_v} splits={fn.splits} {tag}: "
                      f"{us:.1f} us {mla.figure(c, us) / roof:.3f} of copy regs={h.n_regs} "
                      f"spills={h.n_spills} smem={h.metadata.shared}", flush=True)  # fmt: skip
            del x


def main() -> None:
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    paged(roof)
    mla_decode(roof)


if __name__ == "__main__":
    main()
