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
Each call runs the package's checks, then its plan, then its launch.
"""

from __future__ import annotations

import torch

from .kernels import kv_gather
from .kernels.kv_gather import check_cp_gather, check_gather

NAMESPACE = "vllm_blackwell_ext"


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
    check_gather(
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
    kv_gather.gather_and_maybe_dequant_cache(
        src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype,
        scale, seq_starts,
    )  # fmt: skip


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
    check_gather(
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
    check_cp_gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)
    kv_gather.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


def _cp_gather_fake(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    if isinstance(batch_size, int):
        check_cp_gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


# Schemas in the dispatcher's own language: `Tensor(a!) dst` declares that the op writes `dst`
# and nothing else (what `custom_op(mutates_args=("dst",))` would declare), so functionalization,
# torch.compile and CUDA-graph capture treat it right. We register through `torch.library.Library`
# rather than `custom_op`: the latter's Python wrappers (autograd, ADInplaceOrView, dynamo guard)
# cost more host time a call than a small gather takes on the GPU.
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

    Out-of-range entries (a ``token_to_seq``, position or ``block_table`` entry pointing
    outside the tensors) are not checked, as in vLLM's op: their rows are skipped, left
    unwritten, never read or written out of bounds. ``BWX_DEBUG_BOUNDS=1`` checks every index
    on the host first and raises a ValueError naming the argument (a synchronisation per call).
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
    Out-of-range ``block_table`` entries skip their rows (unwritten, nothing read out of
    bounds); ``BWX_DEBUG_BOUNDS=1`` checks them on the host first and raises instead.
    """
    torch.ops.vllm_blackwell_ext.cp_gather_cache(
        src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts
    )


__all__ = ["NAMESPACE", "cp_gather_cache", "gather_and_maybe_dequant_cache"]
