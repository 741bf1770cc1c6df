"""Causal prefill of requests without cached context, from the chunk's own K/V through TMA
(jit code only; the op's plan, launch and checks are its siblings).

A request whose keys all arrive in this step (a new prompt with no prefix-cache hit) has them
contiguous in the forward's `key` / `value` ([tokens, num_kv_heads, head]) as well as paged in
the cache. This kernel reads them from there: each key tile is one tensor-memory-access copy
(TMA) into shared memory, several tiles in flight, instead of a gather page by page through
the block table. Same values as the cache holds when the cache has the query's dtype, so the
same attention (up to the order of fp32 sums).

Which requests it takes is decided on the device, by one rule both kernels apply to the same
`cu_seqlens_q` and `seq_lens`: no cached context and at least `min_query_len` query tokens.
This kernel computes those and the paged kernel, launched with `skip_fresh_from` set to the
same length, skips them, so together they cover every request whatever the host believed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.request_search import find_request


@triton.jit
def _scores(q, k, visible, MASKED: tl.constexpr, qk_scale, DOT_FP32: tl.constexpr):
    if DOT_FP32:  # the CPU interpreter: its bf16 dots multiply raw bits
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        v = v.to(tl.float32)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attend_tile(
    acc, l_i, m_i, q, k, v, visible, MASKED: tl.constexpr, qk_scale, DOT_FP32: tl.constexpr
):
    s = _scores(q, k, visible, MASKED, qk_scale, DOT_FP32)
    return _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)


# The batch size changes from batch to batch: a runtime value, so the JIT warm-up's scratch
# compiles the variant the engine launches. The output strides stay specialised (multiples of 16
# for every head size taken here): the 128 x 128 x 3-stage tiles spill registers with them as
# runtime values and do not without (offline sm90 compiles).
@triton.jit(do_not_specialize=["batch", "min_query_len"])
def _fresh_prefill_kernel(
    q_desc,  # query [T, H, HEAD], block [BLOCK_Q, GQA, HEAD]
    k_desc,  # key as [T, HKV * HEAD], block [TILE_N, HEAD]
    v_desc,  # value likewise
    out_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    batch,
    qk_scale,  # softmax scale x log2(e)
    stride_ot,
    stride_oh,
    min_query_len,
    GQA: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    STAGES: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SKEW: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GQA
    # Programs in reverse: a request's later blocks see more keys, so they start first.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req = find_request(cu_q_ptr, pid, batch, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + req)
    q_len = tl.load(cu_q_ptr + req + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + req)
    if q_block * BLOCK_Q >= q_len:
        return  # the grid is an upper bound: this block lies past the request's queries
    if (tl.load(seq_lens_ptr + req) != q_len) | (q_len < min_query_len):
        return  # cached context, or short: the paged kernel's (the same rule there)

    offs_m = tl.arange(0, BLOCK_M)
    q_local = q_block * BLOCK_Q + offs_m // GQA  # = the row's position: no cached context
    head = kv_head * GQA + offs_m % GQA
    row_ok = q_local < q_len
    tok = (q_start + q_local).to(tl.int64)
    # Rows past the request (the next request's tokens, or TMA's zeros past the tensor) are
    # computed and never stored; keys past the request lie beyond every stored row's position.
    q = q_desc.load([q_start + q_block * BLOCK_Q, kv_head * GQA, 0]).reshape(BLOCK_M, HEAD)
    if DOT_FP32:
        q = q.to(tl.float32)
    first = q_block * BLOCK_Q
    last = tl.minimum(first + BLOCK_Q, q_len) - 1
    whole_hi = (first + 1) // TILE_N  # tiles every row of the block sees whole
    tile_hi = (last + TILE_N) // TILE_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD], tl.float32)
    col = kv_head * HEAD
    offs_n = tl.arange(0, TILE_N)
    if SKEW:
        # Tile j + 1's scores are asked for ahead of tile j's softmax (FreshPrefillConfig);
        # the last ones (tile whole_hi's, zeros past the tensor) go unused.
        s = _scores(q, k_desc.load([q_start, col]), None, False, qk_scale, DOT_FP32)
        for j in tl.range(0, whole_hi, num_stages=STAGES):
            k = k_desc.load([q_start + (j + 1) * TILE_N, col])
            v = v_desc.load([q_start + j * TILE_N, col])
            s_next = _scores(q, k, None, False, qk_scale, DOT_FP32)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)
            s = s_next
    else:
        for j in tl.range(0, whole_hi, num_stages=STAGES):
            k = k_desc.load([q_start + j * TILE_N, col])
            v = v_desc.load([q_start + j * TILE_N, col])
            acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k, v, None, False, qk_scale, DOT_FP32)
    for j in tl.range(whole_hi, tile_hi):
        k = k_desc.load([q_start + j * TILE_N, col])
        v = v_desc.load([q_start + j * TILE_N, col])
        visible = (j * TILE_N + offs_n)[None, :] <= q_local[:, None]
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k, v, visible, True, qk_scale, DOT_FP32)
    out = acc / l_i[:, None]
    offs_d = tl.arange(0, HEAD)
    tl.store(
        out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
