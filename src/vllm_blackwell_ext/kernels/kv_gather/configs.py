"""Launch configurations of the paged-KV gather, per device class (data, no logic).

Keyed by `DeviceInfo.device_class` ('sm90', 'sm120', ..., 'cpu' under the interpreter).
`python benchmarks/bench_kv_gather.py --tune` sweeps candidates on the GPU it runs on and
prints the entry of that class as one line of `GATHER_CONFIGS` (`format_entry`); `--write`
puts that line in this file. A class without an entry gets `DEFAULT_GATHER_CONFIG`.

The kernel keeps nothing in shared memory beyond layout conversions, so one shape serves every
shared-memory budget (the 101 KB parts as well as sm90's 227 KB).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatherConfig:
    """Launch shape: tokens per program, widest column piece, warps per program, and whether
    the streamed cache rows and dst rows are marked evict-first in L2 (keeps the small index
    tensors cached)."""

    block_t: int
    max_piece: int
    num_warps: int
    evict_first: bool = False


C = GatherConfig

# One line per device class, in the form `format_entry` writes.
# sm90: the best geometric mean of the tuning sweep on an H200 (B=8 ctx 32k, B=1 ctx 128k);
# smaller tiles came close, evict-first hints and narrower pieces were slower. cpu (Triton's
# interpreter): big tiles, fewer interpreted programs.
# fmt: off
GATHER_CONFIGS: dict[str, GatherConfig] = {
    "sm90": C(block_t=4, max_piece=512, num_warps=2, evict_first=False),
    "cpu": C(block_t=32, max_piece=1024, num_warps=4, evict_first=False),
}
# fmt: on

# Untuned classes: sm90's shape.
DEFAULT_GATHER_CONFIG = C(block_t=4, max_piece=512, num_warps=2, evict_first=False)


def gather_config(device_class: str) -> GatherConfig:
    """The table's entry for `device_class`, or `DEFAULT_GATHER_CONFIG`."""
    return GATHER_CONFIGS.get(device_class, DEFAULT_GATHER_CONFIG)


def format_entry(device_class: str, config: GatherConfig) -> str:
    """`config` as the line of `GATHER_CONFIGS` that holds `device_class`'s entry."""
    return (
        f'    "{device_class}": C(block_t={config.block_t}, max_piece={config.max_piece}, '
        f"num_warps={config.num_warps}, evict_first={config.evict_first}),"
    )
