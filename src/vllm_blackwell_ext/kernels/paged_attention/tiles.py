"""Tile loops of the paged-attention kernel: the online softmax over a range of key tiles,
gathered through the block table or read by TMA (jit code only)."""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.fp8_pairs import widen_fp8_pairs


@triton.jit
def tile_probs(
    s,
    m_i,
    l_i,
    key_pos,
    key_ok,
    row_ok,
    q_pos,
    softcap,
    window,
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One key tile's online-softmax step on its scores `s`: (p, alpha, l_i, m_new)."""
    if USE_SOFTCAP:
        # softcap * tanh(s / softcap), tanh from exp for portability (interpreter, Triton 3.6)
        y = s / softcap
        e = tl.exp(-2.0 * tl.abs(y))
        t = (1.0 - e) / (1.0 + e)
        s = softcap * tl.where(y < 0, -t, t) * 1.4426950408889634
    if MASKED:
        visible = row_ok[:, None] & key_ok[None, :]
        if CAUSAL:
            visible = visible & (key_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (key_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with nothing visible yet keeps -inf; subtracting 0 gives exp2(-inf) = 0.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def _tile_accumulate(acc, acc_odd, p, alpha, v, q, V_PAIRS: tl.constexpr):
    """acc (and acc_odd) rescaled by alpha plus p @ v; (acc, acc_odd)."""
    if V_PAIRS == 0:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None])
    else:
        pd = p.to(tl.float16)
        acc = tl.dot(pd, widen_fp8_pairs(v, 0, V_PAIRS), acc * alpha[:, None])
        acc_odd = tl.dot(pd, widen_fp8_pairs(v, 1, V_PAIRS), acc_odd * alpha[:, None])
    return acc, acc_odd


@triton.jit
def attend_tiles(
    acc,
    acc_odd,
    l_i,
    m_i,
    q,
    qk_scale,
    softcap,
    window,
    tile_lo,
    tile_hi,
    k_hi,
    row_ok,
    q_pos,
    bt_row,
    k_head,
    v_head,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    offs_dk,
    offs_dv,
    dk_ok,
    dv_ok,
    k_desc,
    v_desc,
    page_rows,
    head_row,
    head_col,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of these tiles is visible to every valid row
    PREFETCH_PAGES: tl.constexpr,
    V_PAIRS: tl.constexpr,
    TMA_TILES: tl.constexpr,
    TMA_PAGE_BATCH: tl.constexpr,
):
    """Online softmax over key tiles [tile_lo, tile_hi); returns (acc, acc_odd, l_i, m_i).

    With V_PAIRS (an fp8 cache, `fp8_pairs`), `v_head`, its strides and `offs_dv`/`dv_ok`
    address uint16 pairs of value columns, and `acc`/`acc_odd` hold the even/odd columns;
    otherwise `acc` holds them all and `acc_odd` is passed through.

    Unmasked tiles skip the key bounds, the causal/window masks and the empty-row guard:
    there every valid row sees every key, so its running max is finite after the first tile
    (padding rows hold a zero query and are never stored).

    With TMA_TILES, a tile is TILE_N slots of one page, read with one TMA copy each of K and V
    through `k_desc` / `v_desc` (the cache as 2D rows of slots: page p, this KV head, slot s at
    row p * page_rows + head_row + s, column head_col). Slots past the request's keys are read
    too and weighted by P = 0, so they must be finite: vLLM allocates the cache zeroed and
    writes finite K/V. TMA_PAGE_BATCH > 0 reads the page ids of that many pages in one vector
    load ahead of an inner loop over their tiles (`_attend_tma_page_batches`).
    """
    if TMA_TILES and TMA_PAGE_BATCH > 0:
        acc, acc_odd, l_i, m_i = _attend_tma_page_batches(
            acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, tile_lo, tile_hi, k_hi, row_ok,
            q_pos, bt_row, k_desc, v_desc, page_rows, head_row, head_col, BLOCK_SIZE, TILE_N,
            CAUSAL, USE_WINDOW, USE_SOFTCAP, MASKED, V_PAIRS, TMA_PAGE_BATCH,
        )  # fmt: skip
    else:
        offs_t = tl.arange(0, TILE_N)
        # PREFETCH_PAGES: each tile's pages are read from the block table one iteration ahead, so
        # its K/V loads depend on a loop-carried value, not on a load of the same iteration.
        next_pos = tile_lo * TILE_N + offs_t
        next_page = tl.zeros([TILE_N], tl.int32)
        if PREFETCH_PAGES:
            next_page = tl.load(bt_row + next_pos // BLOCK_SIZE, mask=next_pos < k_hi, other=0)
        for j in range(tile_lo, tile_hi):
            key_pos = j * TILE_N + offs_t
            key_ok = key_pos < k_hi
            if MASKED:
                kv_ok = key_ok[:, None]
            else:
                kv_ok = tl.full([TILE_N, 1], True, tl.int1)
            if TMA_TILES:
                start = j * TILE_N
                tile_row = tl.load(bt_row + start // BLOCK_SIZE) * page_rows + head_row
                tile_row += start % BLOCK_SIZE
                k = k_desc.load([tile_row, head_col])
            else:
                if PREFETCH_PAGES:
                    page = next_page.to(tl.int64)
                    next_pos = key_pos + TILE_N
                    next_page = tl.load(
                        bt_row + next_pos // BLOCK_SIZE, mask=next_pos < k_hi, other=0
                    )
                elif MASKED:
                    page = tl.load(bt_row + key_pos // BLOCK_SIZE, mask=key_ok, other=0).to(
                        tl.int64
                    )
                else:
                    page = tl.load(bt_row + key_pos // BLOCK_SIZE).to(tl.int64)
                slot = key_pos % BLOCK_SIZE
                k = tl.load(
                    k_head
                    + page[:, None] * stride_kb
                    + slot[:, None] * stride_ks
                    + offs_dk[None, :],
                    mask=kv_ok & dk_ok[None, :],
                    other=0.0,
                )
            s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
            p, alpha, l_i, m_new = tile_probs(
                s, m_i, l_i, key_pos, key_ok, row_ok, q_pos, softcap, window, CAUSAL, USE_WINDOW,
                USE_SOFTCAP, MASKED,
            )  # fmt: skip
            if TMA_TILES:
                v = v_desc.load([tile_row, head_col])
            else:
                v = tl.load(
                    v_head
                    + page[:, None] * stride_vb
                    + slot[:, None] * stride_vs
                    + offs_dv[None, :],
                    mask=kv_ok & dv_ok[None, :],
                    other=0.0,
                )
            acc, acc_odd = _tile_accumulate(acc, acc_odd, p, alpha, v, q, V_PAIRS)
            m_i = m_new
    return acc, acc_odd, l_i, m_i


@triton.jit
def _attend_tma_page_batches(
    acc,
    acc_odd,
    l_i,
    m_i,
    q,
    qk_scale,
    softcap,
    window,
    tile_lo,
    tile_hi,
    k_hi,
    row_ok,
    q_pos,
    bt_row,
    k_desc,
    v_desc,
    page_rows,
    head_row,
    head_col,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MASKED: tl.constexpr,
    V_PAIRS: tl.constexpr,
    PAGE_BATCH: tl.constexpr,
):
    """`attend_tiles` over TMA tiles, the page ids of PAGE_BATCH pages read in one vector load
    ahead of an inner loop over their tiles. A block-table read in each tile's own iteration
    keeps Triton's pipeliner a K/V stage short (seen in offline sm90 compiles); here no
    tile's copy waits on one. The pipeline drains
    once per batch."""
    TILES_PER_PAGE: tl.constexpr = BLOCK_SIZE // TILE_N
    offs_t = tl.arange(0, TILE_N)
    offs_pb = tl.arange(0, PAGE_BATCH)
    num_pages = (k_hi + BLOCK_SIZE - 1) // BLOCK_SIZE  # the pages holding keys below k_hi
    page_lo = tile_lo // TILES_PER_PAGE
    page_hi = (tile_hi + TILES_PER_PAGE - 1) // TILES_PER_PAGE
    for p0 in range(page_lo, page_hi, PAGE_BATCH):
        pages = tl.load(bt_row + p0 + offs_pb, mask=p0 + offs_pb < num_pages, other=0)
        j_lo = tl.maximum(p0 * TILES_PER_PAGE, tile_lo)
        j_hi = tl.minimum((p0 + PAGE_BATCH) * TILES_PER_PAGE, tile_hi)
        for j in range(j_lo, j_hi):
            start = j * TILE_N
            key_pos = start + offs_t
            page = tl.sum(tl.where(offs_pb == j // TILES_PER_PAGE - p0, pages, 0))
            tile_row = page * page_rows + head_row + start % BLOCK_SIZE
            k = k_desc.load([tile_row, head_col])
            s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
            p, alpha, l_i, m_new = tile_probs(
                s, m_i, l_i, key_pos, key_pos < k_hi, row_ok, q_pos, softcap, window, CAUSAL,
                USE_WINDOW, USE_SOFTCAP, MASKED,
            )  # fmt: skip
            v = v_desc.load([tile_row, head_col])
            acc, acc_odd = _tile_accumulate(acc, acc_odd, p, alpha, v, q, V_PAIRS)
            m_i = m_new
    return acc, acc_odd, l_i, m_i
