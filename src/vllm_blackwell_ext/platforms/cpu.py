"""vLLM's CPU platform, with our backends' refusals made where vLLM resolves the config."""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform

from vllm_blackwell_ext.platforms.refusal import RefusesUnservableAsks


class BwxCpuPlatform(RefusesUnservableAsks, CpuPlatform):
    """`CpuPlatform`, refusing an ask of BWX_ATTN / BWX_MLA it cannot serve (in the user's
    process, before any worker starts)."""
