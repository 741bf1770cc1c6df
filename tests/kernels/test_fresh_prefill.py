"""Fresh-prefill kernel (TMA from the chunk's own K/V) against the pure-torch reference, and the
paged kernel's hand-over of those requests.

CPU: Triton's interpreter on small shapes (hypothesis over request lengths around the kernel's
threshold, GQA and dtypes). GPU: real sizes, against the reference and the paged kernel.

Tolerances as the paged kernel's (tests/kernels/test_paged_attention.py): bf16 3e-2 abs + rel
(P rounded to bf16 before the P.V dot, output rounded to bf16: a few ulps of values <= ~4),
fp16 1e-2. The reference reads the same bf16/fp16 values in fp32.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_blackwell_ext.kernels.device import CPU_DEVICE_INFO, DeviceInfo, device_info
from vllm_blackwell_ext.kernels.fresh_prefill import (
    FRESH_PREFILL_MIN_QUERY_LEN,
    FreshPrefillConfig,
    fresh_prefill,
    fresh_prefill_config,
    fresh_prefill_supported,
    has_fresh_prefill,
)
from vllm_blackwell_ext.kernels.paged_attention import (
    AttnShape,
    LayerOptions,
    launch_paged_attention,
    paged_attention,
    paged_cache_layout,
    plan_paged_attention,
)
from vllm_blackwell_ext.reference.paged_attention import paged_attention_ref

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="real sizes need a CUDA GPU")
TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}
H200 = DeviceInfo("H200", (9, 0), num_sms=132, smem_per_block=232_448)
SM120 = DeviceInfo("RTX 5090", (12, 0), num_sms=170, smem_per_block=101_376)
B200 = DeviceInfo("B200", (10, 0), num_sms=148, smem_per_block=232_448)


def make_inputs(
    q_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head: int,
    dtype,
    seed: int = 0,
    seq_lens: list[int] | None = None,
) -> dict:
    """q, key, value as vLLM hands them to a forward (views of one packed qkv activation, two
    padding rows after the last request), and the out buffer filled with NaN. `seq_lens`
    defaults to the query lengths (no cached context)."""
    tokens = sum(q_lens) + 2
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, num_q_heads + 2 * num_kv_heads, head, generator=g)
    qkv = qkv.to(dtype).to(DEVICE)
    q, key, value = qkv.split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    cu = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return {
        "q": q,
        "key": key,
        "value": value,
        "out": torch.full_like(q, float("nan")),
        "cu": cu.to(DEVICE),
        "seq_lens": torch.tensor(seq_lens or q_lens, dtype=torch.int32, device=DEVICE),
        "q_lens": q_lens,
    }


def run(x: dict, scale: float, **kw) -> None:
    fresh_prefill(
        x["q"], x["key"], x["value"], x["out"], x["cu"], x["seq_lens"], softmax_scale=scale, **kw
    )


def fresh_requests(x: dict) -> set[int]:
    """The rule both kernels apply: no cached context, at least the minimum query length."""
    seq_lens = x["seq_lens"].tolist()
    return {
        b
        for b, n in enumerate(x["q_lens"])
        if n >= FRESH_PREFILL_MIN_QUERY_LEN and seq_lens[b] == n
    }


def reference(x: dict, scale: float) -> torch.Tensor:
    """The paged reference over the same K/V as a cache of one-token pages (no context)."""
    starts = x["cu"].tolist()[:-1]
    longest = max(x["q_lens"])
    table = torch.zeros(len(starts), longest, dtype=torch.int32)
    for b, (start, n) in enumerate(zip(starts, x["q_lens"], strict=True)):
        table[b, :n] = torch.arange(start, start + n)
    out, _ = paged_attention_ref(
        x["q"].float().cpu(),
        x["key"].float().cpu().unsqueeze(1),
        x["value"].float().cpu().unsqueeze(1),
        x["cu"].cpu(),
        torch.tensor(x["q_lens"], dtype=torch.int32),
        table,
        softmax_scale=scale,
        causal=True,
    )
    return out


def check_rows(x: dict, scale: float, dtype) -> None:
    """Rows of the fresh requests match the reference; every other row is untouched."""
    want = reference(x, scale)
    taken = fresh_requests(x)
    cu = x["cu"].tolist()
    out = x["out"].float().cpu()
    for b in range(len(x["q_lens"])):
        rows = slice(cu[b], cu[b + 1])
        if b in taken:
            torch.testing.assert_close(out[rows], want[rows], atol=TOL[dtype], rtol=TOL[dtype])
        else:
            assert out[rows].isnan().all(), f"request {b} is not fresh_prefill's but was written"
    assert out[cu[-1] :].isnan().all(), "padding rows were written"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    q_lens=st.lists(
        st.integers(1, FRESH_PREFILL_MIN_QUERY_LEN + 70), min_size=1, max_size=3
    ).filter(lambda lens: max(lens) >= FRESH_PREFILL_MIN_QUERY_LEN),
    gqa=st.sampled_from([1, 2, 4]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    skew=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_and_writes_only_its_requests(q_lens, gqa, dtype, skew, seed):
    num_kv_heads = 2
    x = make_inputs(q_lens, gqa * num_kv_heads, num_kv_heads, 64, dtype, seed)
    scale = 64**-0.5
    cfg = replace(fresh_prefill_config(device_info(DEVICE)), skew_scores=skew)
    run(x, scale, config=cfg)
    check_rows(x, scale, dtype)


def test_requests_with_cached_context_are_left_to_the_paged_kernel():
    # The second request has 10 cached tokens before its 140 queries: not a fresh prefill.
    x = make_inputs([150, 140, 40], 4, 2, 64, torch.bfloat16, seq_lens=[150, 150, 40])
    assert fresh_requests(x) == {0}
    run(x, 0.125)
    check_rows(x, 0.125, torch.bfloat16)


def test_the_host_sees_a_fresh_request_where_the_kernels_do():
    cu = torch.tensor([0, 300, 310, 600], dtype=torch.int32)
    assert has_fresh_prefill(cu, torch.tensor([300, 15, 290], dtype=torch.int32))
    # the long requests have cached context; the one without is short
    assert not has_fresh_prefill(cu, torch.tensor([301, 10, 291], dtype=torch.int32))
    # seq_lens may hold more rows than requests (vLLM's persistent buffers)
    assert has_fresh_prefill(cu[:2], torch.tensor([300, 7, 7], dtype=torch.int32))


def test_paged_kernel_leaves_fresh_requests_to_fresh_prefill():
    """`skip_fresh_from` skips exactly the requests `fresh_prefill` takes; the others'
    rows are the bits of a launch without it."""
    q_lens = [1, 150, 40, 140]
    seq_lens = [30, 150, 40, 170]  # decode, fresh (skipped), short fresh, prefill with context
    block_size, num_kv_heads, head = 16, 2, 64
    g = torch.Generator().manual_seed(3)
    pages = [-(-s // block_size) for s in seq_lens]
    kv = torch.randn(sum(pages) + 1, num_kv_heads, block_size, 2 * head, generator=g)
    kv = kv.to(torch.bfloat16).to(DEVICE)
    key_cache, value_cache = kv.transpose(1, 2).split(head, dim=-1)
    table = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32)
    at = 1
    for b, n in enumerate(pages):
        table[b, :n] = torch.arange(at, at + n)
        at += n
    q = torch.randn(sum(q_lens), 4, head, generator=g).to(torch.bfloat16).to(DEVICE)
    cu = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    args = (key_cache, value_cache)
    kw = dict(max_seqlen_q=max(q_lens), max_seqlen_k=max(seq_lens), softmax_scale=0.125)
    index = (cu.to(DEVICE), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE))
    full = torch.full_like(q, float("nan"))
    paged_attention(q, *args, full, *index, table.to(DEVICE), **kw)
    skipped = torch.full_like(q, float("nan"))
    layout = paged_cache_layout(*args)
    plan = plan_paged_attention(
        AttnShape.of_layout(device_info(DEVICE), q, layout), num_tokens=q.shape[0],
        max_seqlen_q=kw["max_seqlen_q"], max_seqlen_k=kw["max_seqlen_k"],
    )  # fmt: skip
    layer = LayerOptions(softmax_scale=0.125, skip_fresh_from=FRESH_PREFILL_MIN_QUERY_LEN)
    launch_paged_attention(plan, q, layout, skipped, *index, table.to(DEVICE), layer)
    fresh = {1}  # the rule: no cached context and at least FRESH_PREFILL_MIN_QUERY_LEN queries
    bounds = cu.tolist()
    for b in range(len(q_lens)):
        rows = slice(bounds[b], bounds[b + 1])
        if b in fresh:
            assert skipped[rows].isnan().all()
        else:
            assert torch.equal(skipped[rows], full[rows])


@pytest.mark.parametrize(
    ("change", "supported"),
    [
        ({}, True),
        ({"info": CPU_DEVICE_INFO}, True),
        ({"info": SM120}, False),  # 101 KB of shared memory: not sized for it
        ({"info": B200}, False),  # not measured there
        ({"kv_dtype": torch.float8_e4m3fn}, False),  # the cache would hold other values
        ({"q_dtype": torch.float16, "kv_dtype": torch.float16}, True),
        ({"head_size": 256, "head_size_v": 256}, False),
        ({"head_size_v": 64}, False),
        ({"num_q_heads": 24}, False),  # GQA 3
        ({"num_q_heads": 256}, False),  # GQA 32
        ({"causal": False}, False),
        ({"sliding_window": 4096}, False),
        ({"has_sinks": True}, False),
        ({"softcap": 30.0}, False),
    ],
)
def test_supported_layers(change, supported):
    layer = dict(
        info=H200, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, num_q_heads=32,
        num_kv_heads=8, head_size=128, head_size_v=128, causal=True, sliding_window=None,
        has_sinks=False, softcap=0.0,
    )  # fmt: skip
    layer.update(change)
    info = layer.pop("info")
    assert fresh_prefill_supported(info, **layer) is supported


def heads_major(t: torch.Tensor) -> torch.Tensor:
    """The same [tokens, heads, head] values stored head by head: heads not packed per row."""
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def _bad(x: dict, **swap) -> dict:
    args = {k: x[k] for k in ("q", "key", "value", "out", "cu", "seq_lens")}
    args.update(swap)
    return args


@pytest.mark.parametrize(
    ("arg", "exc", "swap"),
    [
        ("key", TypeError, lambda x: {"key": x["key"].float()}),
        ("value", ValueError, lambda x: {"value": x["value"][:-1]}),
        ("key", ValueError, lambda x: {"key": heads_major(x["key"])}),
        ("out", ValueError, lambda x: {"out": x["out"][:, :2]}),
        ("seq_lens", TypeError, lambda x: {"seq_lens": x["seq_lens"].long()}),
        ("cu_seqlens_q", ValueError, lambda x: {"cu": torch.cat((x["cu"], x["cu"][-1:]))}),
        ("cu_seqlens_q", TypeError, lambda x: {"cu": x["cu"].long()}),
    ],
)
def test_bad_input_raises_naming_the_argument(arg, exc, swap):
    x = make_inputs([130], 4, 2, 64, torch.bfloat16)
    a = _bad(x, **swap(x))
    with pytest.raises(exc, match=arg):
        fresh_prefill(
            a["q"], a["key"], a["value"], a["out"], a["cu"], a["seq_lens"], softmax_scale=0.125
        )


# Configs the GPU tests run beside the device's own: scores one tile ahead, on 64-key tiles
# (on 128-key tiles at head 128 they spill on sm90).
SKEWED_GPU_CONFIGS = [
    FreshPrefillConfig(block_m=128, tile_n=64, num_warps=8, num_stages=3, skew_scores=True),
    FreshPrefillConfig(block_m=128, tile_n=64, num_warps=8, num_stages=4, skew_scores=True),
]


@gpu_only
@pytest.mark.parametrize("config", [None, *SKEWED_GPU_CONFIGS], ids=["device", "skew3", "skew4"])
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head", [64, 128])
def test_gpu_real_sizes_match_reference(gqa, head, config):
    num_kv_heads = 32 // gqa
    x = make_inputs([1500, 700, 129, 40], 32, num_kv_heads, head, torch.bfloat16, seed=gqa)
    scale = head**-0.5
    run(x, scale, config=config)
    check_rows(x, scale, torch.bfloat16)


@gpu_only
@pytest.mark.parametrize("config", [None, SKEWED_GPU_CONFIGS[0]], ids=["device", "skew3"])
@pytest.mark.parametrize("q_lens", [[8192], [4096] * 4, [3008, 4992, 128]])
def test_gpu_long_prompts_match_the_paged_kernel(q_lens, config):
    """Qwen3-8B shapes at prompt lengths the reference would take minutes for: against the
    paged kernel over the same values paged in 16-token blocks."""
    x = make_inputs(q_lens, 32, 8, 128, torch.bfloat16, seed=len(q_lens))
    run(x, 128**-0.5, config=config)
    tokens = sum(q_lens)
    block = 16
    pad = -tokens % block
    kc = torch.nn.functional.pad(x["key"][:tokens], (0, 0, 0, 0, 0, pad))
    vc = torch.nn.functional.pad(x["value"][:tokens], (0, 0, 0, 0, 0, pad))
    kc, vc = (t.reshape(-1, block, 8, 128) for t in (kc, vc))
    table = torch.zeros(len(q_lens), -(-max(q_lens) // block) + 1, dtype=torch.int32)
    starts = x["cu"].tolist()
    for b, n in enumerate(q_lens):  # each request starts a page (the lengths are chosen so)
        assert starts[b] % block == 0
        first = starts[b] // block
        table[b, : -(-n // block)] = torch.arange(first, first + -(-n // block))
    want = torch.empty_like(x["q"])
    paged_attention(
        x["q"], kc, vc, want, x["cu"], torch.tensor(q_lens, dtype=torch.int32, device=DEVICE),
        table.to(DEVICE), max_seqlen_q=max(q_lens), max_seqlen_k=max(q_lens),
        softmax_scale=128**-0.5,
    )  # fmt: skip
    got = x["out"][:tokens].float()
    torch.testing.assert_close(got, want[:tokens].float(), atol=3e-2, rtol=3e-2)
