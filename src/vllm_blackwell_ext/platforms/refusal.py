"""The one thing our platforms add to vLLM's: refusing, where vLLM builds its configuration,
an `--attention-backend` of ours that cannot serve the model or its cache."""

from __future__ import annotations

from typing import Any


class RefusesUnservableAsks:
    """Mixin placed before a vLLM platform class: its `check_and_update_config` first refuses
    what `asked_backend_refusal` refuses (a ValueError with our reason), then runs vLLM's."""

    # A CPU engine: our backends run there only where BWX_CPU_BACKENDS routes them.
    cpu_engine = False

    @classmethod
    def refusal_capability(cls) -> Any:
        """The device capability the refusal judges fp8 and the floors by (None: no GPU)."""
        return None

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        # Here, not at the top: vLLM imports platform modules while `vllm.config` is being
        # imported, and the attention modules import `vllm.config`.
        from vllm_blackwell_ext.attention.asked_backend import asked_backend_refusal

        refusal = asked_backend_refusal(
            vllm_config, cls.refusal_capability(), cpu_engine=cls.cpu_engine
        )
        if refusal is not None:
            raise ValueError(refusal)
        super().check_and_update_config(vllm_config)  # type: ignore[misc]
