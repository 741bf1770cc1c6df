"""MLA decode with TMA-fed cache tiles: the 64-row bf16 tiles (128 heads; 16 heads x 4 query
tokens) and the 16-row fp8 tiles (16 heads), each beside the shipped kernel.

The shipped split kernels gather every [BLOCK_N, 576] key tile with `cp.async`: one 16-byte
copy per thread per row chunk, its addresses computed per tile. At 128 heads the bf16 kernel is
compute-bound at about a quarter of the tensor cores' rate, with the load/store pipe at 39 % and
the tensor pipe at 13 % (`h200-ncu-mla-035a69a.txt`); its 64-key tiles, 1.07-1.17x faster,
spilled (`h200-mla-wide-rows.txt`). The fp8 kernel (16 heads) reads 0.55-0.57 of copy, bound by
dependent-instruction latency at two warps per scheduler (`h200-ncu-mla-fp8-d44983a.txt`):
fewer registers would let more programs share an SM. A page of 64 tokens is one contiguous
[64, 576] block of vLLM's MLA cache, so a key tile within a page is five tensor-memory-access
copies (four latent column chunks and the rope part; fp8 tiles as 16-bit pairs of columns, as
the shipped fp8 kernel reads them): no per-thread addresses, no gather instructions. This
experiment times those kernels over tile sizes, warps, stages, the query from plain loads or a
descriptor (bf16) and zeroed page tails or not, against the shipped kernels on the same values
with the same split plan and the shipped merge, as CUDA-graph replays, beside the device copy
bandwidth and matmul rate measured in the same run. Its result (`h100-mla-decode-tma.txt`) put
the bf16 64-row TMA entry into the product (`MLA_DECODE_TMA_CONFIGS`); since then its
"shipped" rows are the table's choice, that entry included.

    python benchmarks/experiments/mla_decode_tma.py [--only SUBSTR]
    TRITON_INTERPRET=1 python benchmarks/experiments/mla_decode_tma.py --check
    python benchmarks/experiments/mla_decode_tma.py --compile-only [--capability 90]

`--check` runs one config of each kind on small shapes against the pure-torch reference (the
CPU interpreter, or the GPU) and exits. `--compile-only` compiles each
config for a GPU architecture without one and prints registers, shared memory and spills.

Bounds of the route: a tile lies within one page (BLOCK_N divides the page size), and the cache
is contiguous [pages, page, 576] (vLLM's MLA layout). A ragged last tile also reads the page's
slots past the keys. Their scores are masked, so their P is 0, but 0 x NaN is NaN: configs with
`zero_tail` zero those rows in every tile, the others need them finite (vLLM zeroes its cache
at allocation and writes finite values; the check fills them with NaN or with large finite
values accordingly).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from benchmarks.bench_mla_decode import (
    PAGE,
    Case,
    Inputs,
    P,
    R,
    W,
    graph_us,
    matmul_tflops,
    ours_fn,
)
from benchmarks.harness import copy_roofline_gbps
from vllm_blackwell_ext.kernels.mla_decode import (
    MAX_SPLITS,
    _finish_rows,
    _mla_decode_merge_kernel,
    _scaled_q,
    _softmax_step,
    _split_program,
    _store_rows,
    _widen,
    merge_config,
    mla_decode_flops,
)
from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference

LOG2E = 1.4426950408889634
K_SCALE = 0.125  # fp8 caches hold 8 x the bf16 values (as bench_mla_decode.py's)


@dataclass(frozen=True)
class TmaConfig:
    fp8: bool
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    q_tma: bool = False  # bf16: the query through a descriptor, or plain loads
    zero_tail: bool = False  # zero the slots past the keys in every tile
    max_registers: int = 0  # Triton's maxnreg (0: no cap): more programs per SM

    @property
    def tag(self) -> str:
        return (
            f"tma {'fp8' if self.fp8 else 'bf16'} m{self.block_m} n{self.block_n} "
            f"w{self.num_warps} s{self.num_stages} q_tma={int(self.q_tma)} "
            f"zero_tail={int(self.zero_tail)} maxnreg={self.max_registers or '-'}"
        )

    def launch_options(self) -> dict[str, int]:
        options = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


BF16_CONFIGS = [
    TmaConfig(False, 64, block_n, 8, stages, q_tma)
    for block_n in (32, 64)
    for stages in (1, 2, 3)
    for q_tma in (False, True)
] + [TmaConfig(False, 64, 32, 8, 2, True, zero_tail=True)]
# (block_n, warps, stages, maxnreg): 128 registers at 8 warps and 168 at 4 leave room for a
# second / third program per SM, which the shipped kernels' 160-220 do not.
FP8_CONFIGS = [
    TmaConfig(True, 16, block_n, warps, stages, zero_tail=zero_tail, max_registers=cap)
    for block_n, warps, stages, cap in (
        (32, 4, 3, 0), (32, 4, 5, 0), (32, 4, 3, 168), (32, 4, 5, 168), (64, 4, 3, 0),
        (64, 8, 3, 0), (64, 8, 5, 0), (64, 8, 3, 128), (64, 8, 5, 128), (128, 8, 3, 0),
    )
    for zero_tail in (False, True)
]  # fmt: skip


# ----------------------------------------------------------------------------- kernels ----


@triton.jit(do_not_specialize=["query_len", "num_splits", "num_row_groups"])
def _mla_tma_kernel(
    Q, q_desc, qr_desc, kl_desc, kr_desc, BT, SEQ, O_PART, L_PART, OUT, LSE,
    stride_qt, stride_qh, stride_bt, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_ot, stride_oh, stride_lse_t, qk_scale_log2, num_heads, query_len, num_splits,
    num_row_groups,
    R: tl.constexpr, P: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_LSE: tl.constexpr, Q_TMA: tl.constexpr, ZERO_TAIL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """The shipped 16-bit split kernel with each key tile read by five TMA copies."""
    DC: tl.constexpr = R // 4
    b, split, seq_len, row_ok, head, tok, limit, start, end = _split_program(
        SEQ, num_heads, query_len, num_splits, num_row_groups, BLOCK_M, BLOCK_N, CAUSAL
    )
    if not SINGLE_SPLIT:
        if start >= seq_len:
            return
    offs_c = tl.arange(0, DC)
    if Q_TMA:
        # Rows of a contiguous [T, H, W] query as [T * H, W]: this program's first row.
        q_row0 = b * query_len * num_heads + tl.program_id(0) % num_row_groups * BLOCK_M
        q0 = q_desc.load([q_row0, 0]).to(DOT_DTYPE)
        q1 = q_desc.load([q_row0, DC]).to(DOT_DTYPE)
        q2 = q_desc.load([q_row0, 2 * DC]).to(DOT_DTYPE)
        q3 = q_desc.load([q_row0, 3 * DC]).to(DOT_DTYPE)
        qp = qr_desc.load([q_row0, R]).to(DOT_DTYPE)
    else:
        offs_p = tl.arange(0, P)
        qrow = Q + (tok.to(tl.int64) * stride_qt + head * stride_qh)[:, None]
        qm = row_ok[:, None]
        q0 = tl.load(qrow + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        q1 = tl.load(qrow + DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        q2 = tl.load(qrow + 2 * DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        q3 = tl.load(qrow + 3 * DC + offs_c[None, :], mask=qm, other=0.0).to(DOT_DTYPE)
        qp = tl.load(qrow + R + offs_p[None, :], mask=qm, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        row = tl.load(bt_row + n0 // PAGE_SIZE) * PAGE_SIZE + n0 % PAGE_SIZE
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        k0 = kl_desc.load([row, 0]).to(DOT_DTYPE)
        k1 = kl_desc.load([row, DC]).to(DOT_DTYPE)
        k2 = kl_desc.load([row, 2 * DC]).to(DOT_DTYPE)
        k3 = kl_desc.load([row, 3 * DC]).to(DOT_DTYPE)
        kr = kr_desc.load([row, R]).to(DOT_DTYPE)
        if ZERO_TAIL:
            k0 = tl.where(n_ok[:, None], k0, 0.0)
            k1 = tl.where(n_ok[:, None], k1, 0.0)
            k2 = tl.where(n_ok[:, None], k2, 0.0)
            k3 = tl.where(n_ok[:, None], k3, 0.0)
            kr = tl.where(n_ok[:, None], kr, 0.0)
        s = tl.dot(q0, tl.trans(k0))
        s = tl.dot(q1, tl.trans(k1), s)
        s = tl.dot(q2, tl.trans(k2), s)
        s = tl.dot(q3, tl.trans(k3), s)
        s = tl.dot(qp, tl.trans(kr), s)
        p, alpha, m_i, l_i = _softmax_step(s * qk_scale_log2, m_i, l_i, offs_n, n_ok, limit)
        pd = p.to(DOT_DTYPE)
        acc0 = tl.dot(pd, k0, acc0 * alpha[:, None])
        acc1 = tl.dot(pd, k1, acc1 * alpha[:, None])
        acc2 = tl.dot(pd, k2, acc2 * alpha[:, None])
        acc3 = tl.dot(pd, k3, acc3 * alpha[:, None])

    dst, row_off, inv_l = _finish_rows(
        m_i, l_i, 1.0, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
        stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
        stride_lse_t, False, SINGLE_SPLIT, HAS_LSE,
    )  # fmt: skip
    _store_rows(dst, row_off, offs_c, acc0 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + DC, offs_c, acc1 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 2 * DC, offs_c, acc2 * inv_l[:, None], row_ok)
    _store_rows(dst, row_off + 3 * DC, offs_c, acc3 * inv_l[:, None], row_ok)


@triton.jit(do_not_specialize=["query_len", "num_splits", "num_row_groups"])
def _mla_fp8_tma_kernel(
    Q, xl_desc, xr_desc, BT, SEQ, KSCALE, O_PART, L_PART, OUT, LSE,
    stride_qt, stride_qh, stride_bt, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_ot, stride_oh, stride_lse_t, qk_scale_log2, num_heads, query_len, num_splits,
    num_row_groups,
    R: tl.constexpr, P: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_LSE: tl.constexpr, ZERO_TAIL: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """The shipped fp8 split kernel (16-bit pairs of columns, widened in registers) with each
    key tile read by five TMA copies of pairs."""
    HC: tl.constexpr = R // 8
    HP: tl.constexpr = P // 2
    b, split, seq_len, row_ok, head, tok, limit, start, end = _split_program(
        SEQ, num_heads, query_len, num_splits, num_row_groups, BLOCK_M, BLOCK_N, CAUSAL
    )
    if not SINGLE_SPLIT:
        if start >= seq_len:
            return
    offs_h = tl.arange(0, HC)
    offs_hp = tl.arange(0, HP)
    qm = row_ok[:, None]
    k_scale = tl.load(KSCALE)
    scale = qk_scale_log2 * k_scale
    qe = Q + (tok.to(tl.int64) * stride_qt + head * stride_qh)[:, None] + 2 * offs_h[None, :]
    qre = Q + (tok.to(tl.int64) * stride_qt + head * stride_qh)[:, None] + R + 2 * offs_hp[None, :]
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
    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        row = tl.load(bt_row + n0 // PAGE_SIZE) * PAGE_SIZE + n0 % PAGE_SIZE
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        x0 = xl_desc.load([row, 0])
        x1 = xl_desc.load([row, HC])
        x2 = xl_desc.load([row, 2 * HC])
        x3 = xl_desc.load([row, 3 * HC])
        xr = xr_desc.load([row, 4 * HC])
        if ZERO_TAIL:
            x0 = tl.where(n_ok[:, None], x0, 0)
            x1 = tl.where(n_ok[:, None], x1, 0)
            x2 = tl.where(n_ok[:, None], x2, 0)
            x3 = tl.where(n_ok[:, None], x3, 0)
            xr = tl.where(n_ok[:, None], xr, 0)
        s = tl.dot(q0e, tl.trans(_widen(x0, 0, DOT_DTYPE)))
        s = tl.dot(q0o, tl.trans(_widen(x0, 1, DOT_DTYPE)), s)
        s = tl.dot(q1e, tl.trans(_widen(x1, 0, DOT_DTYPE)), s)
        s = tl.dot(q1o, tl.trans(_widen(x1, 1, DOT_DTYPE)), s)
        s = tl.dot(q2e, tl.trans(_widen(x2, 0, DOT_DTYPE)), s)
        s = tl.dot(q2o, tl.trans(_widen(x2, 1, DOT_DTYPE)), s)
        s = tl.dot(q3e, tl.trans(_widen(x3, 0, DOT_DTYPE)), s)
        s = tl.dot(q3o, tl.trans(_widen(x3, 1, DOT_DTYPE)), s)
        s = tl.dot(qre_, tl.trans(_widen(xr, 0, DOT_DTYPE)), s)
        s = tl.dot(qro_, tl.trans(_widen(xr, 1, DOT_DTYPE)), s)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, offs_n, n_ok, limit)
        pd = p.to(DOT_DTYPE)
        acc0e = tl.dot(pd, _widen(x0, 0, DOT_DTYPE), acc0e * alpha[:, None])
        acc0o = tl.dot(pd, _widen(x0, 1, DOT_DTYPE), acc0o * alpha[:, None])
        acc1e = tl.dot(pd, _widen(x1, 0, DOT_DTYPE), acc1e * alpha[:, None])
        acc1o = tl.dot(pd, _widen(x1, 1, DOT_DTYPE), acc1o * alpha[:, None])
        acc2e = tl.dot(pd, _widen(x2, 0, DOT_DTYPE), acc2e * alpha[:, None])
        acc2o = tl.dot(pd, _widen(x2, 1, DOT_DTYPE), acc2o * alpha[:, None])
        acc3e = tl.dot(pd, _widen(x3, 0, DOT_DTYPE), acc3e * alpha[:, None])
        acc3o = tl.dot(pd, _widen(x3, 1, DOT_DTYPE), acc3o * alpha[:, None])

    dst, row_off, inv_l = _finish_rows(
        m_i, l_i, k_scale, split, row_ok, head, tok, O_PART, L_PART, OUT, LSE,
        stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
        stride_lse_t, True, SINGLE_SPLIT, HAS_LSE,
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


# ------------------------------------------------------------------------------ launch ----


class TmaMla:
    """A TMA kernel (and, with splits, the shipped merge) on fixed inputs, as a callable."""

    def __init__(self, q, cache, block_table, seq_lens, query_len, num_splits, cfg, k_scale):
        tokens, heads, width = q.shape
        pages, page_size, _ = cache.shape
        if width != W or page_size % cfg.block_n or not cache.is_contiguous():
            raise ValueError("needs a contiguous [pages, page, 576] cache and tiles within a page")
        if not q.is_contiguous():
            raise ValueError("needs a contiguous query")
        rows = pages * page_size
        if cfg.fp8:
            # 16-bit pairs of columns, as the shipped fp8 kernel reads them
            flat = cache.view(torch.uint16).view(rows, W // 2)
            self.descs = (
                TensorDescriptor(flat, [rows, W // 2], [W // 2, 1], [cfg.block_n, R // 8]),
                TensorDescriptor(flat, [rows, W // 2], [W // 2, 1], [cfg.block_n, P // 2]),
            )
        else:
            flat = cache.view(rows, W)
            q2d = q.view(tokens * heads, W)
            self.descs = (
                TensorDescriptor(q2d, [tokens * heads, W], [W, 1], [cfg.block_m, R // 4]),
                TensorDescriptor(q2d, [tokens * heads, W], [W, 1], [cfg.block_m, P]),
                TensorDescriptor(flat, [rows, W], [W, 1], [cfg.block_n, R // 4]),
                TensorDescriptor(flat, [rows, W], [W, 1], [cfg.block_n, P]),
            )
        self.q, self.block_table, self.seq_lens, self.k_scale = q, block_table, seq_lens, k_scale
        self.query_len, self.num_splits, self.cfg, self.page_size = (
            query_len,
            num_splits,
            cfg,
            page_size,
        )
        f32 = {"dtype": torch.float32, "device": q.device}
        self.out = torch.empty(tokens, heads, R, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(tokens, heads, **f32)
        self.o_part = torch.empty(tokens, heads, num_splits, R, **f32)
        self.l_part = torch.empty(tokens, heads, num_splits, **f32)
        self.row_groups = triton.cdiv(query_len * heads, cfg.block_m)
        on_cpu = q.device.type == "cpu"  # the interpreter's 16-bit dots are not exact
        self.dot_dtype = tl.float32 if on_cpu else (tl.float16 if cfg.fp8 else tl.bfloat16)
        self.compiled = None

    def __call__(self) -> torch.Tensor:
        q, cfg, splits = self.q, self.cfg, self.num_splits
        tokens, heads, _ = q.shape
        single = splits == 1
        part = (0,) * 5 if single else (*self.o_part.stride()[:3], *self.l_part.stride()[:2])
        grid = (self.row_groups * splits * self.seq_lens.shape[0],)
        common = (
            self.block_table.stride(0), *part, *self.out.stride()[:2], self.lse.stride(0),
            W**-0.5 * LOG2E, heads, self.query_len, splits, self.row_groups,
        )  # fmt: skip
        consts = dict(
            R=R, P=P, PAGE_SIZE=self.page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=True, SINGLE_SPLIT=single, HAS_LSE=True, ZERO_TAIL=cfg.zero_tail,
            DOT_DTYPE=self.dot_dtype, **cfg.launch_options(),
        )  # fmt: skip
        tensors = (self.block_table, self.seq_lens)
        outs = (self.o_part, self.l_part, self.out, self.lse)
        if cfg.fp8:
            self.compiled = _mla_fp8_tma_kernel[grid](
                q, *self.descs, *tensors, self.k_scale, *outs, *q.stride()[:2], *common,
                **consts,
            )  # fmt: skip
        else:
            self.compiled = _mla_tma_kernel[grid](
                q, *self.descs, *tensors, *outs, *q.stride()[:2], *common, Q_TMA=cfg.q_tma,
                **consts,
            )  # fmt: skip
        if not single:
            block_r, block_s, warps = merge_config(splits)
            _mla_decode_merge_kernel[(tokens, heads, R // block_r)](
                self.o_part, self.l_part, self.out, self.lse, self.seq_lens,
                *part, *self.out.stride()[:2], self.lse.stride(0), splits, self.query_len,
                BLOCK_N=cfg.block_n, BLOCK_R=block_r, BLOCK_S=block_s, HAS_LSE=True,
                num_warps=warps,
            )  # fmt: skip
        return self.out


# ------------------------------------------------------------------------------- check ----


def _small_inputs(batch, heads, ctx, query_len, fp8, device, seed=0):
    """A shuffled block table over a few spare pages; fp8 caches hold 8 x the values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    per_seq = triton.cdiv(ctx, PAGE)
    pages = batch * per_seq + 3
    cache = torch.randn(pages, PAGE, W, generator=g)
    cache = (cache / K_SCALE).to(torch.float8_e4m3fn) if fp8 else cache.to(torch.bfloat16)
    perm = torch.randperm(pages, generator=g)[: batch * per_seq]
    block_table = perm.view(batch, per_seq).to(torch.int32)
    q = torch.randn(batch * query_len, heads, W, generator=g).to(torch.bfloat16)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32)
    return q.to(device), cache.to(device), block_table.to(device), seq_lens.to(device)


def _fill_tail(cache, block_table, ctx, nan: bool) -> None:
    """The slots past each request's keys in its last page: NaN, or the largest finite value."""
    last = block_table[:, (ctx - 1) // PAGE].long()
    if cache.dtype == torch.float8_e4m3fn:
        raw = cache.view(torch.uint8)
        raw[last, ctx % PAGE or PAGE :] = 0x7F if nan else 0x7E  # e4m3 NaN / 448
    else:
        cache[last, ctx % PAGE or PAGE :] = float("nan") if nan else 1e4


def check() -> None:
    """Variants against the reference on small shapes: ragged ends, several splits, causal
    rows of several query tokens, 64-row tiles over two row groups."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = [
        # batch, heads, ctx, query_len, splits
        (2, 128, 150, 1, 1),
        (2, 16, 100, 4, 2),
        (1, 64, 64, 1, 3),
        (3, 16, 37, 4, 1),
        (2, 16, 300, 1, 3),
        (3, 16, 37, 1, 1),
    ]
    # One config of each kind (the interpreter ignores warps, stages and register caps; on a
    # GPU each compile takes seconds, and the bench compares every config with the shipped
    # kernel at real sizes anyway).
    configs = [TmaConfig(False, 64, 32, 8, 2, q_tma, zt) for q_tma in (0, 1) for zt in (0, 1)]
    configs += [TmaConfig(False, 64, 64, 8, 2, True)]
    configs += [TmaConfig(True, 16, 64, 8, 3, zero_tail=zt) for zt in (0, 1)]
    configs += [TmaConfig(True, 16, 32, 4, 5, max_registers=168)]
    k_scale = torch.tensor([K_SCALE], device=device)
    failures = 0
    for batch, heads, ctx, qlen, splits in shapes:
        for fp8 in (False, True):
            kinds = [c for c in configs if c.fp8 == fp8 and (fp8 or heads * qlen >= 64)]
            if fp8 and heads * qlen > 16:
                continue  # the fp8 kernel here takes 16-row tiles
            q, cache, bt, seq = _small_inputs(batch, heads, ctx, qlen, fp8, device)
            ref, ref_lse = mla_decode_reference(
                q, cache, bt, seq, softmax_scale=W**-0.5, kv_lora_rank=R, query_len=qlen,
                k_scale=K_SCALE if fp8 else None,
            )  # fmt: skip
            for cfg in kinds:
                _fill_tail(cache, bt, ctx, nan=cfg.zero_tail)
                fn = TmaMla(q, cache, bt, seq, qlen, splits, cfg, k_scale)
                out = fn().float().cpu()
                ok = torch.allclose(out, ref, atol=2e-2, rtol=2e-2)
                lse_err = (fn.lse.cpu() - ref_lse).abs().max().item()
                ok = ok and lse_err <= 1e-3
                failures += not ok
                print(
                    f"check B={batch} h={heads} ctx={ctx} q_len={qlen} splits={splits} "
                    f"{cfg.tag}: max|out err| {(out - ref).abs().max().item():.2e} "
                    f"max|lse err| {lse_err:.2e} {'ok' if ok else 'FAIL'}",
                    flush=True,
                )
    if failures:
        raise SystemExit(f"{failures} variant(s) off the reference")


# ------------------------------------------------------------------------------- bench ----

CASES = [
    # name, heads, batch, ctx, query_len, fp8
    ("h128 bf16 B=64 ctx=32k", 128, 64, 32768, 1, False),
    ("h128 bf16 B=8 ctx=32k", 128, 8, 32768, 1, False),
    ("h64 bf16 B=64 ctx=32k", 64, 64, 32768, 1, False),
    ("h16 bf16 q_len=4 B=64 ctx=32k", 16, 64, 32768, 4, False),
    ("h32 bf16 q_len=4 B=64 ctx=32k", 32, 64, 32768, 4, False),
    ("h16 fp8 B=64 ctx=32k", 16, 64, 32768, 1, True),
    ("h16 fp8 B=8 ctx=128k", 16, 8, 131072, 1, True),
    ("h16 fp8 B=256 ctx=4k", 16, 256, 4096, 1, True),
    ("h16 fp8 B=1 ctx=128k", 16, 1, 131072, 1, True),
]


def bench(only: str) -> None:
    copy = copy_roofline_gbps("cuda")
    matmul = matmul_tflops()
    print(f"copy {copy:.0f} GB/s, matmul {matmul:.0f} TFLOP/s (bf16 8192^3), same run", flush=True)
    k_scale = torch.tensor([K_SCALE], device="cuda")
    # One page pool per cache dtype for every case, each case a shuffled subset of it.
    pages = max(batch * ctx // PAGE for _, _, batch, ctx, _, _ in CASES) + 3
    pools: dict[bool, torch.Tensor] = {}
    for name, heads, batch, ctx, qlen, fp8 in CASES:
        if only not in name:
            continue
        if fp8 not in pools:
            pool = torch.randn(pages, PAGE, W, device="cuda", dtype=torch.bfloat16)
            pools[fp8] = (pool * 8).to(torch.float8_e4m3fn) if fp8 else pool
            del pool
        cache = pools[fp8]
        perm = torch.randperm(pages, device="cuda")[: batch * (ctx // PAGE)]
        bt = perm.view(batch, ctx // PAGE).to(torch.int32)
        q = torch.randn(batch * qlen, heads, W, device="cuda", dtype=torch.bfloat16)
        seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        scale = k_scale if fp8 else None
        # The shipped kernel with its split plan, which every variant below takes too.
        compiled: list = []
        shipped = ours_fn(
            Case(name, heads, batch, ctx, fp8, qlen), Inputs(q, cache, bt, seq, scale),
            compiled=compiled,
        )  # fmt: skip
        us = graph_us(shipped)
        ref, h = shipped.out.float(), compiled[0]
        splits, cfg0 = shipped.splits, shipped.cfg

        # fp8 rows against the copy bandwidth in fp8 bytes, bf16 rows against the matmul rate
        if fp8:
            work, unit, bound, of = batch * ctx * W / 1e3, "GB/s", copy, "copy"
        else:
            work = mla_decode_flops(batch * qlen, heads, ctx, R) / 1e6
            unit, bound, of = "TFLOP/s", matmul, "matmul"
        print(
            f"{name}: shipped m{cfg0.block_m} n{cfg0.block_n} w{cfg0.num_warps} "
            f"s{cfg0.num_stages} splits={splits} {us:8.1f} us {work / us:7.1f} {unit} "
            f"{work / us / bound:.3f} of {of} "
            f"regs={h.n_regs} spills={h.n_spills}",
            flush=True,
        )
        rows = heads * qlen
        configs = [c for c in (FP8_CONFIGS if fp8 else BF16_CONFIGS) if c.block_m <= max(rows, 16)]
        # More programs per SM want more splits: fp8 rows also try 2x and 3x the plan's.
        split_counts = sorted({min(splits * m, MAX_SPLITS) for m in ((1, 2, 3) if fp8 else (1,))})
        for cfg in configs:
            for n_splits in split_counts:
                try:
                    fn = TmaMla(q, cache, bt, seq, qlen, n_splits, cfg, k_scale)
                    us = graph_us(fn)
                except Exception as e:  # a config that does not compile or fit: say so, go on
                    print(f"{name}: {cfg.tag}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    break
                diff = (fn.out.float() - ref).abs().max().item()
                c = fn.compiled
                print(
                    f"{name}: {cfg.tag} splits={n_splits} {us:8.1f} us {work / us:7.1f} {unit} "
                    f"{work / us / bound:.3f} of {of} "
                    f"regs={c.n_regs} spills={c.n_spills} shared={c.metadata.shared} "
                    f"max|diff vs shipped| {diff:.1e}",
                    flush=True,
                )
                del fn


# ------------------------------------------------------------------------------ offline ----


def compile_only(capability: int) -> None:
    """Each config compiled offline for `capability`: registers, shared memory, spills."""
    from benchmarks.offline_compile import compile_offline

    print(f"# triton {triton.__version__}, offline compile for sm{capability}", flush=True)
    ints = (
        "stride_qt", "stride_qh", "stride_bt", "stride_pt", "stride_ph", "stride_ps",
        "stride_lt", "stride_lh", "stride_ot", "stride_oh", "stride_lse_t", "num_heads",
        "query_len", "num_splits", "num_row_groups",
    )  # fmt: skip
    # What launches specialise on: 16-byte pointers, strides that are multiples of 16.
    aligned = ("Q", "OUT", "BT", "SEQ", "O_PART", "L_PART", "LSE", "stride_qt", "stride_qh")
    aligned += ("stride_ot", "stride_oh", "stride_pt", "stride_ph", "stride_ps")
    for single in (True, False):
        for cfg in BF16_CONFIGS + FP8_CONFIGS:
            consts = dict(
                R=R, P=P, PAGE_SIZE=PAGE, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CAUSAL=True, SINGLE_SPLIT=single, HAS_LSE=True, ZERO_TAIL=cfg.zero_tail,
                DOT_DTYPE=tl.float16 if cfg.fp8 else tl.bfloat16,
            )  # fmt: skip
            sig = {"Q": "*bf16", "OUT": "*bf16", "BT": "*i32", "SEQ": "*i32"}
            sig |= {n: "*fp32" for n in ("O_PART", "L_PART", "LSE")}
            sig |= {n: "i32" for n in ints} | {"qk_scale_log2": "fp32"}
            if cfg.fp8:
                kernel = _mla_fp8_tma_kernel
                sig["KSCALE"] = "*fp32"
                sig["xl_desc"] = f"tensordesc<u16[{cfg.block_n},{R // 8}]>"
                sig["xr_desc"] = f"tensordesc<u16[{cfg.block_n},{P // 2}]>"
            else:
                kernel = _mla_tma_kernel
                consts["Q_TMA"] = cfg.q_tma
                sig["q_desc"] = f"tensordesc<bf16[{cfg.block_m},{R // 4}]>"
                sig["qr_desc"] = f"tensordesc<bf16[{cfg.block_m},{P}]>"
                sig["kl_desc"] = f"tensordesc<bf16[{cfg.block_n},{R // 4}]>"
                sig["kr_desc"] = f"tensordesc<bf16[{cfg.block_n},{P}]>"
            tag = f"{cfg.tag} {'single' if single else 'split'}"
            try:
                stats = compile_offline(
                    kernel, sig, consts, aligned, capability,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                    max_registers=cfg.max_registers,
                )  # fmt: skip
            except Exception as e:  # the compiler's refusal is the finding
                print(f"{tag}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            print(f"{tag}: {stats}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--check", action="store_true", help="correctness on small shapes only")
    ap.add_argument("--compile-only", action="store_true", help="offline compile facts only")
    ap.add_argument("--capability", type=int, default=90, help="with --compile-only")
    args = ap.parse_args()
    if args.check:
        check()
        return
    if args.compile_only:
        compile_only(args.capability)
        return
    gpu = torch.cuda.get_device_name()
    print(f"# torch {torch.__version__}, triton {triton.__version__}, {gpu}")
    bench(args.only)


if __name__ == "__main__":
    main()
