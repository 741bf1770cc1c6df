"""The paged-KV gather kernel (jit code only; plan.py sizes it, launch.py launches it).

Reads the tokens of a paged KV cache ``src_cache[num_blocks, block_size, *entry]`` back into a
dense ``dst[rows, *entry]``, with the semantics of vLLM's CUDA ops of the same names
(``gather_and_maybe_dequant_cache`` and ``cp_gather_cache`` in ``vllm/_custom_ops.py``): for a
token ``t`` of sequence ``b``, ``pos = t - cu_seq_lens[b] + seq_starts[b]``, the token lives in
page ``block_table[b, pos // block_size]`` at slot ``pos % block_size`` and is written to row ``t``
of ``dst``. fp8 values are widened to fp32, multiplied by ``*scale`` and rounded once to the
dtype of ``dst`` (what vLLM's ``scaled_convert`` does), so results match bit for bit.

Fast path. One program moves ``BLOCK_T`` consecutive tokens; each token's whole entry is read
as power-of-two column pieces (576 = 512 + 64 for MLA), so every row is one contiguous,
16-byte-vectorised read and the tail piece is issued before the main piece is stored (two loads
in flight per thread). Dequantization happens in registers. One launch per call, no host sync.

Indices are never trusted: the kernel masks every index it derives, so whatever the index
tensors hold it reads only inside ``src_cache`` and the index tensors and writes only rows
``t < num_rows``. A row whose ``token_to_seq`` entry lies outside ``[0, batch)``, whose position
falls outside its block-table row, or whose block-table entry lies outside ``[0, num_blocks)``
is not written (``checks.check_bounds_on_host`` reports such input instead, in debug mode).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _convert(x, scale, DEQUANT: tl.constexpr, out_dtype: tl.constexpr):
    # vLLM's scaled_convert: exact fp8 -> fp32, one fp32 multiply, one rounding to dst.
    if DEQUANT:
        return (x.to(tl.float32) * scale).to(out_dtype)
    return x.to(out_dtype)


# Sizes that change from call to call are not specialised on (no recompiles as batches vary);
# strides and pointers are, so Triton can prove 16-byte alignment and vectorise the rows.
@triton.jit(
    do_not_specialize=[
        "num_rows",
        "batch_size",
        "search_steps",
        "block_size",
        "num_blocks",
        "max_blocks_per_seq",
        "stride_bt",
    ]
)
def _kv_gather_kernel(
    src_ptr,
    dst_ptr,
    block_table_ptr,
    cu_seq_lens_ptr,
    token_to_seq_ptr,
    seq_starts_ptr,
    scale_ptr,
    num_rows,  # rows of dst this launch may write
    batch_size,
    search_steps,  # binary-search iterations when there is no token_to_seq
    block_size,
    num_blocks,
    max_blocks_per_seq,
    stride_bt,
    stride_src_block,
    stride_src_slot,
    stride_dst_row,
    E: tl.constexpr,  # entry width in elements
    PIECE: tl.constexpr,
    E_MAIN: tl.constexpr,
    TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_TOKEN_TO_SEQ: tl.constexpr,
    HAS_SEQ_STARTS: tl.constexpr,
    DEQUANT: tl.constexpr,
    EVICT: tl.constexpr,  # "" or "evict_first", for the streamed rows
):
    out_dtype: tl.constexpr = dst_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = rows < num_rows

    if HAS_TOKEN_TO_SEQ:
        seq = tl.load(token_to_seq_ptr + rows, mask=valid, other=0)
        valid = valid & (seq >= 0) & (seq < batch_size)
    else:
        # cp_gather_cache has no token_to_seq: find b with cu[b] <= t < cu[b+1] by bisection,
        # keeping cu[lo] <= t < cu[hi] (so empty sequences are never chosen).
        lo = tl.zeros([BLOCK_T], dtype=tl.int32)
        hi = lo + batch_size
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            right = tl.load(cu_seq_lens_ptr + mid, mask=valid, other=0) <= rows
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        seq = lo

    seq_begin = tl.load(cu_seq_lens_ptr + seq, mask=valid, other=0)
    seq_end = tl.load(cu_seq_lens_ptr + seq + 1, mask=valid, other=0)
    # vLLM's CUDA kernel skips rows past their sequence's end (padding in token_to_seq).
    valid = valid & (rows < seq_end)
    if not HAS_TOKEN_TO_SEQ:
        valid = valid & (rows >= seq_begin)
    pos = rows - seq_begin
    if HAS_SEQ_STARTS:
        pos += tl.load(seq_starts_ptr + seq, mask=valid, other=0)
    blk = pos // block_size
    slot = pos - blk * block_size
    valid = valid & (pos >= 0) & (blk < max_blocks_per_seq)
    page = tl.load(block_table_ptr + seq.to(tl.int64) * stride_bt + blk, mask=valid, other=0)
    valid = valid & (page >= 0) & (page < num_blocks)

    src_row = src_ptr + (page.to(tl.int64) * stride_src_block + slot.to(tl.int64) * stride_src_slot)
    dst_row = dst_ptr + rows.to(tl.int64) * stride_dst_row
    row_mask = valid[:, None]

    scale = 1.0
    if DEQUANT:
        scale = tl.load(scale_ptr)

    # Tail first, so its read is in flight while the main piece goes through.
    if TAIL > 0:
        tcols = E_MAIN + tl.arange(0, TAIL)
        tmask = row_mask & (tcols < E)[None, :]
        tail = tl.load(src_row[:, None] + tcols[None, :], mask=tmask, eviction_policy=EVICT)
    cols = tl.arange(0, PIECE)
    for e0 in tl.static_range(0, E_MAIN, PIECE):
        x = tl.load(src_row[:, None] + (e0 + cols)[None, :], mask=row_mask, eviction_policy=EVICT)
        tl.store(
            dst_row[:, None] + (e0 + cols)[None, :],
            _convert(x, scale, DEQUANT, out_dtype),
            mask=row_mask,
            eviction_policy=EVICT,
        )
    if TAIL > 0:
        tl.store(
            dst_row[:, None] + tcols[None, :],
            _convert(tail, scale, DEQUANT, out_dtype),
            mask=tmask,
            eviction_policy=EVICT,
        )
