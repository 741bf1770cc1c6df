"""Merge stage of MLA decode: per-split partial outputs combined by their log-sum-exps.

Jit code only; launched after either split kernel when a plan has more than one split.
"""

import triton
import triton.language as tl


@triton.jit
def _used_splits(seq_len, num_splits, block_n):
    """Splits of a `seq_len`-key request that hold keys (the split kernel's partition)."""
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), block_n) * block_n
    return tl.where(seq_len > 0, tl.cdiv(seq_len, tl.maximum(split_len, 1)), 0)


@triton.jit(do_not_specialize=["num_splits", "query_len", "stride_lt", "stride_lh"])
def _mla_decode_merge_kernel(
    O_PART,  # fp32 [T, H, S, R]
    L_PART,  # fp32 [T, H, S]
    OUT,  # [T, H, R]
    LSE,  # fp32 [T, H]
    SEQ,  # int32 [B]
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_lse_t,
    num_splits,
    query_len,
    BLOCK_N: tl.constexpr,  # the split kernel's key tile: splits are whole tiles
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    # One program per (token, head, column chunk), splits read BLOCK_S at a time in one pass
    # with a running maximum (as the split kernel does over keys). Narrow column chunks give
    # many small programs: the merge is bound by load latency, not bandwidth, and one long
    # request can have hundreds of splits.
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_r = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    l_base = L_PART + t * stride_lt + h * stride_lh
    p_base = O_PART + t * stride_pt + h * stride_ph

    used = _used_splits(tl.load(SEQ + t // query_len), num_splits, BLOCK_N)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    den = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, used, BLOCK_S):
        s_ok = s0 + offs_s < used
        ls = tl.load(l_base + s0 + offs_s, mask=s_ok, other=float("-inf"))
        o = tl.load(
            p_base + (s0 + offs_s)[:, None] * stride_ps + offs_r[None, :],
            mask=s_ok[:, None],
            other=0.0,
        )
        # Each split's normalised output weighs 2^(lse_s - max); a split whose rows see no key
        # (causal rows of a short request) has lse -inf and weighs 0, and while every split so
        # far is such, the shift is 0, so exp2 gives 0, not NaN.
        m_new = tl.maximum(m, tl.max(ls, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(ls - m_safe)
        acc = acc * alpha + tl.sum(w[:, None] * o, 0)
        den = den * alpha + tl.sum(w, 0)
        m = m_new
    total = tl.sum(den, 0)
    has_keys = total > 0.0
    inv = tl.where(has_keys, 1.0 / tl.where(has_keys, total, 1.0), 0.0)
    tl.store(OUT + t * stride_ot + h * stride_oh + offs_r, (acc * inv).to(OUT.dtype.element_ty))
    if HAS_LSE:
        if chunk == 0:
            # total = sum of 2^(lse_s - m), so lse = m + log2(total); -inf where no key.
            log_total = tl.log2(tl.where(has_keys, total, 1.0))
            lse2 = tl.where(has_keys, tl.sum(m, 0) + log_total, -float("inf"))
            tl.store(LSE + t * stride_lse_t + h, lse2 * 0.6931471805599453)
