"""What vLLM 0.32 runs by default on Hopper, as benchmark peers: `vllm-fa3` and `flashmla`.

vLLM's backend priority on Hopper puts FLASH_ATTN (FlashAttention 3, the compiled
`vllm.vllm_flash_attn._vllm_fa3_C` of the vLLM CUDA wheel) first for paged attention, and
FlashMLA (`vllm._flashmla_C` / `_flashmla_extension_C`) among the first for MLA decode. Both
come with the vLLM CUDA wheel, so these peers run where that wheel is installed (the GPU kit of
`scripts/gpu_kit.sh`); elsewhere they raise `PeerMissing` and the table says why.

Each peer is called as vLLM's backend calls it, with the benchmark's values in the peer's own
cache layout (copied once, outside the timed region):
- FA3: `[2, pages, page, kv_heads, head]`; scheduler metadata computed once per case (vLLM's
  builder does it per step on the host side of the graph); at most 32 splits for batches of up
  to 512 tokens (vLLM's `flash_attn_max_num_splits_for_cuda_graph` under full CUDA graphs),
  FA3's own heuristic above. An fp8 cache takes an fp8 query with unit scale, as vLLM
  quantizes the query for FA3 (its `_q_scale` defaults to 1).
- FlashMLA: `[pages, page, 1, rank + rope]`; its schedule is planned by the first call and
  reused (vLLM's metadata); fp8 caches through its dense fp8 decode with an fp8 query.
Every `make` returns a callable that returns the peer's output, for the benchmarks' check
against ours.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.vllm_peer import PeerMissing

# vLLM 0.32's cap on FA3 splits under full CUDA graphs, and the largest graph it captures.
FA3_GRAPH_MAX_SPLITS = 32
FA3_GRAPH_MAX_TOKENS = 512


class FlashAttn3Paged:
    """vLLM's FlashAttention 3 over a paged cache (decode, verify and prefill rows alike)."""

    name = "vllm-fa3"

    def __init__(self) -> None:
        try:
            from vllm.vllm_flash_attn import flash_attn_interface as fa
        except ImportError as e:
            raise PeerMissing(f"vLLM's CUDA wheel is not installed here ({e})") from e
        if not fa.is_fa_version_supported(3):
            raise PeerMissing(f"FA3 unsupported here: {fa.fa_version_unsupported_reason(3)}")
        self.fa = fa

    def make(self, *, kv: torch.Tensor, q: torch.Tensor, cu_seqlens_q: torch.Tensor,
             seq_lens: torch.Tensor, block_table: torch.Tensor, max_seqlen_q: int,
             max_seqlen_k: int, causal: bool, window: int | None,
             k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
             ) -> Callable[[], torch.Tensor]:  # fmt: skip
        """`kv` is vLLM's Triton-backend cache [blocks, kv_heads, page, 2 * head]."""
        blocks, kv_heads, page, two_head = kv.shape
        head = two_head // 2
        cache = kv.view(blocks, kv_heads, page, 2, head).permute(3, 0, 2, 1, 4).contiguous()
        key_cache, value_cache = cache[0], cache[1]
        batch = block_table.shape[0]
        fp8 = kv.dtype.itemsize == 1
        query = q.to(kv.dtype) if fp8 else q  # unit query scale
        out = torch.empty_like(q)
        window_size = [window - 1, 0 if causal else window - 1] if window is not None else None
        splits = FA3_GRAPH_MAX_SPLITS if q.shape[0] <= FA3_GRAPH_MAX_TOKENS else 0
        meta = self.fa.get_scheduler_metadata(
            batch_size=batch,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            num_heads_q=q.shape[1],
            num_heads_kv=kv_heads,
            headdim=head,
            cache_seqlens=seq_lens,
            qkv_dtype=kv.dtype,
            cu_seqlens_q=cu_seqlens_q,
            page_size=page,
            causal=causal,
            window_size=window_size or (-1, -1),
            num_splits=splits,
        )
        scales = {}
        if fp8:
            shape = (batch, kv_heads)
            one = torch.ones(1, dtype=torch.float32, device=q.device)
            scales = {
                "q_descale": one.expand(shape),
                "k_descale": k_scale.expand(shape),
                "v_descale": v_scale.expand(shape),
            }

        def run() -> torch.Tensor:
            self.fa.flash_attn_varlen_func(
                q=query, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q,
                max_seqlen_q=max_seqlen_q, seqused_k=seq_lens, max_seqlen_k=max_seqlen_k,
                softmax_scale=head**-0.5, causal=causal, window_size=window_size,
                block_table=block_table, scheduler_metadata=meta, num_splits=splits,
                fa_version=3, **scales,
            )  # fmt: skip
            return out

        return run


class FlashMlaVllm:
    """vLLM's FlashMLA dense decode (bf16, and fp8 through its dense fp8 kernel)."""

    name = "flashmla"

    def __init__(self) -> None:
        try:
            from vllm.v1.attention.ops import flashmla
        except ImportError as e:
            raise PeerMissing(f"vLLM's CUDA wheel is not installed here ({e})") from e
        ok, why = flashmla.is_flashmla_dense_supported()
        if not ok:
            raise PeerMissing(f"vLLM's FlashMLA: {why}")
        self.ops = flashmla

    def make(self, *, q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
             seq_lens: torch.Tensor, query_len: int, rank: int, softmax_scale: float,
             k_scale: torch.Tensor | None) -> Callable[[], torch.Tensor]:  # fmt: skip
        """`q` [tokens, heads, rank + rope], `cache` [pages, page, rank + rope]."""
        batch = block_table.shape[0]
        heads = q.shape[1]
        k4 = cache.unsqueeze(2)  # one KV head
        if cache.dtype.itemsize == 1:
            q4 = q.to(cache.dtype).view(batch, query_len, heads, q.shape[2])
            meta, splits = self.ops.get_mla_metadata_dense_fp8(seq_lens, query_len * heads, 1)
            one = torch.ones(1, dtype=torch.float32, device=q.device)

            def run() -> torch.Tensor:
                out, _ = self.ops.flash_mla_with_kvcache_fp8(
                    q=q4, k_cache=k4, block_table=block_table, cache_seqlens=seq_lens,
                    head_dim_v=rank, tile_scheduler_metadata=meta, num_splits=splits,
                    softmax_scale=softmax_scale, causal=True, descale_q=one,
                    descale_k=k_scale.reshape(1),
                )  # fmt: skip
                return out

        else:
            q4 = q.view(batch, query_len, heads, q.shape[2])
            meta, _ = self.ops.get_mla_metadata()

            def run() -> torch.Tensor:
                out, _ = self.ops.flash_mla_with_kvcache(
                    q=q4, k_cache=k4, block_table=block_table, cache_seqlens=seq_lens,
                    head_dim_v=rank, tile_scheduler_metadata=meta, softmax_scale=softmax_scale,
                    causal=True,
                )  # fmt: skip
                return out

        run()  # plans the schedule that timed calls (and graph replays) reuse
        return run
