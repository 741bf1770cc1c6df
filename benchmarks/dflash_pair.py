"""Train a tiny target + DFlash draft pair on the CPU, so acceptance can be measured here.

`python benchmarks/dflash_pair.py OUT_DIR` (or `python benchmarks/bench_dflash.py`, which
calls `build_pair` and caches the result). Fixed seeds; a few minutes on 2 cores.

- The language: word-level, 128 tokens, synthetic documents of four sentence kinds with
  different predictability (counting, copying a random letter string, a small noun/verb grammar
  with preferred pairings, reciting fixed lists). Written here, nothing downloaded.
- The target: a Qwen3 (4 layers, hidden 128, GQA 2/1 heads of 64) trained on that language.
- The drafts, one per block size: a z-lab-format DFlash draft (2 non-causal layers) distilled
  from the target's own greedy continuations, as DFlash drafts are: the block
  [bonus, MASK x (B-1)] at positions s .. s+B-1 attends to the target's layer features of
  positions < s and to itself; the loss is cross entropy on the B-1 masked slots, weighted
  down with distance (DFlash's decaying position weights). The mask token has no trained
  target embedding, so the draft learns one and ships it as `mask_embedding.pt`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

# ----------------------------------------------------------------------------- the language
VOCAB = 128
PAD, BOS, STOP, COUNT, COPY, EQUALS, THE, LIST, COLON = range(9)
NUMBERS = range(10, 40)  # "0" .. "29"
LETTERS = range(40, 52)
NOUNS, VERBS, ADJECTIVES = range(52, 60), range(60, 68), range(68, 76)
LIST_NAMES, LIST_ITEMS = range(76, 80), range(80, 96)
MASK_TOKEN = VOCAB - 1  # never in the corpus: the draft's mask slot
DOC_LEN = 96


def _sentence(rng: random.Random) -> list[int]:
    kind = rng.randrange(4)
    if kind == 0:  # counting: deterministic once started
        step = rng.choice((1, 1, 2))
        start = rng.randrange(0, 12)
        n = rng.randrange(4, 10)
        return [COUNT, *[NUMBERS[min(start + i * step, 29)] for i in range(n)], STOP]
    if kind == 1:  # copying: free choices, then an exact repeat
        s = [rng.choice(LETTERS) for _ in range(rng.randrange(3, 7))]
        return [COPY, *s, EQUALS, *s, STOP]
    if kind == 2:  # grammar: nouns prefer a verb, verbs prefer an object (learnable, not fixed)
        subj = rng.choice(NOUNS)
        verb = VERBS[subj - NOUNS[0]] if rng.random() < 0.7 else rng.choice(VERBS)
        obj = NOUNS[(verb - VERBS[0] + 3) % 8] if rng.random() < 0.6 else rng.choice(NOUNS)
        return [THE, rng.choice(ADJECTIVES), subj, verb, THE, rng.choice(ADJECTIVES), obj, STOP]
    name = rng.randrange(4)  # lists: fixed order per list name
    items = LIST_ITEMS[name * 4 : name * 4 + 4]
    n = rng.randrange(2, 5)
    return [LIST, LIST_NAMES[name], COLON, *[items[i % 4] for i in range(n)], STOP]


def document(rng: random.Random, length: int = DOC_LEN) -> list[int]:
    doc = [BOS]
    while len(doc) < length:
        doc += _sentence(rng)
    return doc[:length]


def corpus(seed: int, n: int) -> torch.Tensor:
    rng = random.Random(seed)
    return torch.tensor([document(rng) for _ in range(n)])


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class PairSettings:
    seed: int = 0
    hidden: int = 128
    target_layers: int = 4
    target_steps: int = 800
    target_layer_ids: tuple[int, ...] = (0, 2)
    draft_layers: int = 2
    draft_steps: int = 600
    prompt_len: int = 24  # distillation prompts: corpus prefixes, then target-greedy text
    distill_sequences: int = 512
    block_sizes: tuple[int, ...] = (4, 8, 16)

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


HEADS, KV_HEADS, HEAD_DIM = 2, 1, 64  # BWX_ATTN's smallest head size is 64
ROPE_THETA = 10000.0
EPS = 1e-6


def _target_config(s: PairSettings):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=s.hidden,
        intermediate_size=2 * s.hidden,
        num_hidden_layers=s.target_layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        rope_theta=ROPE_THETA,
        rms_norm_eps=EPS,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=VOCAB + 1,  # never generated: runs always reach max_tokens
        pad_token_id=PAD,
    )


def _batches(data: torch.Tensor, batch: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless shuffled batches of exactly `batch` rows (at most the data's row count)."""
    batch = min(batch, data.shape[0])
    g = torch.Generator().manual_seed(seed)
    while True:
        for idx in torch.randperm(data.shape[0], generator=g).split(batch):
            if idx.numel() == batch:
                yield data[idx]


def _cosine_lr(opt: torch.optim.Optimizer, base: float, step: int, total: int) -> None:
    warm = max(1, total // 20)
    lr = base * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / total))
    for group in opt.param_groups:
        group["lr"] = lr


def train_target(s: PairSettings, log=print):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(s.seed)
    model = Qwen3ForCausalLM(_target_config(s))
    data = corpus(s.seed, 4096)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    batches = _batches(data, 32, s.seed)
    for step in range(s.target_steps):
        _cosine_lr(opt, 3e-3, step, s.target_steps)
        ids = next(batches)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == s.target_steps - 1:
            log(f"  target step {step:4d}  loss {loss.item():.3f}")
    return model.eval()


@torch.no_grad()  # not inference_mode: the draft trains on these tensors
def distillation_data(target, s: PairSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-greedy continuations of corpus prefixes, and the target's layer features."""
    prompts = corpus(s.seed + 1, s.distill_sequences)[:, : s.prompt_len]
    seqs = []
    for chunk in prompts.split(128):
        out = target.generate(
            chunk,
            attention_mask=torch.ones_like(chunk),
            max_new_tokens=DOC_LEN - s.prompt_len,
            do_sample=False,
            pad_token_id=PAD,
        )
        seqs.append(out)
    ids = torch.cat(seqs)
    feats = []
    for chunk in ids.split(128):
        hs = target(chunk, output_hidden_states=True).hidden_states
        feats.append(torch.cat([hs[i + 1] for i in s.target_layer_ids], dim=-1))
    return ids, torch.cat(feats)


# ----------------------------------------------------------------------------- the draft
def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """NeoX rotary embedding of x [..., T, heads, D] at integer positions pos [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv
    emb = torch.cat([ang, ang], -1)[..., None, :]  # [..., T, 1, D]: one angle set per head
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftTrainer(nn.Module):
    """The DFlash draft as trainable parameters under checkpoint names, with a batched forward
    over several anchored blocks per sequence (all layers non-causal, no window)."""

    def __init__(self, s: PairSettings, block_size: int, embed: torch.Tensor) -> None:
        super().__init__()
        h, q, kv = s.hidden, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        k = len(s.target_layer_ids)
        self.block_size = block_size
        self.embed = embed  # the target's embedding (frozen, shared)
        self.mask_embedding = nn.Parameter(embed[: VOCAB - 1].mean(0).clone())
        self.w = nn.ParameterDict()

        def lin(name: str, out: int, inp: int) -> None:
            self.w[name.replace(".", "__")] = nn.Parameter(torch.randn(out, inp) / inp**0.5)

        def ones(name: str, n: int) -> None:
            self.w[name.replace(".", "__")] = nn.Parameter(torch.ones(n))

        lin("fc.weight", h, k * h)
        ones("hidden_norm.weight", h)
        ones("norm.weight", h)
        for i in range(s.draft_layers):
            p = f"layers.{i}."
            ones(p + "input_layernorm.weight", h)
            ones(p + "post_attention_layernorm.weight", h)
            lin(p + "self_attn.q_proj.weight", q, h)
            lin(p + "self_attn.k_proj.weight", kv, h)
            lin(p + "self_attn.v_proj.weight", kv, h)
            lin(p + "self_attn.o_proj.weight", h, q)
            ones(p + "self_attn.q_norm.weight", HEAD_DIM)
            ones(p + "self_attn.k_norm.weight", HEAD_DIM)
            lin(p + "mlp.gate_proj.weight", 2 * h, h)
            lin(p + "mlp.up_proj.weight", 2 * h, h)
            lin(p + "mlp.down_proj.weight", h, 2 * h)
        self.num_layers = s.draft_layers

    def p(self, name: str) -> torch.Tensor:
        return self.w[name.replace(".", "__")]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {k.replace("__", "."): v.detach().clone() for k, v in self.w.items()}

    def forward(self, ids: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor):
        """ids [N, T], feats [N, T, k*H], anchors [N, K] -> hidden [N, K*B, H] of every slot."""
        n, t = ids.shape
        bsz = self.block_size
        offs = torch.arange(bsz)
        blk_pos = (anchors[:, :, None] + offs).reshape(n, -1)  # [N, K*B]
        bonus = torch.gather(ids, 1, anchors)  # [N, K]
        x = self.embed[bonus][:, :, None, :].expand(-1, -1, bsz, -1).clone()
        x[:, :, 1:] = self.mask_embedding
        h = x.reshape(n, -1, x.shape[-1])
        ctx = _rms(feats @ self.p("fc.weight").T, self.p("hidden_norm.weight"))
        k_pos = torch.cat([torch.arange(t).expand(n, t), blk_pos], 1)
        # block j sees context positions < its anchor and its own slots (non-causal)
        block_of = torch.arange(anchors.shape[1]).repeat_interleave(bsz)  # [K*B]
        sees_ctx = torch.arange(t)[None, None, :] < anchors.repeat_interleave(bsz, 1)[..., None]
        sees_blk = (block_of[:, None] == block_of[None, :]).expand(n, -1, -1)
        visible = torch.cat([sees_ctx, sees_blk], -1)[:, None]  # [N, 1, K*B, T+K*B]
        for i in range(self.num_layers):
            p = f"layers.{i}."
            a = _rms(h, self.p(p + "input_layernorm.weight"))
            kv_in = torch.cat([ctx, a], 1)
            q = (a @ self.p(p + "self_attn.q_proj.weight").T).unflatten(-1, (HEADS, HEAD_DIM))
            k = (kv_in @ self.p(p + "self_attn.k_proj.weight").T).unflatten(-1, (KV_HEADS, -1))
            v = (kv_in @ self.p(p + "self_attn.v_proj.weight").T).unflatten(-1, (KV_HEADS, -1))
            q = _rope(_rms(q, self.p(p + "self_attn.q_norm.weight")), blk_pos)
            k = _rope(_rms(k, self.p(p + "self_attn.k_norm.weight")), k_pos)
            k = k.repeat_interleave(HEADS // KV_HEADS, 2)
            v = v.repeat_interleave(HEADS // KV_HEADS, 2)
            scores = torch.einsum("nqhd,nkhd->nhqk", q, k) * HEAD_DIM**-0.5
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            attn = torch.einsum("nhqk,nkhd->nqhd", probs, v).flatten(-2)
            h = h + attn @ self.p(p + "self_attn.o_proj.weight").T
            a = _rms(h, self.p(p + "post_attention_layernorm.weight"))
            gate = a @ self.p(p + "mlp.gate_proj.weight").T
            up = a @ self.p(p + "mlp.up_proj.weight").T
            h = h + (nn.functional.silu(gate) * up) @ self.p(p + "mlp.down_proj.weight").T
        return _rms(h, self.p("norm.weight"))


def train_draft(
    target, ids: torch.Tensor, feats: torch.Tensor, s: PairSettings, block_size: int, log=print
) -> DraftTrainer:
    torch.manual_seed(s.seed + block_size)
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    draft = DraftTrainer(s, block_size, embed)
    opt = torch.optim.AdamW(draft.parameters(), lr=2e-3, weight_decay=0.0)
    # decaying weights over the B-1 masked slots (DFlash: early slots decide acceptance)
    pos_w = torch.exp(-torch.arange(block_size - 1) / max(1.0, (block_size - 1) / 2))
    per_seq = 8
    lo, hi = s.prompt_len - 1, DOC_LEN - block_size  # labels all target-greedy
    g = torch.Generator().manual_seed(s.seed + 100 + block_size)
    batches = _batches(torch.arange(ids.shape[0]), 16, s.seed + block_size)
    for step in range(s.draft_steps):
        _cosine_lr(opt, 2e-3, step, s.draft_steps)
        rows = next(batches)
        anchors = torch.randint(lo, hi + 1, (rows.numel(), per_seq), generator=g)
        hidden = draft(ids[rows], feats[rows], anchors)
        hidden = hidden.unflatten(1, (per_seq, block_size))[:, :, 1:]
        logits = hidden @ lm_head.T  # [N, K, B-1, V]
        labels = torch.gather(
            ids[rows], 1, (anchors[:, :, None] + torch.arange(1, block_size)).flatten(1)
        ).view(rows.numel(), per_seq, block_size - 1)
        ce = nn.functional.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none")
        loss = (ce.view_as(labels) * pos_w).sum() / (pos_w.sum() * labels[..., 0].numel())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == s.draft_steps - 1:
            log(f"  draft b{block_size} step {step:4d}  loss {loss.item():.3f}")
    return draft


# ----------------------------------------------------------------------------- checkpoints
def draft_config(s: PairSettings, block_size: int) -> dict:
    return {
        "architectures": ["BwxDFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": s.hidden,
        "intermediate_size": 2 * s.hidden,
        "num_hidden_layers": s.draft_layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "max_position_embeddings": 2048,
        "block_size": block_size,
        "num_target_layers": s.target_layers,
        "dflash_config": {
            "mask_token_id": MASK_TOKEN,
            "target_layer_ids": list(s.target_layer_ids),
        },
    }


def write_draft(path: Path, s: PairSettings, draft: DraftTrainer) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(draft_config(s, draft.block_size), indent=1))
    save_file(draft.checkpoint_tensors(), str(path / "model.safetensors"))
    emb = draft.mask_embedding.detach().clone()
    torch.save({"mask_token_id": MASK_TOKEN, "embedding": emb}, path / "mask_embedding.pt")


def build_pair(root: str | os.PathLike[str], s: PairSettings = PairSettings(), log=print) -> Path:
    """Train (or reuse) the pair under root/<settings key>: target/ and draft-b<B>/ dirs."""
    out = Path(root) / f"dflash-pair-{s.key()}"
    done = out / "DONE"
    if done.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Builders of the same pair at once (two test workers, two examples) take turns: the
    # second finds DONE and reuses the first one's pair.
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _train_pair(out, s, log)
    return out


def _train_pair(out: Path, s: PairSettings, log) -> None:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    log(f"training the tiny DFlash pair into {out} (fixed seed {s.seed})")
    target = train_target(s, log)
    target.save_pretrained(out / "target")
    ids, feats = distillation_data(target, s)
    for b in s.block_sizes:
        write_draft(out / f"draft-b{b}", s, train_draft(target, ids, feats, s, b, log))
    (out / "settings.json").write_text(json.dumps(asdict(s), indent=1))
    (out / "DONE").write_text("ok\n")


def held_out_prompts(n: int, length: int = 16, seed: int = 12345) -> list[list[int]]:
    """Prompts for measuring: corpus prefixes from a seed no training step saw."""
    return corpus(seed, n)[:, :length].tolist()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = argv[0] if argv else "dflash-pair"
    print(build_pair(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
