"""Experiment: launch configs of the MLA split merge, two-pass (the merge before 2026-12-03)
against one pass with a running maximum (the candidate that became `_mla_decode_merge_kernel`).

H200 run: `benchmarks/results/h200-mla-merge-variants.txt` ("cur" = two-pass). Each case
merges random partials of 16 heads; err is the max difference to the two-pass 128 x 16 result.

    python benchmarks/experiments/mla_merge_variants.py
"""

import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.bench_mla_decode import graph_us  # noqa: E402


@triton.jit(do_not_specialize=["num_splits", "stride_lt", "stride_lh"])
def two_pass_merge(
    O_PART,  # fp32 [T, H, S, R]
    L_PART,  # fp32 [T, H, S]
    OUT,  # [T, H, R]
    LSE,  # fp32 [T, H]
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_lse_t,
    num_splits,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    # One program per (token, head, column chunk), splits read BLOCK_S at a time: one long
    # request can have hundreds of splits, and a split-serial loop would be latency-bound.
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_r = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    l_base = L_PART + t * stride_lt + h * stride_lh
    p_base = O_PART + t * stride_pt + h * stride_ph

    # Pass 1: the largest split LSE, so the weights below never overflow.
    m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        ls = tl.load(l_base + s0 + offs_s, mask=s0 + offs_s < num_splits, other=float("-inf"))
        m = tl.maximum(m, ls)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    # Pass 2: weight each split's normalised output by 2^(lse_s - max); empty splits weigh 0.
    den = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = s0 + offs_s < num_splits
        w = tl.exp2(tl.load(l_base + s0 + offs_s, mask=s_ok, other=float("-inf")) - m_safe)
        o = tl.load(
            p_base + (s0 + offs_s)[:, None] * stride_ps + offs_r[None, :],
            mask=s_ok[:, None],
            other=0.0,
        )
        acc += tl.sum(w[:, None] * o, 0)
        den += w
    total = tl.sum(den, 0)
    has_keys = total > 0.0
    inv = tl.where(has_keys, 1.0 / tl.where(has_keys, total, 1.0), 0.0)
    tl.store(OUT + t * stride_ot + h * stride_oh + offs_r, (acc * inv).to(OUT.dtype.element_ty))
    if HAS_LSE:
        if chunk == 0:
            lse2 = tl.where(
                has_keys, m_safe + tl.log2(tl.where(has_keys, total, 1.0)), -float("inf")
            )
            tl.store(LSE + t * stride_lse_t + h, lse2 * 0.6931471805599453)


@triton.jit(do_not_specialize=["num_splits", "stride_lt", "stride_lh"])
def merge1(
    O_PART,
    L_PART,
    OUT,
    LSE,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_lse_t,
    num_splits,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    # one pass, online rescale
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_r = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    l_base = L_PART + t * stride_lt + h * stride_lh
    p_base = O_PART + t * stride_pt + h * stride_ph
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    den = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = s0 + offs_s < num_splits
        ls = tl.load(l_base + s0 + offs_s, mask=s_ok, other=float("-inf"))
        o = tl.load(
            p_base + (s0 + offs_s)[:, None] * stride_ps + offs_r[None, :],
            mask=s_ok[:, None],
            other=0.0,
        )
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


def run_merge(kern, o_part, l_part, out, splits, block_r, block_s, warps, stages=3):
    T, H = out.shape[:2]
    ps = (o_part.stride(0), o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1))
    kern[(T, H, 512 // block_r)](
        o_part,
        l_part,
        out,
        out,
        *ps,
        out.stride(0),
        out.stride(1),
        0,
        splits,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        HAS_LSE=False,
        num_warps=warps,
        num_stages=stages,
    )


def main():
    for T, splits in [(1, 256), (1, 132), (1, 32), (8, 33), (64, 4), (64, 2)]:
        H = 16
        o_part = torch.randn(T, H, splits, 512, device="cuda")
        l_part = torch.randn(T, H, splits, device="cuda") * 4
        ref = torch.empty(T, H, 512, device="cuda", dtype=torch.bfloat16)
        run_merge(two_pass_merge, o_part, l_part, ref, splits, 128, 16, 4)
        mb = o_part.numel() * 4 / 1e6
        for name, kern in [("cur", two_pass_merge), ("onepass", merge1)]:
            for br, bs, w in [
                (128, 16, 4),
                (64, 16, 4),
                (32, 16, 2),
                (64, 32, 4),
                (32, 32, 4),
                (128, 32, 8),
                (16, 64, 2),
            ]:
                out = torch.empty_like(ref)
                run_merge(kern, o_part, l_part, out, splits, br, bs, w)
                err = (out.float() - ref.float()).abs().max().item()
                us = graph_us(
                    functools.partial(run_merge, kern, o_part, l_part, out, splits, br, bs, w)
                )
                print(
                    f"T={T:3d} splits={splits:3d} ({mb:5.1f} MB) {name:8s} BR={br:3d} BS={bs:2d} "
                    f"w={w} {us:6.1f} us {mb / us * 1e3:6.0f} GB/s err={err:.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
