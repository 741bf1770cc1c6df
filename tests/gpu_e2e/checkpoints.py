"""Random-weight checkpoints of real model shapes for GPU engine tests (nothing downloaded).

vLLM's `--load-format dummy` fills every weight, norms included, from U(-1e-3, 1e-3): the
logits of such a model are all but equal, so greedy tokens are decided by rounding noise and
say nothing about attention. These writers draw weights at scales that keep activations O(1)
and make attention peaked (query/key norms or projections scaled so that raw scores have a
standard deviation of about 4) and logits spread (standard deviation about 6, so the best two
tokens rarely tie), so a wrong mask, page or scale moves the tokens and log-probabilities far
more than bf16 rounding does.

Shapes: Qwen3-8B attention (32 query / 8 KV heads, head 128, hidden 4096), a Llama of the same
attention shape whose layers alternate sliding-window and full attention, DeepSeek-V2-Lite MLA
(16 heads, kv_lora_rank 512, rope 64, nope 128, v 128; dense MLPs), and a z-lab-format DFlash
draft for the Qwen3 target. A smaller vocabulary than the real models keeps them light.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

VOCAB = 32000
MARKER = ".bwx-checkpoint-complete"


class _Weights:
    """Seeded normal draws on the GPU (fast), stored as bf16 on the CPU for safetensors."""

    def __init__(self, seed: int) -> None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self.tensors: dict[str, torch.Tensor] = {}

    def normal(self, name: str, *shape: int, std: float) -> None:
        t = torch.randn(shape, generator=self.gen, device=self.device) * std
        self.tensors[name] = t.to(torch.bfloat16).cpu()

    def linear(self, name: str, out_features: int, in_features: int, gain: float = 1.0) -> None:
        self.normal(name, out_features, in_features, std=gain / math.sqrt(in_features))

    def constant(self, name: str, n: int, value: float = 1.0) -> None:
        self.tensors[name] = torch.full((n,), value, dtype=torch.bfloat16)

    def save(self, path: Path, config: dict) -> Path:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (path / MARKER).write_text("done\n")
        return path


def _common(hidden: int, layers: int, max_positions: int, vocab: int = VOCAB) -> dict:
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _embeddings_and_head(w: _Weights, hidden: int) -> None:
    w.normal("model.embed_tokens.weight", VOCAB, hidden, std=1.0)
    w.constant("model.norm.weight", hidden)
    w.linear("lm_head.weight", VOCAB, hidden, gain=6.0)


def _mlp_and_norms(w: _Weights, p: str, hidden: int, inter: int) -> None:
    w.linear(p + "mlp.gate_proj.weight", inter, hidden)
    w.linear(p + "mlp.up_proj.weight", inter, hidden)
    w.linear(p + "mlp.down_proj.weight", hidden, inter)
    w.constant(p + "input_layernorm.weight", hidden)
    w.constant(p + "post_attention_layernorm.weight", hidden)


# Qwen3-8B attention and MLP widths.
QWEN3_8B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "inter": 12288}


def _gqa_attention(
    w: _Weights, p: str, *, qk_gain: float = 1.0, qk_norm: float | None = None
) -> None:
    """Q/K/V/O projections of Qwen3-8B's attention shape; Qwen3's q/k norms when `qk_norm`."""
    s = QWEN3_8B
    q_out, kv_out = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    w.linear(p + "self_attn.q_proj.weight", q_out, s["hidden"], qk_gain)
    w.linear(p + "self_attn.k_proj.weight", kv_out, s["hidden"], qk_gain)
    w.linear(p + "self_attn.v_proj.weight", kv_out, s["hidden"])
    w.linear(p + "self_attn.o_proj.weight", s["hidden"], q_out)
    if qk_norm is not None:
        w.constant(p + "self_attn.q_norm.weight", s["head_dim"], qk_norm)
        w.constant(p + "self_attn.k_norm.weight", s["head_dim"], qk_norm)


def qwen3_8b_shaped_config(layers: int, *, vocab: int = VOCAB, max_positions: int = 40960) -> dict:
    """config.json of a Qwen3 with Qwen3-8B's layer shapes."""
    s = QWEN3_8B
    return {
        **_common(s["hidden"], layers, max_positions, vocab),
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": s["inter"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "rope_theta": 1000000.0,
        "attention_bias": False,
    }


def write_qwen3_8b_shaped(path: Path, *, layers: int = 4, seed: int = 0) -> Path:
    """Qwen3 with Qwen3-8B's layer shapes; q/k norms at 2.0 give raw scores of std ~4."""
    if (path / MARKER).exists():
        return path
    s = QWEN3_8B
    w = _Weights(seed)
    _embeddings_and_head(w, s["hidden"])
    for i in range(layers):
        p = f"model.layers.{i}."
        _gqa_attention(w, p, qk_norm=2.0)
        _mlp_and_norms(w, p, s["hidden"], s["inter"])
    return w.save(path, qwen3_8b_shaped_config(layers))


def write_sliding_window_llama(path: Path, *, window: int = 256, seed: int = 1) -> Path:
    """Llama with Qwen3-8B's attention shape; layer 0 sliding (W=window), layer 1 full.

    vLLM 0.32's Llama reads per-layer windows from `layer_types`. Query and key projections
    at gain 2 give raw scores of std ~4.
    """
    if (path / MARKER).exists():
        return path
    s = QWEN3_8B
    layer_types = ["sliding_attention", "full_attention"]
    w = _Weights(seed)
    _embeddings_and_head(w, s["hidden"])
    for i in range(len(layer_types)):
        p = f"model.layers.{i}."
        _gqa_attention(w, p, qk_gain=2.0)
        _mlp_and_norms(w, p, s["hidden"], s["inter"])
    config = {
        **_common(s["hidden"], len(layer_types), 8192),
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "intermediate_size": s["inter"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "rope_theta": 500000.0,
        "attention_bias": False,
        "layer_types": layer_types,
        "sliding_window": window,
    }
    return w.save(path, config)


# DeepSeek-V2-Lite's attention (MLA) and dense-MLP widths.
DEEPSEEK_V2_LITE = {
    "hidden": 2048,
    "heads": 16,
    "kv_lora_rank": 512,
    "rope": 64,
    "nope": 128,
    "v": 128,
    "inter": 10944,
}


def write_deepseek_v2_lite_shaped(
    path: Path, *, layers: int = 2, seed: int = 2, heads: int | None = None
) -> Path:
    """DeepSeek-V2 with V2-Lite's MLA shapes; every layer dense (first_k_dense_replace).
    `heads` replaces V2-Lite's 16 (128: DeepSeek-V3 / Kimi K2 at TP1)."""
    if (path / MARKER).exists():
        return path
    s = {**DEEPSEEK_V2_LITE, **({"heads": heads} if heads else {})}
    w = _Weights(seed)
    _embeddings_and_head(w, s["hidden"])
    qk_head = s["nope"] + s["rope"]
    for i in range(layers):
        p = f"model.layers.{i}."
        w.linear(p + "self_attn.q_proj.weight", s["heads"] * qk_head, s["hidden"], 3.0)
        w.linear(
            p + "self_attn.kv_a_proj_with_mqa.weight", s["kv_lora_rank"] + s["rope"], s["hidden"]
        )
        w.constant(p + "self_attn.kv_a_layernorm.weight", s["kv_lora_rank"])
        w.linear(
            p + "self_attn.kv_b_proj.weight", s["heads"] * (s["nope"] + s["v"]), s["kv_lora_rank"]
        )
        w.linear(p + "self_attn.o_proj.weight", s["hidden"], s["heads"] * s["v"])
        _mlp_and_norms(w, p, s["hidden"], s["inter"])
    return w.save(path, deepseek_v2_lite_shaped_config(layers, heads=s["heads"]))


def deepseek_v2_lite_shaped_config(
    layers: int, *, vocab: int = VOCAB, max_positions: int = 8192, heads: int | None = None
) -> dict:
    """config.json of a DeepSeek-V2 with V2-Lite's MLA shapes and dense MLPs in every layer
    (the routed-expert fields are V2-Lite's but no layer uses them); `heads` as above."""
    s = {**DEEPSEEK_V2_LITE, **({"heads": heads} if heads else {})}
    return {
        **_common(s["hidden"], layers, max_positions, vocab),
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "intermediate_size": s["inter"],
        "moe_intermediate_size": 1408,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["heads"],
        "q_lora_rank": None,
        "kv_lora_rank": s["kv_lora_rank"],
        "qk_nope_head_dim": s["nope"],
        "qk_rope_head_dim": s["rope"],
        "v_head_dim": s["v"],
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": layers,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "scoring_func": "softmax",
        "routed_scaling_factor": 1.0,
        "rope_theta": 10000.0,
        "attention_bias": False,
    }


def write_dflash_draft(
    path: Path,
    *,
    target_layer_ids: tuple[int, ...] = (0, 2),
    num_target_layers: int = 4,
    block_size: int = 8,
    layer_types: tuple[str, ...] = (),
    sliding_window: int = 256,
    seed: int = 3,
) -> Path:
    """A z-lab-format DFlash draft for the Qwen3-8B-shaped target, naming our draft class so
    the plugin's model serves it: one non-causal layer, or one layer per `layer_types` entry
    (z-lab's mixed drafts: "sliding_attention" layers causal within `sliding_window` tokens,
    "full_attention" layers non-causal)."""
    if (path / MARKER).exists():
        return path
    s = QWEN3_8B
    w = _Weights(seed)
    w.linear("fc.weight", s["hidden"], len(target_layer_ids) * s["hidden"])
    w.constant("hidden_norm.weight", s["hidden"])
    w.constant("norm.weight", s["hidden"])
    for i in range(max(1, len(layer_types))):
        p = f"layers.{i}."
        _gqa_attention(w, p, qk_norm=2.0)
        _mlp_and_norms(w, p, s["hidden"], s["inter"])
    config = {
        **qwen3_8b_shaped_config(max(1, len(layer_types))),
        "architectures": ["BwxDFlashDraftModel"],
        "block_size": block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": list(target_layer_ids)},
    }
    if layer_types:
        config |= {"layer_types": list(layer_types), "sliding_window": sliding_window}
    return w.save(path, config)
