"""Integer helpers for launch planning on the host.

`triton.cdiv` and `triton.next_power_of_2` are constexpr functions in recent Triton: called
from Python each costs microseconds (a wrapper that unwraps its arguments), and an eager
launch plans with several of them on every attention layer of every step.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1."""
    return 1 << (n - 1).bit_length()
