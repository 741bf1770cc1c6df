"""How a K/V cache pair is read: its TMA view (rows of slots) where TMA can read whole tiles.

`key_cache`/`value_cache` are [num_blocks, block_size, num_kv_heads, head_size] views; vLLM
stores [num_blocks, num_kv_heads, block_size, 2 * head_size] and hands out
`kv_cache.transpose(1, 2).split(head_size, -1)`. Only strides are used, never contiguity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.checks import fail

# Heads whose K/V tiles TMA can read whole (a tile's row is one head, a power of 2 wide).
TMA_HEAD_SIZES: tuple[int, ...] = (64, 128)


def tma_readable_heads(kv_elem: int, head_size: int, head_size_v: int) -> bool:
    """Whether caches of this element size and these head sizes can be read by TMA tiles
    when laid out as vLLM lays them out (`tma_page_size` checks a given pair in full)."""
    return kv_elem == 2 and head_size in TMA_HEAD_SIZES and head_size_v == head_size


def check_tma_tiles(page_size: int | None, tile_n: int, key_cache: torch.Tensor) -> None:
    """TMA tiles of `tile_n` keys need a TMA-readable cache whose pages hold whole tiles."""
    if page_size is None or page_size % tile_n:
        fail(
            ValueError,
            "config",
            f"tma_tiles=False for this cache (TMA tiles need a 2-byte cache with heads in "
            f"{TMA_HEAD_SIZES}, K and V views of the same strides, slots as 16-byte aligned "
            f"rows, and a block size that is a multiple of tile_n = {tile_n})",
            f"tma_tiles=True with a {key_cache.dtype} cache of shape "
            f"{tuple(key_cache.shape)}, strides {key_cache.stride()}",
        )


def tma_page_size(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int | None:
    """The cache's page size where TMA can read its tiles (`AttnConfig.tma_tiles`), else None.

    TMA reads a tile as a block of a 2D view whose rows are the cache's slots (`tma_grid`): a
    2-byte cache with heads in TMA_HEAD_SIZES, K and V views of the same strides (every vLLM
    layout), a page stride that is a multiple of the slot stride, each KV head either rows of
    its own or columns of each slot's row, 16-byte aligned slots and start addresses, and fewer
    than 2**31 rows (TMA coordinates are int32).
    """
    if not tma_readable_heads(key_cache.element_size(), key_cache.shape[3], value_cache.shape[3]):
        return None
    if value_cache.stride() != key_cache.stride() or value_cache.shape != key_cache.shape:
        return None
    grid = tma_grid(key_cache)
    if grid is None or grid[0] >= 2**31:
        return None
    if (key_cache.stride(1) * 2) % 16 or key_cache.data_ptr() % 16 or value_cache.data_ptr() % 16:
        return None
    return key_cache.shape[1]


def tma_grid(cache: torch.Tensor) -> tuple[int, int] | None:
    """(rows, columns) of the 2D slot view TMA reads a cache through, None if it has none.

    Row pitch is the slot stride. A page is `stride_page / stride_slot` rows; a KV head is
    `stride_head / stride_slot` rows where its stride is a multiple of the slot stride (vLLM's
    ...HNC layouts), else `stride_head` columns within each slot's row (...NHC); the kernel
    finds the same split (`_paged_attn_kernel`).
    """
    num_blocks, block_size, num_kv_heads, head = cache.shape
    stride_page, stride_slot, stride_head, _ = cache.stride()
    if stride_slot <= 0 or stride_head <= 0 or stride_page % stride_slot:
        return None
    page_rows = stride_page // stride_slot
    if stride_head % stride_slot == 0:
        head_rows, columns = stride_head // stride_slot, head
    elif (num_kv_heads - 1) * stride_head + head <= stride_slot:
        head_rows, columns = 0, (num_kv_heads - 1) * stride_head + head
    else:
        return None
    return (num_blocks - 1) * page_rows + (num_kv_heads - 1) * head_rows + block_size, columns


def _tma_descriptors(
    key_cache: torch.Tensor, value_cache: torch.Tensor, tile_n: int
) -> tuple[TensorDescriptor, TensorDescriptor]:
    """K and V as 2D [rows of slots, columns] views, read [TILE_N, head] at a time."""
    grid, head, stride_slot = tma_grid(key_cache), key_cache.shape[3], key_cache.stride(1)
    k_desc, v_desc = (
        TensorDescriptor(c, list(grid), [stride_slot, 1], [tile_n, head])
        for c in (key_cache, value_cache)
    )
    return k_desc, v_desc


# The attention kernel's arguments a cache pair fixes, as `PagedCacheLayout.kernel_args` holds them.
CACHE_ARG_NAMES = (
    "k_ptr", "v_ptr", "k_desc", "v_desc",
    "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh",
)  # fmt: skip


@dataclass(frozen=True)
class PagedCacheLayout:
    """What launches derive from a K/V cache pair alone, made once per cache
    (`paged_cache_layout`): callers that launch over the same cache every step (an attention
    backend) pass it to every launch, which then skips the TMA descriptors' construction.
    It holds the views it describes: keep it exactly as long as the cache itself."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    tma_page_size: int | None  # `tma_page_size`
    _descriptors: dict[int, tuple[TensorDescriptor, TensorDescriptor]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _kernel_args: dict[int, tuple] = field(default_factory=dict, compare=False, repr=False)

    def descriptors(self, tile_n: int) -> tuple[TensorDescriptor, TensorDescriptor]:
        """The K and V TMA descriptors of `tile_n`-key tiles (made on first use)."""
        descs = self._descriptors.get(tile_n)
        if descs is None:
            check_tma_tiles(self.tma_page_size, tile_n, self.key_cache)
            descs = self._descriptors[tile_n] = _tma_descriptors(
                self.key_cache, self.value_cache, tile_n
            )
        return descs

    def kernel_args(self, tma_tile_n: int) -> tuple:
        """The values of the attention kernel's arguments `CACHE_ARG_NAMES` (made once per
        tile width): descriptors of `tma_tile_n`-key tiles, None for both when it is 0."""
        args = self._kernel_args.get(tma_tile_n)
        if args is None:
            k, v = self.key_cache, self.value_cache
            descs = self.descriptors(tma_tile_n) if tma_tile_n else (None, None)
            args = self._kernel_args[tma_tile_n] = (k, v, *descs, *k.stride()[:3], *v.stride()[:3])
        return args


def paged_cache_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> PagedCacheLayout:
    """The `PagedCacheLayout` of a K/V cache pair (the views `paged_attention` takes)."""
    return PagedCacheLayout(key_cache, value_cache, tma_page_size(key_cache, value_cache))
