"""The split-KV merge kernel: combines the partial outputs and log2-sum-exps of a split launch
(launches of more splits than the main kernel merges itself) (jit code only)."""

from __future__ import annotations

import triton
import triton.language as tl


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
