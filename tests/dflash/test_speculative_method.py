"""The `bwx_dflash` speculative method (vLLM 0.34+): registered by register(), resolved by
vLLM's own lookup, and adapting a draft config so that vLLM builds our draft model."""

from __future__ import annotations

import pytest

from vllm_blackwell_ext import components, vllm_compat

pytest.importorskip("vllm", reason="needs vLLM")
if not vllm_compat.has_speculative_method_registry():
    pytest.skip(
        f"vLLM {vllm_compat.installed_vllm_version()} has no register_speculative_method (0.34+)",
        allow_module_level=True,
    )

from vllm.v1.worker.gpu.spec_decode import speculator_config as vllm_speculators  # noqa: E402

from vllm_blackwell_ext.dflash.registration import BWX_DFLASH_ARCH_REWRITTEN  # noqa: E402


def test_register_adds_the_method_and_vllm_resolves_it_to_our_config():
    from vllm_blackwell_ext import register, registered_components

    register()
    assert components.DFLASH_METHOD in vllm_speculators.registered_speculative_methods()
    config_cls = vllm_speculators.get_custom_speculator_config_class(components.DFLASH_METHOD)
    from vllm_blackwell_ext.dflash.speculator_config import BwxDFlashSpeculatorConfig

    assert config_cls is BwxDFlashSpeculatorConfig
    assert config_cls.base_method == "dflash"
    assert config_cls.speculator_class.endswith("dflash.speculator.DFlashSpeculator")
    assert registered_components()["speculative_methods"] == {
        components.DFLASH_METHOD: components.DFLASH_METHOD_CONFIG
    }


class _DraftModelConfig:
    def __init__(self, hf_config) -> None:
        self.hf_config = hf_config


class _Spec:
    """What `adapt_draft_model_config` touches of a SpeculativeConfig."""

    def __init__(self, hf_config) -> None:
        self.draft_model_config = _DraftModelConfig(hf_config)
        self.arch_updates = 0

    def update_arch_(self) -> None:
        self.arch_updates += 1


@pytest.mark.parametrize("draft_arch", ["DFlashDraftModel", "Qwen3ForCausalLM"])
def test_adapted_draft_config_names_our_draft(draft_arch):
    from transformers import Qwen3Config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    from vllm_blackwell_ext.dflash.speculator_config import BwxDFlashSpeculatorConfig

    spec = _Spec(Qwen3Config(architectures=[draft_arch], num_hidden_layers=1))
    BwxDFlashSpeculatorConfig.adapt_draft_model_config(spec)
    assert spec.draft_model_config.hf_config.architectures == [BWX_DFLASH_ARCH_REWRITTEN]
    assert isinstance(spec.draft_model_config.hf_config, EAGLEConfig)  # vLLM's wrapper ran
    assert spec.arch_updates >= 1
    assert not BwxDFlashSpeculatorConfig.matches(spec)
