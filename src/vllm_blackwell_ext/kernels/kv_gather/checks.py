"""Validation of the gather ops' arguments, run once per call before the plan is made.

`check_gather` / `check_cp_gather` check every argument's type, dtype, device and shape (no
index value is read: that would synchronise with the device). Errors name the argument, what
was expected and what came (`kernels.checks.fail`). `check_bounds_on_host` is the debug mode
(`BWX_DEBUG_BOUNDS=1`): it reads the indices on the host and raises on the first one the
kernel would skip.
"""

from __future__ import annotations

import math

import torch
import triton

from ...kv_cache_dtypes import FP8_KV_CACHE_DTYPES
from ...switches import DEBUG_BOUNDS
from ..checks import check_index, fail
from ..device import MIN_FP8_CAPABILITY, device_info
from .kernel import _kv_gather_kernel

DEBUG_BOUNDS_ENV = DEBUG_BOUNDS.name

# kv_cache_dtype names of caches holding model-dtype values (None: as stored).
PLAIN_KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the cache holds model-dtype values; converted to dst's dtype if they differ
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
KV_CACHE_DTYPES: tuple[str, ...] = (*PLAIN_KV_CACHE_DTYPES, *FP8_KV_CACHE_DTYPES)
DST_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
# What may hold an fp8 cache's bytes: its kv_cache_dtype string says how they are read.
FP8_STORAGE_DTYPES: tuple[torch.dtype, ...] = (
    torch.uint8,
    *dict.fromkeys(FP8_KV_CACHE_DTYPES.values()),
)
# Whether Triton's CPU interpreter runs the kernel (TRITON_INTERPRET=1 when it was defined).
INTERPRETED = not isinstance(_kv_gather_kernel, triton.runtime.JITFunction)


def debug_bounds_enabled() -> bool:
    """True when ``BWX_DEBUG_BOUNDS`` asks for checked gathers (read at every call)."""
    return DEBUG_BOUNDS.enabled()


def entry_is_dense(t: torch.Tensor, first_entry_dim: int) -> bool:
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


# ---- shapes, dtypes and devices (no index value is read) ----


def _check_tensors(src_cache: object, dst: object) -> None:
    if not isinstance(src_cache, torch.Tensor):
        fail(TypeError, "src_cache", "a torch.Tensor", type(src_cache).__name__)
    if not isinstance(dst, torch.Tensor):
        fail(TypeError, "dst", "a torch.Tensor", type(dst).__name__)


def _check_cache_shape(src_cache: torch.Tensor) -> None:
    if src_cache.dim() < 3:
        fail(ValueError, "src_cache", "[num_blocks, block_size, *entry]", tuple(src_cache.shape))
    if src_cache.shape[1] < 1:
        fail(ValueError, "src_cache", "block_size (dim 1) >= 1", src_cache.shape[1])
    if math.prod(src_cache.shape[2:]) < 1:
        fail(ValueError, "src_cache", "entries of at least one element", tuple(src_cache.shape))


def _check_devices(src_cache: torch.Tensor, dst: torch.Tensor) -> None:
    if src_cache.device.type == "cpu" and not INTERPRETED:
        fail(
            ValueError,
            "src_cache",
            "a CUDA tensor (CPU tensors run only under Triton's interpreter, TRITON_INTERPRET=1)",
            src_cache.device,
        )
    if dst.device != src_cache.device:
        fail(ValueError, "dst", f"a tensor on {src_cache.device} (src_cache's device)", dst.device)


def _check_entries(src_cache: torch.Tensor, dst: torch.Tensor) -> None:
    if dst.shape[1:] != src_cache.shape[2:]:
        fail(
            ValueError,
            "dst",
            f"entry shape {tuple(src_cache.shape[2:])} (src_cache's shape after the first two "
            "dims) after the token dim",
            f"shape {tuple(dst.shape)}",
        )
    if not entry_is_dense(src_cache, 2):
        fail(
            ValueError, "src_cache", "each token's entry laid out contiguously", src_cache.stride()
        )
    if not entry_is_dense(dst, 1):
        fail(ValueError, "dst", "each row's entry laid out contiguously", dst.stride())


def check_cache_and_dst(src_cache: object, dst: object) -> None:
    """Both tensors, on one device the kernel can run on, with matching dense entries."""
    _check_tensors(src_cache, dst)
    _check_cache_shape(src_cache)
    _check_devices(src_cache, dst)
    _check_entries(src_cache, dst)


def check_sequences(
    src_cache: torch.Tensor,
    block_table: object,
    cu_seq_lens: object,
    batch: int,
    batch_from: str,
    seq_starts: object,
) -> None:
    """The index tensors both ops take; `batch` sequences, as read from `batch_from`."""
    dev = src_cache.device
    check_index("block_table", block_table, 2, dev, "src_cache")
    check_index("cu_seq_lens", cu_seq_lens, 1, dev, "src_cache")
    if cu_seq_lens.numel() != batch + 1:
        fail(
            ValueError,
            "cu_seq_lens",
            f"{batch + 1} entries (one more than the {batch} sequences of {batch_from})",
            cu_seq_lens.numel(),
        )
    if seq_starts is not None:
        check_index("seq_starts", seq_starts, 1, dev, "src_cache")
        if seq_starts.numel() < batch:
            fail(
                ValueError,
                "seq_starts",
                f"at least {batch} entries (one a sequence)",
                seq_starts.numel(),
            )


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        fail(TypeError, name, "an int", type(value).__name__)
    if value < 0:
        fail(ValueError, name, "a count >= 0", value)


def _check_kv_cache_dtype(kv_cache_dtype: object) -> None:
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        fail(ValueError, "kv_cache_dtype", f"one of {list(KV_CACHE_DTYPES)}", repr(kv_cache_dtype))


def _check_fp8_device(src_cache: torch.Tensor, kv_cache_dtype: str) -> None:
    if src_cache.is_cuda and device_info(src_cache.device).capability < MIN_FP8_CAPABILITY:
        fail(
            ValueError,
            "kv_cache_dtype",
            f"a GPU of compute capability >= {MIN_FP8_CAPABILITY} for {kv_cache_dtype!r} "
            "(Triton's fp8 conversions)",
            f"{kv_cache_dtype!r} on one of {device_info(src_cache.device).capability}",
        )


def _check_scale(src_cache: torch.Tensor, kv_cache_dtype: str, scale: object) -> None:
    if scale is None:
        fail(
            ValueError,
            "scale",
            f"a 1-element float32 tensor for kv_cache_dtype={kv_cache_dtype!r}",
            None,
        )
    if not isinstance(scale, torch.Tensor):
        fail(TypeError, "scale", "a 1-element float32 tensor", type(scale).__name__)
    if scale.dtype != torch.float32 or scale.numel() != 1:
        fail(
            TypeError,
            "scale",
            "a 1-element float32 tensor",
            f"dtype {scale.dtype}, {scale.numel()} elements",
        )
    if scale.device != src_cache.device:
        fail(ValueError, "scale", f"a tensor on {src_cache.device}", scale.device)


def _check_fp8_cache(src_cache: torch.Tensor, kv_cache_dtype: str, scale: object) -> None:
    _check_fp8_device(src_cache, kv_cache_dtype)
    # The bytes are read as `kv_cache_dtype` says, whatever 1-byte dtype views them: vLLM
    # hands MLA caches over viewed as its platform's fp8 dtype, e5m2 caches included.
    if src_cache.dtype not in FP8_STORAGE_DTYPES:
        fail(
            TypeError,
            "src_cache",
            f"a 1-byte dtype in {list(FP8_STORAGE_DTYPES)} for kv_cache_dtype={kv_cache_dtype!r}",
            src_cache.dtype,
        )
    _check_scale(src_cache, kv_cache_dtype, scale)


def _check_plain_cache(src_cache: torch.Tensor, kv_cache_dtype: str) -> None:
    want = PLAIN_KV_CACHE_DTYPES[kv_cache_dtype]
    allowed = (want,) if want is not None else DST_DTYPES
    if src_cache.dtype not in allowed:
        fail(
            TypeError,
            "src_cache",
            f"dtype in {list(allowed)} for kv_cache_dtype={kv_cache_dtype!r} "
            "(fp8 caches need an fp8 kv_cache_dtype)",
            src_cache.dtype,
        )


def _check_dst_rows(dst: torch.Tensor, num_tokens: object) -> None:
    _check_count("num_tokens", num_tokens)
    if dst.dim() < 1 or dst.shape[0] < num_tokens:
        fail(
            ValueError, "dst", f"at least num_tokens={num_tokens} rows", f"shape {tuple(dst.shape)}"
        )


def check_gather(
    src_cache: object,
    dst: object,
    block_table: object,
    cu_seq_lens: object,
    token_to_seq: object,
    num_tokens: object,
    kv_cache_dtype: object,
    scale: object,
    seq_starts: object,
    symbolic_tokens: bool = False,
) -> None:
    """Every argument of `gather_and_maybe_dequant_cache`, in the order the op reads them.

    `symbolic_tokens`: num_tokens is a torch.compile symbol (the fake): its checks wait for
    the real call, every other check runs."""
    check_cache_and_dst(src_cache, dst)
    _check_kv_cache_dtype(kv_cache_dtype)
    if not symbolic_tokens:
        _check_dst_rows(dst, num_tokens)
    if dst.dtype not in DST_DTYPES:
        fail(TypeError, "dst", f"dtype in {list(DST_DTYPES)}", dst.dtype)
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        _check_fp8_cache(src_cache, kv_cache_dtype, scale)
    else:
        _check_plain_cache(src_cache, kv_cache_dtype)
    batch = block_table.shape[0] if isinstance(block_table, torch.Tensor) else 0
    check_sequences(src_cache, block_table, cu_seq_lens, batch, "block_table's rows", seq_starts)
    check_index("token_to_seq", token_to_seq, 1, src_cache.device, "src_cache")
    if not symbolic_tokens and token_to_seq.numel() < num_tokens:
        fail(
            ValueError,
            "token_to_seq",
            f"at least num_tokens={num_tokens} entries",
            token_to_seq.numel(),
        )


def check_cp_gather(
    src_cache: object,
    dst: object,
    block_table: object,
    cu_seq_lens: object,
    batch_size: object,
    seq_starts: object,
) -> None:
    """Every argument of `cp_gather_cache` (a raw copy: dst has src_cache's dtype)."""
    check_cache_and_dst(src_cache, dst)
    _check_count("batch_size", batch_size)
    if src_cache.dtype.is_complex:
        fail(TypeError, "src_cache", "a real or integer dtype (copied as it is)", src_cache.dtype)
    if dst.dtype != src_cache.dtype:
        fail(TypeError, "dst", f"src_cache's dtype {src_cache.dtype} (a raw copy)", dst.dtype)
    check_sequences(src_cache, block_table, cu_seq_lens, batch_size, "batch_size", seq_starts)
    if block_table.shape[0] < batch_size:
        fail(
            ValueError,
            "block_table",
            f"at least batch_size={batch_size} rows",
            f"shape {tuple(block_table.shape)}",
        )


# ---- debug mode: index values, read on the host (synchronises) ----


def _host_cu_seq_lens(cu_seq_lens: torch.Tensor, batch_size: int) -> torch.Tensor:
    cu = cu_seq_lens[: batch_size + 1].to(torch.int64).cpu()
    if batch_size and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seq_lens: expected non-decreasing values, got {cu.tolist()[:16]}...")
    return cu


def _rows_by_token_to_seq(
    token_to_seq: torch.Tensor, cu_dev: torch.Tensor, num_rows: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, their sequences) of the rows the gather writes: those before their sequence's end."""
    rows = torch.arange(num_rows, device=cu_dev.device)
    seq = token_to_seq[:num_rows].to(torch.int64)
    bad = (seq < 0) | (seq >= batch_size)
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ValueError(
            f"token_to_seq: expected values in [0, {batch_size}), got {int(seq[t])} at {t}"
        )
    live = rows < cu_dev[seq + 1]
    return rows[live], seq[live]


def _rows_by_bisection(
    cu: torch.Tensor, cu_dev: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, their sequences) of cp_gather_cache: every row between the first and last offset."""
    if int(cu[-1]) > num_rows:
        raise ValueError(
            f"cu_seq_lens: expected a last entry <= dst's {num_rows} rows, got {int(cu[-1])}"
        )
    rows = torch.arange(int(cu[0]), int(cu[-1]), device=cu_dev.device)
    seq = torch.searchsorted(cu_dev, rows, right=True) - 1
    return rows, seq


def _check_positions(
    pos: torch.Tensor, rows: torch.Tensor, seq: torch.Tensor, block_size: int, max_blocks: int
) -> torch.Tensor:
    """Each row's block-table column; raises where a position falls outside the table."""
    blk = pos.div(block_size, rounding_mode="floor")
    bad = (pos < 0) | (blk >= max_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"seq_starts/cu_seq_lens: token {int(rows[i])} of sequence {int(seq[i])} is at "
            f"position {int(pos[i])}, outside the block table's {max_blocks} blocks "
            f"of {block_size}"
        )
    return blk


def _check_pages(
    block_table: torch.Tensor, seq: torch.Tensor, blk: torch.Tensor, num_blocks: int
) -> None:
    pages = block_table.to(torch.int64)[seq, blk]
    bad = (pages < 0) | (pages >= num_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"block_table: entry [{int(seq[i])}, {int(blk[i])}] = {int(pages[i])} is outside "
            f"src_cache's {num_blocks} blocks"
        )


def check_bounds_on_host(
    src_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor | None,
    num_rows: int,
    batch_size: int,
    seq_starts: torch.Tensor | None,
) -> None:
    """Debug-mode check of everything the fast path assumes; synchronises with the device.

    `token_to_seq` None: cp_gather_cache's rows (bisection of cu_seq_lens)."""
    cu = _host_cu_seq_lens(cu_seq_lens, batch_size)
    cu_dev = cu.to(block_table.device)
    if token_to_seq is not None:
        rows, seq = _rows_by_token_to_seq(token_to_seq, cu_dev, num_rows, batch_size)
    else:
        rows, seq = _rows_by_bisection(cu, cu_dev, num_rows)
    pos = rows - cu_dev[seq]
    if seq_starts is not None:
        pos = pos + seq_starts.to(torch.int64)[seq]
    blk = _check_positions(pos, rows, seq, src_cache.shape[1], block_table.shape[1])
    _check_pages(block_table, seq, blk, src_cache.shape[0])
