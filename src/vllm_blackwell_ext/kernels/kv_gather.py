"""Paged-KV gather with optional fp8 dequantization, in Triton.

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
``t < num_tokens <= dst.shape[0]`` (``t < dst.shape[0]`` for ``cp_gather_cache``). A row whose
``token_to_seq`` entry lies outside ``[0, batch)``, whose position falls outside its block-table
row, or whose block-table entry lies outside ``[0, num_blocks)`` is not written. Reporting such
input as an error needs the indices on the host (a synchronisation): ``BWX_DEBUG_BOUNDS=1``
makes the launchers check them first and raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..kv_cache_dtypes import FP8_KV_CACHE_DTYPES
from .device import device_info
from .host_ints import cdiv, next_power_of_2
from .launch_cache import DEFAULT_NUM_STAGES, CachedLauncher

DEBUG_BOUNDS_ENV = "BWX_DEBUG_BOUNDS"

# kv_cache_dtype names of caches holding model-dtype values (None: as stored).
PLAIN_KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the cache holds model-dtype values; converted to dst's dtype if they differ
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
KV_CACHE_DTYPES: tuple[str, ...] = (*PLAIN_KV_CACHE_DTYPES, *FP8_KV_CACHE_DTYPES)
DST_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


def debug_bounds_enabled() -> bool:
    """True when ``BWX_DEBUG_BOUNDS`` asks for checked gathers (read at every call)."""
    return os.environ.get(DEBUG_BOUNDS_ENV, "0").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class GatherConfig:
    """Launch shape: tokens per program, widest column piece, warps per program, and whether
    the streamed cache rows and dst rows are marked evict-first in L2 (keeps the small index
    tensors cached)."""

    block_t: int
    max_piece: int
    num_warps: int
    evict_first: bool = False


# sm90: best geometric mean on the H200 of `python benchmarks/bench_kv_gather.py --tune` (B=8
# ctx 32k and B=1 ctx 128k); tiles of 8/16 rows were within 1-2%, evict-first hints 2-4%
# slower, 64-wide pieces 25% slower. Other devices: the same shape, untuned (the kernel keeps
# nothing in shared memory beyond layout conversions, so the 101 KB parts need no change).
_CONFIGS: dict[str, GatherConfig] = {
    "sm90": GatherConfig(block_t=4, max_piece=512, num_warps=2),
    "cpu": GatherConfig(block_t=32, max_piece=1024, num_warps=4),  # interpreter: big tiles
}
_DEFAULT_CONFIG = GatherConfig(block_t=4, max_piece=512, num_warps=2)


def default_config(device: torch.device) -> GatherConfig:
    return _CONFIGS.get(device_info(device).device_class, _DEFAULT_CONFIG)


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _pieces(entry: int, max_piece: int) -> tuple[int, int, int]:
    """(piece, main, tail): `main` columns in `piece`-wide chunks, then a masked `tail` tile."""
    piece = min(_pow2_floor(entry), max_piece)
    main = entry // piece * piece
    rest = entry - main
    tail = next_power_of_2(rest) if rest else 0
    return piece, main, tail


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


def _entry_width(t: torch.Tensor, first_entry_dim: int) -> int:
    width = 1
    for s in t.shape[first_entry_dim:]:
        width *= s
    return width


def _entry_is_dense(t: torch.Tensor, first_entry_dim: int) -> bool:
    """The entry dims are laid out contiguously (one row of `width` unit-stride elements)."""
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in zip(
        reversed(t.shape[first_entry_dim:]), reversed(t.stride()[first_entry_dim:]), strict=False
    ):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def check_bounds_on_host(
    src_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor | None,
    num_rows: int,
    batch_size: int,
    seq_starts: torch.Tensor | None,
) -> None:
    """Debug-mode check of everything the fast path assumes; synchronises with the device."""
    cu = cu_seq_lens[: batch_size + 1].to(torch.int64).cpu()
    if batch_size and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seq_lens: expected non-decreasing values, got {cu.tolist()[:16]}...")
    dev = block_table.device
    if token_to_seq is not None:
        rows = torch.arange(num_rows, device=dev)
        seq = token_to_seq[:num_rows].to(torch.int64)
        bad = (seq < 0) | (seq >= batch_size)
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            raise ValueError(
                f"token_to_seq: expected values in [0, {batch_size}), got {int(seq[t])} at {t}"
            )
        cu_dev = cu.to(dev)
        live = rows < cu_dev[seq + 1]
    else:
        if int(cu[-1]) > num_rows:
            raise ValueError(
                f"cu_seq_lens: expected a last entry <= dst's {num_rows} rows, got {int(cu[-1])}"
            )
        rows = torch.arange(int(cu[0]), int(cu[-1]), device=dev)
        seq = torch.searchsorted(cu.to(dev), rows, right=True) - 1
        cu_dev = cu.to(dev)
        live = torch.ones_like(rows, dtype=torch.bool)
    rows, seq = rows[live], seq[live]
    pos = rows - cu_dev[seq]
    if seq_starts is not None:
        pos = pos + seq_starts.to(torch.int64)[seq]
    block_size = src_cache.shape[1]
    blk = pos.div(block_size, rounding_mode="floor")
    bad = (pos < 0) | (blk >= block_table.shape[1])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"seq_starts/cu_seq_lens: token {int(rows[i])} of sequence {int(seq[i])} is at "
            f"position {int(pos[i])}, outside the block table's {block_table.shape[1]} blocks "
            f"of {block_size}"
        )
    pages = block_table.to(torch.int64)[seq, blk]
    bad = (pages < 0) | (pages >= src_cache.shape[0])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"block_table: entry [{int(seq[i])}, {int(blk[i])}] = {int(pages[i])} is outside "
            f"src_cache's {src_cache.shape[0]} blocks"
        )


_GATHER_LAUNCHER = CachedLauncher(_kv_gather_kernel)
# Whether Triton's CPU interpreter runs the kernel (TRITON_INTERPRET=1 when it was defined).
INTERPRETED = not isinstance(_kv_gather_kernel, triton.runtime.JITFunction)


def launch_kv_gather(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor | None,
    num_rows: int,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    scale: torch.Tensor | None,
    config: GatherConfig | None = None,
    debug_bounds: bool | None = None,
) -> None:
    """Launch the gather on already-validated arguments (see `vllm_blackwell_ext.ops`).

    `token_to_seq` given: rows ``t < num_rows`` (``num_tokens``); otherwise (cp_gather_cache)
    rows ``t < num_rows`` (``dst.shape[0]``) are mapped to sequences by bisection of
    ``cu_seq_lens[: batch_size + 1]``. `scale` given means dequantize ``src_cache`` (already
    viewed as its fp8 dtype). Never allocates; one launch, or none when there is nothing to do.
    `debug_bounds` (default: the environment variable) checks the indices on the host first
    and raises on a bad one; without it, rows with bad indices are skipped by the kernel.
    """
    if num_rows <= 0 or batch_size <= 0:
        return
    if debug_bounds is None:
        debug_bounds = debug_bounds_enabled()
    if debug_bounds:
        check_bounds_on_host(
            src_cache, block_table, cu_seq_lens, token_to_seq, num_rows, batch_size, seq_starts
        )
    cfg = config or default_config(src_cache.device)
    entry = _entry_width(src_cache, 2)
    piece, main, tail = _pieces(entry, cfg.max_piece)
    grid = (cdiv(num_rows, cfg.block_t), 1, 1)
    # Unused pointer arguments get a real tensor of the right kind; constexprs keep them unread.
    _GATHER_LAUNCHER.launch(
        grid,
        (
            src_cache, dst, block_table, cu_seq_lens,
            token_to_seq if token_to_seq is not None else cu_seq_lens,
            seq_starts if seq_starts is not None else cu_seq_lens,
            scale if scale is not None else cu_seq_lens,
            num_rows, batch_size, max(batch_size - 1, 0).bit_length(),
            src_cache.shape[1], src_cache.shape[0], block_table.shape[1], block_table.stride(0),
            src_cache.stride(0), src_cache.stride(1), dst.stride(0),
            # constexprs, in signature order: E .. EVICT
            entry, piece, main, tail, cfg.block_t,
            token_to_seq is not None, seq_starts is not None, scale is not None,
            "evict_first" if cfg.evict_first else "",
        ),
        num_warps=cfg.num_warps,
        num_stages=DEFAULT_NUM_STAGES,
    )  # fmt: skip


def gather_and_maybe_dequant_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None = None,
    config: GatherConfig | None = None,
) -> None:
    """Kernel-level entry (no validation: `vllm_blackwell_ext.ops` validates first)."""
    fp8 = FP8_KV_CACHE_DTYPES.get(kv_cache_dtype)
    if fp8 is not None:
        src_cache = src_cache.view(fp8)  # uint8 storage -> its fp8 meaning; free
    launch_kv_gather(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        num_tokens,
        block_table.shape[0],
        seq_starts,
        scale if fp8 is not None else None,
        config=config,
    )


def cp_gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    config: GatherConfig | None = None,
) -> None:
    """Kernel-level entry of the raw copy (no validation: `vllm_blackwell_ext.ops` validates)."""
    if src_cache.dtype.is_floating_point and src_cache.element_size() == 1:
        # fp8 bytes are copied as bytes: no conversion may touch them (NaN patterns included).
        src_cache, dst = src_cache.view(torch.uint8), dst.view(torch.uint8)
    launch_kv_gather(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        None,
        dst.shape[0],
        batch_size,
        seq_starts,
        None,
        config=config,
    )
