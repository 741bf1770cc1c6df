"""BWX_ATTN's cache write where vLLM's Triton writer does not serve: plain torch indexing."""

from __future__ import annotations

import torch


def write_kv_with_torch(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor],
    fp8_dtype: torch.dtype | None,
) -> None:
    """Store this step's K/V at `slot_mapping` (slot -1: padding), no host sync.

    Padding rows are redirected to slot 0, which lies in vLLM's null block (block 0 is
    reserved by the block pool and never handed to a request), and write that slot's current
    bytes back, so they change nothing. fp8 caches (`fp8_dtype`) take the values divided by
    their scale, saturated, as vLLM's writers store them.
    """
    num_tokens = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(torch.long)
    valid = slots >= 0
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots - blocks * block_size
    valid = valid.view(-1, 1, 1)
    for cache, new, scale in zip((key_cache, value_cache), (key, value), scales, strict=True):
        new = new[:num_tokens]
        if fp8_dtype is not None:
            # Quantise with saturation, then move raw bytes: index and where kernels are not
            # implemented for float8 on every device.
            fmax = torch.finfo(fp8_dtype).max
            new = (new.float() / scale).clamp_(-fmax, fmax).to(fp8_dtype)
            new = new.view(torch.uint8)
            cache = cache.view(torch.uint8)
        else:
            new = new.to(cache.dtype)
        new = torch.where(valid, new, cache[blocks, offsets])
        cache.index_put_((blocks, offsets), new)
