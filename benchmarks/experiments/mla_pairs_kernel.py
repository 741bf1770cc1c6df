"""Experiment: the MLA decode split kernel (fp8 cache) reading each KV tile as 16-bit pairs.

Same arguments, partition and results as `kernels/mla_decode._mla_decode_split_kernel` for an
fp8 cache. There, the fp8 value tile is a tensor-core B operand whose reduction axis (keys) is
not the contiguous one, and Triton 3.6 reads it from shared memory a byte at a time (LDS.U8,
two packs and a convert per pair); and the tile is read from L2 twice (RELOAD_V). Here the tile
is read once, as 16-bit pairs of neighbouring columns (an element type ldmatrix loads in either
operand order); a pair's low and high bytes widen to the even and odd columns, so both products
run as two half-width dots (q's even and odd columns against them for QK^T; even and odd
accumulators for P @ V, interleaved again when stored).
"""

import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.mla_decode import _store_rows


@triton.jit
def _widen_bytes(pairs, SELECT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp16 of one byte of each 16-bit pair: the low bytes (SELECT 0) or the high ones (1).

    On the GPU, two pairs at a time: one byte permute gathers the chosen bytes, one convert
    widens both (e4m3x2 -> f16x2). The interpreter (no inline asm) takes the same values
    through shifts and a bitcast.
    """
    if DOT_DTYPE == tl.float16:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; .reg .b16 lo, hi;\n"
            f"prmt.b32 t, $1, 0, {0x20 + 0x11 * SELECT};\n"
            "mov.b32 {lo, hi}, t;\n"
            "cvt.rn.f16x2.e4m3x2 $0, lo; }",
            "=r,r",
            [pairs],
            dtype=tl.float16,
            is_pure=True,
            pack=2,
        )
    return (pairs >> (8 * SELECT)).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)


@triton.jit
def _lo(pairs, DOT_DTYPE: tl.constexpr):
    return _widen_bytes(pairs, 0, DOT_DTYPE)


@triton.jit
def _hi(pairs, DOT_DTYPE: tl.constexpr):
    return _widen_bytes(pairs, 1, DOT_DTYPE)


@triton.jit
def _scaled(ptrs, mask, q_mul, DOT_DTYPE: tl.constexpr):
    return (tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)


# Per-batch ints are not specialised on: a new batch shape never recompiles.
# The split count and what follows from it (the partial-LSE strides: heads x splits, splits)
# change from batch to batch in eager mixed batches: runtime values, never a new compile.
@triton.jit(
    do_not_specialize=["query_len", "num_splits", "num_row_groups", "stride_lt", "stride_lh"]
)
def _mla_split_pairs(
    Q,  # [T, H, R + P]
    KV,  # paged cache, element (page, slot, d) at page*stride_kv_page + slot*stride_kv_tok + d
    BT,  # int32 [B, max_pages]
    SEQ,  # int32 [B]
    KSCALE,  # fp32 [1] (read only when HAS_SCALE)
    O_PART,  # fp32 [T, H, S, R]: per-split normalised outputs (multi-split only)
    L_PART,  # fp32 [T, H, S]: per-split log2-sum-exp (multi-split only)
    OUT,  # [T, H, R] (single split only)
    LSE,  # fp32 [T, H] (single split with HAS_LSE only)
    stride_qt,
    stride_qh,
    stride_kv_page,
    stride_kv_tok,
    stride_bt,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_lse_t,
    qk_scale_log2,  # softmax_scale * log2(e)
    num_heads,
    query_len,
    num_splits,
    num_row_groups,
    R: tl.constexpr,  # kv_lora_rank (value width)
    P: tl.constexpr,  # rope dim
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    HAS_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # q's dtype on GPUs; fp32 under the interpreter (see launcher)
    RELOAD_V: tl.constexpr,  # read each KV tile twice (QK^T, then P @ V); see the loop
    PRESCALE_Q: tl.constexpr,  # fold the score scale into q before the (fp16) dot
):
    # The latent width is handled as four column chunks (q0..q3, k0..k3, acc0..acc3) rather
    # than one [*, R] tile: a tensor-core operand is held whole in each warp's registers, and a
    # full [BLOCK_M, 512] query operand alone would take 128 registers per thread (spills).
    # Chunks keep each operand at a quarter of that while every KV tile still crosses HBM once.
    DC: tl.constexpr = R // 4

    # Row tiles of the same (request, split) are adjacent in launch order, so a KV tile read by
    # the first row tile is still in L2 for the next one (128 heads = two 64-row tiles).
    pid = tl.program_id(0)
    rg = pid % num_row_groups
    rest = pid // num_row_groups
    split = rest % num_splits
    b = rest // num_splits

    seq_len = tl.load(SEQ + b)
    rows = rg * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < query_len * num_heads
    tok_in_req = rows // num_heads
    head = rows % num_heads
    tok = b * query_len + tok_in_req
    if CAUSAL:
        # Row j of a request sees keys [0, seq_len - query_len + j].
        limit = seq_len - query_len + 1 + tok_in_req
    else:
        limit = tl.zeros([BLOCK_M], dtype=tl.int32) + seq_len

    # Splits are whole tiles long, so only a split's last tile is ragged.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if not SINGLE_SPLIT:
        # A graph captured for the longest context replays its split count at every length:
        # splits past a short request's keys write nothing, and the merge reads only the
        # splits that hold keys (`_used_splits`).
        if start >= seq_len:
            return

    q_row = tok.to(tl.int64) * stride_qt + head * stride_qh
    qm = row_ok[:, None]

    scale = qk_scale_log2
    if HAS_SCALE:
        k_scale = tl.load(KSCALE)
        scale = scale * k_scale
    # With PRESCALE_Q the scores come out of the dot already in log2 units. That keeps the
    # bf16 query's range in fp16 (the fp8 path's operand type): softmax_scale * k_scale is ~0.1
    # shrinks it, and only |q| beyond ~65504 / scale would overflow.
    q_mul = scale if PRESCALE_Q else 1.0
    # q's even and odd columns, each chunk [BLOCK_M, HC]: the key tile arrives as 16-bit
    # pairs of columns (2i, 2i + 1), so QK^T = q_even K_even^T + q_odd K_odd^T.
    HC: tl.constexpr = DC // 2
    HP: tl.constexpr = P // 2
    offs_h = tl.arange(0, HC)
    offs_hp = tl.arange(0, HP)
    qe = Q + q_row[:, None] + 2 * offs_h[None, :]
    qpe = Q + q_row[:, None] + R + 2 * offs_hp[None, :]
    q0e = _scaled(qe, qm, q_mul, DOT_DTYPE)
    q0o = _scaled(qe + 1, qm, q_mul, DOT_DTYPE)
    q1e = _scaled(qe + DC, qm, q_mul, DOT_DTYPE)
    q1o = _scaled(qe + DC + 1, qm, q_mul, DOT_DTYPE)
    q2e = _scaled(qe + 2 * DC, qm, q_mul, DOT_DTYPE)
    q2o = _scaled(qe + 2 * DC + 1, qm, q_mul, DOT_DTYPE)
    q3e = _scaled(qe + 3 * DC, qm, q_mul, DOT_DTYPE)
    q3o = _scaled(qe + 3 * DC + 1, qm, q_mul, DOT_DTYPE)
    qpe_ = _scaled(qpe, qm, q_mul, DOT_DTYPE)
    qpo_ = _scaled(qpe + 1, qm, q_mul, DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0e = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc0o = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc1e = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc1o = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc2e = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc2o = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc3e = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    acc3o = tl.zeros([BLOCK_M, HC], dtype=tl.float32)
    KV16 = KV.to(tl.pointer_type(tl.uint16), bitcast=True)

    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_row = page * stride_kv_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kv_tok
        # The tile as 16-bit pairs of fp8 columns, read once: a pair is one 16-bit element
        # (ldmatrix-able in both operand orders), its low and high bytes the even and odd
        # columns of both products. Masked keys read as 0 (an unwritten slot may hold fp8
        # NaN patterns).
        vp = KV16 + (kv_row // 2)[:, None]
        km = n_ok[:, None]
        x0 = tl.load(vp + offs_h[None, :], mask=km, other=0)
        x1 = tl.load(vp + HC + offs_h[None, :], mask=km, other=0)
        x2 = tl.load(vp + 2 * HC + offs_h[None, :], mask=km, other=0)
        x3 = tl.load(vp + 3 * HC + offs_h[None, :], mask=km, other=0)
        xr = tl.load(vp + 4 * HC + offs_hp[None, :], mask=km, other=0)
        s = tl.dot(q0e, tl.trans(_lo(x0, DOT_DTYPE)))
        s = tl.dot(q0o, tl.trans(_hi(x0, DOT_DTYPE)), s)
        s = tl.dot(q1e, tl.trans(_lo(x1, DOT_DTYPE)), s)
        s = tl.dot(q1o, tl.trans(_hi(x1, DOT_DTYPE)), s)
        s = tl.dot(q2e, tl.trans(_lo(x2, DOT_DTYPE)), s)
        s = tl.dot(q2o, tl.trans(_hi(x2, DOT_DTYPE)), s)
        s = tl.dot(q3e, tl.trans(_lo(x3, DOT_DTYPE)), s)
        s = tl.dot(q3o, tl.trans(_hi(x3, DOT_DTYPE)), s)
        s = tl.dot(qpe_, tl.trans(_lo(xr, DOT_DTYPE)), s)
        s = tl.dot(qpo_, tl.trans(_hi(xr, DOT_DTYPE)), s)
        if not PRESCALE_Q:
            s = s * scale
        valid = (offs_n[None, :] < limit[:, None]) & n_ok[None, :]
        s = tl.where(valid, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pd = p.to(DOT_DTYPE)
        acc0e = tl.dot(pd, _lo(x0, DOT_DTYPE), acc0e * alpha[:, None])
        acc0o = tl.dot(pd, _hi(x0, DOT_DTYPE), acc0o * alpha[:, None])
        acc1e = tl.dot(pd, _lo(x1, DOT_DTYPE), acc1e * alpha[:, None])
        acc1o = tl.dot(pd, _hi(x1, DOT_DTYPE), acc1o * alpha[:, None])
        acc2e = tl.dot(pd, _lo(x2, DOT_DTYPE), acc2e * alpha[:, None])
        acc2o = tl.dot(pd, _hi(x2, DOT_DTYPE), acc2o * alpha[:, None])
        acc3e = tl.dot(pd, _lo(x3, DOT_DTYPE), acc3e * alpha[:, None])
        acc3o = tl.dot(pd, _hi(x3, DOT_DTYPE), acc3o * alpha[:, None])
        m_i = m_new

    has_keys = l_i > 0.0
    inv_l = tl.where(has_keys, 1.0 / tl.where(has_keys, l_i, 1.0), 0.0)
    if HAS_SCALE:
        inv_l = inv_l * k_scale
    lse2 = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    if SINGLE_SPLIT:
        dst = OUT
        row_off = tok.to(tl.int64) * stride_ot + head * stride_oh
        if HAS_LSE:
            # Natural log for callers (DCP merges): ln(x) = log2(x) * ln(2).
            tl.store(
                LSE + tok.to(tl.int64) * stride_lse_t + head, lse2 * 0.6931471805599453, mask=row_ok
            )
    else:
        dst = O_PART
        row_off = tok.to(tl.int64) * stride_pt + head * stride_ph + split * stride_ps
        tl.store(
            L_PART + tok.to(tl.int64) * stride_lt + head * stride_lh + split, lse2, mask=row_ok
        )
    ev = 2 * offs_h
    _store_rows(dst, row_off, ev, acc0e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 1, ev, acc0o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + DC, ev, acc1e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + DC + 1, ev, acc1o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * DC, ev, acc2e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * DC + 1, ev, acc2o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 3 * DC, ev, acc3e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 3 * DC + 1, ev, acc3o * inv_l[:, None], row_ok)
