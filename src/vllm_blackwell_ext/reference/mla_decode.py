"""Pure-torch fp32 oracle of MLA decode over a paged latent cache (shares no code with kernels/).

Written to be obviously right, not fast: one request at a time, pages gathered position by
position, one query row at a time, softmax by `torch.softmax`.
"""

from __future__ import annotations

import torch


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    softmax_scale: float,
    kv_lora_rank: int,
    query_len: int = 1,
    k_scale: torch.Tensor | float | None = None,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out fp32 [T, H, kv_lora_rank], lse fp32 [T, H], natural log).

    Token t belongs to request t // query_len; row j of a request sees keys
    [0, seq_len - query_len + j] when causal, all seq_len keys otherwise. A row that sees no key
    gets out 0 and lse -inf. fp8 cache values are `stored * k_scale`.
    """
    num_tokens, num_heads, width = q.shape
    block_size = kv_cache.shape[1]
    scale = 1.0 if k_scale is None else float(k_scale)
    out = torch.zeros(num_tokens, num_heads, kv_lora_rank, dtype=torch.float32)
    lse = torch.full((num_tokens, num_heads), float("-inf"), dtype=torch.float32)
    for b in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[b])
        positions = torch.arange(seq_len)
        pages = block_table[b].long().cpu()[positions // block_size]
        slots = positions % block_size
        kv = kv_cache.cpu()[pages, slots].to(torch.float32) * scale  # [seq_len, width]
        for j in range(query_len):
            t = b * query_len + j
            visible = seq_len - query_len + 1 + j if causal else seq_len
            if visible <= 0:
                continue
            keys = kv[:visible]
            scores = q[t].cpu().to(torch.float32) @ keys.T * softmax_scale  # [H, visible]
            out[t] = torch.softmax(scores, dim=-1) @ keys[:, :kv_lora_rank]
            lse[t] = torch.logsumexp(scores, dim=-1)
    return out, lse
