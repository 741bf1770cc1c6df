"""MLA decode attention over a paged latent KV cache, in Triton.

Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM) decodes with absorbed queries: every
head attends over the same latent cache line `[kv_lora_rank latent | rope_dim rope]` (576 or 288
values), the latent part doubling as the value. So the whole head group of one request shares
each KV tile, and the kernel is built around that:

- one program takes a tile of query rows of one request (heads x query tokens, up to 64) and
  multiplies it against each KV tile on tensor cores (`tl.dot`), so a KV tile is read from
  memory once per row tile, not once per head as a per-head kernel would;
- the sequence is cut into splits (split-KV); the split count is planned on the host from the
  batch size, the rows, the longest context and the SM count (`plan_mla_decode`), so one long
  request and many short ones both fill the GPU; a second kernel merges the splits by their
  log-sum-exp (one split writes the output directly and skips the merge); splits past a
  request's keys are skipped by both, so a CUDA graph captured with the longest context's
  split count stays cheap when it replays short contexts;
- an fp8 e4m3 cache has its own split kernel: each tile is loaded once as fp8 (half the
  bytes), viewed as 16-bit pairs of columns so both products read it from shared memory with
  ldmatrix, and widened in registers to fp16 (a byte permute and one convert per two values);
  the query is multiplied by softmax scale x log2(e) x the per-tensor scale before it is
  rounded to fp16, and the per-tensor scale also multiplies the final output, not every
  element;
- on Hopper a 16-bit cache stored contiguously with pages a multiple of 64 tokens (vLLM's
  layout; BWX_MLA asks for 64-token pages) takes 64-key tiles read by TMA copies for 64-row
  tiles (`MLA_DECODE_TMA_CONFIGS`); other caches are gathered per thread with `cp.async`. An
  fp8 cache's TMA tiles take the same path, each tile widened to q's dtype;
- Hopper's 64-row TMA tiles of a bf16 or fp8 cache run through a Gluon kernel of the same tile
  (`mla_decode_gluon`) that computes each score tile once where the Triton kernel computes it
  in both warp groups: the same programs, splits, outputs and merge;
- query_len up to 8 rows per request (MTP / speculative verification), causal within the rows;
- capture-safe: with a preallocated `MlaDecodeWorkspace` and a given `num_splits`, `mla_decode`
  neither allocates nor synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels import mla_decode_gluon
from vllm_blackwell_ext.kernels.checks import check_index, fail
from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.fp8_pairs import (
    PAIRS_E4M3,
    PAIRS_E4M3_ASM,
    PAIRS_E4M3_SCALED,
    PAIRS_E4M3_SCALED_ASM,
    PAIRS_SCALED_FACTOR,
    widen_fp8_pairs,
)
from vllm_blackwell_ext.kernels.host_ints import cdiv
from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig, get_mla_decode_config

# (kv_lora_rank, rope_dim) pairs the kernel is built for: DeepSeek/Kimi (512 + 64) and the
# half-width variant (256 + 32).
SUPPORTED_LATENT: dict[int, int] = {512: 64, 256: 32}
MAX_QUERY_LEN = 8
# Upper bound of the split planner; a workspace sized with it fits every plan.
MAX_SPLITS = 256
# From this many splits on, the merge takes its wide-split launch config (`merge_config`).
WIDE_MERGE_SPLITS = 64

_LOG2E = 1.4426950408889634


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
    DOT_DTYPE: tl.constexpr,  # q's dtype on GPUs; fp32 under the interpreter (see launcher)
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


def merge_config(num_splits: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_S, num_warps) of the merge for `num_splits` splits.

    Measured on the H200 (graph replays, 16 heads): with 256 splits (B=1, 128k) 16-column
    chunks reading 64 splits at a time took 11.2 us against 39.3 us for 128 x 16; with 2-33
    splits 32 x 16 on 2 warps was the fastest tried (15.6 us at B=64 x 4 splits, 18.6 before).
    """
    return (16, 64, 2) if num_splits >= WIDE_MERGE_SPLITS else (32, 16, 2)


def _dot_dtype(q: torch.Tensor, kv_dtype: torch.dtype) -> tl.dtype:
    # Triton 3.9's interpreter computes bf16 `tl.dot` on the raw 16-bit patterns (garbage;
    # fp16 and fp32 are right), so CPU runs widen the operands to fp32.
    if q.device.type == "cpu":
        return tl.float32
    # fp8 e4m3 widens to fp16 in one instruction per pair (to bf16 it takes several), and
    # e4m3 values and probabilities are exact / well inside fp16; q is pre-scaled (see the
    # fp8 kernel).
    if kv_dtype == torch.float8_e4m3fn:
        return tl.float16
    return tl.bfloat16 if q.dtype == torch.bfloat16 else tl.float16


def _kv_tag(dtype: torch.dtype) -> str:
    return "fp8" if dtype == torch.float8_e4m3fn else "bf16"


# TMA (tensor-memory-access copies) exists from Hopper on; the interpreter runs it on the CPU.
MIN_TMA_CAPABILITY: tuple[int, int] = (9, 0)


def cache_tma_page_size(kv_cache: torch.Tensor, info: DeviceInfo) -> int | None:
    """The cache's page size where TMA can read its tiles, else None: a cache on a GPU with TMA
    (or the interpreter), contiguous [pages, page, width] at a 16-byte address (a tile is then
    one block of a 2-D [pages * page, width] view; rows of 576 or 288 elements keep every
    row 16-byte aligned in bf16 and fp8 alike)."""
    if not kv_cache.is_contiguous() or kv_cache.data_ptr() % 16:
        return None
    if info.device_class != "cpu" and info.capability < MIN_TMA_CAPABILITY:
        return None
    return kv_cache.shape[1]


def mla_decode_config(
    kv_cache: torch.Tensor, rows: int, batch: int, info: DeviceInfo | None = None
) -> MlaDecodeConfig:
    """The table's launch config `mla_decode` takes for this cache, `rows` query rows per
    request (heads x query tokens) and `batch` requests (TMA entries where the cache allows)."""
    info = info or device_info(kv_cache.device)
    return get_mla_decode_config(
        info.device_class,
        _kv_tag(kv_cache.dtype),
        rows,
        batch,
        tma_page_size=cache_tma_page_size(kv_cache, info),
    )


def _tma_descriptors(kv_cache: torch.Tensor, block_n: int, kv_lora_rank: int) -> tuple:
    """The two descriptors a TMA launch reads its key tiles through: the latent columns in
    quarters and the rope columns, over the cache as [pages * page, width]."""
    pages, page, width = kv_cache.shape
    shape, strides = [pages * page, width], [width, 1]
    return (
        TensorDescriptor(kv_cache, shape, strides, [block_n, kv_lora_rank // 4]),
        TensorDescriptor(kv_cache, shape, strides, [block_n, width - kv_lora_rank]),
    )


@dataclass(frozen=True)
class MlaCacheLayout:
    """What launches derive from an MLA cache alone, made once per cache (`mla_cache_layout`):
    callers that decode over the same cache every step (an attention backend) pass it as
    `mla_decode(..., cache_layout=...)`, which then skips the TMA checks and the descriptors'
    construction (microseconds of host time per eager call). It holds the cache: keep it
    exactly as long as the cache itself."""

    kv_cache: torch.Tensor
    tma_page_size: int | None  # `cache_tma_page_size`
    _descriptors: dict[tuple[int, int] | str, tuple] = field(
        default_factory=dict, compare=False, repr=False
    )

    def descriptors(self, block_n: int, kv_lora_rank: int) -> tuple:
        """`_tma_descriptors` of this cache (made on first use)."""
        key = (block_n, kv_lora_rank)
        descs = self._descriptors.get(key)
        if descs is None:
            descs = self._descriptors[key] = _tma_descriptors(self.kv_cache, block_n, kv_lora_rank)
        return descs

    def gluon_descriptors(self) -> tuple:
        """`mla_decode_gluon.cache_descriptors` of this cache (made on first use)."""
        descs = self._descriptors.get("gluon")
        if descs is None:
            descs = self._descriptors["gluon"] = mla_decode_gluon.cache_descriptors(self.kv_cache)
        return descs


def mla_cache_layout(kv_cache: torch.Tensor, info: DeviceInfo | None = None) -> MlaCacheLayout:
    """The `MlaCacheLayout` of a latent cache on its device (`info`: that device's)."""
    info = info or device_info(kv_cache.device)
    return MlaCacheLayout(kv_cache, cache_tma_page_size(kv_cache, info))


_SPLIT_LAUNCHER = CachedLauncher(_mla_decode_split_kernel)
_SPLIT_FP8_LAUNCHER = CachedLauncher(_mla_decode_split_fp8_kernel)
_MERGE_LAUNCHER = CachedLauncher(_mla_decode_merge_kernel)


def plan_mla_decode(
    batch: int,
    num_heads: int,
    max_seq_len: int,
    query_len: int,
    device_info: DeviceInfo,
    *,
    kv_dtype: torch.dtype = torch.bfloat16,
    config: MlaDecodeConfig | None = None,
    tma_page_size: int | None = None,
) -> tuple[int, MlaDecodeConfig]:
    """Split count and launch config for a decode step; pure host arithmetic (no GPU call).

    Splits are added until the grid holds about `num_sms * ctas_per_sm` programs (so B=1 at
    128k and B=256 at 4k both fill the GPU), but never so many that a split holds fewer than
    `min_split_keys` keys (the merge would cost more than the parallelism gains).
    `tma_page_size`: the page size of a cache TMA can read, whose TMA entry then plans (as
    `mla_decode` takes it for that cache).
    """
    rows = query_len * num_heads
    cfg = config or get_mla_decode_config(
        device_info.device_class, _kv_tag(kv_dtype), rows, batch, tma_page_size=tma_page_size
    )
    row_groups = cdiv(rows, cfg.block_m)
    programs = max(1, batch * row_groups)
    target = device_info.num_sms * cfg.ctas_per_sm
    # Rounded down: a grid already within one wave of the target gains less from another
    # split than the merge costs.
    wanted = target // programs
    useful = max(1, cdiv(max(max_seq_len, 1), cfg.min_split_keys))
    return max(1, min(wanted, useful, MAX_SPLITS)), cfg


@dataclass
class MlaDecodeWorkspace:
    """Split-KV scratch, allocated once (outside CUDA-graph capture) and reused by every call.

    `capacity_rows` is the largest `num_tokens * num_heads * num_splits` it holds; a call whose
    plan needs more is refused with a ValueError rather than allocating.
    """

    o_part: torch.Tensor  # fp32 [capacity_rows, kv_lora_rank]
    l_part: torch.Tensor  # fp32 [capacity_rows]

    @classmethod
    def allocate(
        cls,
        max_num_tokens: int,
        num_heads: int,
        max_splits: int,
        kv_lora_rank: int = 512,
        device: torch.device | str = "cuda",
    ) -> MlaDecodeWorkspace:
        """Scratch for `max_num_tokens` tokens x `num_heads` heads x `max_splits` splits."""
        rows = max(1, max_num_tokens * num_heads * max_splits)
        return cls(
            o_part=torch.empty(rows, kv_lora_rank, dtype=torch.float32, device=device),
            l_part=torch.empty(rows, dtype=torch.float32, device=device),
        )

    @classmethod
    def for_plans(
        cls,
        max_tokens: int,
        num_heads: int,
        max_seq_len: int,
        max_query_len: int = 1,
        kv_lora_rank: int = 512,
        device: torch.device | str = "cuda",
        *,
        kv_dtype: torch.dtype = torch.bfloat16,
        info: DeviceInfo | None = None,
        tma_page_size: int | None = None,
    ) -> MlaDecodeWorkspace:
        """The smallest scratch that fits every `plan_mla_decode` plan of up to `max_tokens`
        query tokens, for query lengths 1..`max_query_len`, contexts up to `max_seq_len` and
        the same `tma_page_size`.

        The planner splits small batches more, and plans for the longest context dominate the
        shorter ones (splits grow with the context), so every batch size and query length is
        walked at the longest context: host arithmetic only, and far smaller than
        `max_tokens * heads * MAX_SPLITS`.
        """
        info = info or device_info(device)
        need = 1
        for query_len in range(1, max_query_len + 1):
            for batch in range(1, max_tokens // query_len + 1):
                splits, _ = plan_mla_decode(
                    batch,
                    num_heads,
                    max_seq_len,
                    query_len,
                    info,
                    kv_dtype=kv_dtype,
                    tma_page_size=tma_page_size,
                )
                if splits > 1:
                    need = max(need, batch * query_len * num_heads * splits)
        return cls(
            o_part=torch.empty(need, kv_lora_rank, dtype=torch.float32, device=device),
            l_part=torch.empty(need, dtype=torch.float32, device=device),
        )

    @property
    def capacity_rows(self) -> int:
        return self.l_part.shape[0]


def _validate(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    kv_lora_rank: int,
    query_len: int,
    k_scale: torch.Tensor | None,
    lse_out: torch.Tensor | None,
) -> None:
    """Shape/dtype checks on metadata only (never reads device memory)."""
    if kv_lora_rank not in SUPPORTED_LATENT:
        fail(ValueError, "kv_lora_rank", f"one of {sorted(SUPPORTED_LATENT)}", kv_lora_rank)
    width = kv_lora_rank + SUPPORTED_LATENT[kv_lora_rank]
    if q.dim() != 3 or q.shape[-1] != width:
        fail(ValueError, "q", f"[num_tokens, num_heads, {width}]", f"shape {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, "q", "dtype bfloat16 or float16", q.dtype)
    if q.stride(-1) != 1:
        fail(ValueError, "q", "a contiguous last dim", f"strides {q.stride()}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width:
        fail(
            ValueError,
            "kv_cache",
            f"[num_blocks, block_size, {width}]",
            f"shape {tuple(kv_cache.shape)}",
        )
    if kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        fail(TypeError, "kv_cache", f"dtype {q.dtype} (q's) or torch.float8_e4m3fn", kv_cache.dtype)
    if kv_cache.stride(-1) != 1:
        fail(ValueError, "kv_cache", "a contiguous last dim", f"strides {kv_cache.stride()}")
    if kv_cache.dtype == torch.float8_e4m3fn and (
        kv_cache.stride(0) % 2 or kv_cache.stride(1) % 2 or kv_cache.data_ptr() % 2
    ):
        # The fp8 kernel reads the cache as 16-bit pairs of columns.
        fail(
            ValueError,
            "kv_cache",
            "a float8_e4m3fn cache with even page and token strides at an even address",
            f"strides {kv_cache.stride()}",
        )
    if kv_cache.dtype == torch.float8_e4m3fn and k_scale is None:
        fail(ValueError, "k_scale", "a 1-element float32 tensor for a float8_e4m3fn kv_cache", None)
    if k_scale is not None and (k_scale.numel() != 1 or k_scale.dtype != torch.float32):
        fail(
            ValueError,
            "k_scale",
            "a 1-element float32 tensor",
            f"{k_scale.dtype} {tuple(k_scale.shape)}",
        )
    if k_scale is not None and k_scale.device != q.device:
        fail(ValueError, "k_scale", f"a tensor on {q.device} (q's device)", k_scale.device)
    if kv_cache.device != q.device:
        fail(ValueError, "kv_cache", f"a tensor on {q.device} (q's device)", kv_cache.device)
    check_index("block_table", block_table, 2, q.device, "q")
    check_index("seq_lens", seq_lens, 1, q.device, "q")
    if not 1 <= query_len <= MAX_QUERY_LEN:
        fail(ValueError, "query_len", f"a value in [1, {MAX_QUERY_LEN}]", query_len)
    batch = seq_lens.shape[0]
    if q.shape[0] != batch * query_len:
        fail(
            ValueError,
            "q",
            f"batch * query_len = {batch} * {query_len} tokens",
            f"{q.shape[0]} tokens",
        )
    if block_table.shape[0] < batch:
        fail(ValueError, "block_table", f"at least batch = {batch} rows", block_table.shape[0])
    if out.shape != (q.shape[0], q.shape[1], kv_lora_rank) or out.stride(-1) != 1:
        fail(
            ValueError,
            "out",
            f"[{q.shape[0]}, {q.shape[1]}, {kv_lora_rank}] with a contiguous last dim",
            f"shape {tuple(out.shape)} strides {out.stride()}",
        )
    if out.device != q.device:
        fail(ValueError, "out", f"a tensor on {q.device} (q's device)", out.device)
    if lse_out is not None and (
        lse_out.shape != q.shape[:2]
        or lse_out.dtype != torch.float32
        or lse_out.stride(-1) != 1
        or lse_out.device != q.device
    ):
        fail(
            ValueError,
            "lse_out",
            f"float32 [{q.shape[0]}, {q.shape[1]}] on {q.device} with a contiguous last dim",
            f"{lse_out.dtype} {tuple(lse_out.shape)} strides {lse_out.stride()} on "
            f"{lse_out.device}",
        )


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    softmax_scale: float,
    kv_lora_rank: int,
    query_len: int = 1,
    k_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    workspace: MlaDecodeWorkspace | None = None,
    num_splits: int | None = None,
    causal: bool = True,
    max_seq_len: int | None = None,
    config: MlaDecodeConfig | None = None,
    compiled: list | None = None,
    check_inputs: bool = True,
    cache_layout: MlaCacheLayout | None = None,
) -> torch.Tensor:
    """Absorbed-query MLA decode over a paged latent cache; writes and returns `out`.

    q: [num_tokens, num_heads, kv_lora_rank + rope_dim] (request-major: token t belongs to
    request t // query_len); kv_cache: [num_blocks, block_size, kv_lora_rank + rope_dim], q's
    dtype (bf16 or fp16) or float8_e4m3fn (value = stored * k_scale); block_table: int32 [batch,
    max_blocks]; seq_lens: int32 [batch], KV length including the new tokens; out: [num_tokens,
    num_heads, kv_lora_rank]. Row j of a request sees keys [0, seq_len - query_len + j] (all
    seq_len keys when `causal=False`). A row that sees no key (seq_len 0, as on a DCP rank
    holding none of a request) gets output 0 and LSE -inf. `lse_out` (float32 [num_tokens,
    num_heads]) receives the natural-log LSE. With `workspace` and `num_splits` given, nothing
    is allocated and the host never waits on the GPU; otherwise `max_seq_len` (or, failing that,
    a host read of `seq_lens`) feeds the split planner. `config` overrides the table's launch
    config (tuning); `compiled`, when a list, receives the compiled split kernel (for
    shared/regs/spills). `check_inputs=False` skips the shape/dtype checks for callers that
    validated the same layout once (an attention backend's forward); `cache_layout`:
    `mla_cache_layout(kv_cache)`, made once by such a caller (None derives it per call).
    """
    if check_inputs:
        _validate(
            q, kv_cache, block_table, seq_lens, out, kv_lora_rank, query_len, k_scale, lse_out
        )
    if cache_layout is not None and cache_layout.kv_cache is not kv_cache:
        fail(
            ValueError,
            "cache_layout",
            "mla_cache_layout(kv_cache) of this very kv_cache",
            "the layout of another tensor",
        )
    num_tokens, num_heads, _ = q.shape
    batch = seq_lens.shape[0]
    rope_dim = SUPPORTED_LATENT[kv_lora_rank]
    if num_tokens == 0:
        return out
    info = device_info(q.device)
    if cache_layout is not None:
        tma_page_size = cache_layout.tma_page_size
    else:
        tma_page_size = cache_tma_page_size(kv_cache, info)
    if num_splits is None:
        if max_seq_len is None:
            # Host sync: callers on the hot path pass num_splits (or max_seq_len) instead.
            max_seq_len = int(seq_lens.max().item()) if batch else 0
        num_splits, _ = plan_mla_decode(
            batch, num_heads, max_seq_len, query_len, info, kv_dtype=kv_cache.dtype,
            config=config, tma_page_size=tma_page_size,
        )  # fmt: skip
    elif num_splits < 1:
        fail(ValueError, "num_splits", ">= 1", num_splits)
    rows = query_len * num_heads
    cfg = config or get_mla_decode_config(
        info.device_class, _kv_tag(kv_cache.dtype), rows, batch, tma_page_size=tma_page_size
    )
    if cfg.tma and (tma_page_size is None or tma_page_size % cfg.block_n):
        fail(
            ValueError,
            "config",
            f"tma=False for this cache (TMA needs a contiguous cache at a 16-byte address "
            f"whose page size is a multiple of block_n = {cfg.block_n}, on sm90+)",
            f"tma=True with a {kv_cache.dtype} cache of shape {tuple(kv_cache.shape)}, strides "
            f"{kv_cache.stride()} on {info.device_class}",
        )
    row_groups = cdiv(rows, cfg.block_m)
    single = num_splits == 1

    if single:
        o_part = l_part = out  # unused placeholders
        part_strides = (0, 0, 0, 0, 0)
    else:
        need = num_tokens * num_heads * num_splits
        if workspace is None:
            workspace = MlaDecodeWorkspace.allocate(
                num_tokens, num_heads, num_splits, kv_lora_rank, q.device
            )
        if workspace.capacity_rows < need or workspace.o_part.shape[1] != kv_lora_rank:
            fail(
                ValueError,
                "workspace",
                f"at least {need} rows of {kv_lora_rank} ({num_tokens} tokens x {num_heads} "
                f"heads x {num_splits} splits)",
                f"{workspace.capacity_rows} rows of {workspace.o_part.shape[1]}",
            )
        # The first `need` rows, addressed as contiguous [T, H, S, R] and [T, H, S] (no views:
        # eager launches pay host time per view op).
        o_part, l_part = workspace.o_part, workspace.l_part
        part_strides = (
            num_heads * num_splits * kv_lora_rank,
            num_splits * kv_lora_rank,
            kv_lora_rank,
            num_heads * num_splits,
            num_splits,
        )

    has_lse = lse_out is not None
    lse_arg = lse_out if has_lse else out
    has_scale = k_scale is not None
    scale_arg = k_scale if has_scale else out
    grid = (row_groups * num_splits * batch, 1, 1)
    if cfg.gluon and mla_decode_gluon.gluon_decode_supported(q, kv_cache, kv_lora_rank):
        if cache_layout is not None:
            kv_descs = cache_layout.gluon_descriptors()
        else:
            kv_descs = mla_decode_gluon.cache_descriptors(kv_cache)
        handle = mla_decode_gluon.launch_split(
            grid, q, kv_cache, kv_descs, block_table, seq_lens, (o_part, l_part, out, lse_arg),
            (block_table.stride(0), *part_strides, *out.stride()[:2],
             lse_out.stride(0) if has_lse else 0),
            (float(softmax_scale) * _LOG2E, num_heads, query_len, num_splits, row_groups),
            k_scale=k_scale, causal=causal, single=single, has_lse=has_lse,
        )  # fmt: skip
    else:  # the Triton kernel
        tensors = (q, kv_cache, block_table, seq_lens, scale_arg, o_part, l_part, out, lse_arg)
        scalars = (
            *q.stride()[:2], *kv_cache.stride()[:2], block_table.stride(0),
            *part_strides, *out.stride()[:2], lse_out.stride(0) if has_lse else 0,
            float(softmax_scale) * _LOG2E, num_heads, query_len, num_splits, row_groups,
            # constexprs, in signature order: R .. DOT_DTYPE. TMA tiles of an fp8 cache widen to
            # q's dtype (exact for e4m3) and take the 16-bit kernel: the per-tensor scale folds
            # into the scores and the output there too.
            kv_lora_rank, rope_dim, kv_cache.shape[1], cfg.block_m, cfg.block_n,
            causal, has_scale, single, has_lse,
            _dot_dtype(q, q.dtype if cfg.tma else kv_cache.dtype),
        )  # fmt: skip
        options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if kv_cache.dtype == torch.float8_e4m3fn and not cfg.tma:
            handle = _SPLIT_FP8_LAUNCHER.launch(
                grid, (*tensors, *scalars, cfg.int_widen), **options
            )
        else:
            if not cfg.tma:
                descs = (None, None)
            elif cache_layout is not None:
                descs = cache_layout.descriptors(cfg.block_n, kv_lora_rank)
            else:
                descs = _tma_descriptors(kv_cache, cfg.block_n, kv_lora_rank)
            handle = _SPLIT_LAUNCHER.launch(grid, (*tensors, *descs, *scalars, cfg.tma), **options)
    if compiled is not None:
        compiled.append(handle)
    if not single:
        block_r, block_s, merge_warps = merge_config(num_splits)
        _MERGE_LAUNCHER.launch(
            (num_tokens, num_heads, kv_lora_rank // block_r),
            (
                o_part, l_part, out, lse_arg, seq_lens,
                *part_strides, *out.stride()[:2], lse_out.stride(0) if has_lse else 0,
                num_splits, query_len,
                # constexprs: BLOCK_N, BLOCK_R, BLOCK_S, HAS_LSE
                cfg.block_n, block_r, block_s, has_lse,
            ),
            num_warps=merge_warps,
            num_stages=DEFAULT_NUM_STAGES,
        )  # fmt: skip
    return out


def mla_decode_flops(num_tokens: int, num_heads: int, context: int, kv_lora_rank: int) -> float:
    """Matrix FLOPs of one decode call: QK^T over latent+rope and P@V over the latent."""
    width = kv_lora_rank + SUPPORTED_LATENT[kv_lora_rank]
    return 2.0 * num_tokens * num_heads * context * (width + kv_lora_rank)


__all__ = [
    "MAX_SPLITS",
    "WIDE_MERGE_SPLITS",
    "MlaCacheLayout",
    "MlaDecodeWorkspace",
    "cache_tma_page_size",
    "merge_config",
    "mla_cache_layout",
    "mla_decode",
    "mla_decode_config",
    "mla_decode_flops",
    "plan_mla_decode",
]
