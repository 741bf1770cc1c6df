"""What launches derive from an MLA cache (and a query) alone: TMA readability and descriptors.

The Triton TMA variant reads key tiles through two descriptors of the cache viewed as
[pages * page, width]; the Gluon variant through two of its own (the latent columns as 64-wide
chunks for one 3D copy, the rope columns), and two of the query. `MlaCacheLayout` makes the
cache's once and keeps them, for callers that decode over the same cache every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info

# TMA (tensor-memory-access copies) exists from Hopper on; the interpreter runs it on the CPU.
MIN_TMA_CAPABILITY: tuple[int, int] = (9, 0)
# The Gluon kernel's one shape: latent and rope widths, rows and keys per tile, warps.
GLUON_KV_LORA_RANK = 512
GLUON_ROPE_DIM = 64
GLUON_BLOCK_M = 64
GLUON_BLOCK_N = 64
GLUON_NUM_WARPS = 8
# Columns per swizzled row of a Gluon tile's latent chunk: one TMA box's width.
GLUON_CHUNK = 64


def device_reads_tma(info: DeviceInfo) -> bool:
    """Whether launches on `info`'s device can read key tiles by TMA."""
    return info.device_class == "cpu" or info.capability >= MIN_TMA_CAPABILITY


def cache_tma_page_size(kv_cache: torch.Tensor, info: DeviceInfo) -> int | None:
    """The cache's page size where TMA can read its tiles, else None: a cache on a GPU with TMA
    (or the interpreter), contiguous [pages, page, width] at a 16-byte address (a tile is then
    one block of a 2-D [pages * page, width] view; rows of 576 or 288 elements keep every
    row 16-byte aligned in bf16 and fp8 alike)."""
    if not kv_cache.is_contiguous() or kv_cache.data_ptr() % 16:
        return None
    if not device_reads_tma(info):
        return None
    return kv_cache.shape[1]


def query_is_tma_readable(q: torch.Tensor) -> bool:
    """Whether the Gluon variant can read q's rows through TMA: contiguous, 16-byte aligned."""
    return q.is_contiguous() and q.data_ptr() % 16 == 0


def tma_descriptors(kv_cache: torch.Tensor, block_n: int, kv_lora_rank: int) -> tuple:
    """The two descriptors a Triton TMA launch reads its key tiles through: the latent columns
    in quarters and the rope columns, over the cache as [pages * page, width]."""
    pages, page, width = kv_cache.shape
    shape, strides = [pages * page, width], [width, 1]
    return (
        TensorDescriptor(kv_cache, shape, strides, [block_n, kv_lora_rank // 4]),
        TensorDescriptor(kv_cache, shape, strides, [block_n, width - kv_lora_rank]),
    )


def gluon_descriptors(t: torch.Tensor, rows: int, block_rows: int) -> tuple:
    """Gluon descriptors of a [rows, R + P] view of `t`: its latent columns as R / 64 chunks of
    [block_rows, 64] (one 3D copy), and its rope columns as [block_rows, P]; each 64-column
    row swizzled over its own width (128 bytes of bf16, 64 of fp8)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    width = GLUON_KV_LORA_RANK + GLUON_ROPE_DIM
    bits = t.element_size() * 8
    chunks = GLUON_KV_LORA_RANK // GLUON_CHUNK
    swizzle = GLUON_CHUNK * bits // 8
    return (
        GluonDescriptor(
            t, [chunks, rows, GLUON_CHUNK], [GLUON_CHUNK, width, 1],
            [chunks, block_rows, GLUON_CHUNK], gl.NVMMASharedLayout(swizzle, bits, rank=3),
        ),
        GluonDescriptor(
            t, [rows, width], [width, 1], [block_rows, GLUON_ROPE_DIM],
            gl.NVMMASharedLayout(swizzle, bits),
        ),
    )  # fmt: skip


def gluon_cache_descriptors(kv_cache: torch.Tensor) -> tuple:
    """The cache's two Gluon descriptors (a contiguous [pages, page, R + P] cache)."""
    pages, page, _ = kv_cache.shape
    return gluon_descriptors(kv_cache, pages * page, GLUON_BLOCK_N)


def gluon_query_descriptors(q: torch.Tensor) -> tuple:
    """The query's two Gluon descriptors (a contiguous [tokens, heads, R + P] query)."""
    tokens, heads, _ = q.shape
    return gluon_descriptors(q, tokens * heads, GLUON_BLOCK_M)


@dataclass(frozen=True)
class MlaCacheLayout:
    """What launches derive from an MLA cache alone, made once per cache (`mla_cache_layout`):
    callers that decode over the same cache every step (an attention backend) pass it to
    `launch_mla_decode` / `mla_decode(..., cache_layout=...)`, which then skip the TMA checks
    and the descriptors' construction (host time per eager call). It holds the cache: keep it
    exactly as long as the cache itself."""

    kv_cache: torch.Tensor
    tma_page_size: int | None  # `cache_tma_page_size`
    _descriptors: dict[tuple[int, int] | str, tuple] = field(
        default_factory=dict, compare=False, repr=False
    )

    def descriptors(self, block_n: int, kv_lora_rank: int) -> tuple:
        """`tma_descriptors` of this cache (made on first use)."""
        key = (block_n, kv_lora_rank)
        descs = self._descriptors.get(key)
        if descs is None:
            descs = self._descriptors[key] = tma_descriptors(self.kv_cache, block_n, kv_lora_rank)
        return descs

    def gluon_descriptors(self) -> tuple:
        """`gluon_cache_descriptors` of this cache (made on first use)."""
        descs = self._descriptors.get("gluon")
        if descs is None:
            descs = self._descriptors["gluon"] = gluon_cache_descriptors(self.kv_cache)
        return descs


def mla_cache_layout(kv_cache: torch.Tensor, info: DeviceInfo | None = None) -> MlaCacheLayout:
    """The `MlaCacheLayout` of a latent cache on its device (`info`: that device's)."""
    info = info or device_info(kv_cache.device)
    return MlaCacheLayout(kv_cache, cache_tma_page_size(kv_cache, info))
