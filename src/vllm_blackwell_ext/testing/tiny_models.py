"""Deterministic tiny checkpoints written locally (config.json + safetensors, fixed seed).

Nothing is downloaded: configs come from transformers' classes, weights from a seeded random
initialisation. The initialisation is scaled up from transformers' default (0.02) because a
random model initialised that small tended to repeat one token forever, which makes "same
greedy tokens" a weak check; with these scales the tiny models produce varied continuations.

Each writer returns the directory and is a no-op when a complete checkpoint is already there
(the marker file is written last), so tests, the demo and benchmarks can share one copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VOCAB_SIZE = 512
# Weight scale of the random initialisation (transformers uses 0.02): at 0.25 the tiny Qwen3
# gives varied greedy continuations (at 0.08 it repeated one token after a few steps).
INIT_STD = 0.25
MARKER = ".bwx-tiny-complete"
# Word-level vocabulary: "<unk>", "<s>", "</s>", then "w3" ... "w511".
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def _done(path: Path) -> bool:
    return (path / MARKER).exists()


def _finish(path: Path, kind: str) -> Path:
    (path / MARKER).write_text(kind + "\n")
    return path


def write_tiny_tokenizer(path: str | os.PathLike) -> None:
    """A word-level tokenizer over the tiny vocabulary, so `vllm serve` can detokenize."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), VOCAB_SIZE)})
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(str(path))


def _save_model(model, path: Path) -> None:
    model.save_pretrained(str(path), safe_serialization=True)
    write_tiny_tokenizer(path)


def _scaled_init(model, std: float, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name or "_norm" in name:
                param.fill_(1.0)
            elif param.dim() == 1:
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def write_tiny_qwen3(
    path: str | os.PathLike, *, num_layers: int = 4, seed: int = 0, max_positions: int = 4096
) -> Path:
    """Qwen3-style GQA model: hidden 128, 4 query / 2 KV heads, head 64, vocab 512."""
    path = Path(path)
    if _done(path):
        return path
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config)
    _scaled_init(model, std=INIT_STD, seed=seed)
    _save_model(model.to(torch.bfloat16), path)
    return _finish(path, "qwen3")


def write_tiny_sliding_window(
    path: str | os.PathLike, *, window: int = 16, seed: int = 0, max_positions: int = 4096
) -> Path:
    """Llama-style model whose layers alternate sliding-window (W=window) and full attention.

    vLLM 0.32's Llama reads per-layer windows from `layer_types` (its Qwen2 ignores them), and
    head_dim is 64 so every attention backend we compare accepts it.
    """
    path = Path(path)
    if _done(path):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
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
    _scaled_init(model, std=INIT_STD, seed=seed)
    _save_model(model.to(torch.bfloat16), path)
    return _finish(path, "sliding-window")


def write_tiny_deepseek_v2(path: str | os.PathLike, *, seed: int = 0) -> Path:
    """DeepSeek-V2-style MLA model (kv_lora_rank 512, rope 64: the latent size vLLM's MLA
    backends accept), 2 dense layers, 4 heads, hidden 128."""
    path = Path(path)
    if _done(path):
        return path
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    model = DeepseekV2ForCausalLM(config)
    _scaled_init(model, std=INIT_STD, seed=seed)
    _save_model(model.to(torch.bfloat16), path)
    return _finish(path, "deepseek-v2")


def write_tiny_dflash_draft(
    path: str | os.PathLike,
    *,
    target_layer_ids: tuple[int, ...] = (0, 2),
    block_size: int = 4,
    mask_token_id: int = VOCAB_SIZE - 1,
    num_layers: int = 2,
    architecture: str = "DFlashDraftModel",
    seed: int = 0,
) -> Path:
    """A DFlash draft in the z-lab format for the tiny Qwen3 target (hidden 128).

    Tensors: `fc.weight [H, k*H]`, `hidden_norm`, `norm`, and per layer q/k/v/o projections,
    q/k norms, SwiGLU MLP and both layer norms; no embedding or head (shared with the target).
    """
    path = Path(path)
    if _done(path):
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
        "vocab_size": VOCAB_SIZE,
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
    return _finish(path, "dflash-draft")


WRITERS = {
    "qwen3": write_tiny_qwen3,
    "sliding-window": write_tiny_sliding_window,
    "deepseek-v2": write_tiny_deepseek_v2,
}
