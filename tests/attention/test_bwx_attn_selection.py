"""The GPU user's selection path for BWX_ATTN, which no CPU engine takes.

`--attention-backend BWX_ATTN` on a GPU reaches vLLM 0.32's
`CudaPlatform.get_attn_backend_cls`, which validates the selected backend
(`validate_configuration`) and refuses it with vLLM's reasons. Here that code runs on the CPU
with the device query stubbed per test: every configuration of the support matrix is
accepted on sm80/sm90/sm100/sm120, and each unsupported one is refused with the reason vLLM
prints.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("vllm")

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backends.registry import (  # noqa: E402
    AttentionBackendEnum,
)
from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: E402

from tests.attention.conftest import (  # noqa: E402
    SUPPORTED_CAPABILITIES,
    registered_member,
    stub_capability,
)

BACKEND_PATH = "vllm_blackwell_ext.attention.bwx_attn.BwxAttentionBackend"

HEAD_SIZES = (64, 80, 96, 128, 192, 256)
DTYPES = (torch.bfloat16, torch.float16)
NATIVE_KV_DTYPES = ("auto", "float16", "bfloat16")
FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# None = the user gave no --block-size (vLLM then validates without one).
BLOCK_SIZES = (None, 16, 32, 64, 128)


@pytest.fixture(scope="module")
def bwx_member() -> AttentionBackendEnum:
    return registered_member("BWX_ATTN", BACKEND_PATH)


def _config(**overrides) -> AttentionSelectorConfig:
    fields = dict(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)
    fields.update(overrides)
    return AttentionSelectorConfig(**fields)


@pytest.mark.parametrize("capability", SUPPORTED_CAPABILITIES.values(), ids=SUPPORTED_CAPABILITIES)
def test_selection_accepts_every_configuration_of_the_support_matrix(
    cuda_platform, bwx_member, monkeypatch, capability
):
    stub_capability(monkeypatch, cuda_platform, capability)
    # fp8 caches need sm89+ (Triton's fp8e4nv); every listed capability but sm80 has it.
    kv_dtypes = NATIVE_KV_DTYPES + (FP8_KV_DTYPES if capability >= (8, 9) else ())
    checked = 0
    for head_size, dtype, kv_dtype, block_size, flags in itertools.product(
        HEAD_SIZES, DTYPES, kv_dtypes, BLOCK_SIZES, itertools.product((False, True), repeat=3)
    ):
        has_sink, has_sliding_window, use_non_causal = flags
        config = _config(
            head_size=head_size,
            dtype=dtype,
            kv_cache_dtype=kv_dtype,
            block_size=block_size,
            has_sink=has_sink,
            has_sliding_window=has_sliding_window,
            use_non_causal=use_non_causal,
        )
        path = cuda_platform.get_attn_backend_cls(bwx_member, config)
        assert path == BACKEND_PATH, config
        checked += 1
    assert checked >= 6 * 2 * 3 * 5 * 8


@pytest.mark.parametrize(
    ("capability", "overrides", "reason"),
    [
        pytest.param((9, 0), {"head_size": 72}, "head_size not supported", id="head72"),
        pytest.param((9, 0), {"head_size": 512}, "head_size not supported", id="head512"),
        pytest.param(
            (9, 0),
            {"kv_cache_dtype": "int8_per_token_head"},
            "kv_cache_dtype not supported",
            id="kv-int8-per-token-head",
        ),
        pytest.param(
            (9, 0),
            {"kv_cache_dtype": "fp8_per_token_head"},
            "kv_cache_dtype not supported",
            id="kv-fp8-per-token-head",
        ),
        pytest.param((9, 0), {"block_size": 24}, "block_size not supported", id="block24"),
        pytest.param((9, 0), {"block_size": 8}, "block_size not supported", id="block8"),
        pytest.param((7, 5), {}, "compute capability not supported", id="sm75"),
        pytest.param((9, 0), {"dtype": torch.float32}, "dtype not supported", id="fp32"),
        pytest.param((9, 0), {"use_mla": True}, "MLA not supported", id="mla"),
        pytest.param(
            (9, 0),
            {"attn_type": "encoder_only"},
            "attention type encoder_only not supported",
            id="encoder-only",
        ),
        pytest.param(
            (8, 0),
            {"kv_cache_dtype": "fp8"},
            "fp8 KV cache (fp8) needs compute capability >= 8.9, got 8.0",
            id="fp8-on-sm80",
        ),
        pytest.param(
            (8, 6),
            {"kv_cache_dtype": "fp8_e5m2"},
            "fp8 KV cache (fp8_e5m2) needs compute capability >= 8.9, got 8.6",
            id="fp8e5m2-on-sm86",
        ),
    ],
)
def test_selection_refuses_unsupported_configuration_with_vllms_reason(
    cuda_platform, bwx_member, monkeypatch, capability, overrides, reason
):
    stub_capability(monkeypatch, cuda_platform, DeviceCapability(*capability))
    with pytest.raises(ValueError) as excinfo:
        cuda_platform.get_attn_backend_cls(bwx_member, _config(**overrides))
    message = str(excinfo.value)
    assert "Selected backend AttentionBackendEnum.BWX_ATTN is not valid" in message
    assert reason in message


def test_sm75_refusal_lists_every_reason_at_once(cuda_platform, bwx_member, monkeypatch):
    stub_capability(monkeypatch, cuda_platform, DeviceCapability(7, 5))
    config = _config(head_size=72, kv_cache_dtype="int4_per_token_head", block_size=40)
    with pytest.raises(ValueError) as excinfo:
        cuda_platform.get_attn_backend_cls(bwx_member, config)
    for reason in (
        "head_size not supported",
        "kv_cache_dtype not supported",
        "block_size not supported",
        "compute capability not supported",
    ):
        assert reason in str(excinfo.value)


@pytest.mark.parametrize("capability", SUPPORTED_CAPABILITIES)
def test_vllm_gives_bwx_attn_whole_tma_tile_pages_on_hopper_only(
    cuda_platform, monkeypatch, capability
):
    """Without --block-size vLLM (0.32-0.34) asks a lone backend
    `get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)` (16 in 0.32-0.33, 64 in 0.34):
    ours answers 128 (whole TMA prefill tiles) on Hopper, vLLM's default elsewhere and on the
    CPU platform."""
    from vllm.config import CacheConfig

    from vllm_blackwell_ext.attention import bwx_attn
    from vllm_blackwell_ext.kernels.paged_attention import tuning_for

    default = CacheConfig.DEFAULT_BLOCK_SIZE
    assert bwx_attn.BwxAttentionBackend.get_preferred_block_size(default) == default  # CPU
    stub_capability(monkeypatch, cuda_platform, SUPPORTED_CAPABILITIES[capability])
    monkeypatch.setattr(bwx_attn, "current_platform", cuda_platform())
    pages = bwx_attn.BwxAttentionBackend.get_preferred_block_size(default)
    assert pages == (
        max(default, tuning_for("sm90").prefill_wide_tile_n) if capability == "sm90" else default
    )
    assert bwx_attn.BwxAttentionBackend.supports_block_size(pages)
