"""Pure-torch oracle of DFlash speculative decoding (one draft step + greedy verification).

Written from the DFlash paper (arXiv 2602.06036) and z-lab's `dflash/model.py`
(`dflash_generate`, `DFlashDraftModel`), sharing no code with `vllm_blackwell_ext.dflash`:

- Context features: HF `hidden_states[i + 1]` (output of target layer i) for every
  i in `target_layer_ids`, concatenated in declared order -> `fc` -> `hidden_norm`.
- Every draft layer attends from the query block to K/V of [context features ; block]. Context
  tokens only contribute K/V (k_proj/v_proj, k_norm, RoPE at their own positions): no Q, no MLP.
- The query block is [bonus, MASK x (B - 1)] embedded with the *target's* embedding, at
  positions start .. start + B - 1 right after the last context token; one forward, per-layer
  causality and backward-only window; final norm; the *target's* LM head on the B - 1 masks.
- Greedy verification: the target scores the block; accept the longest prefix of proposals
  equal to the target's argmax, then append the target's own next token (z-lab's rule).

The oracle is stateless: it recomputes context K/V from all accumulated features every step,
which equals z-lab's draft KV cache (context K/V depend only on features and positions).
Imports neither vLLM nor `kernels/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "RefDraftSpec",
    "RefStep",
    "RefResult",
    "extract_context_features",
    "draft_block_logits",
    "greedy_accept",
    "dflash_generate_reference",
    "greedy_generate_reference",
]


@dataclass(frozen=True)
class RefDraftSpec:
    """What the oracle needs to know about a draft (filled in by hand, not from our config)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    # Per draft layer: (causal, sliding_window or None). Window: key k visible to query q
    # iff q - k < window (backward-only; keys after q are never hidden by the window).
    layer_attention: tuple[tuple[bool, int | None], ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    value_scale: float | None = None
    attention_sink_bias: bool = False


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX-style rotary embedding (HF `rotate_half`) of x [T, heads, D] at `positions` [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def extract_context_features(
    hidden_states: Sequence[torch.Tensor], target_layer_ids: Sequence[int]
) -> torch.Tensor:
    """z-lab's offset: the feature of target layer i is `hidden_states[i + 1]` (index 0 is the
    embedding output). Concatenated in declared order along the last dim."""
    return torch.cat([hidden_states[i + 1] for i in target_layer_ids], dim=-1)


def _w(weights: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in weights:
        raise KeyError(f"reference DFlash draft weights lack {name!r}")
    return weights[name]


def _linear(x: torch.Tensor, weights: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    b = weights.get(name + ".bias")
    return nn.functional.linear(x, _w(weights, name + ".weight"), b)


def draft_block_logits(
    spec: RefDraftSpec,
    weights: Mapping[str, torch.Tensor],
    context_features: torch.Tensor,
    block_embeddings: torch.Tensor,
    start: int,
    lm_head_weight: torch.Tensor,
) -> torch.Tensor:
    """One DFlash draft forward for one sequence.

    context_features: [start, k * H_target] (positions 0 .. start - 1).
    block_embeddings: [B, H] for positions start .. start + B - 1 ([bonus, MASK, ...]).
    Returns logits [B, V] for every block position (position 0's is unused by DFlash).
    """
    n_ctx, bsz = context_features.shape[0], block_embeddings.shape[0]
    if n_ctx != start:
        raise ValueError(f"context_features must have start={start} rows; got {n_ctx}")
    nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    eps = spec.rms_norm_eps
    ctx = _rms_norm(
        _linear(context_features, weights, "fc"), _w(weights, "hidden_norm.weight"), eps
    )
    ctx_pos = torch.arange(n_ctx)
    blk_pos = torch.arange(start, start + bsz)
    k_pos = torch.cat([ctx_pos, blk_pos])

    h = block_embeddings
    for li, (causal, window) in enumerate(spec.layer_attention):
        p = f"layers.{li}."
        x = _rms_norm(h, _w(weights, p + "input_layernorm.weight"), eps)
        q = _linear(x, weights, p + "self_attn.q_proj").view(bsz, nh, hd)
        kv_in = torch.cat([ctx, x], dim=0)  # context K/V come from the projected features
        k = _linear(kv_in, weights, p + "self_attn.k_proj").view(-1, nkv, hd)
        v = _linear(kv_in, weights, p + "self_attn.v_proj").view(-1, nkv, hd)
        q = _rms_norm(q, _w(weights, p + "self_attn.q_norm.weight"), eps)
        k = _rms_norm(k, _w(weights, p + "self_attn.k_norm.weight"), eps)
        q, k = _rope(q, blk_pos, spec.rope_theta), _rope(k, k_pos, spec.rope_theta)
        if spec.value_scale is not None:
            v = v * spec.value_scale
        rep = nh // nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * hd**-0.5
        dq, dk = blk_pos[:, None], k_pos[None, :]
        visible = torch.ones(bsz, k_pos.numel(), dtype=torch.bool)
        if causal:
            visible &= dk <= dq
        if window is not None:
            visible &= (dq - dk) < window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        if spec.attention_sink_bias:
            sink = _w(weights, p + "self_attn.attention_sink_bias").float()
            sink_col = sink[:, None, None].expand(nh, bsz, 1)
            probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v.float()).to(h.dtype).reshape(bsz, nh * hd)
        h = h + _linear(attn, weights, p + "self_attn.o_proj")
        x = _rms_norm(h, _w(weights, p + "post_attention_layernorm.weight"), eps)
        gate = _linear(x, weights, p + "mlp.gate_proj")
        up = _linear(x, weights, p + "mlp.up_proj")
        h = h + _linear(nn.functional.silu(gate) * up, weights, p + "mlp.down_proj")
    h = _rms_norm(h, _w(weights, "norm.weight"), eps)
    return nn.functional.linear(h, lm_head_weight)


def greedy_accept(block_ids: torch.Tensor, posterior: torch.Tensor) -> tuple[int, int]:
    """z-lab's greedy rule. block_ids [B] = [bonus, d_1 .. d_{B-1}], posterior [B] = target
    argmax after each block position. Returns (accepted drafts n, the target's token after
    them); the step commits block_ids[: n + 1] then that token."""
    match = (block_ids[1:] == posterior[:-1]).to(torch.int64)
    n = int(match.cumprod(0).sum())
    return n, int(posterior[n])


@dataclass
class RefStep:
    start: int  # position of the bonus token
    proposals: list[int]  # the B - 1 drafted tokens
    accepted: int  # how many proposals the target accepted
    logits: torch.Tensor | None = None  # [N, V] draft logits of the proposal slots


@dataclass
class RefResult:
    tokens: list[int]  # generated tokens (prompt excluded), exactly max_new_tokens long
    steps: list[RefStep] = field(default_factory=list)

    @property
    def acceptance_lengths(self) -> list[int]:
        """Tokens committed per verification step (accepted + 1), z-lab's tau samples."""
        return [s.accepted + 1 for s in self.steps]


def _target_forward(target: nn.Module, ids: list[int]) -> tuple[torch.Tensor, tuple]:
    out = target(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return out.logits[0], tuple(h[0] for h in out.hidden_states)


@torch.inference_mode()
def greedy_generate_reference(
    target: nn.Module, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Plain greedy decoding with full recompute (the lossless baseline)."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        logits, _ = _target_forward(target, seq)
        seq.append(int(logits[-1].argmax()))
    return seq[len(prompt) :]


@torch.inference_mode()
def dflash_generate_reference(
    target: nn.Module,
    spec: RefDraftSpec,
    weights: Mapping[str, torch.Tensor],
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    num_speculative_tokens: int | None = None,
    mask_embedding: torch.Tensor | None = None,
) -> RefResult:
    """z-lab `dflash_generate` at temperature 0 on a Hugging Face causal LM target.

    `num_speculative_tokens` N (default block_size - 1) sets the query block to 1 + N, as vLLM's
    `num_speculative_tokens` does. `mask_embedding` replaces the embedding of every block slot
    whose id is mask_token_id (checkpoints that ship `mask_embedding.pt`).
    """
    n_spec = spec.block_size - 1 if num_speculative_tokens is None else num_speculative_tokens
    if not 1 <= n_spec <= spec.block_size - 1:
        raise ValueError(
            f"num_speculative_tokens must be in [1, {spec.block_size - 1}]; got {n_spec}"
        )
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings().weight
    seq = list(prompt)
    logits, hs = _target_forward(target, seq)
    seq.append(int(logits[-1].argmax()))  # the bonus token of the first block
    result = RefResult(tokens=[])
    feats = extract_context_features(hs, spec.target_layer_ids)
    while len(seq) - len(prompt) < max_new_tokens:
        start = len(seq) - 1
        block = torch.tensor([seq[-1]] + [spec.mask_token_id] * n_spec)
        emb = embed(block)
        if mask_embedding is not None:
            is_mask = (block == spec.mask_token_id)[:, None]
            emb = torch.where(is_mask, mask_embedding.to(emb.dtype), emb)
        dlogits = draft_block_logits(spec, weights, feats, emb, start, lm_head)
        block[1:] = dlogits[1:].argmax(-1)
        vlogits, vhs = _target_forward(target, seq[:start] + block.tolist())
        posterior = vlogits[start:].argmax(-1)
        n, nxt = greedy_accept(block, posterior)
        result.steps.append(
            RefStep(start=start, proposals=block[1:].tolist(), accepted=n, logits=dlogits[1:])
        )
        seq = seq[:start] + block[: n + 1].tolist() + [nxt]
        # Features of the committed tokens (causal target: same as from any longer forward).
        feats = extract_context_features(vhs, spec.target_layer_ids)[: start + n + 1]
    result.tokens = seq[len(prompt) : len(prompt) + max_new_tokens]
    return result
