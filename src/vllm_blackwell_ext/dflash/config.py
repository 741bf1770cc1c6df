"""Normalise a DFlash draft checkpoint's `config.json` into one explicit plan.

DFlash drafts ship in several config dialects (z-lab `DFlashDraftModel`, z-lab mixed-layer drafts
with `layer_types`, MiMo's `use_swa`, vLLM `speculators` exports). Every consumer here (loader,
reference, vLLM model) reads the resulting `DFlashPlan` instead of re-deriving fields, so a rule
lives in exactly one place. Imports nothing from vLLM.

Rules:
- `target_layer_ids` is required; there is no fallback formula (a guessed layer list silently
  destroys acceptance). Ids are 0-based target layers; the feature of id `i` is HF
  `hidden_states[i + 1]`, i.e. the output of target layer `i`.
- `mask_token_id` from `dflash_config`, then top level; `block_size` from the top level or
  `dflash_config` (both present and different is an error). vLLM's conversion of a speculators
  export drops `block_size`: then the plan has none and `num_speculative_tokens` is not bounded
  by it.
- Fields that change the draft's outputs and that this draft does not implement (z-lab's
  `input_embedding_scale`, `output_multiplier`, `final_logit_softcapping`; vLLM's
  `sample_from_anchor`; `use_aux_hidden_state: false`) are refused when set to anything but
  their neutral value, rather than ignored.
- Causality per layer: explicit `is_causal`, then `dflash_config.causal`, then conventions:
  z-lab mixed `layer_types` -> sliding layers causal, full layers non-causal; everything else
  (incl. MiMo `use_swa` without `layer_types`) non-causal.
- Sliding: `layer_types[i] == "sliding_attention"`; `dflash_config.use_swa` forces every layer
  sliding when `layer_types` names no sliding layer (HF fills an absent `layer_types` with
  "full_attention", so that case must mean "no layer_types"). The window comes from
  `dflash_config.swa_window_size`, then top-level `sliding_window`, and is a backward-only bound:
  a query at position p sees key k only if p - k < window; keys after p inside the block stay
  visible to non-causal layers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"

__all__ = [
    "DFlashPlan",
    "LayerPlan",
    "normalize_dflash_config",
    "load_dflash_plan",
]


@dataclass(frozen=True)
class LayerPlan:
    """Attention of one draft layer. `sliding_window` None means full attention."""

    index: int
    causal: bool
    sliding_window: int | None

    def key_visible(self, q_pos: int, k_pos: int) -> bool:
        """Whether a query at absolute position `q_pos` may attend to a key at `k_pos`."""
        if self.causal and k_pos > q_pos:
            return False
        # Backward-only bound: the window never hides keys after the query.
        return not (self.sliding_window is not None and q_pos - k_pos >= self.sliding_window)


@dataclass(frozen=True)
class DFlashPlan:
    """Everything the draft needs, resolved and validated, independent of the config dialect."""

    source_format: str  # "dflash" (z-lab style) or "speculators"
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    mask_token_id: int
    block_size: int | None  # None: the config does not say (see the module docstring)
    layers: tuple[LayerPlan, ...]
    # MiMo-style extras (vLLM 0.32 reads them from dflash_config): a learned per-head softmax
    # sink on every layer and a constant multiplier on V.
    attention_sink_bias: bool = False
    value_scale: float | None = None

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def fc_shape(self) -> tuple[int, int]:
        """`fc.weight` is [H, k * H_target] for k target layers (nn.Linear layout)."""
        return (self.hidden_size, self.num_target_features * self.target_hidden_size)

    @property
    def max_speculative_tokens(self) -> int | None:
        # One query slot is the bonus token; the other B - 1 are masks that become proposals.
        return None if self.block_size is None else self.block_size - 1

    @property
    def any_non_causal(self) -> bool:
        return any(not lp.causal for lp in self.layers)

    @property
    def uniform_attention(self) -> bool:
        """All layers share causality and window (one attention group suffices)."""
        first = self.layers[0]
        return all(
            lp.causal == first.causal and lp.sliding_window == first.sliding_window
            for lp in self.layers
        )

    def check_num_speculative_tokens(self, num_speculative_tokens: int) -> None:
        if self.max_speculative_tokens is None:
            if num_speculative_tokens < 1:
                raise ValueError(
                    f"num_speculative_tokens must be >= 1; got {num_speculative_tokens}"
                )
            return
        if not 1 <= num_speculative_tokens <= self.max_speculative_tokens:
            raise ValueError(
                f"num_speculative_tokens must be in [1, block_size - 1 = "
                f"{self.max_speculative_tokens}] for this DFlash draft (block_size "
                f"{self.block_size}); got {num_speculative_tokens}"
            )

    def check_target(
        self,
        *,
        num_target_layers: int,
        target_hidden_size: int,
        target_vocab_size: int | None = None,
    ) -> None:
        """Validate the draft against the target it will run with."""
        if target_hidden_size != self.target_hidden_size:
            raise ValueError(
                f"target hidden_size {target_hidden_size} disagrees with the draft's "
                f"target_hidden_size {self.target_hidden_size} (fc expects "
                f"{self.num_target_features} x {self.target_hidden_size} input features)"
            )
        bad = [i for i in self.target_layer_ids if not 0 <= i < num_target_layers]
        if bad:
            raise ValueError(
                f"dflash_config.target_layer_ids {list(self.target_layer_ids)} must be 0-based "
                f"layer indices of the target in [0, {num_target_layers - 1}]; got {bad} outside"
            )
        if self.num_target_layers is not None and self.num_target_layers != num_target_layers:
            raise ValueError(
                f"draft config num_target_layers {self.num_target_layers} disagrees with the "
                f"target's {num_target_layers} layers"
            )
        if target_vocab_size is not None and not 0 <= self.mask_token_id < target_vocab_size:
            raise ValueError(
                f"mask_token_id must be in the target vocabulary [0, {target_vocab_size}); "
                f"got {self.mask_token_id}"
            )
        if target_vocab_size is not None and self.vocab_size != target_vocab_size:
            # The draft runs on the target's embedding and LM head, with no token map.
            raise ValueError(
                f"the draft's vocab_size {self.vocab_size} differs from the target's "
                f"{target_vocab_size}: this draft shares the target's embedding and LM head "
                "and has no map between two vocabularies"
            )


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(
        f"config must be a mapping (parsed config.json) or a transformers config with "
        f"to_dict(); got {type(config).__name__}"
    )


def _int_field(name: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def _required(cfg: Mapping[str, Any], name: str) -> Any:
    if cfg.get(name) is None:
        raise ValueError(f"DFlash draft config is missing required field {name!r}")
    return cfg[name]


def _from_speculators(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """speculators-format -> (architecture fields, dflash fields in z-lab convention).

    speculators stores `aux_hidden_state_layer_ids` in vLLM's capture convention (id L = output
    of layer L - 1), i.e. z-lab `target_layer_ids` + 1. `sliding_window_non_causal` (default
    True) chooses the causality of sliding layers only: speculators trains full-attention
    layers bidirectional whatever it says (its mask: `non_causal = sliding_window is None or
    sliding_window_non_causal`).
    """
    arch = dict(raw.get("transformer_layer_config") or {})
    if not arch:
        raise ValueError("speculators DFlash config is missing 'transformer_layer_config'")
    dflash: dict[str, Any] = {}
    aux = raw.get("aux_hidden_state_layer_ids")
    if aux is None:
        raise ValueError(
            "speculators DFlash config is missing required field 'aux_hidden_state_layer_ids' "
            "(the target layers whose hidden states feed the draft)"
        )
    if not isinstance(aux, (list, tuple)):
        raise ValueError(f"aux_hidden_state_layer_ids must be a list; got {aux!r}")
    dflash["target_layer_ids"] = [_int_field("aux_hidden_state_layer_ids[]", i) - 1 for i in aux]
    if raw.get("mask_token_id") is not None:
        dflash["mask_token_id"] = raw["mask_token_id"]
    dflash[_SLIDING_CAUSAL] = not raw.get("sliding_window_non_causal", True)
    if raw.get("block_size") is not None:
        arch["block_size"] = raw["block_size"]
    if raw.get("target_hidden_size") is not None:
        arch["target_hidden_size"] = raw["target_hidden_size"]
    return arch, dflash


# A speculators export's causality, which binds its sliding layers only (`_from_speculators`).
_SLIDING_CAUSAL = "sliding_causal"

# Fields that change the draft's outputs, with the value at which they change nothing.
_NEUTRAL_FIELDS: tuple[tuple[str, object], ...] = (
    ("input_embedding_scale", 1.0),
    ("output_multiplier", 1.0),
    ("final_logit_softcapping", 0.0),  # 0 or absent: no soft-capping
    ("sample_from_anchor", False),
    ("use_aux_hidden_state", True),
)


def _refuse_unimplemented(cfg: Mapping[str, Any], dflash: Mapping[str, Any]) -> None:
    """Refuse fields this draft does not implement, where set to a value that would matter."""
    for name, neutral in _NEUTRAL_FIELDS:
        for where, source in (("dflash_config.", dflash), ("", cfg)):
            value = source.get(name)
            if value is None or value == neutral:
                continue
            raise ValueError(
                f"{where}{name} = {value!r}: this DFlash draft implements only {neutral!r} "
                "(the field changes the draft's outputs; refusing rather than ignoring it)"
            )


def _resolve_layers(
    cfg: Mapping[str, Any], dflash: Mapping[str, Any], num_layers: int
) -> tuple[LayerPlan, ...]:
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, (list, tuple)) or len(layer_types) != num_layers:
            raise ValueError(
                f"layer_types must list one entry per draft layer ({num_layers}); "
                f"got {layer_types!r}"
            )
        unknown = sorted({t for t in layer_types if t not in (SLIDING_ATTENTION, FULL_ATTENTION)})
        if unknown:
            raise ValueError(
                f"layer_types entries must be {SLIDING_ATTENTION!r} or {FULL_ATTENTION!r}; "
                f"got {unknown}"
            )
    use_swa = bool(dflash.get("use_swa", False))
    any_sliding = layer_types is not None and SLIDING_ATTENTION in layer_types

    if any_sliding:
        sliding = [t == SLIDING_ATTENTION for t in layer_types]  # type: ignore[union-attr]
    else:
        # MiMo: use_swa with no (or an all-full, HF-filled) layer_types -> every layer sliding.
        sliding = [use_swa] * num_layers

    window: int | None = None
    if any(sliding):
        raw_window = dflash.get("swa_window_size", cfg.get("sliding_window"))
        if raw_window is None:
            raise ValueError(
                "DFlash sliding layers need a window: set dflash_config.swa_window_size or "
                "the top-level sliding_window"
            )
        window = _int_field(
            "sliding window (swa_window_size / sliding_window)", raw_window, minimum=1
        )

    # Causality: explicit is_causal, then dflash_config.causal, then checkpoint conventions.
    if cfg.get("is_causal") is not None:
        causal = [bool(cfg["is_causal"])] * num_layers
    elif dflash.get(_SLIDING_CAUSAL) is not None:
        causal = [is_sliding and bool(dflash[_SLIDING_CAUSAL]) for is_sliding in sliding]
    elif dflash.get("causal") is not None:
        if dflash["causal"] and cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
            full = [i for i in range(num_layers) if not sliding[i]]
            if full:
                # vLLM 0.32 turns a speculators export's sliding_window_non_causal=False into
                # dflash_config.causal=True for every layer; speculators trained the full
                # layers bidirectional, and this converted config no longer says which.
                raise ValueError(
                    f"this draft (a speculators export as vLLM 0.32 converts it) would run its "
                    f"full-attention layers {full} causal, but speculators trains them "
                    "bidirectional (only sliding layers follow sliding_window_non_causal); "
                    "refusing rather than serving the draft with other attention than it was "
                    "trained with (a draft trained causal in every layer says so with a "
                    "top-level is_causal: true)"
                )
        causal = [bool(dflash["causal"])] * num_layers
    elif any_sliding:
        # z-lab mixed drafts (gemma-4 / Qwen3.5 style): sliding layers were trained causal.
        causal = list(sliding)
    else:
        causal = [False] * num_layers

    return tuple(
        LayerPlan(index=i, causal=causal[i], sliding_window=window if sliding[i] else None)
        for i in range(num_layers)
    )


def normalize_dflash_config(config: Any) -> DFlashPlan:
    """Turn a draft `config.json` (dict, or a transformers/vLLM config object) into a plan.

    Raises ValueError naming the field for anything missing or inconsistent.
    """
    raw = _as_dict(config)
    cfg, dflash, source_format = _split_sections(raw)
    dims = _model_dims(cfg)
    target_layer_ids = _target_layer_ids(cfg, dflash)
    mask = _mask_token_id(cfg, dflash, dims["vocab_size"])
    block = _block_size(cfg, dflash)
    _refuse_unimplemented(cfg, dflash)
    _refuse_quantized(raw, cfg)
    num_target_layers = _num_target_layers(cfg, target_layer_ids)
    target_hidden = _int_field(
        "target_hidden_size", cfg.get("target_hidden_size") or dims["hidden_size"], minimum=1
    )
    rope_params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_theta = cfg.get("rope_theta") or rope_params.get("rope_theta") or 1_000_000.0
    layers = _resolve_layers(cfg, dflash, dims["num_hidden_layers"])
    _refuse_short_noncausal_windows(layers, block)
    return DFlashPlan(
        source_format=source_format,
        **dims,
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),
        rope_theta=float(rope_theta),
        attention_bias=bool(cfg.get("attention_bias", False)),
        target_hidden_size=target_hidden,
        target_layer_ids=target_layer_ids,
        num_target_layers=num_target_layers,
        mask_token_id=mask,
        block_size=block,
        layers=layers,
        attention_sink_bias=bool(
            dflash.get("attention_sink_bias", cfg.get("add_swa_attention_sink_bias", False))
        ),
        value_scale=(
            None
            if dflash.get("attention_value_scale") is None
            else float(dflash["attention_value_scale"])
        ),
    )


def _split_sections(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(model fields, DFlash fields, source format) of a z-lab or speculators config."""
    if raw.get("speculators_model_type") is not None:
        if raw["speculators_model_type"] != "dflash":
            raise ValueError(
                f"speculators_model_type must be 'dflash' for a DFlash draft; "
                f"got {raw['speculators_model_type']!r}"
            )
        cfg, dflash = _from_speculators(raw)
        return cfg, dflash, "speculators"
    dflash_raw = raw.get("dflash_config") or {}
    if not isinstance(dflash_raw, Mapping):
        raise ValueError(f"dflash_config must be a mapping; got {type(dflash_raw).__name__}")
    return raw, dict(dflash_raw), "dflash"


def _model_dims(cfg: Mapping[str, Any]) -> dict[str, int]:
    """The draft's sizes, by `DFlashPlan` field name."""
    hidden = _int_field("hidden_size", _required(cfg, "hidden_size"), minimum=1)
    num_layers = _int_field("num_hidden_layers", _required(cfg, "num_hidden_layers"), minimum=1)
    num_heads = _int_field("num_attention_heads", _required(cfg, "num_attention_heads"), minimum=1)
    num_kv = _int_field(
        "num_key_value_heads", cfg.get("num_key_value_heads") or num_heads, minimum=1
    )
    if num_heads % num_kv:
        raise ValueError(
            f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
            f"({num_kv})"
        )
    head_dim = _int_field("head_dim", cfg.get("head_dim") or hidden // num_heads, minimum=1)
    return {
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv,
        "head_dim": head_dim,
        "intermediate_size": _int_field(
            "intermediate_size", _required(cfg, "intermediate_size"), minimum=1
        ),
        "vocab_size": _int_field("vocab_size", _required(cfg, "vocab_size"), minimum=1),
    }


def _target_layer_ids(cfg: Mapping[str, Any], dflash: Mapping[str, Any]) -> tuple[int, ...]:
    """dflash_config's target_layer_ids, then the top level's. No fallback formula, on purpose."""
    ids = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
    if ids is None:
        raise ValueError(
            "DFlash draft config is missing dflash_config.target_layer_ids (the target layers "
            "whose hidden states feed the draft); refusing to guess a layer list"
        )
    if not isinstance(ids, (list, tuple)) or not ids:
        raise ValueError(f"dflash_config.target_layer_ids must be a non-empty list; got {ids!r}")
    target_layer_ids = tuple(
        _int_field("dflash_config.target_layer_ids[]", i, minimum=0) for i in ids
    )
    if len(set(target_layer_ids)) != len(target_layer_ids):
        raise ValueError(
            f"dflash_config.target_layer_ids must not repeat a layer; got {list(target_layer_ids)}"
        )
    return target_layer_ids


def _mask_token_id(cfg: Mapping[str, Any], dflash: Mapping[str, Any], vocab: int) -> int:
    mask = dflash.get("mask_token_id", cfg.get("mask_token_id"))
    if mask is None:
        raise ValueError("DFlash draft config is missing dflash_config.mask_token_id")
    mask = _int_field("dflash_config.mask_token_id", mask)
    if not 0 <= mask < vocab:
        raise ValueError(
            f"dflash_config.mask_token_id must be in the vocabulary [0, {vocab}); got {mask}"
        )
    return mask


def _block_size(cfg: Mapping[str, Any], dflash: Mapping[str, Any]) -> int | None:
    top_b, nested_b = cfg.get("block_size"), dflash.get("block_size")
    if top_b is not None and nested_b is not None and top_b != nested_b:
        raise ValueError(f"block_size {top_b} disagrees with dflash_config.block_size {nested_b}")
    block = top_b if top_b is not None else nested_b
    return None if block is None else _int_field("block_size", block, minimum=2)


def _refuse_quantized(raw: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    quantization = raw.get("quantization_config") or cfg.get("quantization_config")
    if quantization:
        method = (
            quantization.get("quant_method", quantization)
            if isinstance(quantization, Mapping)
            else quantization
        )
        raise ValueError(
            f"quantization_config ({method!r}): this DFlash draft loads unquantized weights "
            "only; refusing a quantized checkpoint rather than misreading its packed tensors"
        )


def _num_target_layers(cfg: Mapping[str, Any], target_layer_ids: tuple[int, ...]) -> int | None:
    num_target_layers = cfg.get("num_target_layers")
    if num_target_layers is None:
        return None
    num_target_layers = _int_field("num_target_layers", num_target_layers, minimum=1)
    bad = [i for i in target_layer_ids if i >= num_target_layers]
    if bad:
        raise ValueError(
            f"dflash_config.target_layer_ids {list(target_layer_ids)} reach past "
            f"num_target_layers {num_target_layers}: {bad}"
        )
    return num_target_layers


def _refuse_short_noncausal_windows(layers: tuple[LayerPlan, ...], block: int | None) -> None:
    """Non-causal windows bound only the past here; trainers that also bound the future
    (z-lab's mask, vLLM's FlashAttention) differ once the window is shorter than a block."""
    short = [
        lp.index
        for lp in layers
        if block is not None and not lp.causal and lp.sliding_window is not None
        and lp.sliding_window < block
    ]  # fmt: skip
    if short:
        raise ValueError(
            f"non-causal sliding layers {short} have a window shorter than block_size {block}: "
            "where the window bounds the future too (as the draft's trainer may have) results "
            "would differ; refusing"
        )


def load_dflash_plan(path: str | os.PathLike[str]) -> DFlashPlan:
    """Read `<dir>/config.json` (or a config file path) and normalise it."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    with open(p, encoding="utf-8") as f:
        return normalize_dflash_config(json.load(f))


def ordered_feature_permutation(target_layer_ids: Sequence[int]) -> list[int]:
    """Order in which feature blocks of a config's declared `target_layer_ids` appear when a
    runtime captures them in ascending layer order (vLLM does): perm[j] = declared index of
    the j-th smallest id."""
    return sorted(range(len(target_layer_ids)), key=lambda j: target_layer_ids[j])
