"""BWX_MLA's chunked-context prefill: vLLM's chunk loop, reading the paged context through our
gather ops.

The paged-context read goes through `torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache`
(fp8 dequantised on the way; our raw `cp_gather_cache` only when vLLM asks for an fp8
workspace, i.e. fp8 prefill attention), with and without DCP. Under DCP every rank gathers its
own cache in the padded local layout vLLM's builder planned (`padded_local_cu_seq_lens`,
`padded_local_token_to_seq`, local `starts`). vLLM 0.32 inlines that read in
`MLACommonBaseImpl._compute_prefill_context` and `_context_parallel_compute_prefill_context`;
`BwxMLAContextPrefill` overrides both with one loop that calls `gather_context_chunk`, the single
place the read happens. `BwxMLAImpl` (`bwx_mla`) takes it as its first base.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonMetadata,
    MLACommonPrefillMetadata,
    _get_kv_b_proj_input_dtype,
    accumulate_mla_context_chunk,
    init_mla_context_partial,
    reorg_kvcache,
)
from vllm.platforms import current_platform

import vllm_blackwell_ext.ops  # noqa: F401  (registers torch.ops.vllm_blackwell_ext.*)


class BwxMLAContextPrefill:
    """The chunked-context prefill methods of `BwxMLAImpl` (an `MLACommonImpl`: they read its
    `dcp_world_size`, `kv_lora_rank`, `kv_b_proj`, ... )."""

    # ------------------------------------------------------------------ context prefill
    def gather_context_chunk(
        self,
        kv_c_and_k_pe_cache: torch.Tensor,
        block_table: torch.Tensor,
        chunk: MLACommonPrefillMetadata.ContextChunk,
        workspace: torch.Tensor,
        k_scale: torch.Tensor,
    ) -> torch.Tensor:
        """Read one context chunk out of this rank's paged cache into `workspace[:rows]`.

        Without DCP the rows are the chunk's context tokens in request order. Under DCP they
        are this rank's padded local layout, as vLLM's builder planned it (every rank gets
        the same `padded_local_cu_seq_lens` / `padded_local_token_to_seq` and local
        `starts`; a rank holding fewer tokens of a request leaves pad rows that
        `reorg_kvcache` drops after the all-gather). fp8 caches are dequantised by our op,
        so the workspace is always in the model dtype.
        """
        if self.dcp_world_size > 1:
            assert chunk.padded_local_cu_seq_lens is not None
            assert chunk.padded_local_token_to_seq is not None
            rows = chunk.num_local_context_tokens
            cu_seq_lens = chunk.padded_local_cu_seq_lens
            token_to_seq = chunk.padded_local_token_to_seq
        else:
            rows = chunk.num_context_tokens
            cu_seq_lens = chunk.cu_seq_lens
            token_to_seq = chunk.token_to_seq
        if workspace.dtype == kv_c_and_k_pe_cache.dtype == current_platform.fp8_dtype():
            # fp8 prefill attention (vLLM's use_prefill_query_quantization): raw fp8 rows.
            # The rows this chunk fills, as vLLM passes them: the kernel's grid covers dst.
            torch.ops.vllm_blackwell_ext.cp_gather_cache(
                kv_c_and_k_pe_cache,
                workspace[:rows],
                block_table,
                cu_seq_lens,
                chunk.num_requests,
                chunk.starts,
            )
        else:
            # bf16 caches are copied, fp8 ones dequantised (x k_scale) into the model dtype.
            torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache(
                kv_c_and_k_pe_cache,
                workspace,
                block_table,
                cu_seq_lens,
                token_to_seq,
                rows,
                self.kv_cache_dtype,
                k_scale,
                chunk.starts,
            )
        return workspace[:rows]

    def _compute_prefill_context(
        self,
        q: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        k_scale: torch.Tensor,
    ):
        return self._prefill_context(q, kv_c_and_k_pe_cache, attn_metadata, k_scale)

    def _context_parallel_compute_prefill_context(
        self,
        q: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        k_scale: torch.Tensor,
        dcp_world_size: int,
        fused_mla_kv_concat_fn=None,
    ):
        return self._prefill_context(q, kv_c_and_k_pe_cache, attn_metadata, k_scale)

    def _prefill_context(
        self,
        q: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        k_scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM 0.32's chunked-context loop (with and without DCP), reading via our gather."""
        prefill = attn_metadata.prefill
        assert prefill is not None and prefill.prefill_backend is not None
        chunked = prefill.chunked_context
        assert chunked is not None
        use_fp8_prefill = prefill.q_data_type == current_platform.fp8_dtype()
        kv_b_proj_input_dtype = _get_kv_b_proj_input_dtype(self.kv_b_proj, use_fp8_prefill)
        if use_fp8_prefill:
            q = q.to(prefill.q_data_type)
        workspace = chunked.workspace
        dcp = self.dcp_world_size
        output = output_lse = None
        for chunk in chunked.chunks:
            block_table = prefill.block_table[chunk.request_slice]
            if dcp > 1:
                # workspace = [local rows | dcp x local rows for the all-gather]
                allgather_offset = workspace.shape[0] // (dcp + 1)
                local = self.gather_context_chunk(
                    kv_c_and_k_pe_cache,
                    block_table,
                    chunk,
                    workspace[:allgather_offset],
                    k_scale,
                )
                toks = local.shape[0]
                gathered = workspace[allgather_offset : allgather_offset + toks * dcp]
                assert chunked.dcp_manager is not None
                chunked.dcp_manager.kv_gather(gathered, local)
                kv_c_normed, k_pe = reorg_kvcache(
                    *gathered.unsqueeze(1).split(
                        [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1
                    ),
                    padded_local_chunk_seq_lens_lst=chunk.padded_local_seq_lens,
                    local_context_lens_allranks=chunk.local_context_lens_allranks,
                    local_starts=chunk.local_starts,
                    sum_seq_len=chunk.num_context_tokens,
                    max_seq_len=chunk.max_seq_len,
                    toks=toks,
                )
                kv_c_normed = kv_c_normed.squeeze(1)
            else:
                rows = self.gather_context_chunk(
                    kv_c_and_k_pe_cache, block_table, chunk, workspace, k_scale
                )
                kv_c_normed = rows[..., : self.kv_lora_rank]
                k_pe = rows[..., self.kv_lora_rank :].unsqueeze(1)
            if kv_b_proj_input_dtype is not None:
                kv_c_normed = kv_c_normed.to(kv_b_proj_input_dtype)
            kv_nope = self.kv_b_proj(kv_c_normed)[0].view(
                -1, self.num_heads, self.qk_nope_head_dim + self.v_head_dim
            )
            if use_fp8_prefill:
                kv_nope = kv_nope.to(prefill.q_data_type)
                k_pe = k_pe.to(prefill.q_data_type)
            k_nope, v = kv_nope.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = self._concat_k_nope_k_pe(k_nope, k_pe)
            attn_output, attn_lse = prefill.prefill_backend.run_prefill_context_chunk(
                chunk=chunk, q=q[chunk.token_slice], k=k, v=v
            )
            if output is None:
                if len(chunked.chunks) == 1 and not chunked.empty_token_slices:
                    return attn_output, attn_lse
                output, output_lse = init_mla_context_partial(
                    chunked, attn_output, attn_lse, num_tokens=q.shape[0]
                )
            accumulate_mla_context_chunk(chunk, attn_output, attn_lse, output, output_lse)
        assert output is not None and output_lse is not None
        return output, output_lse
