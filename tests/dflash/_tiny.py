"""Tiny DFlash draft checkpoints for the dflash tests (random weights, written to tmp dirs)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch
from safetensors.torch import save_file

from vllm_blackwell_ext.dflash.config import DFlashPlan, normalize_dflash_config
from vllm_blackwell_ext.dflash.loader import expected_draft_shapes


def tiny_draft_config(
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    block_size: int = 4,
    target_layer_ids: tuple[int, ...] = (0, 2),
    num_target_layers: int = 4,
    mask_token_id: int = 255,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "block_size": block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(target_layer_ids),
        },
    }
    for k, v in (extra or {}).items():
        if k == "dflash_config":
            cfg["dflash_config"].update(v)
        else:
            cfg[k] = v
    return cfg


def random_draft_tensors(plan: DFlashPlan, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights: norms near 1, projections ~ 1/sqrt(fan_in) (outputs vary)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_draft_shapes(plan).items():
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("attention_sink_bias"):
            out[name] = torch.randn(shape, generator=g)
        elif len(shape) == 1:  # biases
            out[name] = 0.02 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / shape[1] ** 0.5
    return out


def write_draft(
    ckpt_dir: str | os.PathLike[str],
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    *,
    shards: list[list[str]] | None = None,
    prefix: str = "",
    extra_shards: dict[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """Write config.json and tensors; with `shards`, a multi-shard index (one list of names per
    shard) plus `extra_shards` (file -> tensors not belonging to the draft)."""
    d = os.fspath(ckpt_dir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    named = {prefix + k: v.contiguous() for k, v in tensors.items()}
    if shards is None and not extra_shards:
        save_file(named, os.path.join(d, "model.safetensors"))
        return
    weight_map: dict[str, str] = {}
    groups = shards or [list(tensors)]
    n = len(groups) + len(extra_shards or {})
    for i, names in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({prefix + k: named[prefix + k] for k in names}, os.path.join(d, fname))
        weight_map |= {prefix + k: fname for k in names}
    for fname, ts in (extra_shards or {}).items():
        save_file({k: v.contiguous() for k, v in ts.items()}, os.path.join(d, fname))
        weight_map |= {k: fname for k in ts}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def tiny_plan(**kwargs: Any) -> tuple[dict[str, Any], DFlashPlan]:
    cfg = tiny_draft_config(**kwargs)
    return cfg, normalize_dflash_config(copy.deepcopy(cfg))


def write_small_vocab_pair(
    root: str | os.PathLike[str],
    *,
    vocab: int = 32,
    block_size: int = 4,
    draft_extra: dict[str, Any] | None = None,
    draft_layers: int = 2,
    architecture: str = "BwxDFlashDraftModel",
    mask_embedding: bool = False,
    seed: int = 0,
) -> tuple[str, str]:
    """A fp32 Qwen3 target (4 layers, hidden 128) and a DFlash draft over a *small* vocabulary.

    With 32 tokens a random draft's proposals match the target's greedy token often enough
    (~1/8 of slots here) that acceptance counts become a fingerprint of the proposals: an
    engine whose draft differs from the reference's shows different counts.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = os.fspath(root)
    tdir, ddir = os.path.join(root, "target"), os.path.join(root, "draft")
    torch.manual_seed(seed)
    tcfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # CPU_ATTN has no 16, BWX_ATTN no 32
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=vocab + 10,  # never generated: runs always reach max_tokens
    )
    Qwen3ForCausalLM(tcfg).save_pretrained(tdir)
    cfg, plan = tiny_plan(
        hidden=128,
        heads=2,
        kv_heads=1,
        layers=draft_layers,
        vocab=vocab,
        block_size=block_size,
        mask_token_id=vocab - 1,
        extra=draft_extra,
    )
    cfg["architectures"] = [architecture]
    cfg["hidden_act"] = "silu"
    write_draft(ddir, cfg, random_draft_tensors(plan, seed=seed + 1))
    if mask_embedding:
        emb = torch.randn(128, generator=torch.Generator().manual_seed(seed + 2))
        torch.save(
            {"mask_token_id": vocab - 1, "embedding": emb}, os.path.join(ddir, "mask_embedding.pt")
        )
    return tdir, ddir


def write_crafted_pair(
    root: str | os.PathLike[str], *, shift: int, block_size: int = 4, vocab: int = 32
) -> tuple[str, str]:
    """A hand-built target/draft pair whose acceptance is known, to drive the accept paths.

    Target: token embeddings are orthonormal in the first 32 of 128 dims and every layer's
    o_proj/down_proj is zero, so the residual stream is the embedding and the LM head (row
    t + shift = e_t) makes the greedy next token `t + shift (mod vocab)`.
    Draft: `_write_copying_draft`, every slot proposes `bonus + shift`. shift=0: all proposals
    accepted; shift=1: exactly one per step.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = os.fspath(root)
    tdir, ddir = os.path.join(root, "target"), os.path.join(root, "draft")
    hidden = 128
    tcfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # CPU_ATTN has no 16, BWX_ATTN no 32
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    target = Qwen3ForCausalLM(tcfg)
    emb, head = _shift_embeddings(vocab, hidden, shift)
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(emb)
        target.lm_head.weight.copy_(head)
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target.save_pretrained(tdir)

    _write_copying_draft(ddir, vocab=vocab, block_size=block_size)
    return tdir, ddir


def _shift_embeddings(vocab: int, hidden: int, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Embedding rows orthonormal in the first 32 dims and an LM head with row t + shift =
    10 * e_t: a target whose residual stream is the embedding predicts `t + shift`."""
    if vocab > 32:
        raise ValueError(f"vocab must be <= 32 (orthonormal in 32 dims); got {vocab}")
    q, _ = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(7)))
    emb = torch.zeros(vocab, hidden)
    emb[:, :32] = q[:vocab]
    head = torch.zeros(vocab, hidden)
    for t in range(vocab):
        head[(t + shift) % vocab] = 10.0 * emb[t]
    return emb, head


def write_mla_pair(
    root: str | os.PathLike[str], *, draft: str, block_size: int = 4
) -> tuple[str, str]:
    """A DeepSeek-V2 (MLA) target of 2 layers, hidden 128, and a DFlash draft for it.

    draft="random": the random tiny target of `demo.tiny_models` (vocab 512) and a random
    draft. draft="shift0": a crafted target (vocab 32, o_proj/down_proj zero, so the greedy
    next token repeats the last one) and `_write_copying_draft`: every proposal is accepted.
    Both drafts read target layer 0 only: with 2 target layers the last one (1) is refused
    (`plan_for_vllm`: vLLM captures it before the final norm, HF after it).
    """
    from vllm_blackwell_ext.demo.tiny_models import write_tiny_deepseek_v2

    root = os.fspath(root)
    tdir, ddir = os.path.join(root, "target"), os.path.join(root, "draft")
    ids, num_target = (0,), 2
    if draft == "random":
        write_tiny_deepseek_v2(tdir)
        cfg, plan = tiny_plan(
            hidden=128,
            heads=2,
            kv_heads=1,
            vocab=512,
            block_size=block_size,
            mask_token_id=511,
            target_layer_ids=ids,
            num_target_layers=num_target,
        )
        cfg["architectures"] = ["BwxDFlashDraftModel"]
        cfg["hidden_act"] = "silu"
        write_draft(ddir, cfg, random_draft_tensors(plan, seed=1))
        return tdir, ddir
    if draft != "shift0":
        raise ValueError(f"draft must be 'random' or 'shift0'; got {draft!r}")
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    vocab, hidden = 32, 128
    # The tiny_models shape (kv_lora_rank 512 + rope 64: the latent width MLA backends take).
    tcfg = DeepseekV2Config(
        vocab_size=vocab,
        hidden_size=hidden,
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
        first_k_dense_replace=2,  # dense MLPs: down_proj = 0 silences them
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    target = DeepseekV2ForCausalLM(tcfg)
    emb, head = _shift_embeddings(vocab, hidden, 0)
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(emb)
        target.lm_head.weight.copy_(head)
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target.save_pretrained(tdir)
    _write_copying_draft(
        ddir, vocab=vocab, block_size=block_size, target_layer_ids=ids, num_target_layers=num_target
    )
    return tdir, ddir


def _write_copying_draft(
    ddir: str,
    *,
    vocab: int,
    block_size: int,
    target_layer_ids: tuple[int, ...] = (0, 2),
    num_target_layers: int = 4,
) -> None:
    """Draft (hidden 128, 2 heads, 1 kv head of 64) whose every slot outputs the bonus token's
    embedding: q_proj = 0 gives uniform attention; v_proj/o_proj copy the first 32 dims; fc = 0
    and a zero `mask_embedding.pt` leave the bonus token as the only non-zero value. Through a
    crafted target's LM head (row t + shift = e_t) every slot proposes `bonus + shift`."""
    hidden = 128
    cfg, plan = tiny_plan(
        hidden=hidden,
        heads=2,
        kv_heads=1,
        layers=2,
        vocab=vocab,
        block_size=block_size,
        mask_token_id=vocab - 1,
        target_layer_ids=target_layer_ids,
        num_target_layers=num_target_layers,
    )
    cfg["architectures"] = ["BwxDFlashDraftModel"]
    cfg["hidden_act"] = "silu"
    w = random_draft_tensors(plan, seed=3)
    w["fc.weight"].zero_()
    for i in range(2):
        p = f"layers.{i}."
        w[p + "self_attn.q_proj.weight"].zero_()
        w[p + "mlp.down_proj.weight"].zero_()
        w[p + "self_attn.o_proj.weight"].zero_()
        for name in ("input_layernorm", "post_attention_layernorm"):
            w[p + name + ".weight"].fill_(1.0)
    # Layer 0 copies dims 0..31 through V (one kv head of 64) and o_proj (query head 0).
    v = torch.zeros(64, hidden)
    v[:32, :32] = torch.eye(32)
    w["layers.0.self_attn.v_proj.weight"] = v
    o = torch.zeros(hidden, hidden)
    o[0:32, 0:32] = torch.eye(32)
    w["layers.0.self_attn.o_proj.weight"] = o
    w["norm.weight"].fill_(1.0)
    write_draft(ddir, cfg, w)
    torch.save(torch.zeros(hidden), os.path.join(ddir, "mask_embedding.pt"))
