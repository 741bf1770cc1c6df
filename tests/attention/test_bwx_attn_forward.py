"""BwxAttentionImpl.do_kv_cache_update + forward, driven the way vLLM 0.32's runner drives them.

Metadata comes from our builder fed with vLLM's own `CommonAttentionMetadata`; the KV cache is
laid out as vLLM allocates it for this backend (logical [blocks, kv_heads, block_size,
2 * head_size], physically block/slot/head-major: vLLM's default LBNHC layout); the kernel runs
under TRITON_INTERPRET=1 on the CPU. Each step first writes the cached context with
`do_kv_cache_update`, then the step's own tokens, then calls `forward`, and the output is
compared with a straightforward torch computation over the same (quantised) K/V.

Shapes are small on purpose (the interpreter is slow); the whole file takes about a minute.
"""

from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from vllm_blackwell_ext.attention import bwx_attn  # noqa: E402
from vllm_blackwell_ext.attention.bwx_attn import (  # noqa: E402
    BwxAttentionBackend,
    BwxAttentionImpl,
    BwxAttentionMetadataBuilder,
)
from vllm_blackwell_ext.switches import FRESH_PREFILL  # noqa: E402

NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_SIZE = 64
BLOCK_SIZE = 16
NUM_BLOCKS = 160
MAX_MODEL_LEN = 2048
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}

# Tolerances on outputs of magnitude ~1 (softmax-weighted means of N(0, 1) values). The kernel
# multiplies bf16/fp16 operands with fp32 accumulation and rounds P to the query dtype before
# P @ V, so its error is a few units of the query dtype's epsilon (bf16: 2^-8 = 3.9e-3,
# fp16: 2^-11 = 4.9e-4) times a small factor; the reference works in fp32 on the same
# quantised K/V, so fp8 adds no error of its own here.
TOLERANCE = {torch.bfloat16: 2.5e-2, torch.float16: 5e-3}


@dataclass(frozen=True)
class Request:
    context_len: int  # tokens already in the cache before this step
    query_len: int  # tokens this step computes (written by do_kv_cache_update first)


class FakeLayer(torch.nn.Module):
    """What the Impl reads from vLLM's Attention layer: per-tensor fp32 k/v scales."""

    def __init__(self, k_scale: float, v_scale: float) -> None:
        super().__init__()
        self._k_scale = torch.tensor(k_scale, dtype=torch.float32)
        self._v_scale = torch.tensor(v_scale, dtype=torch.float32)
        self._q_scale = torch.tensor(1.0, dtype=torch.float32)
        self._k_scale_float, self._v_scale_float = k_scale, v_scale


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A config-only tiny Qwen3 checkpoint directory (ModelConfig reads config.json only)."""
    from transformers import Qwen3Config

    path = tmp_path_factory.mktemp("tiny-qwen3-config")
    Qwen3Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_SIZE,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=MAX_MODEL_LEN,
    ).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def vllm_configs(model_dir):
    """One VllmConfig per (model dtype, kv cache dtype), built once (ModelConfig is slow)."""
    made: dict[tuple[torch.dtype, str], VllmConfig] = {}

    def get(dtype: torch.dtype, kv_cache_dtype: str) -> VllmConfig:
        key = (dtype, kv_cache_dtype)
        if key not in made:
            model_config = ModelConfig(
                model=model_dir,
                skip_tokenizer_init=True,
                dtype=dtype,
                max_model_len=MAX_MODEL_LEN,
            )
            made[key] = VllmConfig(
                model_config=model_config,
                cache_config=CacheConfig(block_size=BLOCK_SIZE, cache_dtype=kv_cache_dtype),
            )
        return made[key]

    return get


def _kv_cache(kv_cache_dtype: str, dtype: torch.dtype, head_size_v: int) -> torch.Tensor:
    """vLLM's cache tensor for this backend: logical [B, H, N, D + Dv], physical [B, N, H, ...]."""
    storage = torch.uint8 if kv_cache_dtype in FP8 else dtype
    width = HEAD_SIZE + head_size_v
    physical = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, width, dtype=storage)
    return physical.permute(0, 2, 1, 3)


def _stored(x: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """What a K/V value reads back as after the cache round trip (fp32)."""
    fp8 = FP8.get(kv_cache_dtype)
    if fp8 is None:
        return x.float()
    fmax = torch.finfo(fp8).max
    return (x.float() / scale).clamp(-fmax, fmax).to(fp8).float() * scale


def _reference(
    q: torch.Tensor,
    k: list[torch.Tensor],
    v: list[torch.Tensor],
    requests: list[Request],
    *,
    scale: float,
    causal: bool,
    window: int | None,
    sinks: torch.Tensor | None,
    softcap: float,
) -> torch.Tensor:
    """Attention per request in fp32; k[b]/v[b]: [seq_len, kv_heads, D] of every position."""
    out = []
    start = 0
    group = NUM_HEADS // NUM_KV_HEADS
    for b, req in enumerate(requests):
        seq_len = req.context_len + req.query_len
        qb = q[start : start + req.query_len].float()  # [L, H, D]
        start += req.query_len
        kb = k[b].repeat_interleave(group, dim=1)  # [S, H, D]
        vb = v[b].repeat_interleave(group, dim=1)
        logits = torch.einsum("lhd,shd->hls", qb, kb) * scale
        if softcap > 0:
            logits = softcap * torch.tanh(logits / softcap)
        pos_q = torch.arange(req.context_len, seq_len).view(-1, 1)
        pos_k = torch.arange(seq_len).view(1, -1)
        visible = torch.ones(req.query_len, seq_len, dtype=torch.bool)
        if causal:
            visible &= pos_k <= pos_q
        if window is not None:
            visible &= pos_k >= pos_q - window + 1  # backward-only, Hugging Face convention
        logits = logits.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks.float().view(-1, 1, 1).expand(-1, req.query_len, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        out.append(torch.einsum("hls,shd->lhd", probs, vb))
    return torch.cat(out)


def _run_step(
    vllm_configs,
    requests: list[Request],
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_cache_dtype: str = "auto",
    causal: bool = True,
    window: int | None = None,
    use_sinks: bool = False,
    softcap: float = 0.0,
    num_padding_tokens: int = 2,
    seed: int = 0,
    layer_mode: tuple[bool, int | None] | None = None,
    head_size_v: int = HEAD_SIZE,
    vllm_cache_writer=None,
    step: dict | None = None,
):
    """Write context and step K/V through the Impl, run forward; return (ours, reference, md).
    `step`, if given, receives the Impl (`step["impl"]`).

    `layer_mode` = (causal, window) set on the layer as `bwx_causal` / `bwx_sliding_window`
    (a mixed DFlash draft's per-layer mode): it, not the batch's `causal` and the Impl's
    `window`, is what the reference computes."""
    gen = torch.Generator().manual_seed(seed)
    step = {} if step is None else step
    vllm_config = vllm_configs(dtype, kv_cache_dtype)
    k_scale, v_scale = (0.5, 0.25) if kv_cache_dtype in FP8 else (1.0, 1.0)
    layer = FakeLayer(k_scale, v_scale)
    effective_causal, effective_window = causal, window
    if layer_mode is not None:
        layer.bwx_causal, layer.bwx_sliding_window = layer_mode
        effective_causal, effective_window = layer_mode
    sinks = torch.randn(NUM_HEADS, generator=gen).to(dtype) if use_sinks else None
    scale = 1.0 / math.sqrt(HEAD_SIZE)
    impl = BwxAttentionImpl(
        NUM_HEADS,
        HEAD_SIZE,
        scale,
        NUM_KV_HEADS,
        None,
        window,
        kv_cache_dtype,
        softcap if softcap > 0 else None,
        sinks=sinks,
    )
    impl.process_weights_after_loading(dtype)
    if vllm_cache_writer is not None:  # as on CUDA, where vLLM's Triton writer is taken
        impl._vllm_cache_writer = vllm_cache_writer
    storage = torch.uint8 if kv_cache_dtype in FP8 else dtype
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        head_size_v=head_size_v,
        dtype=storage,
    )
    builder = BwxAttentionMetadataBuilder(
        spec, ["model.layers.0.self_attn.attn"], vllm_config, "cpu"
    )
    kv_cache = _kv_cache(kv_cache_dtype, dtype, head_size_v)
    # Distinct random pages per request, never the null block 0.
    max_blocks = max(-(-(r.context_len + r.query_len) // BLOCK_SIZE) for r in requests)
    pages = (torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1).tolist()
    block_table = torch.zeros(len(requests), max_blocks + 1, dtype=torch.int32)
    for b, req in enumerate(requests):
        n = -(-(req.context_len + req.query_len) // BLOCK_SIZE)
        block_table[b, :n] = torch.tensor([pages.pop() for _ in range(n)], dtype=torch.int32)

    def slots(b: int, positions: range) -> list[int]:
        return [
            int(block_table[b, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in positions
        ]

    keys = [
        torch.randn(r.context_len + r.query_len, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        for r in requests
    ]
    values = [
        torch.randn(r.context_len + r.query_len, NUM_KV_HEADS, head_size_v, generator=gen).to(dtype)
        for r in requests
    ]

    # Earlier steps: the context, written as vLLM would have written it.
    ctx_slots = sum((slots(b, range(r.context_len)) for b, r in enumerate(requests)), [])
    if ctx_slots:
        impl.do_kv_cache_update(
            layer,
            torch.cat([k[: r.context_len] for k, r in zip(keys, requests, strict=True)]),
            torch.cat([v[: r.context_len] for v, r in zip(values, requests, strict=True)]),
            kv_cache,
            torch.tensor(ctx_slots, dtype=torch.int64),
        )
    null_block_before = kv_cache[0].clone()

    # This step: its tokens plus CUDA-graph-style padding rows (slot -1).
    num_tokens = sum(r.query_len for r in requests)
    padded = num_tokens + num_padding_tokens
    step_slots = (
        sum(
            (
                slots(b, range(r.context_len, r.context_len + r.query_len))
                for b, r in enumerate(requests)
            ),
            [],
        )
        + [-1] * num_padding_tokens
    )
    junk_k = torch.full((num_padding_tokens, NUM_KV_HEADS, HEAD_SIZE), 7.0, dtype=dtype)
    junk_v = torch.full((num_padding_tokens, NUM_KV_HEADS, head_size_v), 7.0, dtype=dtype)
    step_k = torch.cat([k[r.context_len :] for k, r in zip(keys, requests, strict=True)] + [junk_k])
    step_v = torch.cat(
        [v[r.context_len :] for v, r in zip(values, requests, strict=True)] + [junk_v]
    )
    slot_mapping = torch.tensor(step_slots, dtype=torch.int64)
    impl.do_kv_cache_update(layer, step_k, step_v, kv_cache, slot_mapping)
    assert torch.equal(kv_cache[0], null_block_before), "padding rows (slot -1) wrote a page"

    query_lens = torch.tensor([r.query_len for r in requests], dtype=torch.int32)
    seq_lens = torch.tensor([r.context_len + r.query_len for r in requests], dtype=torch.int32)
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(query_lens, 0)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=seq_lens,
        num_reqs=len(requests),
        num_actual_tokens=padded,
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        causal=causal,
        seq_lens_cpu_upper_bound=seq_lens.clone(),  # exact here, as on prefill rows in vLLM
    )
    metadata = builder.build(0, common)
    query = torch.randn(padded, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    output = torch.full((padded, NUM_HEADS, head_size_v), float("nan"), dtype=dtype)
    impl.forward(layer, query, step_k, step_v, kv_cache, metadata, output)
    # forward hands the kernel the whole (padded) query and output: padding rows stay unwritten.
    assert torch.isnan(output[num_tokens:]).all(), "forward wrote a padding row of the output"
    step.update(impl=impl)

    # The cache holds exactly the quantised K/V at every slot of every request.
    key_cache, value_cache = kv_cache.transpose(1, 2).split([HEAD_SIZE, head_size_v], dim=-1)
    if kv_cache_dtype in FP8:
        key_cache, value_cache = (
            key_cache.view(FP8[kv_cache_dtype]),
            value_cache.view(FP8[kv_cache_dtype]),
        )
    ref_k = [_stored(k, kv_cache_dtype, k_scale) for k in keys]
    ref_v = [_stored(v, kv_cache_dtype, v_scale) for v in values]
    for b, req in enumerate(requests):
        s = torch.tensor(slots(b, range(req.context_len + req.query_len)))
        got_k = key_cache[s // BLOCK_SIZE, s % BLOCK_SIZE].float() * k_scale
        got_v = value_cache[s // BLOCK_SIZE, s % BLOCK_SIZE].float() * v_scale
        assert torch.equal(got_k, ref_k[b]) and torch.equal(got_v, ref_v[b]), f"request {b} cache"

    expected = _reference(
        query[:num_tokens], ref_k, ref_v, requests,
        scale=scale, causal=effective_causal, window=effective_window, sinks=sinks,
        softcap=softcap,
    )  # fmt: skip
    return output[:num_tokens], expected, metadata


def _assert_close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


MIXED = [Request(40, 24), Request(70, 1), Request(5, 1), Request(0, 17)]


@pytest.mark.parametrize(
    ("kv_cache_dtype", "dtype"),
    [("auto", torch.bfloat16), ("float16", torch.float16), ("fp8", torch.bfloat16)],
)
def test_mixed_batch_prefill_chunk_with_context_and_decodes_matches_torch(
    vllm_configs, kv_cache_dtype, dtype
):
    got, expected, md = _run_step(vllm_configs, MIXED, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    assert md.causal and md.max_query_len == 24
    _assert_close(got, expected, dtype)


# A fresh prompt (no cached context, 150 tokens) beside a short one, a decode and a prefill
# chunk with context: the first is `fresh_prefill`'s, the rest the paged kernel's.
WITH_FRESH = [Request(0, 150), Request(40, 24), Request(70, 1), Request(0, 17), Request(10, 140)]


@pytest.mark.parametrize(
    ("kv_cache_dtype", "dtype", "window", "takes_fresh"),
    [
        ("auto", torch.bfloat16, None, True),
        ("float16", torch.float16, None, True),
        ("fp8", torch.bfloat16, None, False),  # the cache holds other values than key/value
        ("auto", torch.bfloat16, 64, False),  # the fresh kernel has no window
    ],
)
def test_fresh_prompts_take_the_tma_kernel_where_the_layer_allows_and_match_torch(
    vllm_configs, monkeypatch, kv_cache_dtype, dtype, window, takes_fresh
):
    monkeypatch.delenv(FRESH_PREFILL.name, raising=False)  # on by default
    step: dict = {}
    got, expected, md = _run_step(
        vllm_configs, WITH_FRESH, dtype=dtype, kv_cache_dtype=kv_cache_dtype, window=window,
        step=step,
    )  # fmt: skip
    assert md.fresh_prefill, "the builder saw the fresh prompt"
    assert not md.only_fresh_prefill
    assert bool(step["impl"]._fresh_plan) is takes_fresh
    _assert_close(got, expected, dtype)


@pytest.mark.parametrize(("kv_cache_dtype", "launches_paged"), [("auto", False), ("fp8", True)])
def test_a_batch_of_fresh_prompts_only_launches_no_paged_kernel_where_the_layer_takes_them(
    vllm_configs, monkeypatch, kv_cache_dtype, launches_paged
):
    # Every request is a fresh prompt: a layer that takes them leaves the paged kernel
    # nothing to do and does not launch it; an fp8 layer (which does not) still does.
    monkeypatch.delenv(FRESH_PREFILL.name, raising=False)  # on by default
    paged_calls = []
    paged = bwx_attn.launch_paged_attention
    monkeypatch.setattr(
        bwx_attn,
        "launch_paged_attention",
        lambda *a, **kw: paged_calls.append(1) or paged(*a, **kw),
    )
    got, expected, md = _run_step(
        vllm_configs, [Request(0, 150), Request(0, 130)], kv_cache_dtype=kv_cache_dtype
    )
    assert md.fresh_prefill and md.only_fresh_prefill
    assert bool(paged_calls) is launches_paged
    _assert_close(got, expected, torch.bfloat16)


def test_batches_without_a_fresh_prompt_plan_none(vllm_configs, monkeypatch):
    monkeypatch.delenv(FRESH_PREFILL.name, raising=False)  # on by default
    # 140 queries after 10 cached tokens and a fresh prompt shorter than one key tile
    _, _, md = _run_step(vllm_configs, [Request(10, 140), Request(0, 17), Request(70, 1)])
    assert not md.fresh_prefill


def test_fresh_prompts_stay_with_the_paged_kernel_when_switched_off(vllm_configs, monkeypatch):
    monkeypatch.setenv(FRESH_PREFILL.name, "0")
    got, expected, md = _run_step(vllm_configs, WITH_FRESH)
    assert not md.fresh_prefill
    _assert_close(got, expected, torch.bfloat16)


@pytest.mark.parametrize("window", [None, 24])
def test_noncausal_draft_block_sees_whole_context_and_window_is_backward_only(vllm_configs, window):
    # DFlash draft blocks: [bonus, MASK x 3] per request, non-causal over context + block.
    requests = [Request(50, 4), Request(33, 4), Request(9, 4)]
    got, expected, md = _run_step(vllm_configs, requests, causal=False, window=window, seed=1)
    assert md.causal is False
    _assert_close(got, expected, torch.bfloat16)


@pytest.mark.parametrize(
    "batch_causal, layer_mode",
    [(False, (True, 12)), (True, (False, None)), (False, (False, 20))],
    ids=["sliding-causal-layer-in-noncausal-batch", "full-noncausal-layer", "noncausal-window"],
)
def test_per_layer_mode_of_a_mixed_dflash_draft_overrides_the_batch(
    vllm_configs, batch_causal, layer_mode
):
    requests = [Request(40, 4), Request(17, 4)]
    got, expected, md = _run_step(
        vllm_configs, requests, causal=batch_causal, layer_mode=layer_mode, seed=6
    )
    assert md.causal is batch_causal
    _assert_close(got, expected, torch.bfloat16)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_with_sliding_window_and_sinks_matches_torch(vllm_configs, kv_cache_dtype):
    got, expected, _ = _run_step(
        vllm_configs, MIXED, kv_cache_dtype=kv_cache_dtype, window=20, use_sinks=True, seed=2
    )
    _assert_close(got, expected, torch.bfloat16)


def test_softcap_and_sinks_in_non_causal_mode_match_torch(vllm_configs):
    requests = [Request(20, 3), Request(0, 5)]
    got, expected, _ = _run_step(
        vllm_configs, requests, causal=False, use_sinks=True, softcap=5.0, seed=3
    )
    _assert_close(got, expected, torch.bfloat16)


def test_long_context_decode_takes_the_split_kv_path_and_matches_torch(vllm_configs):
    # Few requests, long context: the builder's plan splits the KV range (device_info('cpu')
    # reports 4 SMs, and a split needs >= 256 keys). The padding rows must not count as
    # requests in the plan.
    requests = [Request(1100, 1), Request(530, 1)]
    got, expected, md = _run_step(vllm_configs, requests, kv_cache_dtype="fp8", seed=4)
    assert md.num_splits > 1
    assert md.workspace is not None
    _assert_close(got, expected, torch.bfloat16)


def test_value_heads_wider_than_key_heads_split_through_the_builders_workspace(vllm_configs):
    # Layers whose values are wider than their keys (vLLM's spec carries head_size_v): the
    # split partials are as wide as the values, and the builder's scratch must be too.
    requests = [Request(1100, 1), Request(530, 3), Request(40, 9)]
    got, expected, md = _run_step(vllm_configs, requests, head_size_v=96, seed=6)
    assert md.num_splits > 1
    assert md.workspace.head_size_v == 96
    _assert_close(got, expected, torch.bfloat16)


def test_builder_refuses_a_value_head_size_the_kernel_lacks(vllm_configs):
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        head_size_v=48,
        dtype=torch.bfloat16,
    )
    with pytest.raises(ValueError, match="value head size 48 \\(key head size 64\\)"):
        BwxAttentionMetadataBuilder(
            spec, ["model.layers.0.self_attn.attn"], vllm_configs(torch.bfloat16, "auto"), "cpu"
        )


def test_spec_verify_rows_split_too(vllm_configs):
    # Verify rows of 4 query tokens over a long context also take the split-KV path.
    requests = [Request(600, 4)]
    got, expected, md = _run_step(vllm_configs, requests, seed=5)
    assert md.num_splits > 1
    _assert_close(got, expected, torch.bfloat16)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 80), st.integers(1, 20)), min_size=1, max_size=4),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 64)),
    kv_cache_dtype=st.sampled_from(["auto", "fp8_e4m3"]),
    seed=st.integers(0, 2**16),
)
def test_random_batches_match_torch(vllm_configs, lengths, causal, window, kv_cache_dtype, seed):
    requests = [Request(c, q) for c, q in lengths]
    got, expected, _ = _run_step(
        vllm_configs,
        requests,
        causal=causal,
        window=window,
        kv_cache_dtype=kv_cache_dtype,
        seed=seed,
    )
    _assert_close(got, expected, torch.bfloat16)


def test_profiling_run_without_metadata_zero_fills_output():
    impl = BwxAttentionImpl(NUM_HEADS, HEAD_SIZE, 0.125, NUM_KV_HEADS, None, None, "auto")
    out = torch.full((3, NUM_HEADS, HEAD_SIZE), 5.0)
    impl.forward(FakeLayer(1.0, 1.0), out, out, out, torch.empty(0), None, out)
    assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_size": 72}, r"head_size not supported \(BWX_ATTN takes \[.*128.*\]\)"),
        (
            {"kv_cache_dtype": "int8_per_token_head"},
            r"kv_cache_dtype not supported \(BWX_ATTN takes \['auto', .*'fp8_e5m2'\]\)",
        ),
        ({"attn_type": "encoder_only"}, "attention type encoder_only not supported"),
        ({"alibi_slopes": [0.5] * NUM_HEADS}, "ALiBi not supported"),
    ],
)
def test_impl_refuses_unsupported_layers_with_the_validation_reasons(kwargs, match):
    # The CPU platform skips vLLM's validation, so the Impl repeats it.
    args = dict(
        num_heads=NUM_HEADS,
        head_size=HEAD_SIZE,
        scale=0.125,
        num_kv_heads=NUM_KV_HEADS,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BwxAttentionImpl(**args)


def test_impl_refuses_a_model_without_latent_attention_when_bwx_mla_was_asked():
    # vLLM's CPU platform hands such a model its CPU_ATTN entry whatever was asked; where that
    # entry is ours (BWX_CPU_BACKENDS=attn) the choice is refused, not served by BWX_ATTN.
    from vllm.config import AttentionConfig, set_current_vllm_config

    from tests.attention.conftest import registered_member
    from vllm_blackwell_ext.components import BWX_MLA

    member = registered_member(BWX_MLA.name, BWX_MLA.class_path)
    asked = VllmConfig(attention_config=AttentionConfig(backend=member))
    args = (NUM_HEADS, HEAD_SIZE, 0.125, NUM_KV_HEADS, None, None, "auto")
    with set_current_vllm_config(asked), pytest.raises(ValueError) as excinfo:
        BwxAttentionImpl(*args)
    assert "BWX_MLA was asked for, but this model has no latent attention" in str(excinfo.value)
    assert "choose BWX_ATTN" in str(excinfo.value)
    with set_current_vllm_config(VllmConfig()):
        BwxAttentionImpl(*args)  # nothing asked: served


def test_backend_declares_its_names_and_classes():
    assert BwxAttentionBackend.get_name() == "BWX_ATTN"
    assert BwxAttentionBackend.get_impl_cls() is BwxAttentionImpl
    assert BwxAttentionBackend.get_builder_cls() is BwxAttentionMetadataBuilder
    assert BwxAttentionBackend.forward_includes_kv_cache_update is False


def test_cpu_impl_writes_the_cache_with_torch_since_vllm_cpu_disables_its_triton_writer():
    impl = BwxAttentionImpl(NUM_HEADS, HEAD_SIZE, 0.125, NUM_KV_HEADS, None, None, "fp8")
    assert impl._vllm_cache_writer is None


def test_a_captured_graph_is_planned_for_max_model_len_and_eager_batches_for_their_own(
    vllm_configs,
):
    # A captured graph replays its split count for any context length (the kernel divides
    # each request's own key range among the splits on the device), so capture plans for
    # max_model_len, whatever max_seq_len the capturing path passes; an eager batch of two
    # 300-token decodes is not split into dozens of mostly empty splits.
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.bfloat16
    )
    builder = BwxAttentionMetadataBuilder(
        spec, ["layer"], vllm_configs(torch.bfloat16, "auto"), "cpu"
    )
    seq_lens = torch.tensor([300, 290], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=seq_lens,
        num_reqs=2,
        num_actual_tokens=2,
        max_query_len=1,
        max_seq_len=300,
        block_table_tensor=torch.ones(2, 20, dtype=torch.int32),
        slot_mapping=torch.zeros(2, dtype=torch.int64),
        causal=True,
    )
    assert builder.build(0, common).plan == builder.plan(2, 1, 300)
    assert builder.plan(2, 1, 300).num_splits == 1
    captured = builder.build_for_cudagraph_capture(common)
    assert captured.plan == builder.plan(2, 1, MAX_MODEL_LEN)
    assert captured.num_splits > 1
    assert captured.max_seq_len == MAX_MODEL_LEN


def test_values_narrower_or_wider_than_keys_never_reach_vllms_cache_writer(vllm_configs):
    # vLLM's Triton writer takes the head size from `key` and writes V at K's offsets: such
    # layers are written with torch (the stand-in fails the test if it is called).
    def vllm_writer(*args):
        raise AssertionError("vLLM's cache writer called for values of another width")

    requests = [Request(40, 1), Request(7, 3)]
    got, expected, _ = _run_step(
        vllm_configs, requests, head_size_v=96, seed=8, vllm_cache_writer=vllm_writer
    )
    _assert_close(got, expected, torch.bfloat16)


def test_cache_views_live_as_long_as_vllms_cache_tensor():
    # The K/V views (and their layout's TMA descriptors) made on the first forward are kept on
    # the cache tensor itself: once vLLM drops its reference (its profiling cache), nothing of
    # the layer holds the memory, and the layer checks the next cache it is handed.
    impl = BwxAttentionImpl(NUM_HEADS, HEAD_SIZE, 0.125, NUM_KV_HEADS, None, None, "auto")
    kv_cache = _kv_cache("auto", torch.bfloat16, HEAD_SIZE)
    first = impl._cache_layout(kv_cache)
    assert impl._cache_layout(kv_cache) is first  # made once per tensor
    first.descriptors(16)  # TMA descriptors of the views, kept in the layout
    impl._inputs_checked = True
    alive = weakref.ref(kv_cache)
    del kv_cache, first
    gc.collect()
    assert alive() is None, "the layer keeps a cache vLLM has dropped"
    impl._cache_layout(_kv_cache("auto", torch.bfloat16, HEAD_SIZE))
    assert not impl._inputs_checked
