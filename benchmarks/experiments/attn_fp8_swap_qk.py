"""fp8 decode with S^T = K Q^T on fp8 wgmma (keys as the MMA's M): an H200 experiment.

A variant of `kernels/paged_attention._paged_attn_kernel` for 1-byte caches: the query is
split into two e4m3 terms (hi + lo / 16, exact for a bf16 query), so QK^T multiplies the cache
tile as stored (no widening, no registers for a converted copy); P @ V stays as shipped. It
ran exact to the shipped kernel (max |diff| 1e-4) and 3-15% faster, still 0.37-0.63 of copy
with ~210 registers per thread (two programs per SM): `h200-attn-fp8-decode-configs.txt`.
Not adopted: a 2-5% smaller gain came from the stage count alone, and Triton's interpreter
converts fp32 to e4m3 differently from the GPU, so the CPU tests could not check this path.

Its kernel takes the place of the shipped one in `paged_attention`'s launch, so it runs
against the launch arguments of the commit it was written at (later kernels take more, and
its launches then fail with "args must hold all ... parameters"):

    git checkout 035a69a && python benchmarks/experiments/attn_fp8_swap_qk.py
"""

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import triton
import triton.language as tl


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


# Ints that change from batch to batch (request count, split count and the partial-LSE strides
# that follow it) are runtime values, not specialised on: eager mixed batches in vLLM bring any
# of them at any time, and each new specialisation would compile (about a second on an H200)
# in the middle of serving. The block-table row stride (pages per request, from the engine's
# max_model_len) is read once per program: not specialised either, so a JIT warm-up on scratch
# compiles exactly the variant the engine launches.
@triton.jit(do_not_specialize=["batch", "num_splits", "stride_plt", "stride_plh", "stride_bt"])
def _paged_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    part_o_ptr,
    part_lse_ptr,
    sink_ptr,
    k_scale_ptr,
    v_scale_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    block_table_ptr,
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
    GQA: tl.constexpr,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    HEAD_K_PAD: tl.constexpr,
    HEAD_V_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT_KV: tl.constexpr,  # num_splits > 1: partials to scratch, merged by the next kernel
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_KV_SCALE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    DOT_MODE: tl.constexpr,  # 2 (fp8 cache): the only mode this experiment runs
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

    offs_m = tl.arange(0, BLOCK_M)
    q_local = q_block * BLOCK_Q + offs_m // GQA
    head = kv_head * GQA + offs_m % GQA
    # Rows past BLOCK_Q * GQA exist only when GQA is not a power of 2: padding, never stored.
    row_ok = (offs_m < BLOCK_Q * GQA) & (q_local < q_len)
    q_pos = ctx_len + q_local  # absolute position of each row's query token
    tok = (q_start + q_local).to(tl.int64)

    offs_dk = tl.arange(0, HEAD_K_PAD)
    offs_dv = tl.arange(0, HEAD_V_PAD)
    dk_ok = offs_dk < HEAD_K
    dv_ok = offs_dv < HEAD_V

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
        # The variant: q as two e4m3 terms (q = hi + lo / 16, exact for a bf16 query) so
        # that QK^T runs fp8 x fp8 on wgmma with the keys as M, the cache tile read as is.
        qf = q.to(tl.float32)
        amax = tl.max(tl.max(tl.abs(qf), 1), 0)
        q_mul = tl.exp2(8.0 - tl.where(amax > 0.0, tl.ceil(tl.log2(amax)), 0.0))
        qs = qf * q_mul
        q = qs.to(tl.float8e4nv)
        q_lo = ((qs - q.to(tl.float32)) * 16.0).to(tl.float8e4nv)
        qk_scale = qk_scale / q_mul
    if not USE_SOFTCAP:
        qk_scale = qk_scale * 1.4426950408889634  # work in log2 units: exp2 is the fast path

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_V_PAD], dtype=tl.float32)

    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt
    offs_t = tl.arange(0, TILE_N)
    q_t = tl.trans(q)
    q_lo_t = tl.trans(q_lo)
    for j in range(tile_lo, tile_hi):
        key_pos = j * TILE_N + offs_t
        key_ok = key_pos < k_hi
        page = tl.load(bt_row + key_pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        slot = key_pos % BLOCK_SIZE
        k = tl.load(
            k_ptr
            + page[:, None] * stride_kb
            + slot[:, None] * stride_ks
            + kv_head * stride_kh
            + offs_dk[None, :],
            mask=key_ok[:, None] & dk_ok[None, :],
            other=0.0,
        )
        # keys as the MMA's M: S^T = K Q^T, fp8 x fp8 on wgmma, q as two e4m3 terms
        st_lo = tl.dot(k, q_lo_t)
        st = tl.dot(k, q_t, st_lo * 0.0625) * qk_scale
        visible = row_ok[None, :] & key_ok[:, None]
        if CAUSAL:
            visible = visible & (key_pos[:, None] <= q_pos[None, :])
        st = tl.where(visible, st, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pt = tl.exp2(st - m_safe[None, :])
        l_i = l_i * alpha + tl.sum(pt, 0)
        v = tl.load(
            v_ptr
            + page[:, None] * stride_vb
            + slot[:, None] * stride_vs
            + kv_head * stride_vh
            + offs_dv[None, :],
            mask=key_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None]
        acc = tl.dot(tl.trans(pt.to(tl.float16)), v.to(tl.float16), acc)
        m_i = m_new

    if USE_KV_SCALE:
        acc = acc * tl.load(v_scale_ptr)

    if not SPLIT_KV:
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
    else:
        # Partial: normalised output and log2-sum-exp of this segment (empty: 0 and -inf).
        l_div = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_div[:, None]
        part_lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_div))
        base = tok * stride_pt + head * stride_ph + split * stride_ps
        tl.store(
            part_o_ptr + base[:, None] + offs_dv[None, :],
            o,
            mask=row_ok[:, None] & dv_ok[None, :],
        )
        tl.store(part_lse_ptr + tok * stride_plt + head * stride_plh + split, part_lse, mask=row_ok)


def main() -> None:
    import vllm_blackwell_ext.kernels.paged_attention as pa
    from benchmarks.bench_paged_attention import HKV, Case, Inputs, figure, graph_us, ours_fn
    from benchmarks.harness import copy_roofline_gbps
    from vllm_blackwell_ext.kernels.device import device_info
    from vllm_blackwell_ext.kernels.launch_cache import CachedLauncher

    shipped_launcher = pa._ATTN_LAUNCHER
    swap_launcher = CachedLauncher(_paged_attn_kernel)
    roof = copy_roofline_gbps("cuda")
    print(f"copy {roof:.0f} GB/s", flush=True)
    ws = pa.SplitKVWorkspace.for_device(32, HKV, 128, "cuda")
    for b, ctx in ((1, 32768), (8, 32768), (64, 32768), (256, 8192), (1, 131072)):
        c = Case(f"decode fp8 B={b} ctx={ctx // 1024}k", b, ctx, 1, fp8=True)
        x = Inputs(c)
        plan = pa.plan_split_kv(b, 1, ctx, HKV, device_info(x.q.device), kv_elem=1)
        base = pa.launch_config(x.q, x.k, x.v, 1, split_kv=plan > 1)
        pa._ATTN_LAUNCHER = shipped_launcher
        ours_fn(c, x, ws)()
        ref = x.out.clone()
        us = graph_us(ours_fn(c, x, ws), 10, 40)
        shipped = f"{base.tile_n}/{base.num_warps}/{base.num_stages}"
        print(f"{c.name} shipped {shipped} splits={plan}: {us:.1f} us "
              f"{figure(c, us) / roof:.3f} of copy", flush=True)  # fmt: skip
        pa._ATTN_LAUNCHER = swap_launcher
        for tile, warps, stages in (
            (128, 4, 3),
            (128, 4, 5),
            (64, 4, 3),
            (64, 4, 5),
            (128, 8, 3),
            (256, 8, 3),
        ):
            cfg = replace(base, tile_n=tile, num_warps=warps, num_stages=stages)
            for splits in sorted({plan, max(1, plan // 2)}):
                h = []
                try:
                    x.out.fill_(float("nan"))
                    fn = ours_fn(c, x, ws, config=cfg, num_splits=splits, compiled=h)
                    fn()
                    err = (x.out.float() - ref.float()).abs().max().item()
                    us = graph_us(fn, 10, 40)
                except Exception as e:  # out of resources and the like
                    print(f"{c.name} swap {tile}/{warps}/{stages} splits={splits}: failed "
                          f"{type(e).__name__}: {str(e)[:200]}", flush=True)  # fmt: skip
                    continue
                print(f"{c.name} swap {tile}/{warps}/{stages} splits={splits}: {us:.1f} us "
                      f"{figure(c, us) / roof:.3f} of copy max|diff|={err:.4f} "
                      f"regs={h[0].n_regs} spills={h[0].n_spills} smem={h[0].metadata.shared}",
                      flush=True)  # fmt: skip
        pa._ATTN_LAUNCHER = shipped_launcher
        del x


if __name__ == "__main__":
    main()
