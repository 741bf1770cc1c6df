"""Fresh prefill with each tile's scores asked for one tile ahead: the softmax beside the GEMMs.

The shipped `fresh_prefill` kernel runs a key tile's QK^T, softmax and P @ V in turn. Compiled
for sm90, its loop waits for the scores, runs the softmax's exponentials while the tensor cores
idle, then issues P @ V. With `FreshPrefillConfig.skew_scores` the loop asks for tile j + 1's
scores before tile j's softmax (FlashAttention 3's intra-warpgroup overlap): offline sm90
compiles (Triton 3.7.1) then show the exponentials interleaved with the next tile's wgmma on
64-key tiles, and on 128-key tiles the softmax running while the previous P @ V is in flight.
Skewed 128-key tiles spill 64 B in the loop at head 128 (255 registers), 64-key tiles do not.
An arrangement that peels the last tile instead of computing one unused score tile made ptxas
wait after every wgmma of the kernel (`wgmma_serialized` in `offline_compile`).

This times, in one process on the same values: the device's config, the skewed configs, the
unskewed config on the same 64-key tiles (to separate the tile from the skew) and torch SDPA on
cuDNN, as CUDA-graph replays, for causal prompts without cached context (Qwen3-8B shapes).

    python benchmarks/experiments/fresh_prefill_skew.py [--only SUBSTR]
    python benchmarks/experiments/fresh_prefill_skew.py --compile-only [--capability 90]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton

from benchmarks.experiments.attn_prefill_tma import compile_shipped, fresh_prefill_tag
from vllm_blackwell_ext.kernels import fresh_prefill as fp
from vllm_blackwell_ext.kernels.device import device_info

HQ, HKV, D = 32, 8, 128
C = fp.FreshPrefillConfig
# The device's (None), then 64-key tiles unskewed and skewed, then skewed 128-key tiles.
CONFIGS: tuple[fp.FreshPrefillConfig | None, ...] = (
    None,
    C(128, 64, 8, 3),
    C(128, 64, 8, 3, skew_scores=True),
    C(128, 64, 8, 4, skew_scores=True),
    C(128, 128, 8, 2, skew_scores=True),
)
CASES = (
    ("prefill causal B=1 L=8k", [8192]),
    ("prefill causal B=4 L=4k", [4096] * 4),
    ("prefill causal B=1 L=2k", [2048]),
    ("prefill causal B=16 L=1k", [1024] * 16),
)


def compile_only(capability: int) -> None:
    """Each config compiled offline for sm`capability`: registers, shared memory, spills and
    whether ptxas serialised the wgmma pipeline."""
    print(f"# triton {triton.__version__}, offline compile for sm{capability}")
    configs = tuple(cfg or fp._GPU_CONFIG for cfg in CONFIGS)
    compile_shipped(capability, configs, shapes=((128, 4), (64, 4)))


def bench(only: str) -> None:
    from benchmarks.bench_paged_attention import graph_us
    from benchmarks.harness import bench_us

    print(f"# torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}")  # fmt: skip
    info = device_info("cuda")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    cudnn = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
    for name, lens in CASES:
        if only not in name:
            continue
        g = torch.Generator(device="cuda").manual_seed(0)
        tokens = sum(lens)
        q, k, v = (
            torch.randn(tokens, h, D, generator=g, device="cuda", dtype=torch.bfloat16)
            for h in (HQ, HKV, HKV)
        )
        cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        flops = 4.0 * HQ * D * sum(n * (n + 1) // 2 for n in lens)
        if len(set(lens)) == 1:
            b, n = len(lens), lens[0]
            qd, kd, vd = (t.view(b, n, -1, D).transpose(1, 2) for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(cudnn):
                call = functools.partial(sdpa, qd, kd, vd, is_causal=True, enable_gqa=True)
                us = bench_us(call, 10, 40)
            print(f"{name}: sdpa-cudnn {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s", flush=True)
        ref = None
        for cfg in CONFIGS:
            out = torch.empty_like(q)
            label = fresh_prefill_tag(cfg or fp.fresh_prefill_config(info))
            label += " (device)" if cfg is None else ""
            try:
                call = functools.partial(
                    fp.fresh_prefill, q, k, v, out, cu, seq_lens, softmax_scale=D**-0.5, config=cfg
                )
                us = graph_us(call, 10, 40)
            except Exception as e:  # a config that does not compile or launch: say so, go on
                print(f"{name}: {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            ref = out if ref is None else ref
            diff = (out.float() - ref.float()).abs().max().item()
            print(f"{name}: {label}: {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s "
                  f"(max |diff| vs the device's {diff:.1e})", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--compile-only", action="store_true", help="offline compile facts only")
    ap.add_argument("--capability", type=int, default=90, help="with --compile-only")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args.capability)
        return
    bench(args.only)


if __name__ == "__main__":
    main()
