"""Deterministic tiny checkpoints written locally (config.json + safetensors, fixed seed).

Nothing is downloaded: configs come from transformers' classes, weights from a seeded random
initialisation. The initialisation is scaled up from transformers' default (0.02) because a
random model initialised that small tended to repeat one token forever, which makes "same
greedy tokens" a weak check; with these scales the tiny models produce varied continuations.

Each writer returns the directory and is a no-op when a complete checkpoint is already there
(the marker file is written last), so the demo, the examples and tests can share one copy.
Builders only tests need live in `tests/tiny_checkpoints.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

VOCAB_SIZE = 512
# Weight scale of the random initialisation (transformers uses 0.02): at 0.25 the tiny Qwen3
# gives varied greedy continuations (at 0.08 it repeated one token after a few steps).
INIT_STD = 0.25
MARKER = ".bwx-tiny-complete"
# Word-level vocabulary: "<unk>", "<s>", "</s>", then "w3" ... "w511".
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def is_complete(path: Path) -> bool:
    return (path / MARKER).exists()


def mark_complete(path: Path, kind: str) -> Path:
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


def save_model(model, path: Path) -> None:
    model.save_pretrained(str(path), safe_serialization=True)
    write_tiny_tokenizer(path)


def scaled_init(model, std: float, seed: int) -> None:
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
    if is_complete(path):
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
    scaled_init(model, std=INIT_STD, seed=seed)
    save_model(model.to(torch.bfloat16), path)
    return mark_complete(path, "qwen3")


def write_tiny_deepseek_v2(path: str | os.PathLike, *, seed: int = 0) -> Path:
    """DeepSeek-V2-style MLA model (kv_lora_rank 512, rope 64: the latent size vLLM's MLA
    backends accept), 2 dense layers, 4 heads, hidden 128."""
    path = Path(path)
    if is_complete(path):
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
    scaled_init(model, std=INIT_STD, seed=seed)
    save_model(model.to(torch.bfloat16), path)
    return mark_complete(path, "deepseek-v2")


WRITERS = {"qwen3": write_tiny_qwen3, "deepseek-v2": write_tiny_deepseek_v2}
