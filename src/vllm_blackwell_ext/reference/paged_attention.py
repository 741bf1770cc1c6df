"""Pure-torch oracle of paged attention (BWX_ATTN's kernel): fp32 math, explicit masks.

Written from the definition, sharing nothing with `kernels/`: for each request, gather its
keys and values token by token through the block table, build the visibility mask of every
(query, key) pair from absolute positions, and take a plain softmax in fp32.
"""

from __future__ import annotations

import torch


def paged_attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out fp32 [num_tokens, Hq, Dv], lse fp32 [num_tokens, Hq]) for rows < cu[-1].

    Rows past cu_seqlens_q[-1] are zero in `out` and -inf in `lse`.
    Semantics: request b's query i sits at position p = seq_lens[b] - L_b + i and sees key
    position k iff k < seq_lens[b], (not causal or k <= p) and (no window or k >= p - W + 1).
    Logits are q.k * softmax_scale, then softcap * tanh(x / softcap) when softcap > 0; a sink
    is one more logit with a zero value; lse is the natural log of the full denominator.
    """
    num_tokens, num_q_heads, _ = q.shape
    num_kv_heads = key_cache.shape[2]
    block_size = key_cache.shape[1]
    head_size_v = value_cache.shape[3]
    group = num_q_heads // num_kv_heads
    ks = float(k_scale) if k_scale is not None else 1.0
    vs = float(v_scale) if v_scale is not None else 1.0
    cu = [int(x) for x in cu_seqlens_q.tolist()]
    lens = [int(x) for x in seq_lens.tolist()]
    out = torch.zeros(num_tokens, num_q_heads, head_size_v, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_q_heads), float("-inf"), dtype=torch.float32, device=q.device)
    for b, seq_len in enumerate(lens):
        start, stop = cu[b], cu[b + 1]
        q_len = stop - start
        if q_len == 0:
            continue
        # Gather this request's keys/values position by position through its block table.
        pos = torch.arange(seq_len, device=q.device)
        pages = block_table[b, pos // block_size].long()
        slots = pos % block_size
        k = key_cache[pages, slots].float() * ks  # [S, Hkv, D]
        v = value_cache[pages, slots].float() * vs  # [S, Hkv, Dv]
        k = k.repeat_interleave(group, dim=1)  # [S, Hq, D]: query head h reads kv head h // group
        v = v.repeat_interleave(group, dim=1)
        qb = q[start:stop].float()  # [L, Hq, D]
        logits = torch.einsum("lhd,shd->hls", qb, k) * softmax_scale
        if softcap > 0:
            logits = softcap * torch.tanh(logits / softcap)
        # Explicit per-(query, key) visibility from absolute positions.
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]  # [L, 1]
        k_pos = pos[None, :]  # [1, S]
        visible = torch.ones(q_len, seq_len, dtype=torch.bool, device=q.device)
        if causal:
            visible &= k_pos <= q_pos
        if sliding_window is not None:
            visible &= k_pos >= q_pos - sliding_window + 1
        logits = logits.masked_fill(~visible[None], float("-inf"))
        if sinks is not None:
            sink_col = sinks.float()[:, None, None].expand(num_q_heads, q_len, 1)
            logits = torch.cat([logits, sink_col], dim=-1)
            v = torch.cat([v, torch.zeros_like(v[:1])], dim=0)
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hq, L]
        probs = torch.exp(logits - row_lse[..., None]).nan_to_num(0.0)
        out[start:stop] = torch.einsum("hls,shd->lhd", probs, v)
        lse[start:stop] = row_lse.transpose(0, 1)
    return out, lse
