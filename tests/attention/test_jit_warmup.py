"""Our kernels join vLLM 0.32's JIT warm-up: which variants a layer registers, and that
vLLM's own registry compiles them by launching our kernels (here under TRITON_INTERPRET=1).

On a GPU engine the proof is the JIT monitor staying silent about our kernels while serving
(tests/gpu_e2e); here the host side is checked: the keys, the builder's registration through
vLLM's registry, and that each warm-up launch runs.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # noqa: E402
from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from vllm_blackwell_ext.attention import bwx_attn, jit_warmup  # noqa: E402
from vllm_blackwell_ext.attention.bwx_attn import (  # noqa: E402
    BwxAttentionBackend,
    BwxAttentionImpl,
    BwxAttentionMetadataBuilder,
)
from vllm_blackwell_ext.kernels.device import DeviceInfo  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode import (  # noqa: E402
    MAX_SPLITS,
    merge_config,
    plan_mla_decode,
)
from vllm_blackwell_ext.kernels.paged_attention import (  # noqa: E402
    SPLIT_KV_MAX_QUERY_LEN,
    plan_split_kv,
    split_kv_max_tokens,
    tuning_for,
)
from vllm_blackwell_ext.kernels.paged_attention.configs import select_config  # noqa: E402
from vllm_blackwell_ext.switches import FRESH_PREFILL  # noqa: E402

H200 = DeviceInfo("NVIDIA H200", (9, 0), num_sms=132, smem_per_block=232_448)
QWEN3_8B = jit_warmup.AttentionLayerKind(
    q_dtype=torch.bfloat16,
    kv_dtype=torch.bfloat16,
    num_q_heads=32,
    num_kv_heads=8,
    head_size=128,
    block_size=16,
    causal=True,
    sliding_window=None,
    has_sinks=False,
    softcap=0.0,
)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("gqa", [1, 4, 16])
@pytest.mark.parametrize("num_kv_heads", [8, 48])
def test_warmup_keys_cover_every_variant_a_launch_can_compile(
    kv_dtype, gqa, num_kv_heads, monkeypatch
):
    monkeypatch.delenv(FRESH_PREFILL.name, raising=False)  # on by default
    # Brute force over what launches reach: every query length, every batch the split plan
    # may split, contexts up to max_model_len. A variant is the tile config and the merge
    # (none, in the kernel, or the merge kernel). 48 KV heads: fp8 single tokens plan at
    # most 8 splits (merged in the kernel) where 2-token launches on the same tile plan 11.
    max_model_len = 32768
    layer = jit_warmup.AttentionLayerKind(
        **{
            **QWEN3_8B.__dict__,
            "kv_dtype": kv_dtype,
            "num_kv_heads": num_kv_heads,
            "num_q_heads": num_kv_heads * gqa,
        }
    )
    keys = jit_warmup.paged_attention_warmup_keys(layer, max_model_len, H200)
    kv_elem = kv_dtype.itemsize

    def variant(q_len: int, splits: int):
        cfg = select_config(
            H200,
            head_k_pad=128,
            head_v_pad=128,
            gqa=gqa,
            max_seqlen_q=q_len,
            kv_elem=kv_elem,
            split_kv=splits > 1,
        )
        if splits == 1:
            return cfg, "unsplit"
        return cfg, "in kernel" if splits <= cfg.merge_in_kernel_max_splits else "merge kernel"

    reached = {variant(q_len, 1) for q_len in range(1, 4097)}
    max_tokens = split_kv_max_tokens(num_kv_heads, H200)
    for q_len in range(1, SPLIT_KV_MAX_QUERY_LEN + 1):
        for tokens in range(q_len, max_tokens + 1, q_len):
            for ctx in (q_len, 600, 2048, 4096, 8192, max_model_len):
                splits = plan_split_kv(tokens, q_len, ctx, num_kv_heads, H200, kv_elem=kv_elem)
                reached.add(variant(q_len, splits))
    paged = [k for k in keys if isinstance(k, jit_warmup.PagedAttentionKey)]
    warmed = {variant(k.max_seqlen_q, k.num_splits) for k in paged}
    assert warmed == reached
    assert len({(k.max_seqlen_q, k.num_splits) for k in paged}) == len(paged)
    # Fresh prompts of a cache in the query dtype also take the TMA prefill kernel.
    fresh = [k for k in keys if isinstance(k, jit_warmup.FreshPrefillKey)]
    assert len(fresh) == (1 if kv_dtype == torch.bfloat16 else 0)
    assert len(keys) == len(paged) + len(fresh)
    monkeypatch.setenv(FRESH_PREFILL.name, "0")  # the switch off: nothing of it is compiled
    off = jit_warmup.paged_attention_warmup_keys(layer, max_model_len, H200)
    assert off == paged


def test_decode_warmup_at_8_kv_heads_takes_each_merge():
    # Qwen3-8B on an H200 at 32k: single-token decode plans past the in-kernel merge's
    # limit, so its unsplit, in-kernel and merge-kernel variants are all warmed.
    keys = jit_warmup.paged_attention_warmup_keys(QWEN3_8B, 32768, H200)
    paged = [k for k in keys if isinstance(k, jit_warmup.PagedAttentionKey)]
    assert [k.num_splits for k in paged if k.max_seqlen_q == 1] == [
        1,
        2,
        tuning_for("sm90").merge_in_kernel_max_splits + 1,
    ]


def test_warmup_of_a_layer_with_wider_values_launches_at_its_own_widths():
    # vLLM's spec may carry a value head size apart from the key head size: the warm-up
    # launches (here under the interpreter) take both, as the layer's real launches do.
    layer = jit_warmup.AttentionLayerKind(
        **{
            **QWEN3_8B.__dict__,
            "num_q_heads": 4,
            "num_kv_heads": 2,
            "head_size": 64,
            "head_size_v": 96,
        }
    )
    keys = jit_warmup.paged_attention_warmup_keys(layer, 4096, H200)
    assert {k.num_splits for k in keys} >= {1, 2}
    for key in keys:
        jit_warmup.launch_paged_attention_warmup(key, torch.device("cpu"))


class _Layer(AttentionLayerBase):
    """What the builder reads of vLLM's Attention layers: the impl and DFlash's overrides."""

    def __init__(self, impl: BwxAttentionImpl, **overrides) -> None:
        self.impl = impl
        for name, value in overrides.items():
            setattr(self, name, value)

    def get_attn_backend(self):
        return BwxAttentionBackend

    def get_kv_cache_spec(self, vllm_config):
        raise NotImplementedError


@pytest.fixture()
def vllm_config(tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=4096,
    ).save_pretrained(tmp_path)
    model_config = ModelConfig(
        model=str(tmp_path), skip_tokenizer_init=True, dtype=torch.bfloat16, max_model_len=4096
    )
    # The device is named: a CUDA wheel of vLLM on a machine without a GPU infers none.
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=16),
        device_config=DeviceConfig(device="cpu"),
    )


def test_builder_registers_each_layer_kind_once_and_vllm_warmup_launches_them(
    vllm_config, monkeypatch
):
    full = BwxAttentionImpl(4, 64, 0.125, 2)
    window = BwxAttentionImpl(4, 64, 0.125, 2, sliding_window=32)
    layers = {
        "l0": _Layer(full),
        "l1": _Layer(BwxAttentionImpl(4, 64, 0.125, 2)),  # same kind as l0
        "l2": _Layer(window),
        "draft": _Layer(full, bwx_causal=False, bwx_sliding_window=None),
    }
    vllm_config.compilation_config.static_forward_context.update(layers)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    # The builder registers only on CUDA; here the registry's compile step runs our launch
    # on the CPU (interpreter) instead of the GPU, everything else is vLLM's own path.
    monkeypatch.setattr(bwx_attn.current_platform, "is_cuda", lambda: True)
    monkeypatch.delenv(FRESH_PREFILL.name, raising=False)  # on by default
    launched = []

    def compile_on_cpu(key):
        jit_warmup.launch_paged_attention_warmup(key, torch.device("cpu"))
        launched.append(key)

    monkeypatch.setattr(jit_warmup.PAGED_ATTENTION_WARMUP, "compile", compile_on_cpu)
    registry = JitWarmupRegistry(vllm_config)
    with registry.activate():
        BwxAttentionMetadataBuilder(spec, list(layers), vllm_config, "cpu")
    assert len(registry) == 3  # full causal, windowed causal, full non-causal
    registry.warmup()
    kinds = {(k.layer.causal, k.layer.sliding_window) for k in launched}
    assert kinds == {(True, None), (True, 32), (False, None)}
    paged = [k for k in launched if isinstance(k, jit_warmup.PagedAttentionKey)]
    assert any(k.num_splits > 1 for k in paged) and any(k.max_seqlen_q > 16 for k in paged)
    # Only the full causal kind takes fresh prompts through the TMA kernel (no window there).
    fresh = [k for k in launched if isinstance(k, jit_warmup.FreshPrefillKey)]
    assert [(k.layer.causal, k.layer.sliding_window) for k in fresh] == [(True, None)]


def test_nothing_is_registered_off_cuda(vllm_config):
    vllm_config.compilation_config.static_forward_context["l0"] = _Layer(
        BwxAttentionImpl(4, 64, 0.125, 2)
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    registry = JitWarmupRegistry(vllm_config)
    with registry.activate():
        BwxAttentionMetadataBuilder(spec, ["l0"], vllm_config, "cpu")
    assert len(registry) == 0


@pytest.mark.parametrize(
    "cache_dtype, kv_cache_dtype", [(torch.bfloat16, "auto"), (torch.uint8, "fp8")]
)
def test_mla_gather_warmup_launch_runs_on_scratch(cache_dtype, kv_cache_dtype):
    key = jit_warmup.MlaGatherKey(cache_dtype, kv_cache_dtype, torch.bfloat16, 576, 16)
    assert jit_warmup.MLA_GATHER_WARMUP.get_warmup_keys(key=key) == [key]
    jit_warmup.launch_mla_gather_warmup(key, torch.device("cpu"))


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_mla_decode_warmup_covers_every_split_variant_of_each_row_tile(kv_dtype):
    kind = jit_warmup.MlaDecodeKind(torch.bfloat16, kv_dtype, 16, 512, 64, has_lse=False)
    keys = jit_warmup.mla_decode_warmup_keys(kind, 8, H200)

    # Every config a launch of up to 8 query tokens can take, at any batch size, over vLLM's
    # contiguous cache of 64-slot pages (TMA entries included).
    def config(rows: int, batch: int):
        return plan_mla_decode(
            batch, rows, None, 1, H200, kv_dtype=kv_dtype, tma_page_size=64, num_splits=1
        ).config

    configs = {config(q * 16, b) for q in range(1, 9) for b in range(1, 300)}
    assert any(c.tma for c in configs)
    assert {config(k.query_len * 16, k.batch) for k in keys} == configs
    assert len(keys) == 3 * len(configs)
    # The one-split kernel, and the split kernel with every merge config a plan can pick.
    assert 1 in {k.num_splits for k in keys}
    merges = {merge_config(k.num_splits, "sm90", 512) for k in keys if k.num_splits > 1}
    assert merges == {merge_config(n, "sm90", 512) for n in range(2, MAX_SPLITS + 1)}
    for key in keys[:3]:  # one row tile, every variant, on the CPU interpreter
        cpu_key = jit_warmup.MlaDecodeKey(
            jit_warmup.MlaDecodeKind(torch.bfloat16, kv_dtype, 16, 512, 16, has_lse=True),
            key.query_len,
            key.num_splits,
            key.batch,
        )
        jit_warmup.launch_mla_decode_warmup(cpu_key, torch.device("cpu"))
