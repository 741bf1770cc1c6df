"""The Triton paged-KV gather against the pure-torch oracle (token-by-token walk).

Tolerances. The op's arithmetic is: fp8 -> fp32 (exact), one fp32 multiply by the scale (the
same IEEE operation in the kernel and the oracle), one rounding to dst's dtype. So every
comparison is exact equality, with one stated exception: Triton's CPU interpreter (triton
3.9, `runtime/interpreter.py`, `cast_impl`) narrows fp32 -> bf16 by truncation instead of
round-to-nearest-even, so under TRITON_INTERPRET the expected bf16 values are the oracle's fp32
values truncated (`expected_in`), still compared exactly. On the GPU they are rounded to nearest
even, as torch and vLLM's CUDA kernel do.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_blackwell_ext.kernels import kv_gather as kvk
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.reference.kv_gather import (
    cp_gather_cache_ref,
    gather_and_maybe_dequant_cache_ref,
    gather_vectorised,
)

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="real sizes need a CUDA GPU")
# The small-shape search is the CPU's; on the GPU its larger twin below runs instead (each new
# dtype/shape combination costs a Triton compile there).
interpreter_only = pytest.mark.skipif(ON_GPU, reason="the GPU twin covers it at larger sizes")

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
PLAIN_SRC = {
    "auto": [torch.bfloat16, torch.float16, torch.float32],
    "bfloat16": [torch.bfloat16],
    "float16": [torch.float16],
}
FILL = -7.0  # exactly representable in every dst dtype: untouched rows compare exactly


def expected_in(ref_fp32: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The oracle's fp32 result narrowed as the device narrows it (see module docstring)."""
    if dtype == torch.bfloat16 and device == "cpu":
        bits = ref_fp32.contiguous().view(torch.int32) & ~0xFFFF
        return bits.view(torch.float32).to(torch.bfloat16)
    return ref_fp32.to(dtype)


def make_cache(num_blocks, block_size, entry, kv_cache_dtype, src_dtype, device, gen):
    """Random cache values in the cache's storage dtype (fp8 through its uint8 storage or not)."""
    values = torch.randn((num_blocks, block_size, *entry), generator=gen) * 4
    if kv_cache_dtype in FP8:
        cache = values.to(FP8[kv_cache_dtype])  # finite fp8 values (|x| <= 448 for e4m3)
        return (cache.view(torch.uint8) if src_dtype == torch.uint8 else cache).to(device)
    return values.to(src_dtype).to(device)


def make_batch(lens, starts, block_size, num_blocks, device, gen, pad_tokens=0, extra_blocks=0):
    """cu_seq_lens, token_to_seq (optionally padded past the last sequence) and a random
    block table that covers each sequence's [start, start + len)."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    need = max(
        [(s + n + block_size - 1) // block_size for s, n in zip(starts, lens, strict=False)] + [1]
    )
    bt = torch.randint(0, num_blocks, (len(lens), need + extra_blocks), generator=gen)
    t2s = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens, dtype=torch.long))
    # Padding rows name the last sequence but sit past its end: the op must skip them.
    t2s = torch.cat([t2s, torch.full((pad_tokens,), len(lens) - 1, dtype=torch.long)])
    i32 = lambda x: torch.as_tensor(x, dtype=torch.int32).to(device)
    return i32(cu), i32(t2s), i32(bt), i32(starts)


def run_both(src, bt, cu, t2s, num_tokens, kv, scale, starts, dst_dtype, entry, device):
    dst = torch.full((num_tokens + 2, *entry), FILL, dtype=dst_dtype, device=device)
    kvk.gather_and_maybe_dequant_cache(src, dst, bt, cu, t2s, num_tokens, kv, scale, starts)
    ref = torch.full((num_tokens + 2, *entry), FILL, dtype=torch.float32, device=device)
    gather_and_maybe_dequant_cache_ref(src, ref, bt, cu, t2s, num_tokens, kv, scale, starts)
    return dst, expected_in(ref, dst_dtype, device)


@st.composite
def gather_cases(draw, gpu: bool):
    kv = draw(st.sampled_from(["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]))
    src_dtype = (
        draw(st.sampled_from([torch.uint8, FP8[kv]]))
        if kv in FP8
        else draw(st.sampled_from(PLAIN_SRC[kv]))
    )
    block_size = draw(st.sampled_from([1, 3, 16, 48, 64] + ([32, 128] if gpu else [])))
    entries = [(576,), (320,), (4, 64)] if gpu else [(576,), (320,), (2, 8), (40,), (4, 64)]
    entry = draw(st.sampled_from(entries))
    max_len = 400 if gpu else 70
    lens = draw(st.lists(st.integers(0, max_len), min_size=1, max_size=6 if gpu else 4))
    lens = draw(st.one_of(st.just(lens), st.just([0] + lens), st.just([1] * len(lens))))
    starts = [draw(st.integers(0, 2 * block_size + 5)) for _ in lens]
    return dict(
        kv=kv,
        src_dtype=src_dtype,
        block_size=block_size,
        entry=entry,
        lens=lens,
        starts=starts,
        use_starts=draw(st.booleans()),
        dst_dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        scale=draw(st.floats(0.0625, 4.0, width=32)),
        pad=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def gather_inputs(case, device) -> dict:
    """The op's arguments for one drawn case (dst aside)."""
    gen = torch.Generator().manual_seed(case["seed"])
    starts = case["starts"] if case["use_starts"] else [0] * len(case["lens"])
    num_blocks = 3 + sum(
        (s + n) // case["block_size"] + 1 for s, n in zip(starts, case["lens"], strict=False)
    )
    src = make_cache(
        num_blocks, case["block_size"], case["entry"], case["kv"], case["src_dtype"], device, gen
    )
    cu, t2s, bt, st_ = make_batch(
        case["lens"],
        starts,
        case["block_size"],
        num_blocks,
        device,
        gen,
        pad_tokens=case["pad"],
        extra_blocks=1,
    )
    return dict(
        src=src,
        bt=bt,
        cu=cu,
        t2s=t2s,
        num_tokens=int(cu[-1]) + case["pad"],
        kv=case["kv"],
        scale=torch.tensor([case["scale"]], dtype=torch.float32, device=device),
        starts=st_ if case["use_starts"] else None,
    )


def check_gather_case(case, device):
    x = gather_inputs(case, device)
    dst, want = run_both(
        x["src"],
        x["bt"],
        x["cu"],
        x["t2s"],
        x["num_tokens"],
        x["kv"],
        x["scale"],
        x["starts"],
        case["dst_dtype"],
        case["entry"],
        device,
    )
    torch.testing.assert_close(dst, want, rtol=0, atol=0, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(case=gather_cases(gpu=False))
def test_vectorised_oracle_matches_the_token_walk_on_live_rows(case, device):
    # The real-size GPU tests check the op against `gather_vectorised`: pin it to the walk.
    x = gather_inputs(case, device)
    live = int(x["cu"][-1])
    walk = torch.full((x["num_tokens"], *case["entry"]), FILL, dtype=torch.float32, device=device)
    args = (x["bt"], x["cu"], x["t2s"], x["num_tokens"], x["kv"], x["scale"])
    gather_and_maybe_dequant_cache_ref(x["src"], walk, *args, x["starts"])
    vectorised = gather_vectorised(x["src"], *args, x["starts"], torch.float32)
    assert torch.equal(vectorised[:live], walk[:live])


@interpreter_only
@settings(max_examples=60, deadline=None)
@given(case=gather_cases(gpu=False))
def test_gather_matches_token_walk_on_small_random_batches(case, device):
    check_gather_case(case, device)


@gpu_only
@settings(max_examples=30, deadline=None)
@given(case=gather_cases(gpu=True))
def test_gather_matches_token_walk_on_gpu_random_batches(case, device):
    check_gather_case(case, device)


@settings(max_examples=30, deadline=None)
@given(
    block_size=st.sampled_from([1, 16, 48, 64]),
    lens=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.uint8, torch.float8_e5m2, torch.bfloat16, torch.float32]),
    use_starts=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_cp_gather_copies_bytes_unchanged(block_size, lens, dtype, use_starts, seed, device):
    gen = torch.Generator().manual_seed(seed)
    starts = [int(x) for x in torch.randint(0, 2 * block_size + 3, (len(lens),), generator=gen)]
    starts = starts if use_starts else [0] * len(lens)
    num_blocks = 2 + sum((s + n) // block_size + 1 for s, n in zip(starts, lens, strict=False))
    if dtype == torch.uint8:  # every byte pattern, NaN encodings of fp8 included
        src = torch.randint(0, 256, (num_blocks, block_size, 576), generator=gen, dtype=torch.uint8)
    else:
        src = (torch.randn(num_blocks, block_size, 576, generator=gen) * 3).to(dtype)
    src = src.to(device)
    cu, _, bt, st_ = make_batch(lens, starts, block_size, num_blocks, device, gen)
    total = int(cu[-1])
    dst = torch.zeros(total + 3, 576, dtype=dtype, device=device)
    ref = dst.clone()
    kvk.cp_gather_cache(src, dst, bt, cu, len(lens), st_ if use_starts else None)
    cp_gather_cache_ref(src, ref, bt, cu, len(lens), st_ if use_starts else None)
    assert torch.equal(
        dst.view(torch.uint8) if dtype.itemsize == 1 else dst,
        ref.view(torch.uint8) if dtype.itemsize == 1 else ref,
    )


def test_cp_gather_writes_only_rows_between_first_and_last_offsets(device):
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(8, 16, 64, generator=gen).to(torch.bfloat16).to(device)
    cu = torch.tensor([3, 10, 10, 25], dtype=torch.int32, device=device)  # offset start, empty seq
    bt = torch.randint(0, 8, (3, 2), generator=gen).to(torch.int32).to(device)
    dst = torch.full((30, 64), FILL, dtype=torch.bfloat16, device=device)
    ref = dst.clone()
    kvk.cp_gather_cache(src, dst, bt, cu, 3)
    cp_gather_cache_ref(src, ref, bt, cu, 3)
    assert torch.equal(dst, ref)
    assert bool((dst[:3] == FILL).all()) and bool((dst[25:] == FILL).all())


def test_cp_gather_never_writes_past_dst_when_cu_seq_lens_says_more(device):
    src = torch.ones(4, 16, 32, dtype=torch.float16, device=device)
    cu = torch.tensor([0, 40], dtype=torch.int32, device=device)
    bt = torch.tensor([[0, 1, 2]], dtype=torch.int32, device=device)
    backing = torch.full((40, 32), FILL, dtype=torch.float16, device=device)
    kvk.cp_gather_cache(src, backing[:20], bt, cu, 1)
    assert bool((backing[:20] == 1).all()) and bool((backing[20:] == FILL).all())


def test_gather_skips_rows_past_their_sequence_end(device):
    gen = torch.Generator().manual_seed(1)
    src = make_cache(6, 16, (64,), "fp8", torch.uint8, device, gen)
    cu, t2s, bt, _ = make_batch([5, 7], [0, 0], 16, 6, device, gen, pad_tokens=4)
    scale = torch.tensor([2.0], device=device)
    dst, want = run_both(src, bt, cu, t2s, 16, "fp8", scale, None, torch.float32, (64,), device)
    assert torch.equal(dst, want)
    assert bool((dst[12:] == FILL).all())


def test_gather_of_zero_tokens_launches_nothing_and_writes_nothing(device):
    src = torch.randn(2, 16, 64, device=device).to(torch.bfloat16)
    dst = torch.full((4, 64), FILL, dtype=torch.bfloat16, device=device)
    z = torch.zeros(2, dtype=torch.int32, device=device)
    kvk.gather_and_maybe_dequant_cache(src, dst, z.view(1, 2), z, z, 0, "auto", None)
    assert bool((dst == FILL).all())


def test_fp8_scale_is_applied_in_fp32_before_one_rounding(device):
    # 1.875 (exact in e4m3) x 1.005859375 = 1.885986328125, rounded once to bf16: 1.8828125.
    # A scale rounded to bf16 first (1.0078125) would give 1.890625 instead.
    value, scale = 1.875, 1.005859375
    once = torch.tensor(value * scale, dtype=torch.float32).to(torch.bfloat16)
    scale_first = torch.tensor(value * float(torch.tensor(scale).to(torch.bfloat16)))
    assert float(once) == 1.8828125 and float(scale_first.to(torch.bfloat16)) == 1.890625
    src = torch.full((1, 1, 16), value).to(torch.float8_e4m3fn).to(device)
    args = (
        torch.zeros(1, dtype=torch.int32, device=device).view(1, 1),
        torch.tensor([0, 1], dtype=torch.int32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device),
        1,
        "fp8",
        torch.tensor([scale], device=device),
    )
    dst = torch.zeros(1, 16, dtype=torch.bfloat16, device=device)
    kvk.gather_and_maybe_dequant_cache(src, dst, *args)
    ref = torch.zeros_like(dst)
    gather_and_maybe_dequant_cache_ref(src, ref, *args)
    assert torch.equal(dst, ref)
    assert bool((dst == 1.8828125).all())


def test_debug_bounds_mode_rejects_block_table_entry_past_num_blocks(device, monkeypatch):
    monkeypatch.setenv(kvk.DEBUG_BOUNDS_ENV, "1")
    src = torch.randn(4, 16, 64, device=device).to(torch.bfloat16)
    dst = torch.zeros(20, 64, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    bt = torch.tensor([[1, 4]], dtype=torch.int32, device=device)  # 4 == num_blocks
    t2s = torch.zeros(20, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="block_table"):
        kvk.gather_and_maybe_dequant_cache(src, dst, bt, cu, t2s, 20, "auto", None)
    with pytest.raises(ValueError, match="block_table"):
        kvk.cp_gather_cache(src, dst, bt, cu, 1)
    assert bool((dst == 0).all())


def test_debug_bounds_mode_rejects_positions_past_the_block_table(device, monkeypatch):
    monkeypatch.setenv(kvk.DEBUG_BOUNDS_ENV, "1")
    src = torch.randn(4, 16, 64, device=device).to(torch.bfloat16)
    dst = torch.zeros(20, 64, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    bt = torch.tensor([[1, 2]], dtype=torch.int32, device=device)
    starts = torch.tensor([13], dtype=torch.int32, device=device)  # 13 + 20 > 2 * 16
    with pytest.raises(ValueError, match="seq_starts"):
        kvk.cp_gather_cache(src, dst, bt, cu, 1, starts)


@pytest.mark.parametrize("bad_page", [4, 1 << 30, -1, -(1 << 30)])
def test_kernel_skips_rows_whose_page_is_out_of_range_without_debug_mode(device, bad_page):
    # Without BWX_DEBUG_BOUNDS nothing is checked on the host: the kernel's own masks must
    # keep every read inside src_cache (no crash) and leave those rows unwritten.
    src = torch.randn(4, 16, 64, device=device).to(torch.bfloat16)
    dst = torch.full((32, 64), FILL, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 32], dtype=torch.int32, device=device)
    bt = torch.tensor([[1, bad_page]], dtype=torch.int32, device=device)
    t2s = torch.zeros(32, dtype=torch.int32, device=device)
    plan = kvk.plan_kv_gather("auto", src.dtype, 64, False, device_info(src.device))
    kvk.launch_kv_gather(
        plan, src, dst, bt, cu, t2s, None, None, num_rows=32, batch_size=1, debug_bounds=False
    )
    assert torch.equal(dst[:16], src[1])
    assert bool((dst[16:] == FILL).all())
    raw = torch.full((32, 64), FILL, dtype=torch.bfloat16, device=device)
    kvk.cp_gather_cache(src, raw, bt, cu, 1)
    assert torch.equal(raw, dst)


def test_kernel_skips_rows_with_bad_sequence_ids_and_positions_without_debug_mode(device):
    src = torch.randn(4, 16, 64, device=device).to(torch.bfloat16)
    dst = torch.full((32, 64), FILL, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 32], dtype=torch.int32, device=device)
    bt = torch.tensor([[1, 2]], dtype=torch.int32, device=device)
    t2s = torch.zeros(32, dtype=torch.int32, device=device)
    t2s[3], t2s[4] = -1, 7  # outside [0, batch)
    starts = torch.tensor([8], dtype=torch.int32, device=device)  # rows 24.. fall past 2 pages
    plan = kvk.plan_kv_gather("auto", src.dtype, 64, True, device_info(src.device))
    kvk.launch_kv_gather(
        plan, src, dst, bt, cu, t2s, starts, None, num_rows=32, batch_size=1, debug_bounds=False
    )
    pages = torch.cat([src[1], src[2]])
    kept = [t for t in range(32) if t not in (3, 4) and t < 24]
    assert torch.equal(dst[kept], pages[[t + 8 for t in kept]])
    assert bool((dst[[3, 4, *range(24, 32)]] == FILL).all())


def test_entry_pieces_cover_every_column_once():
    info = device_info("cpu")
    for entry in (1, 3, 40, 64, 320, 576, 1000, 2048, 3000):
        for max_piece in (64, 512, 1024):
            cfg = kvk.GatherConfig(4, max_piece, 2)
            plan = kvk.plan_kv_gather("fp8", torch.uint8, entry, False, info, config=cfg)
            piece, main, tail = plan.piece, plan.main, plan.tail
            assert (piece, main, tail) == kvk.entry_pieces(entry, max_piece)
            assert main % piece == 0 and main <= entry and entry - main <= tail
            assert piece & (piece - 1) == 0 and (tail == 0 or tail & (tail - 1) == 0)
            assert plan.constexprs["E"] == entry and plan.constexprs["PIECE"] == piece


# ---- real sizes on the GPU (MLA shapes of the benchmark) ----


def mla_batch(B, ctx, block_size, device, seed, kv="fp8", starts=None, num_blocks=None):
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = (ctx + block_size - 1) // block_size
    num_blocks = num_blocks or B * pages + 7
    if kv in FP8:
        src = torch.randint(
            0, 256, (num_blocks, block_size, 576), generator=gen, device=device, dtype=torch.uint8
        )
        # Exclude NaN encodings so torch.equal can compare (NaN patterns are covered by cp).
        src = (src.view(FP8[kv]).float().nan_to_num(0.0)).to(FP8[kv]).view(torch.uint8)
    else:
        src = torch.randn(num_blocks, block_size, 576, generator=gen, device=device).to(
            torch.bfloat16
        )
    bt = torch.randperm(num_blocks, generator=gen, device=device)[: B * pages].view(B, pages)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    if starts is not None:
        lens = lens - starts
    cu = torch.zeros(B + 1, dtype=torch.int32, device=device)
    cu[1:] = lens.cumsum(0)
    t2s = torch.repeat_interleave(torch.arange(B, device=device, dtype=torch.int32), lens)
    return src, bt.to(torch.int32).contiguous(), cu, t2s, int(cu[-1])


@gpu_only
@pytest.mark.parametrize(
    "B,ctx,kv",
    [(1, 131072, "fp8"), (8, 32768, "fp8_e5m2"), (64, 4096, "fp8"), (8, 16384, "auto")],
    ids=lambda v: str(v),
)
def test_gather_matches_vectorised_oracle_at_mla_sizes(B, ctx, kv, device):
    starts = torch.arange(B, device=device, dtype=torch.int32) * 37 % 64  # not block-aligned
    src, bt, cu, t2s, T = mla_batch(B, ctx, 64, device, seed=B, kv=kv, starts=starts)
    scale = torch.tensor([0.0473], device=device)
    dst = torch.empty(T, 576, dtype=torch.bfloat16, device=device)
    kvk.gather_and_maybe_dequant_cache(src, dst, bt, cu, t2s, T, kv, scale, starts)
    want = gather_vectorised(src, bt, cu, t2s, T, kv, scale, starts, torch.bfloat16)
    assert torch.equal(dst, want)


@gpu_only
def test_gather_addresses_caches_larger_than_2_to_the_31_elements(device):
    # 70,000 blocks x 64 x 576 = 2.58e9 elements: page offsets need 64-bit arithmetic.
    B, ctx = 4, 8192
    src, bt, cu, t2s, T = mla_batch(B, ctx, 64, device, seed=3, num_blocks=70_000)
    bt = (bt % 1000) + 69_000  # pages near the end of the cache
    scale = torch.tensor([1.0], device=device)
    dst = torch.empty(T, 576, dtype=torch.bfloat16, device=device)
    kvk.gather_and_maybe_dequant_cache(src, dst, bt, cu, t2s, T, "fp8", scale, None)
    assert torch.equal(
        dst, gather_vectorised(src, bt, cu, t2s, T, "fp8", scale, None, torch.bfloat16)
    )
    raw = torch.empty(T, 576, dtype=torch.uint8, device=device)
    kvk.cp_gather_cache(src, raw, bt, cu, B)
    assert torch.equal(raw.view(torch.float8_e4m3fn).float() * 1.0, dst.float())


@pytest.mark.parametrize(
    "cfg",
    [kvk.GatherConfig(4, 512, 2), kvk.GatherConfig(8, 512, 4, True), kvk.GatherConfig(32, 64, 4),
     kvk.GatherConfig(64, 128, 8)],
    ids=str,
)  # fmt: skip
def test_every_launch_config_gives_the_same_rows(cfg, device):
    gen = torch.Generator().manual_seed(5)
    src = make_cache(12, 16, (576,), "fp8", torch.uint8, device, gen)
    cu, t2s, bt, starts = make_batch([37, 0, 50], [5, 0, 9], 16, 12, device, gen)
    scale = torch.tensor([1.0], device=device)  # fp8 -> fp32 is exact: no rounding to model
    out = torch.full((87, 576), FILL, dtype=torch.float32, device=device)
    kvk.gather_and_maybe_dequant_cache(src, out, bt, cu, t2s, 87, "fp8", scale, starts, config=cfg)
    ref = torch.full_like(out, FILL)
    gather_and_maybe_dequant_cache_ref(src, ref, bt, cu, t2s, 87, "fp8", scale, starts)
    assert torch.equal(out, ref)


def test_plan_takes_the_device_entry_unless_a_config_is_given():
    info = device_info("cpu")
    plan = kvk.plan_kv_gather("fp8", torch.uint8, 576, True, info)
    assert plan.config == kvk.gather_config(info.device_class)
    assert (plan.piece, plan.main, plan.tail) == kvk.entry_pieces(576, plan.config.max_piece)
    assert plan.dequant and plan.has_token_to_seq and plan.has_seq_starts
    assert plan.src_view == torch.float8_e4m3fn and plan.dst_view is None
    forced = kvk.GatherConfig(8, 64, 4, True)
    tuned = kvk.plan_kv_gather("fp8", torch.uint8, 576, True, info, config=forced)
    assert tuned.config == forced and tuned.constexprs["EVICT"] == "evict_first"
    raw = kvk.plan_kv_gather(None, torch.float8_e5m2, 576, False, info)
    assert not raw.dequant and not raw.has_token_to_seq
    assert raw.src_view == raw.dst_view == torch.uint8  # fp8 bytes copied as bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.entry = 1  # type: ignore[misc]


def test_launch_refuses_tensors_its_plan_was_not_made_for(device):
    src = torch.zeros(4, 16, 64, dtype=torch.bfloat16, device=device)
    dst = torch.full((16, 64), FILL, dtype=torch.bfloat16, device=device)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=device)
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    t2s = torch.zeros(16, dtype=torch.int32, device=device)
    no_starts = kvk.plan_kv_gather("auto", src.dtype, 64, False, device_info(src.device))
    with pytest.raises(ValueError, match="seq_starts: expected None"):
        kvk.launch_kv_gather(no_starts, src, dst, bt, cu, t2s, cu[:1], None, num_rows=16,
                             batch_size=1)  # fmt: skip
    with pytest.raises(ValueError, match="token_to_seq: expected a tensor"):
        kvk.launch_kv_gather(no_starts, src, dst, bt, cu, None, None, None, num_rows=16,
                             batch_size=1)  # fmt: skip
    assert bool((dst == FILL).all())
