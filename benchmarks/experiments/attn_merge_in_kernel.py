"""Split-KV launches: merge in the kernel (the last split to finish) or in a second kernel.

Times each case at its planned split count (CUDA-graph replays and eager host time, Qwen3-8B
shapes: 32 q / 8 KV heads, head 128) with the merge kernel and with the in-kernel merge, and
for fp8 single-token decode with and without the register cap that keeps three programs per
SM; prints the largest output difference between the ways (the same partials, merged in
another order). Sets `MERGE_IN_KERNEL_MAX_SPLITS` and `FP8_DECODE_MAX_REGISTERS`.

    python benchmarks/experiments/attn_merge_in_kernel.py [--only SUBSTR]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch  # noqa: E402

from benchmarks.bench_paged_attention import (  # noqa: E402
    HKV,
    HQ,
    Case,
    Inputs,
    figure,
    graph_us,
    host_us,
    ours_fn,
)
from benchmarks.harness import copy_roofline_gbps  # noqa: E402
from vllm_blackwell_ext.kernels.device import device_info  # noqa: E402
from vllm_blackwell_ext.kernels.paged_attention import (  # noqa: E402
    SplitKVWorkspace,
    launch_config,
    plan_split_kv,
)

CASES = (
    Case("decode bf16 B=1 ctx=32k", 1, 32768, 1),
    Case("decode bf16 B=1 ctx=128k", 1, 131072, 1),
    Case("decode bf16 B=8 ctx=32k", 8, 32768, 1),
    Case("decode bf16 B=32 ctx=32k", 32, 32768, 1),
    Case("decode fp8 B=1 ctx=32k", 1, 32768, 1, fp8=True),
    Case("decode fp8 B=1 ctx=128k", 1, 131072, 1, fp8=True),
    Case("decode fp8 B=8 ctx=32k", 8, 32768, 1, fp8=True),
    Case("decode fp8 B=32 ctx=32k", 32, 32768, 1, fp8=True),
    Case("decode fp8 B=64 ctx=32k", 64, 32768, 1, fp8=True),
    Case("decode fp8 B=256 ctx=8k", 256, 8192, 1, fp8=True),
    Case("verify causal q=4 B=1 ctx=32k", 1, 32768, 4),
    Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16),
    Case("verify causal q=16 B=8 ctx=32k", 8, 32768, 16),
)
HOST_CASES = ("decode bf16 B=8 ctx=32k", "decode fp8 B=64 ctx=32k", "decode fp8 B=8 ctx=32k")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    only = ap.parse_args().only
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    ws = SplitKVWorkspace.for_device(HQ, HKV, 128, device="cuda")
    for c in [c for c in CASES if only in c.name]:
        x = Inputs(c)
        info = device_info(x.q.device)
        splits = plan_split_kv(
            x.q.shape[0], x.max_seqlen_q, c.ctx, HKV, info, kv_elem=1 if c.fp8 else 2
        )
        cfg = launch_config(x.q, x.k, x.v, x.max_seqlen_q, split_kv=splits > 1)
        ways = {
            "merge kernel": replace(cfg, merge_in_kernel_max_splits=0),
            "in kernel": replace(cfg, merge_in_kernel_max_splits=64),
        }
        if c.fp8:
            ways["merge kernel, no cap"] = replace(ways["merge kernel"], max_registers=0)
            ways["in kernel, no cap"] = replace(ways["in kernel"], max_registers=0)
        outs = {}
        for way, way_cfg in ways.items():
            fn = ours_fn(c, x, ws, num_splits=splits, config=way_cfg, check_inputs=False)
            us = graph_us(fn, 10, 50)
            outs[way] = x.out.float().clone()
            gbps = figure(c, us)
            host = f" host {host_us(fn):.1f} us" if c.name in HOST_CASES else ""
            print(
                f"{c.name}: splits={splits} {way:<22} {us:8.1f} us {gbps:6.0f} GB/s "
                f"{gbps / roof:.3f} of copy{host}",
                flush=True,
            )
        base = outs["merge kernel"]
        diff = max(float((o - base).abs().max()) for o in outs.values())
        print(f"{c.name}: max |out - merge kernel's| = {diff:.2e}", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
