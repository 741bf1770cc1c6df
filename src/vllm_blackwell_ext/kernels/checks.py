"""Input validation of the kernels and ops: one message form, built only when a check fails.

Standalone calls validate their arguments on every call, so the success path must cost no
more than the comparisons themselves: formatting the messages of a launch eagerly would cost
more host time than a decode step's GPU time. Call `fail` from the failing branch, where its
arguments (f-strings, shape tuples) are evaluated::

    if t.dtype != torch.int32:
        fail(TypeError, "block_table", "dtype torch.int32", t.dtype)
"""

from __future__ import annotations

from typing import NoReturn

import torch


def fail(exc: type[Exception], arg: str, expected: str, got: object) -> NoReturn:
    """Raise `exc` with the message "<arg>: expected <expected>, got <got>"."""
    raise exc(f"{arg}: expected {expected}, got {got}")


def check_index(name: str, t: object, ndim: int, device: torch.device, device_of: str) -> None:
    """An int32 tensor of `ndim` dims on `device` (`device_of`'s) with a unit-stride last dim.

    The kernels address index tensors (sequence lengths, block-table rows) as packed int32
    arrays: a strided view would be read as other entries, so it is refused here.
    """
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype != torch.int32:
        fail(TypeError, name, "dtype torch.int32", t.dtype)
    if t.dim() != ndim:
        fail(ValueError, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.device != device:
        fail(ValueError, name, f"a tensor on {device} ({device_of}'s device)", t.device)
    if t.stride(-1) != 1 and t.numel() > 1:
        fail(ValueError, name, "unit stride in the last dim", f"strides {t.stride()}")
