"""Split stage of MLA decode for a 16-bit cache (and an fp8 cache read through TMA), in Triton.

Jit code only: the program layout, online-softmax step and row epilogue shared with the fp8
pair kernel (`split_fp8_kernel`), and `_mla_decode_split_kernel`. The package docstring
(`mla_decode/__init__.py`) says how the pieces fit; `plan.py` chooses which kernel runs.
"""

import triton
import triton.language as tl


@triton.jit
def _store_rows(PTR, row_off, offs_c, vals, row_ok):
    tl.store(
        PTR + row_off[:, None] + offs_c[None, :],
        vals.to(PTR.dtype.element_ty),
        mask=row_ok[:, None],
    )


@triton.jit
def _split_program(
    SEQ, num_heads, query_len, num_splits, num_row_groups,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """This program's request, rows and key range [start, end) (both split kernels).

    Row tiles of the same (request, split) are adjacent in launch order, so a KV tile read by
    the first row tile is still in L2 for the next one (128 heads = two 64-row tiles).
    """
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
    return b, split, seq_len, row_ok, head, tok, limit, start, end


@triton.jit
def _softmax_step(s, m_i, l_i, offs_n, n_ok, limit):
    """Online-softmax update for one key tile of log2-scaled scores `s`: (p, alpha, m, l)."""
    valid = (offs_n[None, :] < limit[:, None]) & n_ok[None, :]
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _finish_rows(
    m_i, l_i, k_scale, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh, stride_lse_t,
    HAS_SCALE: tl.constexpr, SINGLE_SPLIT: tl.constexpr, HAS_LSE: tl.constexpr,
):  # fmt: skip
    """Writes the rows' log-sum-exp; returns (output base, row offsets, 1 / l) for the values.

    One split writes `OUT` (and the natural-log LSE); several write normalised partials and
    their log2-sum-exps for the merge. A row that saw no key gets 0 and -inf.
    """
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
    return dst, row_off, inv_l


# Per-batch ints are not specialised on: a new batch shape never recompiles.
# The split count and what follows from it (the partial-LSE strides: heads x splits, splits)
# change from batch to batch in eager mixed batches: runtime values, never a new compile.
@triton.jit(
    do_not_specialize=["query_len", "num_splits", "num_row_groups", "stride_lt", "stride_lh"]
)
def _mla_decode_split_kernel(
    Q,  # [T, H, R + P]
    KV,  # paged cache, element (page, slot, d) at page*stride_kv_page + slot*stride_kv_tok + d
    BT,  # int32 [B, max_pages]
    SEQ,  # int32 [B]
    KSCALE,  # fp32 [1] (read only when HAS_SCALE)
    O_PART,  # fp32 [T, H, S, R]: per-split normalised outputs (multi-split only)
    L_PART,  # fp32 [T, H, S]: per-split log2-sum-exp (multi-split only)
    OUT,  # [T, H, R] (single split only)
    LSE,  # fp32 [T, H] (single split with HAS_LSE only)
    KL_DESC,  # TMA only: the cache as [pages * PAGE_SIZE, R + P], [BLOCK_N, R // 4] blocks
    KR_DESC,  # TMA only: the same, [BLOCK_N, P] blocks (the rope columns)
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
    DOT_DTYPE: tl.constexpr,  # q's dtype on GPUs; fp32 under the interpreter (`plan.dot_dtype`)
    TMA: tl.constexpr,  # key tiles through KL_DESC / KR_DESC (tiles within a page)
):
    """Split kernel of a 16-bit (bf16 / fp16) cache, and of an fp8 cache read through TMA
    (each tile widened to q's dtype, exact for e4m3; the scale applied as in the fp8 kernel)."""
    # The latent width is handled as four column chunks (q0..q3, k0..k3, acc0..acc3) rather
    # than one [*, R] tile: a dot loads its operands whole into each warp's registers (q from
    # shared memory every tile), and a full [BLOCK_M, 512] query operand alone would take 128
    # registers per thread (spills). Chunks keep each operand at a quarter of that while every
    # KV tile still crosses HBM once.
    DC: tl.constexpr = R // 4
    b, split, seq_len, row_ok, head, tok, limit, start, end = _split_program(
        SEQ, num_heads, query_len, num_splits, num_row_groups, BLOCK_M, BLOCK_N, CAUSAL
    )
    if not SINGLE_SPLIT:
        # A graph captured for the longest context replays its split count at every length:
        # splits past a short request's keys write nothing, and the merge reads only the
        # splits that hold keys (`_used_splits`).
        if start >= seq_len:
            return

    offs_c = tl.arange(0, DC)
    offs_p = tl.arange(0, P)
    q_row = tok.to(tl.int64) * stride_qt + head * stride_qh
    qm = row_ok[:, None]
    scale = qk_scale_log2
    k_scale = 1.0
    if HAS_SCALE:
        k_scale = tl.load(KSCALE)
        scale = scale * k_scale
    q0 = tl.load(Q + q_row[:, None] + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
    q1 = tl.load(Q + q_row[:, None] + DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
    q2 = tl.load(Q + q_row[:, None] + 2 * DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
    q3 = tl.load(Q + q_row[:, None] + 3 * DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
    qp = tl.load(Q + q_row[:, None] + R + offs_p[None, :], mask=qm, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)

    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        if TMA:
            # The tile is BLOCK_N consecutive slots of one page: five copies, no addresses.
            # Slots past the keys are read too; their P is 0, so they must hold finite values
            # (vLLM zeroes the cache at allocation and writes only finite K/V).
            row = tl.load(bt_row + n0 // PAGE_SIZE) * PAGE_SIZE + n0 % PAGE_SIZE
            k0 = KL_DESC.load([row, 0]).to(DOT_DTYPE)
            k1 = KL_DESC.load([row, DC]).to(DOT_DTYPE)
            k2 = KL_DESC.load([row, 2 * DC]).to(DOT_DTYPE)
            k3 = KL_DESC.load([row, 3 * DC]).to(DOT_DTYPE)
            kr = KR_DESC.load([row, R]).to(DOT_DTYPE)
        else:
            page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
            kv_row = page * stride_kv_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kv_tok
            kp = KV + kv_row[:, None]
            km = n_ok[:, None]
            k0 = tl.load(kp + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k1 = tl.load(kp + DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k2 = tl.load(kp + 2 * DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            k3 = tl.load(kp + 3 * DC + offs_c[None, :], mask=km, other=0.0).to(DOT_DTYPE)
            kr = tl.load(kp + R + offs_p[None, :], mask=km, other=0.0).to(DOT_DTYPE)

        s = tl.dot(q0, tl.trans(k0))
        s = tl.dot(q1, tl.trans(k1), s)
        s = tl.dot(q2, tl.trans(k2), s)
        s = tl.dot(q3, tl.trans(k3), s)
        s = tl.dot(qp, tl.trans(kr), s)
        p, alpha, m_i, l_i = _softmax_step(s * scale, m_i, l_i, offs_n, n_ok, limit)
        pd = p.to(DOT_DTYPE)
        acc0 = tl.dot(pd, k0, acc0 * alpha[:, None])
        acc1 = tl.dot(pd, k1, acc1 * alpha[:, None])
        acc2 = tl.dot(pd, k2, acc2 * alpha[:, None])
        acc3 = tl.dot(pd, k3, acc3 * alpha[:, None])

    dst, row_off, inv_l = _finish_rows(
        m_i, l_i, k_scale, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
        stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
        stride_lse_t, HAS_SCALE, SINGLE_SPLIT, HAS_LSE,
    )  # fmt: skip
    _store_rows(dst, row_off, offs_c, acc0 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + DC, offs_c, acc1 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * DC, offs_c, acc2 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 3 * DC, offs_c, acc3 * inv_l[:, None], row_ok)
