"""Wide-head MLA decode in Gluon: each score tile computed once per program, not per warp group.

BWX_MLA's Hopper decode of 64-row tiles (128 heads at TP1, 16 heads x 4 query tokens) runs 8
warps, and Triton lays the score dot out as [8, 1] warps over 64 rows, so both warp groups
compute the whole 64 x 64 score tile: 1.53x the tile's tensor-core work
(`mla_loop_schedule.py`, `offline-mla-loop-schedule.txt`), a ceiling of 0.65 of the matmul rate
before any stall. Triton's tile language cannot place a dot's work on warp groups; Gluon can.
This kernel lays the scores out as [4, 2] warps (each warp group computes 32 of the 64 keys'
scores over all 576 columns), reduces the softmax's row max and sum across the two groups,
stages P (bf16) in shared memory and multiplies it by the tile's 512 latent columns as [4, 2]
warps again (each group 256 of them): exactly the tile's work, once.

Loads: the query tile ([64 rows, 576]) once, then each 64-key tile (one 64-token page, vLLM's
layout) as nine 64-column TMA copies into one of two stages (2 x 72 KB + the query's 72 KB + P's
8 KB: 229,376 B of sm90's 232,448). All eight warps run the same loop (no warp specialisation):
wait for the tile, scores, softmax, P, P @ V, a CTA barrier, then the copy of the tile two ahead
into the stage just freed.

Scope: bf16 cache and query, query_len 1, heads a multiple of 64, one split (128 heads x B=64:
128 programs, one wave on 132 SMs), latent 512 + rope 64, 64-token pages. It answers whether
the tensor-core work saved turns into time before it is worth a product kernel (which would
also need splits, query_len up to 8, fp8, and a CPU-interpreter plan: Gluon does not run
under TRITON_INTERPRET).

    python benchmarks/experiments/mla_decode_gluon.py              # GPU: check, then time
    python benchmarks/experiments/mla_decode_gluon.py --compile-only  # sm90 offline, no GPU
    ncu --profile-from-start off ... python benchmarks/experiments/mla_decode_gluon.py --profile

`--profile` launches the 128-head B=64 32k case once per kernel (shipped, then each variant)
between cudaProfilerStart / Stop, for Nsight Compute.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

R, P, W, PAGE = 512, 64, 576, 64
BLOCK_M = 64  # query rows (heads) per program
NUM_WARPS = 8
_LOG2E = 1.4426950408889634
# A CTA barrier: `gl.barrier` in Triton 3.7, `gl.thread_barrier` in 3.6 (the H200's native image).
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _load_tile(
    lat_desc,
    kv_desc,
    bt_row,
    tile,
    bar,
    lat,
    rope,
    R: gl.constexpr,
    BN: gl.constexpr,
    TMA3D: gl.constexpr,
):
    """Ask for key tile `tile` (BN slots of one 64-token page) into `lat` / `rope` on `bar`."""
    key = tile * BN
    row = gl.load(bt_row + key // 64) * 64 + key % 64
    mbarrier.expect(bar, BN * (R + 64) * 2)
    if TMA3D:  # one copy of [8 chunks, BN, 64]: `lat`'s own byte order
        chunks_layout: gl.constexpr = gl.NVMMASharedLayout(128, 16, rank=3)
        chunks = lat._reinterpret(gl.bfloat16, [R // 64, BN, 64], chunks_layout)
        tma.async_copy_global_to_shared(lat_desc, [0, row, 0], bar, chunks)
    else:  # eight copies of [BN, 64]
        for c in gl.static_range(R // 64):
            tma.async_copy_global_to_shared(
                kv_desc, [row, c * 64], bar, lat.slice(c * 64, 64, dim=1)
            )
    tma.async_copy_global_to_shared(kv_desc, [row, R], bar, rope)


@gluon.jit
def _scores(q_lat, q_rope, k_lat, k_rope, ready, tile, s_zero, STAGES: gl.constexpr):
    """Ask the tensor cores for tile `tile`'s scores once its copy has landed (async)."""
    stage = tile % STAGES
    mbarrier.wait(ready.index(stage), (tile // STAGES) & 1)
    s = warpgroup_mma(
        q_lat, k_lat.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True
    )
    return warpgroup_mma(q_rope, k_rope.index(stage).permute((1, 0)), s, is_async=True)


@gluon.jit
def _mla_decode_gluon_kernel(
    q_desc,  # q as [T * H, 576], [64, 64] blocks
    lat_desc,  # the cache's latent as [8 chunks, pages * 64, 64], [8, BN, 64] blocks
    kv_desc,  # the cache as [pages * 64, 576], [BN, 64] blocks
    out_ptr,  # [T, H, 512]
    bt_ptr,  # int32 [B, max_pages]
    seq_ptr,  # int32 [B]
    stride_bt,
    stride_ot,
    stride_oh,
    qk_scale_log2,
    num_heads,
    R: gl.constexpr,
    BN: gl.constexpr,  # keys per tile: 64 (a page) or 32
    STAGES: gl.constexpr,
    SKEW: gl.constexpr,  # ask for tile i + 1's scores before tile i's softmax
    TMA3D: gl.constexpr,  # a tile's latent in one 3D copy rather than eight 2D ones
):
    BM: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BN // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, R // 2, 16]
    )
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16)

    groups = num_heads // BM
    b = gl.program_id(0) // groups
    g = gl.program_id(0) % groups
    seq_len = gl.load(seq_ptr + b)
    n_tiles = gl.cdiv(seq_len, BN)
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt

    q_lat = gl.allocate_shared_memory(gl.bfloat16, [BM, R], smem_layout)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [BM, 64], smem_layout)
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, R], smem_layout)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, 64], smem_layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
    fence_async_shared()

    q_row = b * num_heads + g * BM
    mbarrier.expect(q_bar, BM * (R + 64) * 2)
    for c in gl.static_range(R // 64):
        tma.async_copy_global_to_shared(
            q_desc, [q_row, c * 64], q_bar, q_lat.slice(c * 64, 64, dim=1)
        )
    tma.async_copy_global_to_shared(q_desc, [q_row, R], q_bar, q_rope)
    for st in gl.static_range(STAGES):
        if st < n_tiles:
            _load_tile(lat_desc, kv_desc, bt_row, st, ready.index(st), k_lat.index(st),
                       k_rope.index(st), R, BN, TMA3D)  # fmt: skip

    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, R], gl.float32, o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
    offs_n = gl.arange(0, BN, gl.SliceLayout(0, s_layout))
    mbarrier.wait(q_bar, 0)
    if SKEW:
        s = _scores(q_lat, q_rope, k_lat, k_rope, ready, 0, s_zero, STAGES)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

    for i in range(n_tiles):
        stage = i % STAGES
        if SKEW:
            # The last tile asks for its own scores again (unused): one wasted score tile.
            s_next = _scores(q_lat, q_rope, k_lat, k_rope, ready, gl.minimum(i + 1, n_tiles - 1),
                             s_zero, STAGES)  # fmt: skip
        else:
            s = _scores(q_lat, q_rope, k_lat, k_rope, ready, i, s_zero, STAGES)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s = gl.where((i * BN + offs_n < seq_len)[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        cta_barrier()  # every warp's P in shared memory before either group multiplies it
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(p_smem, k_lat.index(stage), acc, is_async=True)
        if SKEW:
            s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_next, acc))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cta_barrier()  # both groups done with this stage and with P
        if i + STAGES < n_tiles:
            _load_tile(lat_desc, kv_desc, bt_row, i + STAGES, ready.index(stage),
                       k_lat.index(stage), k_rope.index(stage), R, BN, TMA3D)  # fmt: skip

    for st in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(st))
    mbarrier.invalidate(q_bar)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = acc / l_o[:, None]
    rows = gl.arange(0, BM, gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, R, gl.SliceLayout(0, o_layout))
    head = g * BM + rows
    ptrs = out_ptr + b.to(gl.int64) * stride_ot + head[:, None] * stride_oh + cols[None, :]
    gl.store(ptrs, o.to(gl.bfloat16))


# (keys per tile, stages, skew, 3D copies). A first H100 run (`h100-mla-decode-gluon.txt`) also
# timed half-page tiles (32 keys, 3-4 stages, with and without skew): 1.03-1.09x the shipped
# kernel against 1.48-1.55x for whole pages (score wgmma of N=16 per warp group).
VARIANTS = ((64, 2, False, False), (64, 2, False, True), (64, 2, True, True))


def _smem_layout() -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16)


def descriptors(q: torch.Tensor, kv_cache: torch.Tensor, block_n: int) -> tuple:
    t, h, w = q.shape
    pages, page, _ = kv_cache.shape
    q2 = q.reshape(t * h, w)
    kv2 = kv_cache.reshape(pages * page, w)
    chunks = gl.NVMMASharedLayout(128, 16, rank=3)
    return (
        TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [64, 64], _smem_layout()),
        TensorDescriptor(
            kv2, [R // 64, kv2.shape[0], 64], [64, w, 1], [R // 64, block_n, 64], chunks
        ),  # fmt: skip
        TensorDescriptor(kv2, list(kv2.shape), list(kv2.stride()), [block_n, 64], _smem_layout()),
    )


def mla_decode_gluon(
    q, kv_cache, block_table, seq_lens, out, *, softmax_scale: float, variant=VARIANTS[0],
    descs=None,
):  # fmt: skip
    t, h, w = q.shape
    if w != W or h % BLOCK_M or kv_cache.shape[1] != PAGE or q.dtype != torch.bfloat16:
        raise ValueError(f"this experiment takes bf16 [T, 64k heads, {W}] on {PAGE}-token pages")
    block_n, stages, skew, tma3d = variant
    q_desc, lat_desc, kv_desc = descs or descriptors(q, kv_cache, block_n)
    _mla_decode_gluon_kernel[(t * (h // BLOCK_M),)](
        q_desc, lat_desc, kv_desc, out, block_table, seq_lens, block_table.stride(0), out.stride(0),
        out.stride(1), softmax_scale * _LOG2E, h, R, block_n, stages, skew, tma3d,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


def compile_only(capability: int) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from benchmarks.offline_compile import loop_schedule, sass_of, stats_of

    print(f"# triton {triton.__version__}, gluon, offline compile for sm{capability}")
    kernel = _mla_decode_gluon_kernel
    q = torch.empty(64, 128, W, dtype=torch.bfloat16)
    kv = torch.empty(64, PAGE, W, dtype=torch.bfloat16)
    for block_n, stages, skew, tma3d in VARIANTS:
        q_desc, lat_desc, kv_desc = descriptors(q, kv, block_n)
        constexprs = {"R": R, "BN": block_n, "STAGES": stages, "SKEW": skew, "TMA3D": tma3d}
        sig = {
            "q_desc": mangle_type(q_desc), "lat_desc": mangle_type(lat_desc),
            "kv_desc": mangle_type(kv_desc), "out_ptr": "*bf16",
            "bt_ptr": "*i32", "seq_ptr": "*i32", "stride_bt": "i32", "stride_ot": "i32",
            "stride_oh": "i32", "qk_scale_log2": "fp32", "num_heads": "i32",
        } | {name: "constexpr" for name in constexprs}  # fmt: skip
        aligned = ("out_ptr", "bt_ptr", "seq_ptr", "stride_ot", "stride_oh")
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        compiled = triton.compile(
            GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
            target=GPUTarget("cuda", capability, 32),
            options=dict(num_warps=NUM_WARPS),
        )
        print(f"== tile {block_n} keys, {stages} stages, skew {skew}, 3D copies {tma3d}: "
              f"{stats_of(compiled)}")  # fmt: skip
        runs = loop_schedule(sass_of(compiled))
        print("   " + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in runs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--capability", type=int, default=90)
    ap.add_argument("--profile", action="store_true", help="one launch per kernel, for ncu")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args.capability)
        return 0
    return run_gpu(profile=args.profile)


def run_gpu(profile: bool = False) -> int:
    from benchmarks.bench_mla_decode import graph_us, matmul_tflops
    from benchmarks.profile_ncu import profile_once
    from vllm_blackwell_ext.kernels.device import device_info
    from vllm_blackwell_ext.kernels.mla_decode import (
        MlaDecodeWorkspace,
        mla_decode,
        mla_decode_flops,
        plan_mla_decode,
    )
    from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference

    dev = "cuda"
    torch.manual_seed(0)
    scale = 1.0 / (192**0.5)
    info = device_info(torch.device(dev))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")  # fmt: skip
    roof = 1.0 if profile else matmul_tflops(dev)
    print(f"bf16 matmul {roof:.0f} TFLOP/s")
    # (heads, batch, context): the check cases first (ragged lengths), then the timed ones
    checks = ((64, 3, (1, 200, 1000)), (128, 2, (64, 4097)))
    for heads, batch, lens in () if profile else checks:
        pages_per = -(-max(lens) // PAGE)
        cache = torch.randn(batch * pages_per + 3, PAGE, W, dtype=torch.bfloat16, device=dev)
        bt = torch.randperm(cache.shape[0], device=dev)[: batch * pages_per]
        bt = bt.view(batch, pages_per).to(torch.int32)
        seq = torch.tensor(lens, dtype=torch.int32, device=dev)
        q = torch.randn(batch, heads, W, dtype=torch.bfloat16, device=dev)
        ref, _ = mla_decode_reference(q.cpu(), cache.cpu(), bt.cpu(), seq.cpu(),
                                      softmax_scale=scale, kv_lora_rank=R)  # fmt: skip
        for variant in VARIANTS:
            out = torch.zeros(batch, heads, R, dtype=torch.bfloat16, device=dev)
            mla_decode_gluon(q, cache, bt, seq, out, softmax_scale=scale, variant=variant)
            err = (out.float().cpu() - ref).abs().max().item()
            print(f"check {variant} heads={heads} lens={lens}: max|out - reference| = {err:.4f}")
            if not err <= 0.02:  # bf16 output rounding of values |x| < 2 (NaN fails too)
                print("MISMATCH")
                return 1
    timed = ((128, 64, 32768), (128, 64, 8192), (128, 132, 8192), (64, 128, 16384))
    for heads, batch, ctx in timed[:1] if profile else timed:
        pages_per = ctx // PAGE
        cache = torch.randn(batch * pages_per, PAGE, W, dtype=torch.bfloat16, device=dev)
        bt = torch.randperm(cache.shape[0], device=dev).view(batch, pages_per).to(torch.int32)
        seq = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(batch, heads, W, dtype=torch.bfloat16, device=dev)
        out_s = torch.empty(batch, heads, R, dtype=torch.bfloat16, device=dev)
        splits, _ = plan_mla_decode(batch, heads, ctx, 1, info, kv_dtype=cache.dtype,
                                    tma_page_size=PAGE)  # fmt: skip
        ws = MlaDecodeWorkspace.allocate(batch, heads, splits, R, q.device)
        flops = mla_decode_flops(batch, heads, ctx, R)
        if profile:
            profile_once(
                "shipped",
                partial(
                    mla_decode,
                    q,
                    cache,
                    bt,
                    seq,
                    out_s,
                    softmax_scale=scale,
                    kv_lora_rank=R,
                    workspace=ws,
                    num_splits=splits,
                ),
            )
            for variant in VARIANTS:
                profile_once(
                    f"gluon {variant}",
                    partial(
                        mla_decode_gluon,
                        q,
                        cache,
                        bt,
                        seq,
                        torch.empty_like(out_s),
                        softmax_scale=scale,
                        variant=variant,
                    ),
                )
            return 0
        us_s = graph_us(partial(mla_decode, q, cache, bt, seq, out_s, softmax_scale=scale,
                                kv_lora_rank=R, workspace=ws, num_splits=splits))  # fmt: skip
        tf_s = flops / us_s / 1e6
        print(f"h{heads} B={batch} ctx={ctx // 1024}k: shipped (splits={splits}) {us_s:8.1f} us "
              f"{tf_s:6.1f} TFLOP/s ({tf_s / roof:.3f} of matmul)")  # fmt: skip
        for variant in VARIANTS:
            out_g = torch.empty_like(out_s)
            descs = descriptors(q, cache, variant[0])
            us_g = graph_us(partial(mla_decode_gluon, q, cache, bt, seq, out_g,
                                    softmax_scale=scale, variant=variant, descs=descs))  # fmt: skip
            gap = (out_g.float() - out_s.float()).abs().max().item()
            tf_g = flops / us_g / 1e6
            print(
                f"   gluon {variant}: {us_g:8.1f} us {tf_g:6.1f} TFLOP/s ({tf_g / roof:.3f} of "
                f"matmul), {us_s / us_g:.2f}x the shipped kernel, max|diff| {gap:.4f}"
            )
        del cache
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
