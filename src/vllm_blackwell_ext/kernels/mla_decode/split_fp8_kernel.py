"""Split stage of MLA decode for an fp8 e4m3 cache read as 16-bit column pairs, in Triton.

Jit code only (the `triton_fp8` variant of `plan.py`); it shares the program layout, softmax
step and row epilogue of `split_kernel`.
"""

import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.fp8_pairs import (
    PAIRS_E4M3,
    PAIRS_E4M3_ASM,
    PAIRS_E4M3_SCALED,
    PAIRS_E4M3_SCALED_ASM,
    PAIRS_SCALED_FACTOR,
    widen_fp8_pairs,
)
from vllm_blackwell_ext.kernels.mla_decode.split_kernel import (
    _finish_rows,
    _softmax_step,
    _split_program,
    _store_rows,
)


@triton.jit
def _widen(pairs, SELECT: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Even (SELECT 0) or odd (1) columns of e4m3 pairs in the dot dtype (`fp8_pairs`)."""
    if DOT_DTYPE == tl.float16:
        return widen_fp8_pairs(pairs, SELECT, PAIRS_E4M3_ASM)
    return widen_fp8_pairs(pairs, SELECT, PAIRS_E4M3).to(DOT_DTYPE)


@triton.jit
def _widen_scaled(pairs, SELECT: tl.constexpr, DOT_DTYPE: tl.constexpr, IN_INT_OPS: tl.constexpr):
    """`_widen`, or with IN_INT_OPS in integer ops (off the conversion pipe) as the values
    times 1 / PAIRS_SCALED_FACTOR."""
    if not IN_INT_OPS:
        return _widen(pairs, SELECT, DOT_DTYPE)
    if DOT_DTYPE == tl.float16:
        return widen_fp8_pairs(pairs, SELECT, PAIRS_E4M3_SCALED_ASM)
    return widen_fp8_pairs(pairs, SELECT, PAIRS_E4M3_SCALED).to(DOT_DTYPE)


@triton.jit
def _scaled_q(ptrs, mask, q_mul, DOT_DTYPE: tl.constexpr):
    return (tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)


@triton.jit(
    do_not_specialize=["query_len", "num_splits", "num_row_groups", "stride_lt", "stride_lh"]
)
def _mla_decode_split_fp8_kernel(
    Q,
    KV,
    BT,
    SEQ,
    KSCALE,
    O_PART,
    L_PART,
    OUT,
    LSE,
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
    qk_scale_log2,
    num_heads,
    query_len,
    num_splits,
    num_row_groups,
    R: tl.constexpr,
    P: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    HAS_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # fp16 on GPUs; fp32 under the interpreter
    INT_WIDEN: tl.constexpr,  # MlaDecodeConfig.int_widen: 0, 1 (P @ V operand) or 2 (both)
):
    """Split kernel of an fp8 e4m3 cache: the arguments of `_mla_decode_split_kernel`.

    Each KV tile is read once, as 16-bit pairs of neighbouring latent columns (2i, 2i + 1). As
    fp8 elements, the value tile's reduction axis (keys) is not its contiguous one, and Triton
    reads such a tensor-core operand from shared memory a byte at a time; as 16-bit elements
    it is loaded with ldmatrix in either operand order. A pair's low and high bytes widen
    (`_widen`) to the even and odd columns, so both products run as two half-width dots: q's
    even and odd columns against them for QK^T, and even and odd accumulators for P @ V,
    interleaved again when stored. The per-tensor scale is folded into q and the output.
    """
    HC: tl.constexpr = R // 8  # pairs per column chunk (chunks as in the 16-bit kernel)
    HP: tl.constexpr = P // 2
    VALUES_INT: tl.constexpr = INT_WIDEN >= 1
    KEYS_INT: tl.constexpr = INT_WIDEN >= 2
    b, split, seq_len, row_ok, head, tok, limit, start, end = _split_program(
        SEQ, num_heads, query_len, num_splits, num_row_groups, BLOCK_M, BLOCK_N, CAUSAL
    )
    if not SINGLE_SPLIT:
        if start >= seq_len:
            return  # as in the 16-bit kernel

    offs_h = tl.arange(0, HC)
    offs_hp = tl.arange(0, HP)
    q_row = tok.to(tl.int64) * stride_qt + head * stride_qh
    qm = row_ok[:, None]
    scale = qk_scale_log2
    k_scale = 1.0
    if HAS_SCALE:
        k_scale = tl.load(KSCALE)
        scale = scale * k_scale
    # The score scale is folded into q, so the dots give log2-unit scores directly. That keeps
    # a bf16 query's range in fp16: softmax_scale * k_scale ~ 0.1 shrinks it, and only |q|
    # beyond ~65504 / scale would overflow.
    qe = Q + q_row[:, None] + 2 * offs_h[None, :]
    qre = Q + q_row[:, None] + R + 2 * offs_hp[None, :]
    q0e = _scaled_q(qe, qm, scale, DOT_DTYPE)
    q0o = _scaled_q(qe + 1, qm, scale, DOT_DTYPE)
    q1e = _scaled_q(qe + 2 * HC, qm, scale, DOT_DTYPE)
    q1o = _scaled_q(qe + 2 * HC + 1, qm, scale, DOT_DTYPE)
    q2e = _scaled_q(qe + 4 * HC, qm, scale, DOT_DTYPE)
    q2o = _scaled_q(qe + 4 * HC + 1, qm, scale, DOT_DTYPE)
    q3e = _scaled_q(qe + 6 * HC, qm, scale, DOT_DTYPE)
    q3o = _scaled_q(qe + 6 * HC + 1, qm, scale, DOT_DTYPE)
    qre_ = _scaled_q(qre, qm, scale, DOT_DTYPE)
    qro_ = _scaled_q(qre + 1, qm, scale, DOT_DTYPE)

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
        # Masked keys read as 0: an unwritten cache slot may hold fp8 NaN patterns, and
        # 0 * NaN in the P @ V product would poison the row. (Row strides are even: 576/288.)
        xp = KV16 + (kv_row // 2)[:, None]
        km = n_ok[:, None]
        x0 = tl.load(xp + offs_h[None, :], mask=km, other=0)
        x1 = tl.load(xp + HC + offs_h[None, :], mask=km, other=0)
        x2 = tl.load(xp + 2 * HC + offs_h[None, :], mask=km, other=0)
        x3 = tl.load(xp + 3 * HC + offs_h[None, :], mask=km, other=0)
        xr = tl.load(xp + 4 * HC + offs_hp[None, :], mask=km, other=0)

        s = tl.dot(q0e, tl.trans(_widen_scaled(x0, 0, DOT_DTYPE, KEYS_INT)))
        s = tl.dot(q0o, tl.trans(_widen_scaled(x0, 1, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q1e, tl.trans(_widen_scaled(x1, 0, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q1o, tl.trans(_widen_scaled(x1, 1, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q2e, tl.trans(_widen_scaled(x2, 0, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q2o, tl.trans(_widen_scaled(x2, 1, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q3e, tl.trans(_widen_scaled(x3, 0, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(q3o, tl.trans(_widen_scaled(x3, 1, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(qre_, tl.trans(_widen_scaled(xr, 0, DOT_DTYPE, KEYS_INT)), s)
        s = tl.dot(qro_, tl.trans(_widen_scaled(xr, 1, DOT_DTYPE, KEYS_INT)), s)
        if KEYS_INT:  # exact: a power of two on fp32 scores
            s = s * PAIRS_SCALED_FACTOR
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, offs_n, n_ok, limit)
        pd = p.to(DOT_DTYPE)
        acc0e = tl.dot(pd, _widen_scaled(x0, 0, DOT_DTYPE, VALUES_INT), acc0e * alpha[:, None])
        acc0o = tl.dot(pd, _widen_scaled(x0, 1, DOT_DTYPE, VALUES_INT), acc0o * alpha[:, None])
        acc1e = tl.dot(pd, _widen_scaled(x1, 0, DOT_DTYPE, VALUES_INT), acc1e * alpha[:, None])
        acc1o = tl.dot(pd, _widen_scaled(x1, 1, DOT_DTYPE, VALUES_INT), acc1o * alpha[:, None])
        acc2e = tl.dot(pd, _widen_scaled(x2, 0, DOT_DTYPE, VALUES_INT), acc2e * alpha[:, None])
        acc2o = tl.dot(pd, _widen_scaled(x2, 1, DOT_DTYPE, VALUES_INT), acc2o * alpha[:, None])
        acc3e = tl.dot(pd, _widen_scaled(x3, 0, DOT_DTYPE, VALUES_INT), acc3e * alpha[:, None])
        acc3o = tl.dot(pd, _widen_scaled(x3, 1, DOT_DTYPE, VALUES_INT), acc3o * alpha[:, None])

    out_scale = k_scale
    if VALUES_INT:  # the values were widened times 1 / PAIRS_SCALED_FACTOR
        out_scale = k_scale * PAIRS_SCALED_FACTOR
    dst, row_off, inv_l = _finish_rows(
        m_i, l_i, out_scale, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
        stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
        stride_lse_t, HAS_SCALE or VALUES_INT, SINGLE_SPLIT, HAS_LSE,
    )  # fmt: skip
    even = 2 * offs_h
    _store_rows(dst, row_off, even, acc0e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 1, even, acc0o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * HC, even, acc1e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * HC + 1, even, acc1o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 4 * HC, even, acc2e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 4 * HC + 1, even, acc2o * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 6 * HC, even, acc3e * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 6 * HC + 1, even, acc3o * inv_l[:, None], row_ok)
