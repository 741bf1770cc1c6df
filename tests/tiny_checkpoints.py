"""Tiny checkpoints only the tests use, written like the demo's (`demo/tiny_models.py`: fixed
seed, nothing downloaded, a no-op when a complete copy is already there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vllm_blackwell_ext.demo import tiny_models as tm


def write_tiny_sliding_window(
    path: str | os.PathLike, *, window: int = 16, seed: int = 0, max_positions: int = 4096
) -> Path:
    """Llama-style model whose layers alternate sliding-window (W=window) and full attention.

    vLLM 0.32's Llama reads per-layer windows from `layer_types` (its Qwen2 ignores them), and
    head_dim is 64 so every attention backend we compare accepts it.
    """
    path = Path(path)
    if tm.is_complete(path):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    config = LlamaConfig(
        vocab_size=tm.VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    # Not LlamaConfig fields: stored as extra attributes, written to config.json, read by vLLM.
    config.layer_types = layer_types
    config.sliding_window = window
    model = LlamaForCausalLM(config)
    tm.scaled_init(model, std=tm.INIT_STD, seed=seed)
    tm.save_model(model.to(torch.bfloat16), path)
    return tm.mark_complete(path, "sliding-window")


def write_tiny_dflash_draft(
    path: str | os.PathLike,
    *,
    target_layer_ids: tuple[int, ...] = (0, 2),
    block_size: int = 4,
    mask_token_id: int = tm.VOCAB_SIZE - 1,
    num_layers: int = 2,
    architecture: str = "DFlashDraftModel",
    seed: int = 0,
) -> Path:
    """A DFlash draft in the z-lab format for the tiny Qwen3 target (hidden 128).

    Tensors: `fc.weight [H, k*H]`, `hidden_norm`, `norm`, and per layer q/k/v/o projections,
    q/k norms, SwiGLU MLP and both layer norms; no embedding or head (shared with the target).
    """
    path = Path(path)
    if tm.is_complete(path):
        return path
    import torch
    from safetensors.torch import save_file

    hidden, heads, kv_heads, head_dim, inter = 128, 4, 2, 64, 256
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * 0.08).to(torch.bfloat16)

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    tensors = {
        "fc.weight": rand(hidden, len(target_layer_ids) * hidden),
        "hidden_norm.weight": ones(hidden),
        "norm.weight": ones(hidden),
    }
    for i in range(num_layers):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": ones(head_dim),
                p + "self_attn.k_norm.weight": ones(head_dim),
                p + "mlp.gate_proj.weight": rand(inter, hidden),
                p + "mlp.up_proj.weight": rand(inter, hidden),
                p + "mlp.down_proj.weight": rand(hidden, inter),
                p + "input_layernorm.weight": ones(hidden),
                p + "post_attention_layernorm.weight": ones(hidden),
            }
        )
    config = {
        "architectures": [architecture],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": tm.VOCAB_SIZE,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "num_target_layers": 4,
        "dflash_config": {
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(target_layer_ids),
        },
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tm.mark_complete(path, "dflash-draft")


WRITERS = {**tm.WRITERS, "sliding-window": write_tiny_sliding_window}
