"""What a kernel needs to know about the device it runs on, to pick tile sizes.

Shared-memory limits per block (opt-in maximum) by compute capability, as in
flash-linear-attention's `fla/utils`: the consumer Blackwell/Ada/Ampere parts (sm86, sm89,
sm120) have 101,376 B; sm80 has 166,912 B; sm90 and sm100 have 232,448 B.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SMEM_LIMIT_BY_CAPABILITY: dict[tuple[int, int], int] = {
    (8, 0): 166_912,
    (8, 6): 101_376,
    (8, 7): 166_912,
    (8, 9): 101_376,
    (9, 0): 232_448,
    (10, 0): 232_448,
    (10, 3): 232_448,
    (12, 0): 101_376,
    (12, 1): 101_376,
}
# What we assume for a capability we have no entry for: the smallest budget we know.
CONSERVATIVE_SMEM_LIMIT = 101_376
# Our kernels' floors: tensor-core dots from sm80; fp8 caches need Triton's fp8e4nv (e4m3 loads
# and conversions), which exists from sm89 (e5m2 is held to the same floor: only tested there).
MIN_CAPABILITY: tuple[int, int] = (8, 0)
MIN_FP8_CAPABILITY: tuple[int, int] = (8, 9)


@dataclass(frozen=True)
class DeviceInfo:
    """The few device facts our launch heuristics and config tables read."""

    name: str
    capability: tuple[int, int]
    num_sms: int
    smem_per_block: int

    @property
    def warp_mma_only(self) -> bool:
        """Tensor cores fed per warp (mma.sync: sm80-sm89, sm120), without Hopper's warpgroup
        MMA or sm100's tensor-memory MMA: a tile's accumulator and dot operands sit in its
        warps' registers, so wide tiles need more warps."""
        return self.capability[0] in (8, 12)

    @property
    def device_class(self) -> str:
        """Config-table key: 'sm90', 'sm100', 'sm120', ... ('cpu' under the interpreter)."""
        return device_class_of(self.capability)


def device_class_of(capability: tuple[int, int]) -> str:
    """The config-table key of a compute capability ((0, 0): the CPU interpreter)."""
    if tuple(capability) == (0, 0):
        return "cpu"
    return f"sm{capability[0]}{capability[1]}"


CPU_DEVICE_INFO = DeviceInfo("cpu (TRITON_INTERPRET)", (0, 0), num_sms=4, smem_per_block=101_376)


def smem_limit_for(capability: tuple[int, int]) -> int:
    return SMEM_LIMIT_BY_CAPABILITY.get(tuple(capability), CONSERVATIVE_SMEM_LIMIT)


@functools.cache
def device_info(device: torch.device | str | int | None = None) -> DeviceInfo:
    """Facts of a CUDA device, or CPU_DEVICE_INFO for CPU tensors (interpreter runs)."""
    if device is None:
        if not torch.cuda.is_available():
            return CPU_DEVICE_INFO
        device = torch.cuda.current_device()
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        return CPU_DEVICE_INFO
    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    # The driver's opt-in limit when torch exposes it; else our table.
    smem = getattr(props, "shared_memory_per_block_optin", 0) or smem_limit_for(capability)
    return DeviceInfo(props.name, capability, props.multi_processor_count, int(smem))
