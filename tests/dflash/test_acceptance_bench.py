"""The acceptance benchmark's parts (`benchmarks/bench_dflash.py`): the training forward is the
oracle's draft forward, a trained pair loads through our loader, and the statistics."""

from __future__ import annotations

import random

import pytest
import torch

from benchmarks import dflash_pair as dp
from benchmarks.bench_dflash import engine_stats, oracle_stats
from vllm_blackwell_ext.dflash.config import load_dflash_plan
from vllm_blackwell_ext.dflash.loader import read_draft_tensors, read_mask_embedding
from vllm_blackwell_ext.reference.dflash import RefDraftSpec, draft_block_logits

QUICK = dp.PairSettings(target_steps=3, draft_steps=3, distill_sequences=8, block_sizes=(4, 8))


def test_corpus_is_deterministic_and_in_vocabulary() -> None:
    a, b = dp.corpus(7, 16), dp.corpus(7, 16)
    assert torch.equal(a, b)
    assert a.shape == (16, dp.DOC_LEN)
    assert int(a.max()) < dp.MASK_TOKEN  # the mask token never appears in text
    assert not torch.equal(a, dp.corpus(8, 16))


@pytest.mark.parametrize("block", [4, 16])
def test_training_forward_equals_the_oracle_draft_forward(block: int) -> None:
    """Every anchored block of the batched training forward (several per sequence, shared
    context) equals the reference's one-block forward with the same weights, to fp32 rounding
    (sums over 128-wide vectors of O(1) terms: measured ~1e-6; 1e-4 leaves a wide margin
    while a wrong RoPE position or mask shows as > 1e-2)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    target = Qwen3ForCausalLM(dp._target_config(QUICK)).eval()
    ids, feats = dp.distillation_data(target, QUICK)
    draft = dp.DraftTrainer(QUICK, block, target.get_input_embeddings().weight.detach())
    with torch.no_grad():
        for w in draft.w.values():
            w.add_(0.1 * torch.randn_like(w))  # away from the all-ones norms
    anchors = torch.tensor([[30, 50], [23, dp.DOC_LEN - block]])
    lm_head = target.get_output_embeddings().weight.detach()
    with torch.no_grad():
        hidden = draft(ids[:2], feats[:2], anchors).unflatten(1, (2, block))
    spec = RefDraftSpec(
        num_heads=dp.HEADS,
        num_kv_heads=dp.KV_HEADS,
        head_dim=dp.HEAD_DIM,
        target_layer_ids=QUICK.target_layer_ids,
        mask_token_id=dp.MASK_TOKEN,
        block_size=block,
        layer_attention=((False, None),) * QUICK.draft_layers,
        rope_theta=dp.ROPE_THETA,
    )
    weights = draft.checkpoint_tensors()
    for n in range(2):
        for j in range(2):
            a = int(anchors[n, j])
            mask = draft.mask_embedding.detach().expand(block - 1, -1)
            emb = torch.cat([draft.embed[ids[n, a]][None], mask])
            want = draft_block_logits(spec, weights, feats[n, :a], emb, a, lm_head)
            torch.testing.assert_close(hidden[n, j] @ lm_head.T, want, rtol=0, atol=1e-4)


def test_a_built_pair_loads_through_our_loader(tmp_path) -> None:
    root = dp.build_pair(tmp_path, QUICK, log=lambda _: None)
    assert (root / "DONE").exists()
    assert dp.build_pair(tmp_path, QUICK, log=lambda _: None) == root  # cached
    for b in QUICK.block_sizes:
        plan = load_dflash_plan(root / f"draft-b{b}")
        assert plan.block_size == b and plan.mask_token_id == dp.MASK_TOKEN
        assert plan.target_layer_ids == QUICK.target_layer_ids
        assert all(not lp.causal and lp.sliding_window is None for lp in plan.layers)
        tensors = read_draft_tensors(root / f"draft-b{b}", plan, dtype=torch.float32).tensors
        assert tensors["fc.weight"].shape == (QUICK.hidden, 2 * QUICK.hidden)
        assert read_mask_embedding(root / f"draft-b{b}", plan).shape == (QUICK.hidden,)


def test_acceptance_statistics() -> None:
    # steps accepting 0, 3 (all of 3) and 1 drafts: tau = 1 + 4/3; p_i = share with >= i
    tau, per_pos = oracle_stats([0, 3, 1], 3)
    assert tau == pytest.approx(1 + 4 / 3)
    assert per_pos == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    # vLLM's counters for the same steps
    e = {"drafts": 3, "accepted_total": 4, "per_pos": [2, 1, 1]}
    e_tau, e_per_pos = engine_stats(e)
    assert e_tau == pytest.approx(tau)
    assert e_per_pos == pytest.approx(per_pos)


def test_held_out_prompts_are_not_training_documents() -> None:
    train = {tuple(r[:16]) for r in dp.corpus(QUICK.seed, 4096).tolist()}
    held = dp.held_out_prompts(16)
    assert sum(tuple(p) in train for p in held) <= 1  # a short prefix can collide by chance
    assert held == dp.held_out_prompts(16)
    random.seed(0)  # the corpus uses its own Random: global state must not matter
    assert held == dp.held_out_prompts(16)


@pytest.mark.e2e
def test_vllm_engine_acceptance_equals_the_oracle(tmp_path, session_cache) -> None:
    """The bench's engine path: a real vLLM CPU engine with our draft (fp32, vLLM's CPU
    attention) commits the same tokens in the same number of steps, with the same per-position
    acceptance, as the oracle: vLLM's counters and ours describe identical runs."""
    pytest.importorskip("vllm", reason="the engine half of the bench needs vLLM")
    from benchmarks.bench_dflash import _engine, _oracle

    # a few hundred steps: the draft proposes some right tokens, so acceptance is not all 0
    quick = dp.PairSettings(target_steps=150, draft_steps=100, distill_sequences=64,
                            block_sizes=(4,))  # fmt: skip
    # The pair examples/dflash_speculate.py trains (same settings, same place when both run in
    # one session: tests/e2e/test_examples.py points the example's cache at session_cache).
    root = dp.build_pair(session_cache / "vllm-bwx" / "examples" / "dflash", quick,
                         log=lambda _: None)  # fmt: skip
    prompts = dp.held_out_prompts(3)
    oracle = _oracle(root, 4, prompts, 24)
    engine = _engine(root, 4, prompts, 24, "vllm-default", tmp_path)
    assert engine["tokens"] == oracle["tokens"]
    assert engine["drafts"] == len(oracle["accepted"])
    assert engine["accepted_total"] == sum(oracle["accepted"]) > 0
    assert engine_stats(engine)[1] == pytest.approx(oracle_stats(oracle["accepted"], 3)[1])
