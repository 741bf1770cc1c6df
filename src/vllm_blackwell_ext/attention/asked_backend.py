"""What the engine being built asked for, read from vLLM's current config: for the refusals
that vLLM's CPU platform does not make itself (it hands every model its own attention entry,
whatever `--attention-backend` named)."""

from __future__ import annotations

from vllm.config import get_current_vllm_config_or_none

from vllm_blackwell_ext.components import BWX_MLA

LATENT_ATTENTION_ASKED = (
    "attention_backend=BWX_MLA was asked for, but this model has no latent attention (MLA): "
    "choose BWX_ATTN"
)


def latent_attention_was_asked() -> bool:
    """Whether the engine being built asked for BWX_MLA (False outside an engine's build)."""
    config = get_current_vllm_config_or_none()
    backend = config.attention_config.backend if config is not None else None
    return backend is not None and backend.name == BWX_MLA.name
