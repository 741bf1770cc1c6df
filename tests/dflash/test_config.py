"""Table-driven tests of DFlash config normalisation (no vLLM, no torch work)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from vllm_blackwell_ext.dflash.config import (
    DFlashPlan,
    LayerPlan,
    load_dflash_plan,
    normalize_dflash_config,
    ordered_feature_permutation,
)

# z-lab/Qwen3-8B-DFlash-b16 config.json. Fields as quoted by vllm-project/speculators'
# DFlashConverter unit test (`_source_config`, which copies that checkpoint's config) plus the
# Qwen3 defaults the checkpoint carries (rope_theta, rms_norm_eps, no sliding window).
ZLAB_QWEN3_8B_B16: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "model_type": "qwen3",
    "block_size": 16,
    "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "use_sliding_window": False,
    "sliding_window": None,
}

# z-lab Qwen3.5 mixed-layer draft: 5 layers, target taps [1, 8, 15, 22, 29], mask 248070,
# block 16 (model card of z-lab/Qwen3.5-9B-DFlash as mirrored by its fine-tunes), with the
# mixed `layer_types` + top-level `sliding_window` that z-lab's dflash/model.py reads
# (`config.sliding_window if config.layer_types[i] == "sliding_attention"`) and vLLM 0.32's
# qwen3_dflash.py documents for mixed drafts ("causal only for SWA"). 4 sliding + 1 full is the
# shape of the benchmark draft.
ZLAB_QWEN35_MIXED: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": 16,
    "num_target_layers": 32,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 8, 15, 22, 29]},
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "sliding_window": 2048,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
}

# XiaomiMiMo/MiMo-V2.5-Pro DFlash: `dflash_config.use_swa` + `swa_window_size`, no
# `layer_types`, sink bias and value scale inside dflash_config (the fields vLLM 0.32's
# qwen3_dflash.py reads for it; sizes here are illustrative, the field layout is the point).
MIMO_V25_PRO: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": 8,
    "vocab_size": 152576,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "dflash_config": {
        "mask_token_id": 152575,
        "target_layer_ids": [4, 20, 36, 52, 68],
        "use_swa": True,
        "swa_window_size": 128,
        "attention_sink_bias": True,
        "attention_value_scale": 0.5,
    },
}

# speculators-format DFlash export (vllm-project/speculators; field list from vLLM 0.32
# transformers_utils/configs/speculators/algos.py `update_dflash`): architecture in
# transformer_layer_config, taps as `aux_hidden_state_layer_ids` = target_layer_ids + 1.
SPECULATORS_DFLASH: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "speculators_model_type": "dflash",
    "speculators_version": "0.5.0",
    "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34],
    "block_size": 16,
    "mask_token_id": 151669,
    "draft_vocab_size": 151936,
    "speculators_config": {
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 15}],
        "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
    },
    "transformer_layer_config": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 5,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
    },
}

_FULL_NC = (False, None)

# (name, config, target_layer_ids, mask, block, [(causal, window) per layer])
CASES = [
    ("zlab-qwen3-8b-b16", ZLAB_QWEN3_8B_B16, (1, 9, 17, 25, 33), 151669, 16, [_FULL_NC] * 5),
    (
        "zlab-qwen3.5-mixed",
        ZLAB_QWEN35_MIXED,
        (1, 8, 15, 22, 29),
        248070,
        16,
        [(True, 2048)] * 4 + [(False, None)],
    ),
    ("mimo-v2.5-pro", MIMO_V25_PRO, (4, 20, 36, 52, 68), 152575, 8, [(False, 128)] * 3),
    ("speculators", SPECULATORS_DFLASH, (1, 9, 17, 25, 33), 151669, 16, [_FULL_NC] * 5),
]


@pytest.mark.parametrize(
    "config, ids, mask, block, layers", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_known_checkpoint_shapes_normalise_to_explicit_plan(
    config: dict, ids: tuple, mask: int, block: int, layers: list
) -> None:
    plan = normalize_dflash_config(copy.deepcopy(config))
    assert plan.target_layer_ids == ids
    assert plan.mask_token_id == mask
    assert plan.block_size == block
    assert [(lp.causal, lp.sliding_window) for lp in plan.layers] == layers
    assert plan.fc_shape == (plan.hidden_size, len(ids) * plan.hidden_size)


def test_mimo_extras_are_carried_in_plan() -> None:
    plan = normalize_dflash_config(MIMO_V25_PRO)
    assert plan.attention_sink_bias is True and plan.value_scale == 0.5


def test_speculators_source_format_is_recorded() -> None:
    assert normalize_dflash_config(SPECULATORS_DFLASH).source_format == "speculators"
    assert normalize_dflash_config(ZLAB_QWEN3_8B_B16).source_format == "dflash"


def _with(base: dict, path: str, value: Any) -> dict:
    cfg = copy.deepcopy(base)
    node = cfg
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


_DELETE = object()

# Causality/window precedence: (description, base, edits, expected per-layer (causal, window))
PRECEDENCE = [
    (
        "is_causal beats everything",
        ZLAB_QWEN35_MIXED,
        {"is_causal": True},
        [(True, 2048)] * 4 + [(True, None)],
    ),
    (
        "dflash_config.causal beats layer_types convention",
        ZLAB_QWEN35_MIXED,
        {"dflash_config.causal": False},
        [(False, 2048)] * 4 + [(False, None)],
    ),
    (
        "is_causal beats dflash_config.causal",
        ZLAB_QWEN3_8B_B16,
        {"is_causal": False, "dflash_config.causal": True},
        [_FULL_NC] * 5,
    ),
    (
        "HF-filled all-full layer_types + use_swa is every layer sliding",
        MIMO_V25_PRO,
        {"layer_types": ["full_attention"] * 3},
        [(False, 128)] * 3,
    ),
    (
        "swa_window_size beats top-level sliding_window",
        MIMO_V25_PRO,
        {"sliding_window": 4096},
        [(False, 128)] * 3,
    ),
    (
        "top-level sliding_window used when swa_window_size absent",
        MIMO_V25_PRO,
        {"dflash_config.swa_window_size": _DELETE, "sliding_window": 64},
        [(False, 64)] * 3,
    ),
    (
        "block_size may live in dflash_config",
        ZLAB_QWEN3_8B_B16,
        {"block_size": _DELETE, "dflash_config.block_size": 16},
        [_FULL_NC] * 5,
    ),
    (
        # speculators: the flag binds sliding layers; full layers are always bidirectional.
        "speculators sliding_window_non_causal=False leaves full layers bidirectional",
        SPECULATORS_DFLASH,
        {"sliding_window_non_causal": False},
        [_FULL_NC] * 5,
    ),
]


def test_speculators_sliding_window_non_causal_binds_only_the_sliding_layers() -> None:
    mixed = _with(
        _with(SPECULATORS_DFLASH, "sliding_window_non_causal", False),
        "transformer_layer_config.layer_types",
        ["sliding_attention"] * 4 + ["full_attention"],
    )
    mixed = _with(mixed, "transformer_layer_config.sliding_window", 256)
    plan = normalize_dflash_config(mixed)
    assert [(lp.causal, lp.sliding_window) for lp in plan.layers] == [(True, 256)] * 4 + [_FULL_NC]


def test_a_converted_speculators_draft_whose_full_layers_vllm_made_causal_is_refused() -> None:
    # What vLLM 0.32 hands over for that export: dflash_config.causal=True for every layer.
    converted = _with(
        _with(ZLAB_QWEN3_8B_B16, "dflash_config.causal", True),
        "eagle_aux_hidden_state_layer_ids",
        [2, 10, 18, 26, 34],
    )
    with pytest.raises(ValueError, match=r"full-attention layers \[0, 1, 2, 3, 4\] causal"):
        normalize_dflash_config(converted)
    # A z-lab draft that asks for causal layers itself is served as asked.
    plan = normalize_dflash_config(_with(ZLAB_QWEN3_8B_B16, "dflash_config.causal", True))
    assert all(lp.causal for lp in plan.layers)


@pytest.mark.parametrize(
    "base, edits, layers", [c[1:] for c in PRECEDENCE], ids=[c[0] for c in PRECEDENCE]
)
def test_causality_and_window_precedence(base: dict, edits: dict, layers: list) -> None:
    cfg = base
    for path, value in edits.items():
        cfg = _with(cfg, path, value)
    plan = normalize_dflash_config(cfg)
    assert [(lp.causal, lp.sliding_window) for lp in plan.layers] == layers


# Bad input: (description, base, edits, fragment the error must contain)
BAD = [
    (
        "missing target_layer_ids",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.target_layer_ids": _DELETE},
        "target_layer_ids",
    ),
    (
        "speculators missing aux ids",
        SPECULATORS_DFLASH,
        {"aux_hidden_state_layer_ids": _DELETE},
        "aux_hidden_state_layer_ids",
    ),
    (
        "empty target_layer_ids",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.target_layer_ids": []},
        "target_layer_ids",
    ),
    (
        "repeated target layer",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.target_layer_ids": [1, 1]},
        "target_layer_ids",
    ),
    (
        "target layer past num_target_layers",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.target_layer_ids": [1, 36]},
        "num_target_layers",
    ),
    (
        "missing mask_token_id",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.mask_token_id": _DELETE},
        "mask_token_id",
    ),
    (
        "mask_token_id outside vocabulary",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.mask_token_id": 151936},
        "mask_token_id",
    ),
    ("block_size of 1", ZLAB_QWEN3_8B_B16, {"block_size": 1}, "block_size"),
    (
        "embedding scale",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.input_embedding_scale": 2.0},
        "dflash_config.input_embedding_scale = 2.0",
    ),
    ("output multiplier", ZLAB_QWEN3_8B_B16, {"output_multiplier": 0.5}, "output_multiplier"),
    (
        "logit soft-capping",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.final_logit_softcapping": 30.0},
        "final_logit_softcapping",
    ),
    (
        "sampling from the anchor",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.sample_from_anchor": True},
        "sample_from_anchor",
    ),
    (
        "no aux hidden states",
        ZLAB_QWEN3_8B_B16,
        {"dflash_config.use_aux_hidden_state": False},
        "use_aux_hidden_state",
    ),
    ("conflicting block sizes", ZLAB_QWEN3_8B_B16, {"dflash_config.block_size": 8}, "block_size"),
    (
        "sliding layer without window",
        ZLAB_QWEN35_MIXED,
        {"sliding_window": _DELETE},
        "swa_window_size",
    ),
    (
        "layer_types length mismatch",
        ZLAB_QWEN35_MIXED,
        {"layer_types": ["full_attention"]},
        "layer_types",
    ),
    (
        "heads not a multiple of kv heads",
        ZLAB_QWEN3_8B_B16,
        {"num_key_value_heads": 5},
        "num_key_value_heads",
    ),
]


@pytest.mark.parametrize("base, edits, fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config_is_refused_naming_the_field(base: dict, edits: dict, fragment: str) -> None:
    cfg = base
    for path, value in edits.items():
        cfg = _with(cfg, path, value)
    with pytest.raises(ValueError, match=fragment):
        normalize_dflash_config(cfg)


def test_non_mapping_config_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="config must be a mapping"):
        normalize_dflash_config(42)


def test_neutral_values_of_the_refused_fields_are_accepted() -> None:
    cfg = ZLAB_QWEN3_8B_B16
    for path, value in {
        "dflash_config.input_embedding_scale": 1.0,
        "output_multiplier": 1,
        "dflash_config.final_logit_softcapping": 0.0,
        "dflash_config.sample_from_anchor": False,
        "dflash_config.use_aux_hidden_state": True,
    }.items():
        cfg = _with(cfg, path, value)
    assert normalize_dflash_config(cfg) == normalize_dflash_config(ZLAB_QWEN3_8B_B16)


def test_without_block_size_num_speculative_tokens_is_bounded_below_only() -> None:
    # vLLM's conversion of a speculators export drops block_size.
    plan = normalize_dflash_config(_with(ZLAB_QWEN3_8B_B16, "block_size", _DELETE))
    assert plan.block_size is None and plan.max_speculative_tokens is None
    plan.check_num_speculative_tokens(15)
    plan.check_num_speculative_tokens(40)
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1; got 0"):
        plan.check_num_speculative_tokens(0)


def test_num_speculative_tokens_above_block_minus_one_is_refused() -> None:
    plan = normalize_dflash_config(ZLAB_QWEN3_8B_B16)
    plan.check_num_speculative_tokens(15)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        plan.check_num_speculative_tokens(16)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(num_target_layers=36, target_hidden_size=2048), "hidden_size"),
        (dict(num_target_layers=30, target_hidden_size=4096), "target_layer_ids"),
        (
            dict(num_target_layers=36, target_hidden_size=4096, target_vocab_size=1000),
            "mask_token_id",
        ),
        (
            # The mask token fits, the vocabularies differ: no map between them.
            dict(num_target_layers=36, target_hidden_size=4096, target_vocab_size=152064),
            "vocab_size 151936 differs",
        ),
    ],
    ids=[
        "hidden-size-disagrees",
        "layer-outside-target",
        "mask-outside-target-vocab",
        "vocab-differs",
    ],
)
def test_target_mismatch_is_refused(kwargs: dict, fragment: str) -> None:
    plan = normalize_dflash_config(ZLAB_QWEN3_8B_B16)
    with pytest.raises(ValueError, match=fragment):
        plan.check_target(**kwargs)


def test_a_quantized_draft_is_refused_by_name() -> None:
    quantized = _with(ZLAB_QWEN3_8B_B16, "quantization_config", {"quant_method": "modelopt"})
    with pytest.raises(ValueError, match="quantization_config \\('modelopt'\\)"):
        normalize_dflash_config(quantized)


def test_a_noncausal_window_shorter_than_a_block_is_refused() -> None:
    # Backward-only here, both ways in z-lab's mask and vLLM's FlashAttention: they differ
    # only when the window is shorter than the block, which is refused.
    short = _with(_with(MIMO_V25_PRO, "dflash_config.swa_window_size", 8), "block_size", 16)
    with pytest.raises(ValueError, match="shorter than block_size 16"):
        normalize_dflash_config(short)


def test_noncausal_window_is_backward_only() -> None:
    lp = LayerPlan(index=0, causal=False, sliding_window=4)
    assert lp.key_visible(q_pos=10, k_pos=7)
    assert not lp.key_visible(q_pos=10, k_pos=6)
    assert lp.key_visible(q_pos=10, k_pos=25)  # later keys stay visible: the bound is backward
    causal = LayerPlan(index=0, causal=True, sliding_window=4)
    assert not causal.key_visible(q_pos=10, k_pos=11)


def test_plan_loads_from_checkpoint_dir(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(ZLAB_QWEN3_8B_B16))
    plan = load_dflash_plan(tmp_path)
    assert isinstance(plan, DFlashPlan) and plan.max_speculative_tokens == 15


def test_transformers_config_object_is_accepted() -> None:
    from transformers import Qwen3Config

    hf = Qwen3Config(**{k: v for k, v in ZLAB_QWEN3_8B_B16.items() if k != "auto_map"})
    plan = normalize_dflash_config(hf)
    # HF fills layer_types with full_attention: still the all-non-causal z-lab plan.
    assert [(lp.causal, lp.sliding_window) for lp in plan.layers] == [_FULL_NC] * 5
    assert plan.block_size == 16 and plan.target_layer_ids == (1, 9, 17, 25, 33)


def test_feature_permutation_sorts_declared_ids() -> None:
    assert ordered_feature_permutation([29, 1, 15]) == [1, 2, 0]
