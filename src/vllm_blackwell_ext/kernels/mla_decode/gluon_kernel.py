"""The split stage of MLA decode for 64-row tiles on Hopper, in Gluon (the `gluon` variant).

Jit code only. The Triton split kernel, given a 64-row tile on 8 warps (128 heads at TP1, 16
heads x 4 query tokens), lays the score dot out over [8, 1] warps, so both warp groups compute
the whole 64 x 64 score tile before each multiplies P by its half of the 512 latent columns:
half again the tile's tensor-core work. This kernel places the work on the warp groups itself:
the scores as [4, 2] warps (each group 32 of the tile's 64 keys over all 576 columns), the
softmax's row max and sum reduced across the two groups, P staged in shared memory, and P @ V
as [4, 2] warps again (each group 256 latent columns). Each tile's latent columns arrive in
one 3D TMA copy (the tile's own byte order in shared memory) and its rope columns in a second,
two stages deep; the query tile once.

An fp8 e4m3 cache's tiles land in fp8 stages (half the bytes in flight) and all eight warps
widen each into one bf16 tile in shared memory (exact, in integer ops: `e4m3_to_bf16`) before
the same dots; the per-tensor scale multiplies the scores and the output, as in the Triton
kernels. The stage is refilled as soon as it is widened. Integer widening keeps the
conversion pipe free, which Triton's e4m3 -> fp16 -> bf16 conversions would fill (see
benchmarks/README.md, routes tried).

It computes what `_mla_decode_split_kernel` does for its programs (same program order, key
splits, causal rows, outputs and partials), so a plan launches one or the other and the same
merge. Scope (`plan.gluon_supported`): sm90, a bf16 query over a bf16 or fp8 e4m3 cache with
pages a multiple of 64 tokens read through TMA, latent 512 + rope 64, a contiguous query.
Gluon does not run under the CPU interpreter: the kernel is checked there by compiling it
offline for sm90 (`tune_mla_decode.py --check sm90`), and runs against the reference on the GPU.
"""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401 (probe)

    # A CTA barrier: `gl.barrier` from Triton 3.7 on, `gl.thread_barrier` in 3.6.
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    GLUON_AVAILABLE = True
except (ImportError, AttributeError):  # no Gluon Hopper API: plans keep Triton's kernels
    GLUON_AVAILABLE = False


if GLUON_AVAILABLE:

    @gluon.jit
    def _load_tile(
        lat_desc, rope_desc, row, bar, lat, rope,
        R: gl.constexpr, P: gl.constexpr, BN: gl.constexpr,
    ):  # fmt: skip
        """Ask for BN rows from `row` into `lat` (as [R // 64, BN, 64], the NVMMA layout's own
        byte order) and `rope`, arriving on `bar`."""
        bits: gl.constexpr = lat.dtype.primitive_bitwidth
        mbarrier.expect(bar, BN * (R + P) * bits // 8)
        tma.async_copy_global_to_shared(lat_desc, [0, row, 0], bar, _chunks(lat, R, BN))
        tma.async_copy_global_to_shared(rope_desc, [row, R], bar, rope)

    @gluon.jit
    def _chunks(tile, R: gl.constexpr, BN: gl.constexpr, RANK: gl.constexpr = 3):
        """A [BN, R] tile in shared memory as its R // 64 column chunks of [BN, 64]: one 3D
        block (RANK 3, what a 3D TMA copy fills) or R // 64 tiles to index (RANK 2)."""
        bits: gl.constexpr = tile.dtype.primitive_bitwidth
        layout: gl.constexpr = gl.NVMMASharedLayout(8 * bits, bits, rank=RANK)
        return tile._reinterpret(tile.dtype, [R // 64, BN, 64], layout)

    @gluon.jit
    def _widen_tile(lat8, rope8, lat, rope, R: gl.constexpr, BN: gl.constexpr):
        """Copy an fp8 tile (`lat8`, `rope8`) to the 16-bit tiles `lat`, `rope` that the
        tensor cores read, 64 columns at a time (exact: e4m3 values are bf16 / fp16 values)."""
        # 16 consecutive bytes per thread: one 16-byte shared-memory load per chunk.
        layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [gl.num_warps(), 1], [1, 0])
        src = _chunks(lat8, R, BN, 2)
        dst = _chunks(lat, R, BN, 2)
        for c in gl.static_range(R // 64):
            dst.index(c).store(e4m3_to_bf16(src.index(c).load(layout)))
        rope.store(e4m3_to_bf16(rope8.load(layout)))

    @gluon.jit
    def e4m3_to_bf16(x):
        """e4m3 values as bf16 (exact), four at a time in integer ops plus one bf16x2 multiply:
        each byte moves to the high byte of a 16-bit lane, its sign stays at bit 15 and its 7
        magnitude bits shift right by 4 into the bf16's exponent and mantissa fields, which is
        the value times 2^-120 for normal and subnormal e4m3 values alike; times 2^120 then
        restores it. (Triton's own conversion takes e4m3 -> fp16 -> bf16: a convert per two
        values and another per value, all on the conversion pipe, narrower than the integer
        ones, while the tensor cores wait.) e4m3's NaN bytes come out as +-480, not NaN."""
        return gl.inline_asm_elementwise(
            """{ .reg .b32 a, b, t, m;
            mov.b32 m, 0x7B807B80;
            prmt.b32 a, $2, 0, 0x1404;
            prmt.b32 b, $2, 0, 0x3424;
            shr.b32 t, a, 4;
            and.b32 t, t, 0x07F007F0;
            and.b32 a, a, 0x80008000;
            or.b32 a, a, t;
            shr.b32 t, b, 4;
            and.b32 t, t, 0x07F007F0;
            and.b32 b, b, 0x80008000;
            or.b32 b, b, t;
            mul.rn.bf16x2 $0, a, m;
            mul.rn.bf16x2 $1, b, m; }""",
            "=r,=r,r",
            [x.to(gl.uint8, bitcast=True)],
            dtype=gl.bfloat16,
            is_pure=True,
            pack=4,
        )

    @gluon.jit
    def _cache_row(bt_row, key, PAGE_SIZE: gl.constexpr):
        """The cache row (page * PAGE_SIZE + slot) of key `key` of a request."""
        return gl.load(bt_row + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE

    # Per-batch ints are runtime values, as in the Triton kernel: a new batch never recompiles.
    @gluon.jit(do_not_specialize=["query_len", "num_splits", "num_row_groups", "stride_lt",
                                  "stride_lh"])  # fmt: skip
    def _mla_decode_gluon_kernel(
        q_lat_desc,  # q's latent columns as [R // 64, T * H, 64], [R // 64, 64, 64] blocks
        q_rope_desc,  # q as [T * H, R + P], [64, P] blocks
        kv_lat_desc,  # the cache's latent as [R // 64, pages * PAGE_SIZE, 64]
        kv_rope_desc,  # the cache as [pages * PAGE_SIZE, R + P], [64, P] blocks
        BT,  # int32 [B, max_pages]
        SEQ,  # int32 [B]
        O_PART,  # fp32 [T, H, S, R]: per-split normalised outputs (multi-split only)
        L_PART,  # fp32 [T, H, S]: per-split log2-sum-exp (multi-split only)
        OUT,  # [T, H, R] (single split only)
        LSE,  # fp32 [T, H] (single split with HAS_LSE only)
        KSCALE,  # fp32 [1]: an fp8 cache's per-tensor scale (HAS_SCALE only)
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
        R: gl.constexpr,
        P: gl.constexpr,
        PAGE_SIZE: gl.constexpr,
        CAUSAL: gl.constexpr,
        SINGLE_SPLIT: gl.constexpr,
        HAS_LSE: gl.constexpr,
        HAS_SCALE: gl.constexpr,
    ):
        BM: gl.constexpr = 64
        BN: gl.constexpr = 64
        STAGES: gl.constexpr = 2
        dtype: gl.constexpr = q_rope_desc.dtype
        kv_dtype: gl.constexpr = kv_rope_desc.dtype
        # An fp8 cache's tiles land in fp8 stages and are widened into one 16-bit tile per
        # program before the dots; the per-tensor scale folds into the scores and the output.
        KV_FP8: gl.constexpr = kv_dtype.primitive_bitwidth == 8
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BN // 2, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, R // 2, 16]
        )
        smem: gl.constexpr = gl.NVMMASharedLayout(128, dtype.primitive_bitwidth)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout(64 * kv_dtype.primitive_bitwidth // 8,
                                                     kv_dtype.primitive_bitwidth)  # fmt: skip

        # Program order, key split and causal limits as `_split_program` (the Triton kernel).
        pid = gl.program_id(0)
        rg = pid % num_row_groups
        rest = pid // num_row_groups
        split = rest % num_splits
        b = rest // num_splits
        seq_len = gl.load(SEQ + b)
        split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), BN) * BN
        start = split * split_len
        end = gl.minimum(start + split_len, seq_len)
        if not SINGLE_SPLIT:
            if start >= seq_len:
                return  # a split past a short request's keys: written and merged by nobody
        n_tiles = gl.cdiv(end - start, BN)
        bt_row = BT + b.to(gl.int64) * stride_bt
        rows_per_req = query_len * num_heads
        # Rows past the request's (the next request's, or TMA's zeros) are computed, not stored.
        q_row = b * rows_per_req + rg * BM

        q_lat = gl.allocate_shared_memory(dtype, [BM, R], smem)
        q_rope = gl.allocate_shared_memory(dtype, [BM, P], smem)
        k_lat = gl.allocate_shared_memory(kv_dtype, [STAGES, BN, R], kv_smem)
        k_rope = gl.allocate_shared_memory(kv_dtype, [STAGES, BN, P], kv_smem)
        if KV_FP8:
            wide_lat = gl.allocate_shared_memory(dtype, [BN, R], smem)
            wide_rope = gl.allocate_shared_memory(dtype, [BN, P], smem)
        p_smem = gl.allocate_shared_memory(dtype, [BM, BN], smem)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
        fence_async_shared()

        _load_tile(q_lat_desc, q_rope_desc, q_row, q_bar, q_lat, q_rope, R, P, BM)
        for st in gl.static_range(STAGES):
            if st < n_tiles:
                row = _cache_row(bt_row, start + st * BN, PAGE_SIZE)
                _load_tile(kv_lat_desc, kv_rope_desc, row, ready.index(st), k_lat.index(st),
                           k_rope.index(st), R, P, BN)  # fmt: skip

        rows_s = rg * BM + gl.arange(0, BM, gl.SliceLayout(1, s_layout))
        if CAUSAL:
            # Row j of a request sees keys [0, seq_len - query_len + j].
            limit = seq_len - query_len + 1 + rows_s // num_heads
        else:
            limit = gl.full([BM], 0, gl.int32, gl.SliceLayout(1, s_layout)) + seq_len
        offs_n = gl.arange(0, BN, gl.SliceLayout(0, s_layout))
        m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BM, R], gl.float32, o_layout)
        s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
        score_scale = qk_scale_log2
        if HAS_SCALE:
            k_scale = gl.load(KSCALE)
            score_scale = score_scale * k_scale
        mbarrier.wait(q_bar, 0)

        for i in range(n_tiles):
            stage = i % STAGES
            lat = k_lat.index(stage)
            rope = k_rope.index(stage)
            mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
            if KV_FP8:
                _widen_tile(lat, rope, wide_lat, wide_rope, R, BN)
                fence_async_shared()
                _cta_barrier()  # the whole 16-bit tile written; the fp8 stage is free again
                if i + STAGES < n_tiles:
                    _load_tile(kv_lat_desc, kv_rope_desc,
                               _cache_row(bt_row, start + (i + STAGES) * BN, PAGE_SIZE),
                               ready.index(stage), lat, rope, R, P, BN)  # fmt: skip
                lat = wide_lat
                rope = wide_rope
            s = warpgroup_mma(q_lat, lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(q_rope, rope.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            key = start + i * BN + offs_n
            visible = (key[None, :] < limit[:, None]) & (key < end)[None, :]
            s = gl.where(visible, s * score_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            p_smem.store(p.to(dtype))
            fence_async_shared()
            _cta_barrier()  # every warp's P in shared memory before either group multiplies it
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            acc = warpgroup_mma(p_smem, lat, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()  # both groups done with this tile and with P
            if not KV_FP8:
                if i + STAGES < n_tiles:
                    _load_tile(kv_lat_desc, kv_rope_desc,
                               _cache_row(bt_row, start + (i + STAGES) * BN, PAGE_SIZE),
                               ready.index(stage), lat, rope, R, P, BN)  # fmt: skip

        for st in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(st))
        mbarrier.invalidate(q_bar)

        # As `_finish_rows`: one split writes OUT (and the natural-log LSE), several write
        # normalised partials and their log2-sum-exps; a row that saw no key gets 0 and -inf.
        rows_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
        l_o = gl.convert_layout(l_i, rows_layout)
        m_o = gl.convert_layout(m_i, rows_layout)
        has_keys = l_o > 0.0
        inv_l = gl.where(has_keys, 1.0 / gl.where(has_keys, l_o, 1.0), 0.0)
        if HAS_SCALE:
            inv_l = inv_l * k_scale
        lse2 = gl.where(has_keys, m_o + gl.log2(gl.where(has_keys, l_o, 1.0)), float("-inf"))
        rows = rg * BM + gl.arange(0, BM, rows_layout)
        row_ok = rows < rows_per_req
        tok = (b * query_len + rows // num_heads).to(gl.int64)
        head = rows % num_heads
        cols = gl.arange(0, R, gl.SliceLayout(0, o_layout))
        mask = row_ok[:, None] & (cols < R)[None, :]
        o = acc * inv_l[:, None]
        if SINGLE_SPLIT:
            dst = OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + cols[None, :]
            gl.store(dst, o.to(OUT.dtype.element_ty), mask=mask)
            if HAS_LSE:  # the natural log: ln(x) = log2(x) * ln(2)
                gl.store(LSE + tok * stride_lse_t + head, lse2 * 0.6931471805599453, mask=row_ok)
        else:
            row_off = tok * stride_pt + head * stride_ph + split * stride_ps
            gl.store(O_PART + row_off[:, None] + cols[None, :], o, mask=mask)
            gl.store(L_PART + tok * stride_lt + head * stride_lh + split, lse2, mask=row_ok)
