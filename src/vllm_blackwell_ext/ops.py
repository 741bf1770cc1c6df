"""torch custom ops of vllm-blackwell-ext (namespace ``vllm_blackwell_ext``).

Importing this module registers them (once: a second import, or a reload, finds them there).

* ``gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
  num_tokens, kv_cache_dtype, scale, seq_starts=None)``
* ``cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None)``

Same argument names, order and meaning as vLLM's CUDA ops in ``vllm/_custom_ops.py``, so a
caller swaps one for the other. Both write ``dst`` only (declared as ``Tensor(a!) dst``), have
fake implementations for ``torch.compile``/CUDA-graph tracing, and validate every argument's
dtype, device and shape before anything is launched (errors name the argument). Index values
are not read on the host (that would synchronise): the kernel skips rows whose indices point
outside the tensors, so bad input never reads or writes out of bounds; ``BWX_DEBUG_BOUNDS=1``
checks them on the host and raises instead, see `vllm_blackwell_ext.kernels.kv_gather`.
"""

from __future__ import annotations

import math

import torch

from .kernels import kv_gather as _kv
from .kernels.checks import check_index, fail
from .kernels.device import MIN_FP8_CAPABILITY, device_info

NAMESPACE = "vllm_blackwell_ext"
# What may hold an fp8 cache's bytes: its kv_cache_dtype string says how they are read.
_FP8_STORAGE_DTYPES: tuple[torch.dtype, ...] = (
    torch.uint8,
    *dict.fromkeys(_kv.FP8_KV_CACHE_DTYPES.values()),
)


def _check_cache_and_dst(src_cache: object, dst: object) -> None:
    if not isinstance(src_cache, torch.Tensor):
        fail(TypeError, "src_cache", "a torch.Tensor", type(src_cache).__name__)
    if not isinstance(dst, torch.Tensor):
        fail(TypeError, "dst", "a torch.Tensor", type(dst).__name__)
    if src_cache.dim() < 3:
        fail(ValueError, "src_cache", "[num_blocks, block_size, *entry]", tuple(src_cache.shape))
    if src_cache.shape[1] < 1:
        fail(ValueError, "src_cache", "block_size (dim 1) >= 1", src_cache.shape[1])
    if math.prod(src_cache.shape[2:]) < 1:
        fail(ValueError, "src_cache", "entries of at least one element", tuple(src_cache.shape))
    if src_cache.device.type == "cpu" and not _kv.INTERPRETED:
        fail(
            ValueError,
            "src_cache",
            "a CUDA tensor (CPU tensors run only under Triton's interpreter, TRITON_INTERPRET=1)",
            src_cache.device,
        )
    if dst.device != src_cache.device:
        fail(ValueError, "dst", f"a tensor on {src_cache.device} (src_cache's device)", dst.device)
    if dst.shape[1:] != src_cache.shape[2:]:
        fail(
            ValueError,
            "dst",
            f"entry shape {tuple(src_cache.shape[2:])} (src_cache's shape after the first two "
            "dims) after the token dim",
            f"shape {tuple(dst.shape)}",
        )
    if not _kv._entry_is_dense(src_cache, 2):
        fail(
            ValueError, "src_cache", "each token's entry laid out contiguously", src_cache.stride()
        )
    if not _kv._entry_is_dense(dst, 1):
        fail(ValueError, "dst", "each row's entry laid out contiguously", dst.stride())


def _check_common(
    src_cache, dst, block_table, cu_seq_lens, batch: int, batch_from: str, seq_starts
) -> None:
    """`batch`: the sequence count, read from `batch_from` (named in errors)."""
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


def _validate_gather(
    src_cache,
    dst,
    block_table,
    cu_seq_lens,
    token_to_seq,
    num_tokens,
    kv_cache_dtype,
    scale,
    seq_starts,
    symbolic_tokens: bool = False,
) -> None:
    """`symbolic_tokens`: num_tokens is a torch.compile symbol (the fake): its checks wait for
    the real call, every other check runs."""
    _check_cache_and_dst(src_cache, dst)
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in _kv.KV_CACHE_DTYPES:
        fail(
            ValueError,
            "kv_cache_dtype",
            f"one of {list(_kv.KV_CACHE_DTYPES)}",
            repr(kv_cache_dtype),
        )
    if not symbolic_tokens:
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool):
            fail(TypeError, "num_tokens", "an int", type(num_tokens).__name__)
        if num_tokens < 0:
            fail(ValueError, "num_tokens", "a count >= 0", num_tokens)
        if dst.dim() < 1 or dst.shape[0] < num_tokens:
            fail(
                ValueError,
                "dst",
                f"at least num_tokens={num_tokens} rows",
                f"shape {tuple(dst.shape)}",
            )
    if dst.dtype not in _kv.DST_DTYPES:
        fail(TypeError, "dst", f"dtype in {list(_kv.DST_DTYPES)}", dst.dtype)
    fp8 = _kv.FP8_KV_CACHE_DTYPES.get(kv_cache_dtype)
    if fp8 is not None:
        if src_cache.is_cuda and device_info(src_cache.device).capability < MIN_FP8_CAPABILITY:
            fail(
                ValueError,
                "kv_cache_dtype",
                f"a GPU of compute capability >= {MIN_FP8_CAPABILITY} for {kv_cache_dtype!r} "
                "(Triton's fp8 conversions)",
                f"{kv_cache_dtype!r} on one of {device_info(src_cache.device).capability}",
            )
        # The bytes are read as `kv_cache_dtype` says, whatever 1-byte dtype views them: vLLM
        # hands MLA caches over viewed as its platform's fp8 dtype, e5m2 caches included.
        if src_cache.dtype not in _FP8_STORAGE_DTYPES:
            fail(
                TypeError,
                "src_cache",
                f"a 1-byte dtype in {list(_FP8_STORAGE_DTYPES)} for kv_cache_dtype="
                f"{kv_cache_dtype!r}",
                src_cache.dtype,
            )
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
    else:
        want = _kv.PLAIN_KV_CACHE_DTYPES[kv_cache_dtype]
        allowed = (want,) if want is not None else _kv.DST_DTYPES
        if src_cache.dtype not in allowed:
            fail(
                TypeError,
                "src_cache",
                f"dtype in {list(allowed)} for kv_cache_dtype="
                f"{kv_cache_dtype!r} (fp8 caches need an fp8 kv_cache_dtype)",
                src_cache.dtype,
            )
    batch = block_table.shape[0] if isinstance(block_table, torch.Tensor) else 0
    _check_common(src_cache, dst, block_table, cu_seq_lens, batch, "block_table's rows", seq_starts)
    check_index("token_to_seq", token_to_seq, 1, src_cache.device, "src_cache")
    if not symbolic_tokens and token_to_seq.numel() < num_tokens:
        fail(
            ValueError,
            "token_to_seq",
            f"at least num_tokens={num_tokens} entries",
            token_to_seq.numel(),
        )


def _validate_cp_gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts) -> None:
    _check_cache_and_dst(src_cache, dst)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        fail(TypeError, "batch_size", "an int", type(batch_size).__name__)
    if batch_size < 0:
        fail(ValueError, "batch_size", "a count >= 0", batch_size)
    if src_cache.dtype.is_complex:
        fail(TypeError, "src_cache", "a real or integer dtype (copied as it is)", src_cache.dtype)
    if dst.dtype != src_cache.dtype:
        fail(TypeError, "dst", f"src_cache's dtype {src_cache.dtype} (a raw copy)", dst.dtype)
    _check_common(src_cache, dst, block_table, cu_seq_lens, batch_size, "batch_size", seq_starts)
    if block_table.shape[0] < batch_size:
        fail(
            ValueError,
            "block_table",
            f"at least batch_size={batch_size} rows",
            f"shape {tuple(block_table.shape)}",
        )


def _gather_impl(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None = None,
) -> None:
    _validate_gather(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        num_tokens,
        kv_cache_dtype,
        scale,
        seq_starts,
    )
    _kv.gather_and_maybe_dequant_cache(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        num_tokens,
        kv_cache_dtype,
        scale,
        seq_starts,
    )


def _gather_fake(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None = None,
) -> None:
    # Metadata checks only; a symbolic num_tokens (torch.compile dynamic) leaves its own
    # checks to the real call.
    _validate_gather(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        num_tokens,
        kv_cache_dtype,
        scale,
        seq_starts,
        symbolic_tokens=not isinstance(num_tokens, int),
    )


def _cp_gather_impl(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    _validate_cp_gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)
    _kv.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


def _cp_gather_fake(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    if isinstance(batch_size, int):
        _validate_cp_gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


# Schemas in the dispatcher's own language: `Tensor(a!) dst` declares that the op writes `dst`
# and nothing else (what `custom_op(mutates_args=("dst",))` would declare), so functionalization,
# torch.compile and CUDA-graph capture treat it right. We register through `torch.library.Library`
# rather than `custom_op`: the latter's Python wrappers (autograd, ADInplaceOrView, dynamo guard)
# cost tens to hundreds of microseconds a call, more than a small gather takes on the GPU.
SCHEMAS = {
    "gather_and_maybe_dequant_cache": (
        "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor(a!) dst, Tensor block_table, "
        "Tensor cu_seq_lens, Tensor token_to_seq, int num_tokens, str kv_cache_dtype, "
        "Tensor? scale, Tensor? seq_starts=None) -> ()"
    ),
    "cp_gather_cache": (
        "cp_gather_cache(Tensor src_cache, Tensor(a!) dst, Tensor block_table, "
        "Tensor cu_seq_lens, int batch_size, Tensor? seq_starts=None) -> ()"
    ),
}

# Kept across `importlib.reload` (the module dict survives it): dropping the Library object
# would unregister everything it holds.
if "_LIB" not in globals():
    _LIB = torch.library.Library(NAMESPACE, "FRAGMENT")


def _register(name: str, impl, fake) -> None:
    qualname = f"{NAMESPACE}::{name}"
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return  # already defined in this process (module reloaded, or two copies imported)
    except RuntimeError:
        pass
    _LIB.define(SCHEMAS[name])
    for key in ("CUDA", "CPU"):  # CPU: Triton's interpreter (TRITON_INTERPRET=1)
        _LIB.impl(name, impl, key)
    torch.library.register_fake(qualname, fake, lib=_LIB)


_register("gather_and_maybe_dequant_cache", _gather_impl, _gather_fake)
_register("cp_gather_cache", _cp_gather_impl, _cp_gather_fake)


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
) -> None:
    """Gather ``num_tokens`` rows of a paged KV cache into ``dst``, dequantizing fp8.

    Drop-in for vLLM's op of this name. Row ``t < num_tokens`` of ``dst`` receives the token at
    position ``t - cu_seq_lens[b] + seq_starts[b]`` of sequence ``b = token_to_seq[t]`` (rows
    with ``t >= cu_seq_lens[b + 1]`` are left untouched). ``src_cache``: ``[num_blocks,
    block_size, *entry]``; ``dst``: ``[>= num_tokens, *entry]`` in bf16, fp16 or fp32.
    ``kv_cache_dtype``: "auto", "bfloat16", "float16" (values converted to dst's dtype) or
    "fp8", "fp8_e4m3", "fp8_e5m2" (uint8 or fp8 cache; values times ``scale``, a 1-element
    fp32 tensor). Index tensors are int32 on the cache's device.
    """
    # The op validates (once, before launching); errors keep their type through the dispatcher.
    torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache(
        src_cache,
        dst,
        block_table,
        cu_seq_lens,
        token_to_seq,
        num_tokens,
        kv_cache_dtype,
        scale,
        seq_starts,
    )


def cp_gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    """Copy the tokens of sequences ``b < batch_size`` into rows ``cu_seq_lens[b]..[b+1]`` of
    ``dst``, bytes unchanged (``dst`` has ``src_cache``'s dtype). Drop-in for vLLM's op.

    Rows of ``dst`` outside ``[cu_seq_lens[0], cu_seq_lens[batch_size])`` are left untouched,
    and nothing past ``dst.shape[0]`` is written even if ``cu_seq_lens`` says more.
    """
    torch.ops.vllm_blackwell_ext.cp_gather_cache(
        src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts
    )


__all__ = ["NAMESPACE", "cp_gather_cache", "gather_and_maybe_dequant_cache"]
