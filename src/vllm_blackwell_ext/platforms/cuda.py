"""vLLM's CUDA platform, with our backends' refusals made where vLLM resolves the config."""

from __future__ import annotations

from typing import Any

from vllm.platforms.cuda import CudaPlatform

from vllm_blackwell_ext.platforms.refusal import RefusesUnservableAsks


class BwxCudaPlatform(RefusesUnservableAsks, CudaPlatform):
    """`CudaPlatform`, refusing an ask of BWX_ATTN / BWX_MLA it cannot serve (in the user's
    process, before any worker starts)."""

    @classmethod
    def refusal_capability(cls) -> Any:
        return cls.get_device_capability()
