"""Prefill over cached context (a chunk of a long prompt, a prefix-cache hit) with TMA-read pages.

A prompt without cached context takes `fresh_prefill`, which reads its keys from the step's own
contiguous K/V through TMA. A chunk after cached context must read that context from the paged
cache, and the shipped kernel gathers those tiles with `cp.async` through the block table (H100:
342 TFLOP/s for a 2k chunk after 14k, where FlashAttention 3 ran 597 in the same run,
`h100-paged-attention.md`). Where a page holds whole key tiles (64 or 128 tokens), each tile is
one TMA copy from the cache viewed as 2D rows. This times, on the same values and in one run:
the shipped kernel at pages of 16, 64 and 128, and `attn_prefill_tma.py`'s TMA kernel over the
paged cache, with the block-table read in the tile's own iteration, one iteration ahead, or a
batch of pages at a time ahead of an inner key loop (`page_batch`); and the shipped kernel's
TMA tiles with its own page batches (`AttnConfig.tma_page_batch`).

Why batches: compiled offline for sm90 (Triton 3.7.1, 128 x 128 tiles on 8 warps, 3 stages
asked), the kernel that reads each tile's page id in the tile's own iteration holds two K/V
buffers (131,092 B of shared memory), where the same kernel over contiguous K/V holds three
(196,632 B); with page ids read 16 or 64 pages at a time it holds three again (196,632 B),
at 244 registers against 252. The dependent block-table read keeps Triton's pipeliner a stage
short. `python benchmarks/experiments/attn_prefill_tma.py --compile-only` prints those. The
shipped kernel (head 128, 128 x 128 tiles, 3 stages asked) compiles likewise to 164,864 B and
255 registers per tile read, 230,400 B and 209-214 registers with 16 or 64 pages a batch
(`--compile-only` here, `offline-attn-tma-page-batch.txt`).

    python benchmarks/experiments/attn_chunk_prefill_tma.py [--only SUBSTR]
    TRITON_INTERPRET=1 python benchmarks/experiments/attn_chunk_prefill_tma.py --check
    python benchmarks/experiments/attn_chunk_prefill_tma.py --compile-only     (no GPU needed)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton

from benchmarks.experiments.attn_prefill_tma import (
    HKV,
    HQ,
    D,
    Inputs,
    TmaConfig,
    graph_us,
    kv_views,
    make_inputs,
    query_blocks,
    report_tma,
    tma_prefill,
)
from vllm_blackwell_ext.kernels.paged_attention import launch_config, paged_attention
from vllm_blackwell_ext.reference.paged_attention import paged_attention_ref

# (name, query lengths, cached keys before each)
CASES = (
    ("prefill chunk 2k after 14k ctx B=1", [2048], 14336),
    ("prefill chunk 8k after 24k ctx B=1", [8192], 24576),
    ("prefill chunk 512 after 7.5k ctx B=4", [512] * 4, 7680),
    ("prefill causal B=1 L=8k", [8192], 0),
)
PAGES = (16, 64, 128)
# The product kernel's TMA tiles with page ids read this many pages at a time (0: per tile).
SHIPPED_PAGE_BATCHES = (0, 8, 16, 64)
# Tiles must not cross a page: 64-key tiles on pages of 64, both widths on pages of 128.
TMA_CONFIGS = (
    TmaConfig(32, 64, 8, 3), TmaConfig(32, 64, 8, 4),
    TmaConfig(32, 64, 8, 3, readahead=True), TmaConfig(32, 64, 8, 4, readahead=True),
    TmaConfig(32, 128, 8, 2), TmaConfig(32, 128, 8, 3),
    TmaConfig(32, 128, 8, 2, readahead=True), TmaConfig(32, 128, 8, 3, readahead=True),
    TmaConfig(32, 128, 8, 3, page_batch=16), TmaConfig(32, 128, 8, 3, page_batch=64),
    TmaConfig(32, 64, 8, 3, page_batch=32), TmaConfig(32, 128, 8, 2, page_batch=64),
    TmaConfig(32, 64, 8, 3, skew=True), TmaConfig(32, 64, 8, 4, skew=True),
    TmaConfig(32, 128, 8, 2, skew=True),
    TmaConfig(32, 64, 8, 3, page_batch=32, skew=True),
    TmaConfig(32, 64, 8, 4, page_batch=32, skew=True),
)  # fmt: skip


def check() -> None:
    """The TMA kernel with context, both block-table reads, against the pure-torch reference."""
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    cases = [([40, 70], 32, 50, TmaConfig(8, 16, 4, 2, readahead=ra)) for ra in (False, True)]
    cases += [([33, 5], 64, 100, TmaConfig(4, 32, 4, 3, readahead=True))]
    # Batches of 2 pages: several batches per request, the last one partly past its pages.
    cases += [([40, 70], 32, 150, TmaConfig(8, 16, 4, 2, page_batch=2))]
    cases += [([33, 5], 64, 100, TmaConfig(4, 32, 4, 3, page_batch=4))]
    # Scores one tile ahead: the last ones asked for at the block's last key, never used.
    cases += [([40, 70], 32, 150, TmaConfig(8, 16, 4, 2, skew=True))]
    # Both: scores one tile ahead within each batch of pages (2 tiles a page here).
    cases += [([40, 70], 32, 150, TmaConfig(8, 16, 4, 2, page_batch=2, skew=True))]
    if device == "cuda":
        cases += [([1000, 300], 128, 30000, TmaConfig(32, 64, 8, 3, page_batch=32, skew=True))]
        cases += [([1000, 300], 128, 3000, TmaConfig(32, 64, 8, 3, skew=True))]
        cases += [([1000, 300], 128, 3000, TmaConfig(32, 128, 8, 3, readahead=True))]
        cases += [([1000, 300], 64, 3000, TmaConfig(32, 64, 8, 4, readahead=True))]
        cases += [([1000, 300], 128, 3000, TmaConfig(32, 128, 8, 3, page_batch=4))]
        cases += [([1000, 300], 128, 30000, TmaConfig(32, 128, 8, 3, page_batch=64))]
    for lens, page, ctx, cfg in cases:
        d = 64 if device == "cpu" else 128
        x = make_inputs(lens, page, device, hq=8, hkv=2, d=d, ctx=ctx)
        tma_prefill(
            x.q, x.kv, x.out, x.cu, x.seq_lens, x.block_table, cfg, query_blocks(x.cu, cfg.block_q)
        )
        k, v = kv_views(x)
        ref, _ = paged_attention_ref(
            x.q.float(), k.float(), v.float(), x.cu, x.seq_lens, x.block_table,
            softmax_scale=d**-0.5, causal=True,
        )  # fmt: skip
        err = (x.out.float() - ref).abs().max().item()
        print(f"check lens={lens} ctx={ctx} page={page} {cfg}: max |err| {err:.2e}")
        # bf16 output and bf16 P in the second dot: each rounds to 2**-9 relative
        torch.testing.assert_close(x.out.float(), ref, atol=1e-2, rtol=1e-2)


def shipped_us(x: Inputs, page_batch: int | None = None) -> tuple[float, str]:
    """The product kernel on its own config, or with `tma_page_batch` set (TMA tiles only)."""
    k, v = kv_views(x)
    cfg = launch_config(x.q, k, v, x.max_seqlen_q)
    if page_batch is not None:
        cfg = replace(cfg, tma_page_batch=page_batch)
    max_k = int(x.seq_lens.max())

    def fn() -> None:
        paged_attention(
            x.q, k, v, x.out, x.cu, x.seq_lens, x.block_table, max_seqlen_q=x.max_seqlen_q,
            max_seqlen_k=max_k, softmax_scale=D**-0.5, causal=True, config=cfg,
        )  # fmt: skip

    tag = f"m={cfg.block_m} n={cfg.tile_n} w={cfg.num_warps} st={cfg.num_stages}"
    if cfg.tma_tiles:
        tag += f" tma page_batch={cfg.tma_page_batch}"
    return graph_us(fn), tag


def bench(only: str) -> None:
    for name, lens, ctx in CASES:
        if only not in name:
            continue
        flops = 4.0 * HQ * D * sum(n * ctx + n * (n + 1) // 2 for n in lens)
        for page in PAGES:
            # Each page size lays the values out afresh: TMA outputs are held to the shipped
            # kernel's on the same pages.
            x = make_inputs(lens, page, "cuda", ctx=ctx)
            us, tag = shipped_us(x)
            ref = x.out.clone()
            print(
                f"{name}: page={page} shipped {tag}: {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s",
                flush=True,
            )
            if "tma" in tag:
                for page_batch in SHIPPED_PAGE_BATCHES:
                    x.out.zero_()
                    us, tag = shipped_us(x, page_batch)
                    diff = (x.out.float() - ref.float()).abs().max().item()
                    print(
                        f"{name}: page={page} shipped {tag}: {us:.1f} us "
                        f"{flops / us / 1e6:.1f} TFLOP/s (max |diff| vs shipped {diff:.1e})",
                        flush=True,
                    )
            for cfg in TMA_CONFIGS:
                if page % cfg.tile_n:
                    continue
                tag = (
                    f"tma paged m={cfg.block_q * HQ // HKV} n={cfg.tile_n} w={cfg.num_warps} "
                    f"st={cfg.stages} readahead={int(cfg.readahead)} page_batch={cfg.page_batch} "
                    f"skew={int(cfg.skew)}"
                )
                report_tma(f"{name}: page={page} {tag}", x, cfg, None, ref, flops)
            del x, ref
            torch.cuda.empty_cache()


def compile_shipped() -> None:
    """The shipped kernel's prefill launch over 128-token pages as an H100 makes it, per tile
    read and with page batches, compiled offline for sm90: registers, shared memory, spills."""
    from benchmarks.attn_offline_check import _recording_as
    from benchmarks.offline_compile import compile_offline, signature_of
    from vllm_blackwell_ext.kernels import paged_attention as pa
    from vllm_blackwell_ext.kernels.device import DeviceInfo

    h100 = DeviceInfo("NVIDIA H100", (9, 0), num_sms=132, smem_per_block=232_448)
    i32 = {"dtype": torch.int32}
    print(f"# triton {triton.__version__}, offline compile for sm90")
    for head in (128, 64):
        kv = torch.zeros(8, HKV, 128, 2 * head, dtype=torch.bfloat16)
        k, v = kv.transpose(1, 2).split(head, dim=-1)
        q = torch.zeros(300, HQ, head, dtype=torch.bfloat16)
        cfg = launch_config(q, k, v, 300, h100)
        for page_batch in SHIPPED_PAGE_BATCHES:
            with _recording_as(h100) as (attn, _merge):
                paged_attention(
                    q, k, v, torch.empty_like(q), torch.tensor([0, 300], **i32),
                    torch.tensor([800], **i32), torch.arange(8, **i32).view(1, 8),
                    max_seqlen_q=300, max_seqlen_k=800, softmax_scale=head**-0.5,
                    config=replace(cfg, tma_page_batch=page_batch),
                )  # fmt: skip
            (_grid, args, options), *_ = attn.launches
            stats = compile_offline(
                pa._paged_attn_kernel, *signature_of(pa._paged_attn_kernel, args), 90, **options
            )
            print(f"shipped head={head} tma page_batch={page_batch}: {stats}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--check", action="store_true", help="correctness on small shapes only")
    ap.add_argument("--compile-only", action="store_true", help="offline sm90 compile facts")
    args = ap.parse_args()
    if args.check:
        check()
        return
    if args.compile_only:
        compile_shipped()
        return
    print(
        f"# torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}"
    )
    bench(args.only)


if __name__ == "__main__":
    main()
