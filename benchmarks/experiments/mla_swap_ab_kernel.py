"""Experiment: the MLA decode split kernel with keys as the MMA's M dimension ("swap-AB").

Same arguments and partition as `kernels/mla_decode._mla_decode_split_kernel`, but S^T = K Q^T
and O^T = V^T P, so a 64-key tile is a Hopper wgmma's M; QK_FP8 quantises q per row to e4m3
(scale folded into the scores), PV_FP8 quantises P (x448) and reads V^T from the cache in fp8.
Measured slower than the package's kernel on the H200 (`mla_fp8_variants.py`).
"""

import triton
import triton.language as tl


@triton.jit(
    do_not_specialize=["query_len", "num_splits", "num_row_groups", "stride_lt", "stride_lh"]
)
def _mla_split_t(
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
    DOT_DTYPE: tl.constexpr,
    RELOAD_V: tl.constexpr,
    PRESCALE_Q: tl.constexpr,
    QK_FP8: tl.constexpr = False,
    PV_FP8: tl.constexpr = False,
):
    DC: tl.constexpr = R // 4
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
        limit = seq_len - query_len + 1 + tok_in_req
    else:
        limit = tl.zeros([BLOCK_M], dtype=tl.int32) + seq_len
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_c = tl.arange(0, DC)
    offs_p = tl.arange(0, P)
    q_row = tok.to(tl.int64) * stride_qt + head * stride_qh
    qm = row_ok[None, :]
    scale = qk_scale_log2
    if HAS_SCALE:
        k_scale = tl.load(KSCALE)
        scale = scale * k_scale
    q_mul = scale if PRESCALE_Q else 1.0
    # q^T tiles [DC, BLOCK_M]: the dot's B operand, loaded once.
    qT = Q + q_row[None, :] + offs_c[:, None]
    q0 = (tl.load(qT, mask=qm, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)
    q1 = (tl.load(qT + DC, mask=qm, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)
    q2 = (tl.load(qT + 2 * DC, mask=qm, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)
    q3 = (tl.load(qT + 3 * DC, mask=qm, other=0.0).to(tl.float32) * q_mul).to(DOT_DTYPE)
    qp = (
        tl.load(Q + q_row[None, :] + R + offs_p[:, None], mask=qm, other=0.0).to(tl.float32) * q_mul
    ).to(DOT_DTYPE)
    if QK_FP8:
        amax = tl.maximum(
            tl.maximum(tl.max(tl.abs(q0.to(tl.float32)), 0), tl.max(tl.abs(q1.to(tl.float32)), 0)),
            tl.maximum(tl.max(tl.abs(q2.to(tl.float32)), 0), tl.max(tl.abs(q3.to(tl.float32)), 0)),
        )
        amax = tl.maximum(amax, tl.max(tl.abs(qp.to(tl.float32)), 0))
        amax = tl.where(amax > 0, amax, 1.0)
        qs = 448.0 / amax
        q0 = (q0.to(tl.float32) * qs[None, :]).to(tl.float8e4nv)
        q1 = (q1.to(tl.float32) * qs[None, :]).to(tl.float8e4nv)
        q2 = (q2.to(tl.float32) * qs[None, :]).to(tl.float8e4nv)
        q3 = (q3.to(tl.float32) * qs[None, :]).to(tl.float8e4nv)
        qp = (qp.to(tl.float32) * qs[None, :]).to(tl.float8e4nv)
        q_back = amax / 448.0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([DC, BLOCK_M], dtype=tl.float32)
    acc1 = tl.zeros([DC, BLOCK_M], dtype=tl.float32)
    acc2 = tl.zeros([DC, BLOCK_M], dtype=tl.float32)
    acc3 = tl.zeros([DC, BLOCK_M], dtype=tl.float32)

    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_row = page * stride_kv_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kv_tok
        kp = KV + kv_row[:, None]
        km = n_ok[:, None]
        if QK_FP8:
            k0 = tl.load(kp + offs_c[None, :], mask=km, other=0.0)
            k1 = tl.load(kp + DC + offs_c[None, :], mask=km, other=0.0)
            k2 = tl.load(kp + 2 * DC + offs_c[None, :], mask=km, other=0.0)
            k3 = tl.load(kp + 3 * DC + offs_c[None, :], mask=km, other=0.0)
            kr = tl.load(kp + R + offs_p[None, :], mask=km, other=0.0)
        else:
            k0 = tl.load(kp + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k1 = tl.load(kp + DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k2 = tl.load(kp + 2 * DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k3 = tl.load(kp + 3 * DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            kr = tl.load(kp + R + offs_p[None, :], mask=km, other=0.0).to(DOT_DTYPE)
        s = tl.dot(k0, q0)
        s = tl.dot(k1, q1, s)
        s = tl.dot(k2, q2, s)
        s = tl.dot(k3, q3, s)
        s = tl.dot(kr, qp, s)  # [BLOCK_N, BLOCK_M]
        if QK_FP8:
            s = s * q_back[None, :]
        if not PRESCALE_Q:
            s = s * scale
        valid = (offs_n[:, None] < limit[None, :]) & n_ok[:, None]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        if PV_FP8:
            pd = (p * 448.0).to(tl.float8e4nv)
        else:
            pd = p.to(DOT_DTYPE)
        if PV_FP8:
            vp = KV + kv_row[None, :]
            vm = n_ok[None, :]
            v0 = tl.load(vp + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca")
            v1 = tl.load(vp + DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca")
            v2 = tl.load(vp + 2 * DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca")
            v3 = tl.load(vp + 3 * DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca")
        elif RELOAD_V:
            vp = KV + kv_row[None, :]
            vm = n_ok[None, :]
            v0 = tl.load(vp + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca").to(
                DOT_DTYPE
            )
            v1 = tl.load(vp + DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca").to(
                DOT_DTYPE
            )
            v2 = tl.load(
                vp + 2 * DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca"
            ).to(DOT_DTYPE)
            v3 = tl.load(
                vp + 3 * DC + offs_c[:, None], mask=vm, other=0.0, cache_modifier=".ca"
            ).to(DOT_DTYPE)
        else:
            v0 = tl.trans(k0).to(DOT_DTYPE)
            v1 = tl.trans(k1).to(DOT_DTYPE)
            v2 = tl.trans(k2).to(DOT_DTYPE)
            v3 = tl.trans(k3).to(DOT_DTYPE)
        acc0 = tl.dot(v0, pd, acc0 * alpha[None, :])
        acc1 = tl.dot(v1, pd, acc1 * alpha[None, :])
        acc2 = tl.dot(v2, pd, acc2 * alpha[None, :])
        acc3 = tl.dot(v3, pd, acc3 * alpha[None, :])
        m_i = m_new

    has_keys = l_i > 0.0
    inv_l = tl.where(has_keys, 1.0 / tl.where(has_keys, l_i, 1.0), 0.0)
    if PV_FP8:
        inv_l = inv_l / 448.0
    if HAS_SCALE:
        inv_l = inv_l * k_scale
    lse2 = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    if SINGLE_SPLIT:
        dst = OUT
        row_off = tok.to(tl.int64) * stride_ot + head * stride_oh
        if HAS_LSE:
            tl.store(
                LSE + tok.to(tl.int64) * stride_lse_t + head, lse2 * 0.6931471805599453, mask=row_ok
            )
    else:
        dst = O_PART
        row_off = tok.to(tl.int64) * stride_pt + head * stride_ph + split * stride_ps
        tl.store(
            L_PART + tok.to(tl.int64) * stride_lt + head * stride_lh + split, lse2, mask=row_ok
        )
    ety = dst.dtype.element_ty
    om = row_ok[None, :]
    tl.store(dst + row_off[None, :] + offs_c[:, None], (acc0 * inv_l[None, :]).to(ety), mask=om)
    tl.store(
        dst + row_off[None, :] + DC + offs_c[:, None], (acc1 * inv_l[None, :]).to(ety), mask=om
    )
    tl.store(
        dst + row_off[None, :] + 2 * DC + offs_c[:, None], (acc2 * inv_l[None, :]).to(ety), mask=om
    )
    tl.store(
        dst + row_off[None, :] + 3 * DC + offs_c[:, None], (acc3 * inv_l[None, :]).to(ety), mask=om
    )
