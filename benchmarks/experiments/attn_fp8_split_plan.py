"""fp8-KV single-token decode: GPU time against the split count, per batch and context.

Reading value tiles as 16-bit pairs took the fp8 decode program from ~210 to ~160 registers,
so three programs fit on an H200 SM instead of two; this times the split counts around the
planner's answer (CUDA-graph replays, Qwen3-8B shapes: 32 q / 8 KV heads, head 128) to set
`plan_split_kv`'s fp8 rule.

    python benchmarks/experiments/attn_fp8_split_plan.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks.bench_paged_attention import HKV, Case, Inputs, figure, graph_us, ours_fn
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.paged_attention import SplitKVWorkspace, plan_split_kv

# (requests, context, split counts to time)
CASES = (
    (1, 4096, (4, 8, 16)),
    (1, 8192, (8, 16, 32)),
    (1, 32768, (24, 32, 33, 49)),
    (1, 131072, (33, 49, 64)),
    (8, 32768, (4, 6, 8, 12)),
    (32, 32768, (1, 2, 3, 4)),
    (64, 32768, (1, 2, 3, 4)),
    (128, 16384, (1, 2, 3)),
    (256, 8192, (1, 2)),
)


def main() -> None:
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    ws = SplitKVWorkspace.allocate(256, 32, 128, device="cuda", max_rows=1024)
    for b, ctx, split_counts in CASES:
        c = Case(f"decode fp8 B={b} ctx={ctx // 1024}k", b, ctx, 1, fp8=True)
        x = Inputs(c)
        plan = plan_split_kv(b, 1, ctx, HKV, device_info(x.q.device), kv_elem=1)
        for splits in split_counts:
            us = graph_us(ours_fn(c, x, ws, num_splits=splits), 10, 50)
            gbps = figure(c, us)
            mark = " (planned)" if splits == plan else ""
            print(f"{c.name}: splits={splits}{mark}: {us:.1f} us {gbps:.0f} GB/s "
                  f"{gbps / roof:.3f} of copy", flush=True)  # fmt: skip
        if plan not in split_counts:
            print(f"{c.name}: planned {plan}", flush=True)
        del x


if __name__ == "__main__":
    main()
