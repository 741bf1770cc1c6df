"""Input validation of the kernels and ops: one message form, built only when a check fails.

Every launcher validates its arguments on every call, so the success path must cost no more
than the comparisons themselves: formatting the ~40 messages of a paged-attention launch
eagerly cost about 0.2 ms of host time, more than a decode step's GPU time. Call `fail` from
the failing branch, where its arguments (f-strings, shape tuples) are evaluated::

    if t.dtype != torch.int32:
        fail(TypeError, "block_table", "dtype torch.int32", t.dtype)
"""

from __future__ import annotations

from typing import NoReturn


def fail(exc: type[Exception], arg: str, expected: str, got: object) -> NoReturn:
    """Raise `exc` with the message "<arg>: expected <expected>, got <got>"."""
    raise exc(f"{arg}: expected {expected}, got {got}")
