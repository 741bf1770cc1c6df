"""The `bwx_dflash` speculative method, for vLLM 0.34 and later (`register_speculative_method`).

`speculative_config={"method": "bwx_dflash", "model": DRAFT, ...}` runs vLLM's own DFlash
speculator with our draft model, whatever architecture the draft's config names (z-lab or
speculators format): the draft config is adapted as for `method="dflash"`, then pointed at our
draft's registered architecture. `method="dflash"` itself is left to upstream's draft.

Imported only where `vllm_compat.has_speculative_method_registry()` holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.worker.gpu.spec_decode.dflash.config import DFlashSpeculatorConfig

from vllm_blackwell_ext.dflash.registration import BWX_DFLASH_ARCH_REWRITTEN

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig


class BwxDFlashSpeculatorConfig(DFlashSpeculatorConfig):
    """vLLM's DFlash speculator (base method `dflash`) with `BwxDFlashDraftModel` as the draft."""

    @classmethod
    def matches(cls, spec: SpeculativeConfig) -> bool:
        return False  # chosen by name only, never guessed from a checkpoint

    @classmethod
    def adapt_draft_model_config(cls, spec: SpeculativeConfig) -> None:
        super().adapt_draft_model_config(spec)
        # The name vLLM's EAGLE wrapper gives our draft; ModelRegistry maps it to our class.
        spec.draft_model_config.hf_config.architectures = [BWX_DFLASH_ARCH_REWRITTEN]
        spec.update_arch_()
