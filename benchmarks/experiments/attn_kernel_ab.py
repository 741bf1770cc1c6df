"""GPU time of the paged-attention kernel: this checkout against another revision's kernels.

The two revisions run in one process on the same inputs, each case replayed from a CUDA graph
(as vLLM runs decode) in alternating rounds; the table gives the best round of each and their
ratio, so a kernel change is judged against its parent on one machine draw, not across runs.

    mkdir -p /tmp/ab/kernels_old && git archive REV src/vllm_blackwell_ext/kernels \\
        | tar -x --strip-components=3 -C /tmp/ab/kernels_old
    python benchmarks/experiments/attn_kernel_ab.py --old /tmp/ab/kernels_old
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks.bench_paged_attention import HKV, HQ, Case, Inputs, figure, graph_us
from benchmarks.experiments.attn_host_ab import load_old
from vllm_blackwell_ext.kernels import paged_attention as new_pa

ROUNDS = 3
CASES = [
    Case("decode bf16 B=1 ctx=32k", 1, 32768, 1),
    Case("decode bf16 B=1 ctx=128k", 1, 131072, 1),
    Case("decode bf16 B=8 ctx=32k", 8, 32768, 1),
    Case("decode bf16 B=64 ctx=32k", 64, 32768, 1),
    Case("decode fp8 B=1 ctx=32k", 1, 32768, 1, fp8=True),
    Case("decode fp8 B=8 ctx=32k", 8, 32768, 1, fp8=True),
    Case("decode fp8 B=1 ctx=128k", 1, 131072, 1, fp8=True),
    Case("decode fp8 B=64 ctx=32k", 64, 32768, 1, fp8=True),
    Case("decode fp8 B=256 ctx=8k", 256, 8192, 1, fp8=True),
    Case("verify fp8 causal q=16 B=1 ctx=8k", 1, 8192, 16, fp8=True),
    Case("verify fp8 causal q=16 B=8 ctx=32k", 8, 32768, 16, fp8=True),
    Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16),
    Case("verify causal q=16 B=8 ctx=32k", 8, 32768, 16),
    Case("draft non-causal W=2048 q=16 B=1 ctx=4k", 1, 4096, 16, False, window=2048, metric="us"),
    Case("prefill causal B=1 L=8k", 1, 8192, 8192, metric="TFLOP/s"),
    Case("prefill causal B=4 L=4k", 4, 4096, 4096, metric="TFLOP/s"),
    Case("prefill chunk 2k after 14k ctx B=1", 1, 16384, 2048, metric="TFLOP/s"),
    Case("prefill fp8 causal B=1 L=8k", 1, 8192, 8192, fp8=True, metric="TFLOP/s"),
    Case("mixed 2k prefill chunk + 63 decodes ctx=8k", 64, 8192, 1, prefill=2048, metric="us"),
]


def call_of(pa, c: Case, x: Inputs):
    ws = pa.SplitKVWorkspace.for_device(HQ, HKV, 128, "cuda")

    def fn() -> None:
        pa.paged_attention(
            x.q, x.k, x.v, x.out, x.cu, x.seq_lens, x.block_table,
            max_seqlen_q=x.max_seqlen_q, max_seqlen_k=c.ctx, softmax_scale=128**-0.5,
            causal=c.causal, sliding_window=c.window, k_scale=x.k_scale, v_scale=x.v_scale,
            workspace=ws,
        )  # fmt: skip

    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="a copy of another revision's kernels")
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    args = ap.parse_args()
    old_pa = load_old(args.old.resolve())
    print("| case | metric | new | old | new/old (time) | max abs(new - old) |")
    print("|---|---|---|---|---|---|")
    for c in CASES:
        if args.only is not None and args.only not in c.name:
            continue
        x = Inputs(c)
        fns = {"new": call_of(new_pa, c, x), "old": call_of(old_pa, c, x)}
        fns["new"]()
        ref = x.out.clone()
        fns["old"]()
        torch.cuda.synchronize()
        diff = (x.out.float() - ref.float()).abs().max().item()
        us: dict[str, float] = {k: float("inf") for k in fns}
        for _ in range(ROUNDS):
            for k, fn in fns.items():
                us[k] = min(us[k], graph_us(fn, 10, 50))
        print(
            f"| {c.name} | {c.metric} | {figure(c, us['new']):.1f} | {figure(c, us['old']):.1f} "
            f"| {us['new'] / us['old']:.3f} | {diff:.2e} |",
            flush=True,
        )
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
