"""Input validation of fresh prefill (tensor metadata only), run where its plan is made."""

from __future__ import annotations

import torch

from vllm_blackwell_ext.kernels.checks import check_index, fail
from vllm_blackwell_ext.kernels.fresh_prefill.plan import (
    FRESH_PREFILL_HEAD_SIZES,
    FRESH_PREFILL_MAX_GQA,
)


def check_fresh_prefill(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Every check of one `fresh_prefill` call."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        fail(ValueError, "q", "a [num_tokens, num_heads, head_size] tensor", getattr(q, "shape", q))
    if q.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, "q", "dtype torch.bfloat16 or torch.float16", q.dtype)
    tokens, num_heads, head = q.shape
    if head not in FRESH_PREFILL_HEAD_SIZES:
        fail(ValueError, "q", f"head size in {FRESH_PREFILL_HEAD_SIZES}", head)
    _check_activation("q", q, q, tuple(q.shape))
    if not isinstance(key, torch.Tensor) or key.dim() != 3:
        fail(ValueError, "key", "a [num_tokens, num_kv_heads, head_size] tensor", key)
    num_kv_heads = key.shape[1]
    gqa, rem = divmod(num_heads, num_kv_heads)
    if rem or gqa > FRESH_PREFILL_MAX_GQA or gqa & (gqa - 1):
        fail(
            ValueError,
            "key",
            f"num_kv_heads dividing q's {num_heads} heads by a power of 2 up to "
            f"{FRESH_PREFILL_MAX_GQA}",
            num_kv_heads,
        )
    for name, t in (("key", key), ("value", value)):
        _check_activation(name, t, q, (tokens, num_kv_heads, head))
    _check_activation("out", out, q, tuple(q.shape))
    check_index("cu_seqlens_q", cu_seqlens_q, 1, q.device, "q")
    check_index("seq_lens", seq_lens, 1, q.device, "q")
    if cu_seqlens_q.shape[0] != seq_lens.shape[0] + 1:
        fail(
            ValueError,
            "cu_seqlens_q",
            f"{seq_lens.shape[0] + 1} entries (one more than seq_lens)",
            cu_seqlens_q.shape[0],
        )


def _check_activation(name: str, t: object, q: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype != q.dtype:
        fail(TypeError, name, f"dtype {q.dtype} (the query's)", t.dtype)
    if t.device != q.device:
        fail(ValueError, name, f"a tensor on {q.device} (the query's device)", t.device)
    if tuple(t.shape) != shape:
        fail(ValueError, name, f"shape {shape}", f"shape {tuple(t.shape)}")
    # TMA reads rows through their stride: the head dim packed, heads adjacent, 16-byte rows.
    elem = t.element_size()
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
        fail(ValueError, name, "packed heads (strides (row, head_size, 1))", f"{t.stride()}")
    if t.data_ptr() % 16 or (t.stride(0) * elem) % 16:
        fail(ValueError, name, "a 16-byte aligned start and row stride", f"{t.stride()}")
