"""Paged attention over vLLM 0.32's Triton-backend KV cache, in Triton (the kernel of BWX_ATTN).

Layout. `key_cache`/`value_cache` are [num_blocks, block_size, num_kv_heads, head_size] views
(vLLM stores [num_blocks, num_kv_heads, block_size, 2 * head_size] and hands us
`kv_cache.transpose(1, 2).split(head_size, -1)`): only strides are used, never contiguity.

Work split. A program owns one (request, block of BLOCK_Q query tokens) x one KV head and
processes all GQA query heads of that KV head together (BLOCK_M = BLOCK_Q x GQA rows), so every
K/V byte is read once per KV head and query block. For query lengths up to 16 (decode,
spec-verify, DFlash draft blocks) one block holds the whole query, causal or not; when those
programs cannot fill the GPU, a third grid axis splits the request's KV range into segments
whose partial outputs and log-sum-exps land in fp32 scratch and a small merge kernel combines
them (unlike vLLM 0.32, whose split path needs every query length to be 1). Single-token decode
split a few ways merges in the kernel instead: the last split of each (request, KV head) to
finish, counted in an int32 counter it sets back to zero, merges them (one launch, not two).

Prefill on Hopper over pages of whole 128-key tiles (`AttnConfig.tma_tiles`) reads each K/V
tile with one TMA copy from the cache viewed as 2D rows of slots (`tma_grid`) instead of a
`cp.async` gather through the block table; every other launch gathers.

Sliding window (Hugging Face convention, backward-only in both modes): query at absolute
position p sees keys [p - W + 1, p] (causal) or [p - W + 1, seq_len) (non-causal). The tile
loop starts at the first tile of the window of the block's first query, so whole tiles before
the window are never loaded and cost is flat in context length.

fp8 caches (e4m3fn / e5m2) are read as fp8 (half the bytes) and converted in registers to
fp16 for the tensor-core dots (one native convert per pair of values; to bf16 it takes several
instructions and made vLLM's fp8 decode slower than its bf16 one). A bf16 query is scaled by a
power of two into fp16 range, undone in the softmax scale. The per-tensor k scale is folded
into the softmax scale and the v scale into the output: no extra pass over the tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.paged_attention.tiles import attend_tiles
from vllm_blackwell_ext.kernels.request_search import find_request


# Ints that change from batch to batch (request count, split count and the partial-LSE strides
# that follow it) are runtime values, not specialised on: eager mixed batches in vLLM bring any
# of them at any time, and each new specialisation would compile in the middle of serving.
# The block-table row stride (pages per request, from the engine's max_model_len) is read once
# per program: not specialised either, so a JIT warm-up on scratch compiles exactly the
# variant the engine launches.
@triton.jit(
    do_not_specialize=[
        "batch",
        "num_splits",
        "stride_plt",
        "stride_plh",
        "stride_bt",
        "skip_fresh_from",
    ]
)
def _paged_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    part_o_ptr,
    part_lse_ptr,
    split_count_ptr,
    sink_ptr,
    k_scale_ptr,
    v_scale_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    block_table_ptr,
    k_desc,  # TMA_TILES: key_cache as 2D [rows of slots, HEAD_K], block [TILE_N, HEAD_K]; else None
    v_desc,  # TMA_TILES: value_cache likewise; else None
    batch,
    softmax_scale,
    softcap,
    window,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_plt,
    stride_plh,
    stride_bt,
    num_splits,
    skip_fresh_from,  # > 0: requests without context of this many queries are fresh_prefill's
    GQA: tl.constexpr,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    HEAD_K_PAD: tl.constexpr,
    HEAD_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT_KV: tl.constexpr,  # num_splits > 1: partials to scratch, then merged
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_KV_SCALE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    DOT_MODE: tl.constexpr,  # 0: query dtype, 1: fp32 (CPU interpreter), 2: fp16 (fp8 cache)
    UNMASKED_INTERIOR: tl.constexpr,  # interior tiles in a loop without masks
    PREFETCH_PAGES: tl.constexpr,  # block-table reads one tile ahead (AttnConfig.prefetch_pages)
    V_PAIRS: tl.constexpr,  # 0, or the `fp8_pairs` mode the fp8 value tiles are read in
    MERGE_IN_KERNEL: tl.constexpr,  # SPLIT_KV: the last split to finish merges (no merge kernel)
    TMA_TILES: tl.constexpr,  # K/V tiles of one page each, one TMA copy (AttnConfig.tma_tiles)
    TMA_PAGE_BATCH: tl.constexpr,  # TMA_TILES: page ids read this many at a time, or 0
):
    pid_q = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    req = find_request(cu_q_ptr, pid_q, batch, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + req)
    q_len = tl.load(cu_q_ptr + req + 1) - q_start
    q_block = pid_q - (q_start // BLOCK_Q + req)
    if q_block * BLOCK_Q >= q_len:
        return  # the grid is an upper bound: this block lies past the request's queries
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len
    if (skip_fresh_from > 0) & (ctx_len == 0) & (q_len >= skip_fresh_from):
        return  # `fresh_prefill` computes this request (the same rule on the host)

    offs_m = tl.arange(0, BLOCK_M)
    q_local = q_block * BLOCK_Q + offs_m // GQA
    head = kv_head * GQA + offs_m % GQA
    # Rows past BLOCK_Q * GQA exist only when GQA is not a power of 2: padding, never stored.
    row_ok = (offs_m < BLOCK_Q * GQA) & (q_local < q_len)
    q_pos = ctx_len + q_local  # absolute position of each row's query token
    tok = (q_start + q_local).to(tl.int64)

    offs_dk = tl.arange(0, HEAD_K_PAD)
    dk_ok = offs_dk < HEAD_K

    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_dk[None, :],
        mask=row_ok[:, None] & dk_ok[None, :],
        other=0.0,
    )
    # Key range of the whole block: causal ends at its last query, the window starts at its
    # first query's window; tiles outside are never visited.
    pos_first = ctx_len + q_block * BLOCK_Q
    pos_last = ctx_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len) - 1
    if CAUSAL:
        k_hi = pos_last + 1
    else:
        k_hi = seq_len
    if USE_WINDOW:
        k_lo = tl.maximum(pos_first - window + 1, 0)
    else:
        k_lo = 0
    tile_lo = k_lo // TILE_N
    tile_hi = (k_hi + TILE_N - 1) // TILE_N
    if SPLIT_KV:
        per_split = (tile_hi - tile_lo + num_splits - 1) // num_splits
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)

    qk_scale = softmax_scale
    if USE_KV_SCALE:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    if DOT_MODE == 1:
        # Triton's CPU interpreter multiplies bf16 dot operands as raw bits (3.9): use fp32.
        q = q.to(tl.float32)
    elif DOT_MODE == 2:
        # fp8 cache: dot in fp16, since e4m3/e5m2 -> fp16 is one native convert per pair
        # (-> bf16 is not). A bf16 query may overflow fp16, so scale it by a power of two
        # taking max|q| to 2**14 (exact, undone in qk_scale); fp16 keeps 3 more mantissa bits.
        qf = q.to(tl.float32)
        amax = tl.max(tl.max(tl.abs(qf), 1), 0)
        q_mul = tl.exp2(14.0 - tl.where(amax > 0.0, tl.ceil(tl.log2(amax)), 0.0))
        q = (qf * q_mul).to(tl.float16)
        qk_scale = qk_scale / q_mul
    if not USE_SOFTCAP:
        qk_scale = qk_scale * 1.4426950408889634  # work in log2 units: exp2 is the fast path

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    v_head = v_ptr + kv_head * stride_vh
    if V_PAIRS == 0:
        offs_v = tl.arange(0, HEAD_V_PAD)
        v_ok = offs_v < HEAD_V
        stride_v_blk = stride_vb
        stride_v_slot = stride_vs
        acc = tl.zeros([BLOCK_M, HEAD_V_PAD], dtype=tl.float32)
        acc_odd = 0.0
    else:
        offs_v = tl.arange(0, HEAD_V_PAD // 2)
        v_ok = offs_v < HEAD_V // 2
        v_head = v_head.to(tl.pointer_type(tl.uint16), bitcast=True)
        stride_v_blk = stride_vb // 2
        stride_v_slot = stride_vs // 2
        acc = tl.zeros([BLOCK_M, HEAD_V_PAD // 2], dtype=tl.float32)
        acc_odd = tl.zeros([BLOCK_M, HEAD_V_PAD // 2], dtype=tl.float32)

    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt
    k_head = k_ptr + kv_head * stride_kh
    # TMA_TILES: rows of slots per page, and where this KV head sits among them: rows of its
    # own (vLLM's ...HNC layouts) or columns of each slot's row (...NHC). K and V views share
    # their strides there (`_tma_page_size`).
    page_rows = stride_kb // stride_ks
    if stride_kh % stride_ks == 0:
        head_row = kv_head * (stride_kh // stride_ks)
        head_col = 0
    else:
        head_row = 0
        head_col = kv_head * stride_kh
    if UNMASKED_INTERIOR:
        # Tiles every row of the block sees whole (past the window start of its last query,
        # up to the first query's own position) run without masks, in order between the
        # masked edges: [tile_lo, full_lo) masked, [full_lo, full_hi) not, [full_hi, tile_hi).
        if CAUSAL:
            full_hi = (pos_first + 1) // TILE_N
        else:
            full_hi = k_hi // TILE_N
        full_lo = tile_lo
        if USE_WINDOW:
            full_lo = (tl.maximum(pos_last - window + 1, 0) + TILE_N - 1) // TILE_N
        full_lo = tl.minimum(tl.maximum(full_lo, tile_lo), tile_hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), tile_hi)
    else:
        full_lo = tile_hi
        full_hi = tile_hi
    acc, acc_odd, l_i, m_i = attend_tiles(
        acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, tile_lo, full_lo, k_hi, row_ok,
        q_pos, bt_row, k_head, v_head, stride_kb, stride_ks, stride_v_blk, stride_v_slot,
        offs_dk, offs_v, dk_ok, v_ok, k_desc, v_desc, page_rows, head_row, head_col,
        BLOCK_SIZE, TILE_N, CAUSAL, USE_WINDOW, USE_SOFTCAP, True, PREFETCH_PAGES, V_PAIRS,
        TMA_TILES, TMA_PAGE_BATCH,
    )  # fmt: skip
    if UNMASKED_INTERIOR:
        acc, acc_odd, l_i, m_i = attend_tiles(
            acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, full_lo, full_hi, k_hi, row_ok,
            q_pos, bt_row, k_head, v_head, stride_kb, stride_ks, stride_v_blk, stride_v_slot,
            offs_dk, offs_v, dk_ok, v_ok, k_desc, v_desc, page_rows, head_row, head_col,
            BLOCK_SIZE, TILE_N, CAUSAL, USE_WINDOW, USE_SOFTCAP, False, PREFETCH_PAGES, V_PAIRS,
            TMA_TILES, TMA_PAGE_BATCH,
        )  # fmt: skip
        acc, acc_odd, l_i, m_i = attend_tiles(
            acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, full_hi, tile_hi, k_hi, row_ok,
            q_pos, bt_row, k_head, v_head, stride_kb, stride_ks, stride_v_blk, stride_v_slot,
            offs_dk, offs_v, dk_ok, v_ok, k_desc, v_desc, page_rows, head_row, head_col,
            BLOCK_SIZE, TILE_N, CAUSAL, USE_WINDOW, USE_SOFTCAP, True, PREFETCH_PAGES, V_PAIRS,
            TMA_TILES, TMA_PAGE_BATCH,
        )  # fmt: skip

    if V_PAIRS != 0:
        acc = tl.interleave(acc, acc_odd)
    offs_dv = tl.arange(0, HEAD_V_PAD)
    dv_ok = offs_dv < HEAD_V
    if USE_KV_SCALE:
        acc = acc * tl.load(v_scale_ptr)

    if not SPLIT_KV:
        _store_rows(
            acc, l_i, m_i, out_ptr, lse_ptr, sink_ptr, tok, head, row_ok, offs_dv, dv_ok,
            stride_ot, stride_oh, stride_lt, stride_lh, USE_SINKS, WRITE_LSE,
        )  # fmt: skip
    else:
        # Partial: normalised output and log2-sum-exp of this segment (empty: 0 and -inf).
        l_div = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_div[:, None]
        part_lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_div))
        part_rows = tok * stride_pt + head * stride_ph
        lse_rows = tok * stride_plt + head * stride_plh
        tl.store(
            part_o_ptr + part_rows[:, None] + split * stride_ps + offs_dv[None, :],
            o,
            mask=row_ok[:, None] & dv_ok[None, :],
        )
        tl.store(part_lse_ptr + lse_rows + split, part_lse, mask=row_ok)
        if MERGE_IN_KERNEL:
            # Count the finished splits of this (query block, KV head); the last one merges.
            # The barrier puts every thread's partial stores before the (release) count.
            tl.debug_barrier()
            count_ptr = split_count_ptr + pid_q * tl.num_programs(1) + kv_head
            finished = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            if finished == num_splits - 1:
                tl.store(count_ptr, 0)  # zero again for the next launch
                acc, l_i, m_i = _merge_splits(
                    num_splits, part_o_ptr, part_lse_ptr, part_rows, lse_rows, stride_ps, row_ok,
                    offs_dv, dv_ok,
                )  # fmt: skip
                _store_rows(
                    acc, l_i, m_i, out_ptr, lse_ptr, sink_ptr, tok, head, row_ok, offs_dv,
                    dv_ok, stride_ot, stride_oh, stride_lt, stride_lh, USE_SINKS, WRITE_LSE,
                )  # fmt: skip


@triton.jit
def _store_rows(
    acc,
    l_i,
    m_i,
    out_ptr,
    lse_ptr,
    sink_ptr,
    tok,
    head,
    row_ok,
    offs_dv,
    dv_ok,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    USE_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """Store rows of output (acc / l_i) and their log-sum-exp, the sink joined here.

    `acc` and `l_i` are sums of value rows and of weights, both relative to the log2 max `m_i`
    (-inf for a row that saw nothing).
    """
    if USE_SINKS:
        # The sink is one more logit in the denominator with a zero value vector.
        sink = tl.load(sink_ptr + head, mask=row_ok, other=float("-inf")) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.exp2(sink - m_safe)
        acc = acc * alpha[:, None]
        m_i = m_new
    l_div = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_div[:, None]
    tl.store(
        out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_dv[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dv_ok[None, :],
    )
    if WRITE_LSE:
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_div)) * 0.6931471805599453)
        tl.store(lse_ptr + tok * stride_lt + head * stride_lh, lse, mask=row_ok)


@triton.jit
def _merge_splits(
    num_splits,
    part_o_ptr,
    part_lse_ptr,
    part_rows,
    lse_rows,
    stride_ps,
    row_ok,
    offs_dv,
    dv_ok,
):
    """Every split's partial of these rows, merged in split order from the scratch.

    Returns (acc, l, m) as `_store_rows` takes them: partials weighted by exp2(lse - m). The
    order does not depend on which split merges, so the output is the same bits run to run.
    The loads bypass L1 (.cg): other programs wrote the partials, possibly on other SMs.
    """
    m_i = tl.full(lse_rows.shape, float("-inf"), tl.float32)
    l_i = tl.zeros(lse_rows.shape, tl.float32)
    acc = tl.zeros([lse_rows.shape[0], offs_dv.shape[0]], tl.float32)
    for s in tl.range(0, num_splits, num_stages=1):
        lse_s = tl.load(
            part_lse_ptr + lse_rows + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg"
        )
        o_s = tl.load(
            part_o_ptr + part_rows[:, None] + s * stride_ps + offs_dv[None, :],
            mask=row_ok[:, None] & dv_ok[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        m_new = tl.maximum(m_i, lse_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        beta = tl.exp2(lse_s - m_safe)
        acc = acc * alpha[:, None] + o_s * beta[:, None]
        l_i = l_i * alpha + beta
        m_i = m_new
    return acc, l_i, m_i
