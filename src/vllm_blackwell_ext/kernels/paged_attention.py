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
tile with one TMA copy from the cache viewed as 2D rows of slots (`_tma_grid`) instead of a
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

import functools
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .checks import check_index, fail
from .device import DeviceInfo, device_info
from .fp8_pairs import pair_mode, widen_fp8_pairs
from .host_ints import next_power_of_2
from .launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from .paged_attention_configs import (
    MAX_SPLITS,
    SPLIT_KV_MAX_QUERY_LEN,
    AttnConfig,
    plan_split_kv,
    select_config,
    split_kv_max_rows,
    split_kv_max_tokens,
)

__all__ = [
    "AttnConfig",
    "PagedCacheLayout",
    "SUPPORTED_HEAD_SIZES",
    "SUPPORTED_KV_DTYPES",
    "SUPPORTED_Q_DTYPES",
    "SplitKVWorkspace",
    "launch_config",
    "paged_attention",
    "paged_cache_layout",
    "plan_split_kv",
    "split_kv_max_tokens",
]

SUPPORTED_HEAD_SIZES: tuple[int, ...] = (64, 80, 96, 128, 192, 256)
SUPPORTED_Q_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
SUPPORTED_KV_DTYPES: tuple[torch.dtype, ...] = (
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
# Heads whose K/V tiles TMA can read whole (a tile's row is one head, a power of 2 wide).
TMA_HEAD_SIZES: tuple[int, ...] = (64, 128)


@triton.jit
def _find_request(cu_q_ptr, q_block_idx, batch, BLOCK_Q: tl.constexpr):
    """Request owning global query block `q_block_idx` (binary search over cu_seqlens_q).

    Request b's blocks start at cu_q[b] // BLOCK_Q + b: an upper bound on the blocks of all
    earlier requests that needs no host knowledge of individual query lengths.
    """
    lo: tl.int32 = 0
    hi = batch
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _tile_probs(
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
def _attend_tiles(
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
            p, alpha, l_i, m_new = _tile_probs(
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
    """`_attend_tiles` over TMA tiles, the page ids of PAGE_BATCH pages read in one vector load
    ahead of an inner loop over their tiles. A block-table read in each tile's own iteration
    keeps Triton's pipeliner a stage short (offline sm90 compile, Triton 3.7.1: two K/V
    buffers that way, three batched); here no tile's copy waits on one. The pipeline drains
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
            p, alpha, l_i, m_new = _tile_probs(
                s, m_i, l_i, key_pos, key_pos < k_hi, row_ok, q_pos, softcap, window, CAUSAL,
                USE_WINDOW, USE_SOFTCAP, MASKED,
            )  # fmt: skip
            v = v_desc.load([tile_row, head_col])
            acc, acc_odd = _tile_accumulate(acc, acc_odd, p, alpha, v, q, V_PAIRS)
            m_i = m_new
    return acc, acc_odd, l_i, m_i


# Ints that change from batch to batch (request count, split count and the partial-LSE strides
# that follow it) are runtime values, not specialised on: eager mixed batches in vLLM bring any
# of them at any time, and each new specialisation would compile (about a second on an H200)
# in the middle of serving. The block-table row stride (pages per request, from the engine's
# max_model_len) is read once per program: not specialised either, so a JIT warm-up on scratch
# compiles exactly the variant the engine launches.
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

    req = _find_request(cu_q_ptr, pid_q, batch, BLOCK_Q)
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
    acc, acc_odd, l_i, m_i = _attend_tiles(
        acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, tile_lo, full_lo, k_hi, row_ok,
        q_pos, bt_row, k_head, v_head, stride_kb, stride_ks, stride_v_blk, stride_v_slot,
        offs_dk, offs_v, dk_ok, v_ok, k_desc, v_desc, page_rows, head_row, head_col,
        BLOCK_SIZE, TILE_N, CAUSAL, USE_WINDOW, USE_SOFTCAP, True, PREFETCH_PAGES, V_PAIRS,
        TMA_TILES, TMA_PAGE_BATCH,
    )  # fmt: skip
    if UNMASKED_INTERIOR:
        acc, acc_odd, l_i, m_i = _attend_tiles(
            acc, acc_odd, l_i, m_i, q, qk_scale, softcap, window, full_lo, full_hi, k_hi, row_ok,
            q_pos, bt_row, k_head, v_head, stride_kb, stride_ks, stride_v_blk, stride_v_slot,
            offs_dk, offs_v, dk_ok, v_ok, k_desc, v_desc, page_rows, head_row, head_col,
            BLOCK_SIZE, TILE_N, CAUSAL, USE_WINDOW, USE_SOFTCAP, False, PREFETCH_PAGES, V_PAIRS,
            TMA_TILES, TMA_PAGE_BATCH,
        )  # fmt: skip
        acc, acc_odd, l_i, m_i = _attend_tiles(
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


@triton.jit(do_not_specialize=["batch", "num_splits", "stride_plt", "stride_plh"])
def _split_kv_merge_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    lse_ptr,
    sink_ptr,
    cu_q_ptr,
    batch,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_plt,
    stride_plh,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    num_splits,
    HEAD_V: tl.constexpr,
    HEAD_V_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # MAX_SPLITS rounded up: one specialisation for every split count
    USE_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if tok >= tl.load(cu_q_ptr + batch):
        return  # padding rows of the token axis: never written
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_V_PAD)
    s_ok = offs_s < num_splits
    d_ok = offs_d < HEAD_V
    lse_s = tl.load(
        part_lse_ptr + tok * stride_plt + head * stride_plh + offs_s,
        mask=s_ok,
        other=float("-inf"),
    )
    m = tl.max(lse_s, 0)
    if USE_SINKS:
        # The sink joins the denominator once, here, never in the per-split partials.
        sink = tl.load(sink_ptr + head) * 1.4426950408889634
        m = tl.maximum(m, sink)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse_s - m_safe)
        denom = tl.sum(w, 0) + tl.exp2(sink - m_safe)
    else:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse_s - m_safe)
        denom = tl.sum(w, 0)
    o = tl.load(
        part_o_ptr
        + tok * stride_pt
        + head * stride_ph
        + offs_s[:, None] * stride_ps
        + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    denom_div = tl.where(denom == 0.0, 1.0, denom)
    res = tl.sum(o * w[:, None], 0) / denom_div
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d,
        res.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )
    if WRITE_LSE:
        lse = tl.where(
            denom == 0.0, float("-inf"), (m_safe + tl.log2(denom_div)) * 0.6931471805599453
        )
        tl.store(lse_ptr + tok * stride_lt + head * stride_lh, lse)


_ATTN_LAUNCHER = CachedLauncher(_paged_attn_kernel)
_MERGE_LAUNCHER = CachedLauncher(_split_kv_merge_kernel)


@dataclass
class SplitKVWorkspace:
    """Caller-owned scratch of the split-KV path, allocated once (CUDA-graph safe).

    `partial_out` holds rows of (query token x split) partial outputs, [max_rows, H, Dv];
    `partial_lse` their log2-sum-exps, [max_rows, H]. A launch with T tokens and S splits uses
    the first T * S rows, addressed as contiguous [T, H, S, ...]; `paged_attention` lowers S
    to what fits. `split_counts` (int32, zero between launches) counts the finished splits of
    each (query block, KV head) of a launch that merges in the kernel.
    """

    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    split_counts: torch.Tensor
    max_num_tokens: int
    max_splits: int

    @property
    def max_rows(self) -> int:
        return self.partial_out.shape[0]

    @property
    def num_q_heads(self) -> int:
        return self.partial_out.shape[1]

    @property
    def head_size_v(self) -> int:
        return self.partial_out.shape[2]

    @classmethod
    def allocate(
        cls,
        max_num_tokens: int,
        num_q_heads: int,
        head_size_v: int,
        max_splits: int = MAX_SPLITS,
        device: torch.device | str | None = None,
        *,
        max_rows: int | None = None,
    ) -> SplitKVWorkspace:
        """Allocate scratch for up to `max_num_tokens` tokens x `max_splits` splits.

        `max_rows` caps tokens x splits (many splits only ever come with few tokens);
        default `max_num_tokens * max_splits`.
        """
        for name, val in (
            ("max_num_tokens", max_num_tokens),
            ("num_q_heads", num_q_heads),
            ("head_size_v", head_size_v),
            ("max_splits", max_splits),
        ):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}: expected a positive int, got {val!r}")
        rows = max_num_tokens * max_splits if max_rows is None else int(max_rows)
        if rows < 1:
            raise ValueError(f"max_rows: expected a positive int, got {max_rows!r}")
        return cls(
            partial_out=torch.empty(
                (rows, num_q_heads, head_size_v), dtype=torch.float32, device=device
            ),
            partial_lse=torch.empty((rows, num_q_heads), dtype=torch.float32, device=device),
            # One count per (query block, KV head): a launch of T tokens has at most 2T query
            # blocks (T // BLOCK_Q + requests), and at most as many KV heads as query heads.
            split_counts=torch.zeros(
                2 * max_num_tokens * num_q_heads, dtype=torch.int32, device=device
            ),
            max_num_tokens=max_num_tokens,
            max_splits=max_splits,
        )

    @classmethod
    def for_device(
        cls,
        num_q_heads: int,
        num_kv_heads: int,
        head_size_v: int,
        device: torch.device | str | None = None,
        info: DeviceInfo | None = None,
    ) -> SplitKVWorkspace:
        """Scratch for every launch `plan_split_kv` may split on this device (a few MiB)."""
        info = info if info is not None else device_info(device)
        return cls.allocate(
            split_kv_max_tokens(num_kv_heads, info),
            num_q_heads,
            head_size_v,
            MAX_SPLITS,
            device,
            max_rows=max(1, split_kv_max_rows(num_kv_heads, info)),
        )


def _check_cache(name: str, c: torch.Tensor, q: torch.Tensor) -> None:
    if c.dim() != 4:
        fail(
            ValueError,
            name,
            "[num_blocks, block_size, num_kv_heads, head_size]",
            f"shape {tuple(c.shape)}",
        )
    if c.dtype == torch.uint8:
        fail(
            TypeError,
            name,
            f"the fp8 dtype a uint8 cache holds (view it first, e.g. "
            f"{name}.view(torch.float8_e4m3fn))",
            "a uint8 cache",
        )
    if c.dtype not in SUPPORTED_KV_DTYPES:
        fail(TypeError, name, f"dtype in {SUPPORTED_KV_DTYPES}", c.dtype)
    if c.stride(3) != 1:
        fail(ValueError, name, "a contiguous head dim", f"strides {c.stride()}")
    if c.device != q.device:
        fail(ValueError, name, f"device {q.device}", c.device)


def _check_workspace(
    workspace: SplitKVWorkspace, q: torch.Tensor, num_q_heads: int, head_size_v: int
) -> None:
    if workspace.num_q_heads != num_q_heads or workspace.head_size_v != head_size_v:
        fail(
            ValueError,
            "workspace",
            f"[*, {num_q_heads}, {head_size_v}] scratch",
            f"[*, {workspace.num_q_heads}, {workspace.head_size_v}]",
        )
    if workspace.partial_out.device != q.device:
        fail(ValueError, "workspace", f"device {q.device}", workspace.partial_out.device)


def _check_head_size(name: str, hs: int) -> None:
    if hs not in SUPPORTED_HEAD_SIZES:
        fail(ValueError, name, f"head size in {SUPPORTED_HEAD_SIZES}", f"head size {hs}")


def _check_scale(name: str, sc: torch.Tensor | None, q: torch.Tensor) -> None:
    if sc is None:
        return
    if sc.dtype != torch.float32 or sc.numel() < 1:
        fail(ValueError, name, "a 1-element fp32 tensor", f"{sc.dtype} {tuple(sc.shape)}")
    if sc.device != q.device:
        fail(ValueError, name, f"device {q.device}", sc.device)


def _validate(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
    softcap: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    lse_out: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Shape/dtype/device checks on metadata only (never reads device memory)."""
    if q.dim() != 3:
        fail(ValueError, "q", "[num_tokens, num_q_heads, head_size]", f"shape {tuple(q.shape)}")
    if q.dtype not in SUPPORTED_Q_DTYPES:
        fail(TypeError, "q", "dtype bf16 or fp16", q.dtype)
    if q.stride(2) != 1:
        fail(ValueError, "q", "a contiguous last dim", f"strides {q.stride()}")
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_cache(name, c, q)
    if value_cache.dtype != key_cache.dtype:
        fail(TypeError, "value_cache", f"the key_cache dtype {key_cache.dtype}", value_cache.dtype)
    if value_cache.element_size() == 1 and (
        value_cache.stride(0) % 2 or value_cache.stride(1) % 2 or value_cache.data_ptr() % 2
    ):
        # fp8 value tiles are read as 16-bit pairs of columns (`fp8_pairs`).
        fail(
            ValueError,
            "value_cache",
            "an fp8 cache with even block and slot strides at an even address",
            f"strides {value_cache.stride()}",
        )
    if tuple(value_cache.shape[:3]) != tuple(key_cache.shape[:3]):
        fail(
            ValueError,
            "value_cache",
            f"leading dims {tuple(key_cache.shape[:3])} like key_cache",
            tuple(value_cache.shape[:3]),
        )
    num_tokens, num_q_heads, head_size = q.shape
    _, block_size, num_kv_heads, head_size_k = key_cache.shape
    head_size_v = value_cache.shape[3]
    if head_size_k != head_size:
        fail(ValueError, "key_cache", f"head_size {head_size} (from q)", head_size_k)
    for name, hs in (("q", head_size), ("value_cache", head_size_v)):
        _check_head_size(name, hs)
    if block_size % 16 != 0 or block_size <= 0:
        fail(ValueError, "key_cache", "a block_size multiple of 16", block_size)
    if num_kv_heads <= 0 or num_q_heads % num_kv_heads != 0:
        fail(ValueError, "q", f"num_q_heads a multiple of num_kv_heads={num_kv_heads}", num_q_heads)
    if tuple(out.shape) != (num_tokens, num_q_heads, head_size_v):
        fail(
            ValueError,
            "out",
            f"shape {(num_tokens, num_q_heads, head_size_v)}",
            tuple(out.shape),
        )
    if out.dtype != q.dtype:
        fail(TypeError, "out", f"dtype {q.dtype} like q", out.dtype)
    if out.stride(2) != 1:
        fail(ValueError, "out", "a contiguous last dim", f"strides {out.stride()}")
    if out.device != q.device:
        fail(ValueError, "out", f"device {q.device}", out.device)
    for name, t, nd in (
        ("cu_seqlens_q", cu_seqlens_q, 1),
        ("seq_lens", seq_lens, 1),
        ("block_table", block_table, 2),
    ):
        check_index(name, t, nd, q.device, "q")
    batch = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != batch + 1:
        fail(
            ValueError,
            "cu_seqlens_q",
            f"batch + 1 = {batch + 1} entries (seq_lens has {batch})",
            cu_seqlens_q.shape[0],
        )
    if block_table.shape[0] < batch:  # its rows' unit stride: check_index above
        fail(
            ValueError,
            "block_table",
            f"[batch >= {batch}, max_blocks]",
            f"shape {tuple(block_table.shape)}",
        )
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        fail(ValueError, "max_seqlen_q", "a non-negative int", repr(max_seqlen_q))
    if not isinstance(max_seqlen_k, int) or max_seqlen_k < 0:
        fail(ValueError, "max_seqlen_k", "a non-negative int", repr(max_seqlen_k))
    if sliding_window is not None and not (isinstance(sliding_window, int) and sliding_window > 0):
        fail(ValueError, "sliding_window", "None or a positive int", repr(sliding_window))
    if not softcap >= 0.0:
        fail(ValueError, "softcap", ">= 0 (0 = off)", softcap)
    if sinks is not None:
        if sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_q_heads,):
            fail(
                ValueError, "sinks", f"fp32 [{num_q_heads}]", f"{sinks.dtype} {tuple(sinks.shape)}"
            )
        if sinks.device != q.device:
            fail(ValueError, "sinks", f"device {q.device}", sinks.device)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        _check_scale(name, sc, q)
    if (k_scale is None) != (v_scale is None):
        fail(
            ValueError,
            "k_scale/v_scale",
            "both or neither",
            f"k_scale={'set' if k_scale is not None else None}, "
            f"v_scale={'set' if v_scale is not None else None}",
        )
    if lse_out is not None:
        if lse_out.dtype != torch.float32 or tuple(lse_out.shape) != (num_tokens, num_q_heads):
            fail(
                ValueError,
                "lse_out",
                f"fp32 [{num_tokens}, {num_q_heads}]",
                f"{lse_out.dtype} {tuple(lse_out.shape)}",
            )
        if lse_out.device != q.device:
            fail(ValueError, "lse_out", f"device {q.device}", lse_out.device)


def _tma_page_size(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int | None:
    """The cache's page size where TMA can read its tiles (`AttnConfig.tma_tiles`), else None.

    TMA reads a tile as a block of a 2D view whose rows are the cache's slots (`_tma_grid`): a
    2-byte cache with heads in TMA_HEAD_SIZES, K and V views of the same strides (every vLLM
    layout), a page stride that is a multiple of the slot stride, each KV head either rows of
    its own or columns of each slot's row, 16-byte aligned slots and start addresses, and fewer
    than 2**31 rows (TMA coordinates are int32).
    """
    if key_cache.element_size() != 2 or key_cache.shape[3] not in TMA_HEAD_SIZES:
        return None
    if value_cache.stride() != key_cache.stride() or value_cache.shape != key_cache.shape:
        return None
    grid = _tma_grid(key_cache)
    if grid is None or grid[0] >= 2**31:
        return None
    if (key_cache.stride(1) * 2) % 16 or key_cache.data_ptr() % 16 or value_cache.data_ptr() % 16:
        return None
    return key_cache.shape[1]


def _tma_grid(cache: torch.Tensor) -> tuple[int, int] | None:
    """(rows, columns) of the 2D slot view TMA reads a cache through, None if it has none.

    Row pitch is the slot stride. A page is `stride_page / stride_slot` rows; a KV head is
    `stride_head / stride_slot` rows where its stride is a multiple of the slot stride (vLLM's
    ...HNC layouts), else `stride_head` columns within each slot's row (...NHC); the kernel
    finds the same split (`_paged_attn_kernel`).
    """
    num_blocks, block_size, num_kv_heads, head = cache.shape
    stride_page, stride_slot, stride_head, _ = cache.stride()
    if stride_slot <= 0 or stride_head <= 0 or stride_page % stride_slot:
        return None
    page_rows = stride_page // stride_slot
    if stride_head % stride_slot == 0:
        head_rows, columns = stride_head // stride_slot, head
    elif (num_kv_heads - 1) * stride_head + head <= stride_slot:
        head_rows, columns = 0, (num_kv_heads - 1) * stride_head + head
    else:
        return None
    return (num_blocks - 1) * page_rows + (num_kv_heads - 1) * head_rows + block_size, columns


def _tma_descriptors(
    key_cache: torch.Tensor, value_cache: torch.Tensor, tile_n: int
) -> tuple[TensorDescriptor, TensorDescriptor]:
    """K and V as 2D [rows of slots, columns] views, read [TILE_N, head] at a time."""
    grid, head, stride_slot = _tma_grid(key_cache), key_cache.shape[3], key_cache.stride(1)
    k_desc, v_desc = (
        TensorDescriptor(c, list(grid), [stride_slot, 1], [tile_n, head])
        for c in (key_cache, value_cache)
    )
    return k_desc, v_desc


@dataclass(frozen=True)
class PagedCacheLayout:
    """What launches derive from a K/V cache pair alone, made once per cache
    (`paged_cache_layout`): callers that launch over the same cache every step (an attention
    backend) pass it as `paged_attention(..., cache_layout=...)`, which then skips the layout
    checks and the TMA descriptors' construction (microseconds of host time per eager call).
    It holds the views it describes: keep it exactly as long as the cache itself."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    tma_page_size: int | None  # `_tma_page_size`
    _descriptors: dict[int, tuple[TensorDescriptor, TensorDescriptor]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def descriptors(self, tile_n: int) -> tuple[TensorDescriptor, TensorDescriptor]:
        """The K and V TMA descriptors of `tile_n`-key tiles (made on first use)."""
        descs = self._descriptors.get(tile_n)
        if descs is None:
            descs = self._descriptors[tile_n] = _tma_descriptors(
                self.key_cache, self.value_cache, tile_n
            )
        return descs


def paged_cache_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> PagedCacheLayout:
    """The `PagedCacheLayout` of a K/V cache pair (the views `paged_attention` takes)."""
    return PagedCacheLayout(key_cache, value_cache, _tma_page_size(key_cache, value_cache))


@dataclass(frozen=True)
class _KernelConstants:
    """What one launch's constexprs derive from its layout: computed once per layout."""

    config: AttnConfig
    gqa: int
    head_k_pad: int
    head_v_pad: int
    fp8_cache: bool
    query_dot_mode: int  # DOT_MODE unless an fp8 cache dots in fp16 (the config says)
    value_pairs: int  # V_PAIRS of an fp8 cache read in pairs (the config says), else 0


def _device_info(device_index: int) -> DeviceInfo:
    """`device_info` from `Tensor.get_device()` (an int: cheaper than `Tensor.device`)."""
    return device_info(device_index if device_index >= 0 else "cpu")


@functools.lru_cache(maxsize=256)
def _kernel_constants(
    device_index: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    max_seqlen_q: int,
    split_kv: bool,
    tma_page_size: int | None,
) -> _KernelConstants:
    """Config and constexprs of a launch; cached, as an eager forward pays for every lookup."""
    info = _device_info(device_index)
    kv_elem = kv_dtype.itemsize
    cfg = select_config(
        info,
        head_k_pad=next_power_of_2(head_size),
        head_v_pad=next_power_of_2(head_size_v),
        gqa=num_q_heads // num_kv_heads,
        max_seqlen_q=max_seqlen_q,
        kv_elem=kv_elem,
        q_elem=q_dtype.itemsize,
        split_kv=split_kv,
        tma_page_size=tma_page_size,
    )
    return _KernelConstants(
        cfg,
        num_q_heads // num_kv_heads,
        next_power_of_2(head_size),
        next_power_of_2(head_size_v),
        fp8_cache=kv_elem == 1,
        query_dot_mode=1 if info.device_class == "cpu" and q_dtype == torch.bfloat16 else 0,
        value_pairs=pair_mode(kv_dtype, on_gpu=info.device_class != "cpu") if kv_elem == 1 else 0,
    )


def launch_config(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    max_seqlen_q: int,
    info: DeviceInfo | None = None,
    *,
    split_kv: bool = False,
) -> AttnConfig:
    """The config `paged_attention` would launch with (for tests and the benchmark)."""
    info = info if info is not None else device_info(q.device)
    num_kv_heads = key_cache.shape[2]
    prefill = max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN
    return select_config(
        info,
        head_k_pad=next_power_of_2(key_cache.shape[3]),
        head_v_pad=next_power_of_2(value_cache.shape[3]),
        gqa=q.shape[1] // num_kv_heads,
        max_seqlen_q=max_seqlen_q,
        kv_elem=key_cache.element_size(),
        q_elem=q.element_size(),
        split_kv=split_kv,
        tma_page_size=_tma_page_size(key_cache, value_cache) if prefill else None,
    )


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: SplitKVWorkspace | None = None,
    num_splits: int | None = None,
    config: AttnConfig | None = None,
    compiled: list | None = None,
    check_inputs: bool = True,
    skip_fresh_from: int = 0,
    cache_layout: PagedCacheLayout | None = None,
) -> torch.Tensor:
    """Attention of `q` over the paged KV cache; writes `out[: cu_seqlens_q[-1]]` and returns it.

    Request b has query tokens q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] (length L_b) and KV
    length S_b = seq_lens[b] (its new tokens included, already in the cache); its query i sits
    at absolute position S_b - L_b + i. Causal: keys <= that position; non-causal: all S_b keys.
    `sliding_window` W bounds only how far back a query looks (keys >= position - W + 1).
    `sinks` adds one per-head logit to each softmax denominator (with a zero value).
    fp8 caches are dequantised as stored * k_scale / v_scale (scale 1 when both are None).
    `lse_out`, if given, gets the natural-log sum-exp of each row's (scaled, soft-capped)
    logits, the sink included. `num_splits` overrides the split-KV plan; `config` the tiles;
    `compiled`, if a list, receives the launched Triton kernels (to read registers/smem).
    `check_inputs=False` skips the shape/dtype checks (tens of microseconds of host time) for
    callers that validated the same layout once, e.g. an attention backend's forward.
    `skip_fresh_from` > 0 leaves alone every request without cached context and with at least
    that many query tokens (their rows of `out` too): `fresh_prefill` computes those.
    `cache_layout`: `paged_cache_layout(key_cache, value_cache)`, made once by a caller that
    launches over the same cache every step (host time); None derives it per call.
    With a `workspace`, nothing here allocates or reads device memory on the host.
    """
    if check_inputs:
        _validate(
            q, key_cache, value_cache, out, cu_seqlens_q, seq_lens, block_table,
            sliding_window, sinks, softcap, k_scale, v_scale, lse_out, max_seqlen_q, max_seqlen_k,
        )  # fmt: skip
    if cache_layout is not None and (
        cache_layout.key_cache is not key_cache or cache_layout.value_cache is not value_cache
    ):
        fail(
            ValueError,
            "cache_layout",
            "paged_cache_layout(key_cache, value_cache) of these very key_cache/value_cache",
            "the layout of other tensors",
        )
    num_tokens, num_q_heads, head_size = q.shape
    batch = seq_lens.shape[0]
    _, block_size, num_kv_heads, _ = key_cache.shape
    head_size_v = value_cache.shape[3]
    if num_tokens == 0 or batch == 0 or max_seqlen_q == 0:
        return out
    device_index = q.get_device()  # -1: CPU (interpreter)
    if num_splits is not None:
        splits = num_splits
    else:
        splits = plan_split_kv(
            num_tokens, max_seqlen_q, max_seqlen_k, num_kv_heads, _device_info(device_index),
            kv_elem=key_cache.element_size(),
        )  # fmt: skip
    if splits > 1 and workspace is not None:
        if check_inputs:
            _check_workspace(workspace, q, num_q_heads, head_size_v)
        splits = min(splits, workspace.max_splits, workspace.max_rows // num_tokens)
    prefill = max_seqlen_q > SPLIT_KV_MAX_QUERY_LEN
    if prefill:
        splits = 1  # prefill: its query blocks already fill the grid
    # Only prefill configs take TMA tiles: decode launches skip the cache's layout checks.
    if not (prefill or (config is not None and config.tma_tiles)):
        tma_page = None
    elif cache_layout is not None:
        tma_page = cache_layout.tma_page_size
    else:
        tma_page = _tma_page_size(key_cache, value_cache)
    consts = _kernel_constants(
        device_index, q.dtype, key_cache.dtype, num_q_heads, num_kv_heads, head_size, head_size_v,
        max_seqlen_q, splits > 1, tma_page,
    )  # fmt: skip
    cfg = consts.config if config is None else config
    batch_pages = cfg.tma_page_batch
    if batch_pages and (not cfg.tma_tiles or batch_pages & (batch_pages - 1) or batch_pages < 0):
        fail(
            ValueError,
            "config",
            "tma_page_batch 0, or a power of two with tma_tiles=True",
            f"tma_page_batch={batch_pages} with tma_tiles={cfg.tma_tiles}",
        )
    if cfg.tma_tiles:
        if tma_page is None or tma_page % cfg.tile_n:
            fail(
                ValueError,
                "config",
                f"tma_tiles=False for this cache (TMA tiles need a 2-byte cache with heads in "
                f"{TMA_HEAD_SIZES}, K and V views of the same strides, slots as 16-byte aligned "
                f"rows, and a block size that is a multiple of tile_n = {cfg.tile_n})",
                f"tma_tiles=True with a {key_cache.dtype} cache of shape "
                f"{tuple(key_cache.shape)}, strides {key_cache.stride()}",
            )
        if cache_layout is not None:
            k_desc, v_desc = cache_layout.descriptors(cfg.tile_n)
        else:
            k_desc, v_desc = _tma_descriptors(key_cache, value_cache, cfg.tile_n)
    else:
        k_desc = v_desc = None
    dot_mode = 2 if consts.fp8_cache and cfg.fp8_dot_fp16 else consts.query_dot_mode
    v_pairs = consts.value_pairs if dot_mode == 2 and cfg.fp8_value_pairs else 0
    num_q_blocks = num_tokens // cfg.block_q + batch  # upper bound; surplus blocks exit at once
    merge_in_kernel = False
    if splits > 1:
        # Partials as contiguous [tokens, heads, splits, Dv] and [tokens, heads, splits]: the
        # first rows of the caller's scratch (no allocation, no host sync, not even a view).
        if workspace is None:
            part_o = torch.empty(
                (num_tokens, num_q_heads, splits, head_size_v), dtype=torch.float32, device=q.device
            )
            part_lse = torch.empty(
                (num_tokens, num_q_heads, splits), dtype=torch.float32, device=q.device
            )
            counts = torch.zeros(num_q_blocks * num_kv_heads, dtype=torch.int32, device=q.device)
        else:
            part_o, part_lse = workspace.partial_out, workspace.partial_lse
            counts = workspace.split_counts
        po_strides = (num_q_heads * splits * head_size_v, splits * head_size_v, head_size_v)
        pl_strides = (num_q_heads * splits, splits)
        merge_in_kernel = (
            splits <= cfg.merge_in_kernel_max_splits
            and num_q_blocks * num_kv_heads <= counts.shape[0]
        )
    else:
        splits = 1
        # placeholders: without SPLIT_KV the kernel never touches them
        part_o, part_lse, counts = out, out, out
        po_strides, pl_strides = (0, 0, 0), (0, 0)

    if lse_out is not None:
        lse_t, lse_strides = lse_out, lse_out.stride()[:2]
    else:
        lse_t, lse_strides = out, (0, 0)
    dummy_f32 = sinks if sinks is not None else (k_scale if k_scale is not None else lse_t)
    ks, vs = key_cache.stride(), value_cache.stride()
    qs, os_ = q.stride(), out.stride()
    handle = _ATTN_LAUNCHER.launch(
        (num_q_blocks, num_kv_heads, splits),
        (
            q, key_cache, value_cache, out, lse_t, part_o, part_lse, counts,
            sinks if sinks is not None else dummy_f32,
            k_scale if k_scale is not None else dummy_f32,
            v_scale if v_scale is not None else dummy_f32,
            cu_seqlens_q, seq_lens, block_table, k_desc, v_desc,
            batch, float(softmax_scale), float(softcap), int(sliding_window or 0),
            qs[0], qs[1], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
            os_[0], os_[1], *lse_strides, *po_strides, *pl_strides,
            block_table.stride(0), splits, int(skip_fresh_from),
            # constexprs, in signature order: GQA .. TMA_PAGE_BATCH
            consts.gqa, head_size, head_size_v, consts.head_k_pad, consts.head_v_pad,
            block_size, cfg.block_m, cfg.block_q, cfg.tile_n,
            splits > 1, bool(causal), sliding_window is not None,
            sinks is not None, softcap > 0.0, k_scale is not None,
            lse_out is not None, dot_mode, cfg.unmasked_interior, cfg.prefetch_pages, v_pairs,
            merge_in_kernel, cfg.tma_tiles, batch_pages,
        ),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        max_registers=cfg.max_registers,
    )  # fmt: skip
    if compiled is not None:
        compiled.append(handle)
    if splits > 1 and not merge_in_kernel:
        _MERGE_LAUNCHER.launch(
            (num_tokens, num_q_heads, 1),
            (
                part_o, part_lse, out, lse_t,
                sinks if sinks is not None else dummy_f32,
                cu_seqlens_q, batch,
                *po_strides, *pl_strides, *out.stride()[:2], *lse_strides, splits,
                # constexprs: HEAD_V, HEAD_V_PAD, SPLITS_PAD, USE_SINKS, WRITE_LSE
                head_size_v, consts.head_v_pad, next_power_of_2(max(splits, MAX_SPLITS)),
                sinks is not None, lse_out is not None,
            ),
            num_warps=4 if consts.head_v_pad <= 128 else 8,
            num_stages=DEFAULT_NUM_STAGES,
        )  # fmt: skip
    return out
