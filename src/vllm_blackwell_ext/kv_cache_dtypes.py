"""vLLM's `kv_cache_dtype` names of fp8 caches and the float8 type their bytes hold.

vLLM allocates fp8 caches as uint8; kernels read them through a view of this dtype. One table
for the adapters, the ops and the kernels (references keep their own, by design).
"""

from __future__ import annotations

import torch

FP8_KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,  # vLLM's "fp8" means e4m3 on NVIDIA
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
