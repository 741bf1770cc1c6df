"""The pure-torch DFlash oracle against z-lab's algorithm semantics, on tiny random models.

z-lab's rules checked here (dflash/model.py, `dflash_generate` and `Qwen3DFlashAttention`):
greedy speculative output equals plain greedy output (lossless); features are
`hidden_states[i + 1]`; the draft attends non-causally over the block unless a layer is causal;
a sliding window hides only keys more than `window - 1` positions *behind* a query.
All in fp32: the assertions are exact token equality or exact invariance (a masked key must
change nothing), so the only tolerance is fp32 round-off for "changed vs unchanged" (1e-6).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from vllm_blackwell_ext.reference.dflash import (
    RefDraftSpec,
    dflash_generate_reference,
    draft_block_logits,
    extract_context_features,
    greedy_accept,
    greedy_generate_reference,
)

from ._tiny import random_draft_tensors, tiny_plan

VOCAB, HIDDEN, TARGET_LAYERS = 256, 64, 4


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        # Larger init than HF's 0.02 so the random target's greedy output varies (a target
        # that repeats one token makes "lossless" checks vacuous).
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).eval()


def _spec(block: int, layer_attention, **kw) -> RefDraftSpec:
    return RefDraftSpec(
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        target_layer_ids=(0, 2),
        mask_token_id=VOCAB - 1,
        block_size=block,
        layer_attention=tuple(layer_attention),
        rope_theta=10000.0,
        **kw,
    )


def _weights(extra=None, seed=0):
    _, plan = tiny_plan(hidden=HIDDEN, extra=extra)
    return random_draft_tensors(plan, seed=seed)


PROMPTS = [[3, 17, 42, 99, 7], list(range(10, 31))]
_GREEDY: dict[tuple[int, ...], list[int]] = {}


def _greedy(target, prompt: list[int], n: int) -> list[int]:
    """Plain greedy baseline, computed once per prompt (the slow part on 2 CPU cores)."""
    key = (*prompt, -n)
    if key not in _GREEDY:
        _GREEDY[key] = greedy_generate_reference(target, prompt, n)
    return _GREEDY[key]


def test_random_target_output_varies(target) -> None:
    toks = greedy_generate_reference(target, PROMPTS[0], 12)
    assert len(set(toks)) > 3, toks


@pytest.mark.parametrize("block", [4, 8, 16])
@pytest.mark.parametrize(
    "layers, extra",
    [
        ([(False, None)] * 2, None),
        ([(True, 6), (False, None)], None),  # z-lab mixed: sliding causal + full non-causal
        ([(False, 6)] * 2, "sinks"),  # MiMo use_swa, sink bias, value scale
    ],
    ids=["full-noncausal", "mixed", "mimo-swa"],
)
def test_speculative_greedy_equals_plain_greedy(target, block, layers, extra) -> None:
    kw = {}
    wextra = None
    if extra == "sinks":
        kw = dict(attention_sink_bias=True, value_scale=0.5)
        wextra = {"dflash_config": {"attention_sink_bias": True}}
    spec = _spec(block, layers, **kw)
    w = _weights(wextra)
    for prompt in PROMPTS:
        want = _greedy(target, prompt, 16)
        got = dflash_generate_reference(target, spec, w, prompt, 16)
        assert got.tokens == want
        assert all(1 <= a <= block for a in got.acceptance_lengths)
        assert all(len(s.proposals) == block - 1 for s in got.steps)


def test_fewer_speculative_tokens_than_block_shrinks_the_query_block(target) -> None:
    spec = _spec(16, [(False, None)] * 2)
    got = dflash_generate_reference(
        target, spec, _weights(), PROMPTS[0], 10, num_speculative_tokens=3
    )
    assert all(len(s.proposals) == 3 for s in got.steps)
    assert got.tokens == _greedy(target, PROMPTS[0], 10)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        dflash_generate_reference(
            target, spec, _weights(), PROMPTS[0], 4, num_speculative_tokens=16
        )


def test_mask_embedding_changes_proposals_not_output(target) -> None:
    spec = _spec(4, [(False, None)] * 2)
    w = _weights()
    plain = dflash_generate_reference(target, spec, w, PROMPTS[1], 12)
    emb = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(5))
    masked = dflash_generate_reference(target, spec, w, PROMPTS[1], 12, mask_embedding=emb)
    assert masked.tokens == plain.tokens
    assert [s.proposals for s in masked.steps] != [s.proposals for s in plain.steps]


def test_features_are_hidden_states_after_layer_i(target) -> None:
    captured = {}
    hooks = [
        target.model.layers[i].register_forward_hook(
            lambda m, a, out, i=i: captured.__setitem__(
                i, out[0] if isinstance(out, tuple) else out
            )
        )
        for i in (0, 2)
    ]
    try:
        out = target(torch.tensor([PROMPTS[0]]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    feats = extract_context_features(out.hidden_states, [2, 0])
    torch.testing.assert_close(feats[..., :HIDDEN], captured[2].reshape(feats[..., :HIDDEN].shape))
    torch.testing.assert_close(feats[..., HIDDEN:], captured[0].reshape(feats[..., HIDDEN:].shape))


def _step_logits(spec, w, feats, emb, start):
    return draft_block_logits(
        spec,
        w,
        feats,
        emb,
        start,
        torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1)),
    )


def _inputs(start=12, block=4):
    g = torch.Generator().manual_seed(2)
    return torch.randn(start, 2 * HIDDEN, generator=g), torch.randn(block, HIDDEN, generator=g)


@pytest.mark.parametrize("causal", [False, True])
def test_noncausal_block_sees_later_slots_causal_does_not(causal: bool) -> None:
    spec, w = _spec(4, [(causal, None)] * 2), _weights()
    feats, emb = _inputs()
    base = _step_logits(spec, w, feats, emb, 12)
    emb2 = emb.clone()
    emb2[-1] += 1.0
    moved = (_step_logits(spec, w, feats, emb2, 12)[:-1] - base[:-1]).abs().max()
    assert (moved > 1e-6) == (not causal)


def test_noncausal_window_is_backward_only() -> None:
    window, start, block = 5, 12, 4
    spec, w = _spec(block, [(False, window)] * 2), _weights()
    feats, emb = _inputs(start, block)
    base = _step_logits(spec, w, feats, emb, start)

    def perturbed(pos: int) -> torch.Tensor:
        f = feats.clone()
        f[pos] += 1.0
        return (_step_logits(spec, w, f, emb, start) - base).abs().amax(-1)

    # Context position start - window is behind every block query by >= window: invisible.
    assert perturbed(start - window).max() <= 1e-6
    # start - window + 1 is visible to the bonus slot (q = start) only, at every layer.
    d = perturbed(start - window + 1)
    assert d[0] > 1e-6
    # Later block slots still see the last block slot (window never hides later keys).
    emb2 = emb.clone()
    emb2[-1] += 1.0
    assert (_step_logits(spec, w, feats, emb2, start)[0] - base[0]).abs().max() > 1e-6


def test_greedy_accept_takes_longest_matching_prefix() -> None:
    block = torch.tensor([7, 5, 6, 8])
    assert greedy_accept(block, torch.tensor([5, 6, 9, 1])) == (2, 9)
    assert greedy_accept(block, torch.tensor([4, 6, 8, 1])) == (0, 4)
    assert greedy_accept(block, torch.tensor([5, 6, 8, 3])) == (3, 3)
