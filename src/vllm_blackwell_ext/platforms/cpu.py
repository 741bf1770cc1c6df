"""vLLM's CPU platform, with our backends' refusals made where vLLM resolves the config."""

from __future__ import annotations

from typing import Any

from vllm.platforms.cpu import CpuPlatform

from vllm_blackwell_ext.components import BACKENDS
from vllm_blackwell_ext.platforms.refusal import RefusesUnservableAsks

_OUR_BACKENDS = frozenset(b.name for b in BACKENDS)


class BwxCpuPlatform(RefusesUnservableAsks, CpuPlatform):
    """`CpuPlatform`, refusing an ask of BWX_ATTN / BWX_MLA it cannot serve or this engine
    would not run (in the user's process, before any worker starts), and giving a layer the
    backend asked for where that is ours: vLLM's would answer its own CPU member (which
    `BWX_CPU_BACKENDS` points at the same class) with a log line saying it cannot use ours."""

    cpu_engine = True

    @classmethod
    def get_attn_backend_cls(
        cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if selected_backend is not None and selected_backend.name in _OUR_BACKENDS:
            # check_and_update_config let the ask through: this engine routes it to our class.
            return selected_backend.get_path()
        return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
