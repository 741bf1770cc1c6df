"""MLA decode kernel vs the pure-torch reference (`reference/mla_decode.py`).

CPU (TRITON_INTERPRET=1): small shapes, hypothesis-driven, a few seconds each. GPU: real
sizes (576 and 288 widths, bf16 and fp8 caches, query lengths 1..8, 1 to many splits, contexts
that are not multiples of the page), skipped on the CPU.

Tolerances. The reference is fp32 throughout. The kernel keeps scores, softmax statistics and
the accumulator in fp32 but feeds tensor cores bf16 operands: the probabilities P are rounded
to bf16 before P @ V (relative error 2^-9 each, averaging out over keys), and the output is
stored in bf16 (relative 2^-9). With |values| ~ 1 (randn), that bounds the output error to a few
1e-3 absolute; we allow 2e-2 absolute + 2e-2 relative for bf16 outputs. The LSE comes from fp32
statistics of bf16-exact products: 1e-3 absolute (its values are ~5). An fp8 cache widens to
fp16 exactly (the kernel's fp8 operand type; q is pre-scaled and rounded to fp16, relative
2^-11, finer than bf16), and the reference sees the same dequantised values, so the same
tolerances hold.
Under the interpreter the tensor-core operands are fp32 (see `_dot_dtype`), so the error there
is only the bf16 store.
"""

from __future__ import annotations

import functools
import inspect
import math
import os

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vllm_blackwell_ext.kernels.device import CPU_DEVICE_INFO, DeviceInfo, device_info
from vllm_blackwell_ext.kernels.mla_decode import (
    FEW_PROGRAMS,
    GLUON_AVAILABLE,
    INT_WIDEN_BOTH,
    INT_WIDEN_VALUES,
    MAX_SPLITS,
    MLA_DECODE_CONFIGS,
    MLA_DECODE_FEW_PROGRAM_CONFIGS,
    MLA_DECODE_TMA_CONFIGS,
    PREFERRED_BLOCK_SIZE,
    ROW_TILES,
    VARIANTS,
    MlaDecodeConfig,
    MlaDecodePlan,
    MlaDecodeWorkspace,
    gluon_supported,
    launch_mla_decode,
    merge_config,
    mla_cache_layout,
    mla_decode,
    mla_decode_launches,
    plan_for_tensors,
    plan_mla_decode,
    query_is_tma_readable,
)
from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="real-size MLA decode needs a CUDA GPU")

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from vllm_blackwell_ext.kernels.mla_decode.gluon_kernel import e4m3_to_bf16

    @gluon.jit
    def _widen_bytes_kernel(src, dst, N: gl.constexpr):
        """`e4m3_to_bf16` of N fp8 values."""
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
        offs = gl.arange(0, N, layout)
        gl.store(dst + offs, e4m3_to_bf16(gl.load(src + offs)))


def _class_info(device_class: str) -> DeviceInfo:
    """A GPU of a device class ("sm90" -> capability (9, 0)), 132 SMs."""
    capability = (int(device_class[2:-1]), int(device_class[-1]))
    return DeviceInfo("GPU", capability, num_sms=132, smem_per_block=232_448)


def _table_config(
    device_class: str, tag: str, rows: int, batch: int, tma_page_size: int | None = None
) -> MlaDecodeConfig:
    """The config a plan takes on a device class for `rows` query rows per request."""
    kv = torch.float8_e4m3fn if tag == "fp8" else torch.bfloat16
    return plan_mla_decode(
        batch, rows, None, 1, _class_info(device_class), kv_dtype=kv,
        tma_page_size=tma_page_size, num_splits=1,
    ).config  # fmt: skip


OUT_ATOL = 2e-2
OUT_RTOL = 2e-2
# Outputs average values over many keys (|out| ~ 0.05 at thousands), where OUT_ATOL alone
# would pass a wrong merge: each row's error is also held to this fraction of the row's RMS.
# bf16 rounding of P and of the output costs 0.010-0.016 of it (simulated in fp32 at these
# shapes); a merge that ignored the split weights was off by 0.17-0.57.
OUT_ROW_RMS_FRACTION = 0.05
LSE_ATOL = 1e-3
ROPE = {512: 64, 256: 32}


def _make_case(
    *,
    device: str,
    kv_lora_rank: int,
    num_heads: int,
    seq_lens: list[int],
    query_len: int,
    block_size: int,
    fp8: bool,
    seed: int,
    strided_cache: bool = False,
) -> dict:
    g = torch.Generator().manual_seed(seed)
    width = kv_lora_rank + ROPE[kv_lora_rank]
    batch = len(seq_lens)
    pages_per_seq = max(1, max(math.ceil(s / block_size) for s in seq_lens))
    num_blocks = batch * pages_per_seq + 3
    # Pages are handed out in a shuffled order so the block table is really followed.
    block_table = torch.randperm(num_blocks, generator=g)[: batch * pages_per_seq]
    block_table = block_table.view(batch, pages_per_seq).to(torch.int32)
    cache = torch.randn(num_blocks, block_size, width + (8 if strided_cache else 0), generator=g)
    k_scale = None
    if fp8:
        # Stored values span e4m3's range; the scale brings them back to ~N(0, 1).
        cache = (cache * 8).to(torch.float8_e4m3fn)
        k_scale = torch.tensor([0.125], dtype=torch.float32)
    else:
        cache = cache.to(torch.bfloat16)
    q = torch.randn(batch * query_len, num_heads, width, generator=g).to(torch.bfloat16)
    case = dict(
        q=q,
        kv_cache=cache,
        block_table=block_table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        k_scale=k_scale,
        softmax_scale=width**-0.5,
        kv_lora_rank=kv_lora_rank,
        query_len=query_len,
    )
    case = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    if strided_cache:
        # A view whose token stride is not the row width, taken on the device (moving a
        # non-contiguous view with .to(device) would copy it into a contiguous tensor).
        case["kv_cache"] = case["kv_cache"][..., :width]
    return case


def _run(
    case: dict,
    num_splits: int | None,
    causal: bool = True,
    workspace: MlaDecodeWorkspace | None = None,
    config: MlaDecodeConfig | None = None,
    compiled: list | None = None,
    **launch,
) -> tuple[torch.Tensor, ...]:
    """`mla_decode` on a case (`launch`: its other keyword arguments) and the reference."""
    q = case["q"]
    out = torch.empty(q.shape[0], q.shape[1], case["kv_lora_rank"], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    mla_decode(
        q,
        case["kv_cache"],
        case["block_table"],
        case["seq_lens"],
        out,
        softmax_scale=case["softmax_scale"],
        kv_lora_rank=case["kv_lora_rank"],
        query_len=case["query_len"],
        k_scale=case["k_scale"],
        lse_out=lse,
        num_splits=num_splits,
        causal=causal,
        workspace=workspace,
        config=config,
        compiled=compiled,
        **launch,
    )
    ref_out, ref_lse = mla_decode_reference(
        q.cpu(),
        case["kv_cache"].cpu(),
        case["block_table"].cpu(),
        case["seq_lens"].cpu(),
        softmax_scale=case["softmax_scale"],
        kv_lora_rank=case["kv_lora_rank"],
        query_len=case["query_len"],
        k_scale=None if case["k_scale"] is None else case["k_scale"].cpu(),
        causal=causal,
    )
    return out.float().cpu(), lse.cpu(), ref_out, ref_lse


def _assert_close(out, lse, ref_out, ref_lse) -> None:
    assert torch.isfinite(out).all(), "output has NaN/inf"
    assert not torch.isnan(lse).any(), "LSE has NaN"
    torch.testing.assert_close(out, ref_out, atol=OUT_ATOL, rtol=OUT_RTOL)
    row_rms = ref_out.pow(2).mean(-1, keepdim=True).sqrt()
    worst = ((out - ref_out).abs() - OUT_ROW_RMS_FRACTION * row_rms).max().item()
    assert worst <= 1e-6, f"a row is off by more than {OUT_ROW_RMS_FRACTION} of its RMS"
    # -inf rows (no visible key) must match exactly; finite rows within LSE_ATOL.
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], atol=LSE_ATOL, rtol=0)


# ---------------------------------------------------------------- CPU interpreter (small) ----


@settings(max_examples=10, deadline=None)
@given(
    kv_lora_rank=st.sampled_from([256, 512]),
    num_heads=st.sampled_from([1, 4, 16, 20]),
    seq_lens=st.lists(st.integers(0, 70), min_size=1, max_size=3),
    query_len=st.integers(1, 3),
    block_size=st.sampled_from([1, 16, 32]),
    fp8=st.booleans(),
    # None: the planner's choice (one split at these lengths). 70: the wide merge config,
    # with at most 3 of its splits holding keys (32-key tiles): the rest are skipped by both
    # kernels. `test_wide_merge_reads_splits_beyond_its_first_block` fills both blocks.
    num_splits=st.sampled_from([None, 1, 2, 5, 70]),
    seed=st.integers(0, 2**16),
)
# Cases every run covers, whatever hypothesis draws: fp8 with several splits and several
# causal rows per request, at both latent widths.
@example(
    kv_lora_rank=512, num_heads=16, seq_lens=[70, 33], query_len=3, block_size=16, fp8=True,
    num_splits=5, seed=3,
)  # fmt: skip
@example(
    kv_lora_rank=256, num_heads=4, seq_lens=[65, 0, 7], query_len=2, block_size=1, fp8=True,
    num_splits=2, seed=4,
)  # fmt: skip
def test_matches_reference_on_random_small_cases(
    device, kv_lora_rank, num_heads, seq_lens, query_len, block_size, fp8, num_splits, seed
):
    case = _make_case(
        device=device,
        kv_lora_rank=kv_lora_rank,
        num_heads=num_heads,
        seq_lens=seq_lens,
        query_len=query_len,
        block_size=block_size,
        fp8=fp8,
        seed=seed,
    )
    _assert_close(*_run(case, num_splits))


def _fill_page_tails(case: dict, value: float) -> None:
    """Write `value` into every slot past a request's keys in its pages (as a reused page
    holds an earlier request's K/V): only kernels that mask them stay right."""
    cache, block_size = case["kv_cache"], case["kv_cache"].shape[1]
    for b, seq_len in enumerate(case["seq_lens"].tolist()):
        for j, page in enumerate(case["block_table"][b].tolist()):
            first = min(max(seq_len - j * block_size, 0), block_size)
            cache[page, first:] = value


@settings(max_examples=8, deadline=None)
@given(
    kv_lora_rank=st.sampled_from([256, 512]),
    num_heads=st.sampled_from([4, 16, 20]),
    seq_lens=st.lists(st.integers(0, 100), min_size=1, max_size=3),
    query_len=st.integers(1, 3),
    block_n=st.sampled_from([16, 32]),
    pages_per_tile=st.sampled_from([1, 2]),
    fp8=st.booleans(),
    num_splits=st.sampled_from([None, 1, 3]),
    seed=st.integers(0, 2**16),
)
@example(
    kv_lora_rank=512, num_heads=20, seq_lens=[100, 0, 37], query_len=3, block_n=32,
    pages_per_tile=2, fp8=False, num_splits=3, seed=1,
)  # fmt: skip
@example(
    kv_lora_rank=256, num_heads=16, seq_lens=[70, 5], query_len=2, block_n=16,
    pages_per_tile=1, fp8=True, num_splits=3, seed=2,
)  # fmt: skip
def test_tma_tiles_match_reference_with_stale_page_tails(
    device, kv_lora_rank, num_heads, seq_lens, query_len, block_n, pages_per_tile, fp8,
    num_splits, seed,
):  # fmt: skip
    """The TMA path reads whole page-aligned tiles, past-the-end slots included: with those
    slots holding large stale values, outputs still match the reference. fp8 caches take the
    same path, widened to q's dtype."""
    case = _make_case(
        device=device,
        kv_lora_rank=kv_lora_rank,
        num_heads=num_heads,
        seq_lens=seq_lens,
        query_len=query_len,
        block_size=block_n * pages_per_tile,
        fp8=fp8,
        seed=seed,
    )
    _fill_page_tails(case, 448.0 if fp8 else 1e4)  # e4m3's largest finite value
    cfg = MlaDecodeConfig(16, block_n, 4, 2, 1, 128, tma=True)
    _assert_close(*_run(case, num_splits, config=cfg))


@settings(max_examples=6, deadline=None)
@given(
    kv_lora_rank=st.sampled_from([256, 512]),
    num_heads=st.sampled_from([4, 16, 20]),
    seq_lens=st.lists(st.integers(0, 70), min_size=1, max_size=3),
    query_len=st.integers(1, 3),
    block_n=st.sampled_from([16, 32]),
    num_splits=st.sampled_from([1, 3]),
    int_widen=st.sampled_from([INT_WIDEN_VALUES, INT_WIDEN_BOTH]),
    seed=st.integers(0, 2**16),
)
@example(
    kv_lora_rank=512, num_heads=16, seq_lens=[70, 33], query_len=3, block_n=32, num_splits=3,
    int_widen=INT_WIDEN_VALUES, seed=5,
)  # fmt: skip
@example(
    kv_lora_rank=512, num_heads=16, seq_lens=[70, 33], query_len=3, block_n=32, num_splits=3,
    int_widen=INT_WIDEN_BOTH, seed=5,
)  # fmt: skip
def test_fp8_values_widened_in_integer_ops_match_reference(
    device, kv_lora_rank, num_heads, seq_lens, query_len, block_n, num_splits, int_widen, seed
):
    """`int_widen` entries: an fp8 cache's P @ V operand, or both operands, widened in integer
    ops (the values times 2^-8, restored in the output's scale and the scores), with stale page
    tails at e4m3's largest value."""
    case = _make_case(
        device=device, kv_lora_rank=kv_lora_rank, num_heads=num_heads, seq_lens=seq_lens,
        query_len=query_len, block_size=16, fp8=True, seed=seed,
    )  # fmt: skip
    _fill_page_tails(case, 448.0)
    cfg = MlaDecodeConfig(16, block_n, 4, 2, 1, 128, int_widen=int_widen)
    _assert_close(*_run(case, num_splits, config=cfg))


def test_cache_layout_made_once_gives_the_same_output_and_must_be_the_caches_own(device):
    """`mla_cache_layout`, made once and passed per call with the checks off (what BWX_MLA's
    decode does), launches the same TMA tiles bit for bit; a layout of another tensor is
    refused."""
    case = _make_case(
        device=device, kv_lora_rank=256, num_heads=16, seq_lens=[70, 5], query_len=2,
        block_size=32, fp8=False, seed=3,
    )  # fmt: skip
    cfg = MlaDecodeConfig(16, 32, 4, 2, 1, 128, tma=True)
    layout = mla_cache_layout(case["kv_cache"])
    assert layout.tma_page_size == 32
    assert layout.descriptors(32, 256) is layout.descriptors(32, 256)  # made once per tile
    out, lse, ref_out, ref_lse = _run(case, 3, config=cfg)
    _assert_close(out, lse, ref_out, ref_lse)
    once = _run(case, 3, config=cfg, cache_layout=layout, check_inputs=False)
    torch.testing.assert_close(once[0], out, atol=0, rtol=0)
    torch.testing.assert_close(once[1], lse, atol=0, rtol=0)
    other = mla_cache_layout(case["kv_cache"].clone())
    with pytest.raises(ValueError, match="cache_layout: expected mla_cache_layout"):
        _run(case, 3, config=cfg, cache_layout=other)


def test_tma_config_is_refused_for_a_cache_it_cannot_read(device):
    case = _make_case(
        device=device, kv_lora_rank=256, num_heads=4, seq_lens=[40], query_len=1,
        block_size=16, fp8=False, seed=6,
    )  # fmt: skip
    too_wide = MlaDecodeConfig(16, 32, 4, 2, 1, 128, tma=True)  # 32-key tiles, 16-slot pages
    with pytest.raises(ValueError, match="config: expected tma=False"):
        _run(case, None, config=too_wide)
    case = _make_case(
        device=device, kv_lora_rank=256, num_heads=4, seq_lens=[40], query_len=1,
        block_size=16, fp8=False, seed=6, strided_cache=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="config: expected tma=False"):
        _run(case, None, config=MlaDecodeConfig(16, 16, 4, 2, 1, 128, tma=True))


def test_tma_entries_apply_only_to_caches_they_can_read():
    """A class's TMA entry replaces its entry for caches TMA can read; a split plan given the
    page size is made for that entry, and a workspace sized the same way holds its plans."""
    for cls, by_tag in MLA_DECODE_TMA_CONFIGS.items():
        for tag, by_tile in by_tag.items():
            for tile, tma in by_tile.items():
                main = MLA_DECODE_CONFIGS[cls][tag][tile]
                assert tma.tma and not main.tma
                rows, batch = tile, 64
                assert _table_config(cls, tag, rows, batch) == main
                assert _table_config(cls, tag, rows, batch, tma_page_size=64) == tma
                assert PREFERRED_BLOCK_SIZE % tma.block_n == 0  # BWX_MLA's pages take it
                page = tma.block_n // 2  # a tile would span two pages
                assert _table_config(cls, tag, rows, batch, tma_page_size=page) == main
                info = _class_info(cls)
                assert info.device_class == cls
                kv = torch.float8_e4m3fn if tag == "fp8" else torch.bfloat16
                for heads, q_len in ((tile, 1), (tile // 4, 4), (2 * tile, 1)):
                    plan = functools.partial(
                        plan_mla_decode, num_heads=heads, max_seq_len=32768, query_len=q_len,
                        device_info=info, kv_dtype=kv,
                    )  # fmt: skip
                    assert plan(batch).config == main
                    assert plan(batch, tma_page_size=PREFERRED_BLOCK_SIZE).config == tma
                    ws = MlaDecodeWorkspace.for_plans(
                        64, heads, 32768, q_len, 512, "cpu", kv_dtype=kv, info=info,
                        tma_page_size=PREFERRED_BLOCK_SIZE,
                    )  # fmt: skip
                    for b in range(1, 64 // q_len + 1):
                        s = plan(b, tma_page_size=PREFERRED_BLOCK_SIZE).num_splits
                        assert s == 1 or ws.capacity_rows >= b * q_len * heads * s, (heads, b, s)
    # Every main-table entry gathers, so it serves any cache.
    for by_tag in MLA_DECODE_CONFIGS.values():
        assert not any(c.tma for by_tile in by_tag.values() for c in by_tile.values())


def test_empty_sequence_gives_zero_output_and_minus_inf_lse(device):
    # As on a DCP rank that holds no token of request 1; split count large enough that most
    # splits of every request are empty too.
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=4,
        seq_lens=[9, 0, 3],
        query_len=1,
        block_size=16,
        fp8=False,
        seed=1,
    )
    out, lse, ref_out, ref_lse = _run(case, num_splits=4)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[1]).all()
    _assert_close(out, lse, ref_out, ref_lse)


def test_wide_merge_reads_splits_beyond_its_first_block(device):
    # 70 splits take the wide merge config on a GPU (64 splits per block; the CPU's reads 64
    # at a time whatever the splits). 2200 keys cut into splits of one 32-key tile (the CPU
    # config's) fill 69 splits, so both blocks of splits carry weight; the short request
    # leaves most of its splits empty.
    assert merge_config(70, "sm90", 256) != merge_config(2, "sm90", 256)
    assert merge_config(70, device_info(device).device_class, 256)[1] < 70
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=2,
        seq_lens=[2200, 5],
        query_len=1,
        block_size=64,
        fp8=False,
        seed=4,
    )
    _assert_close(*_run(case, num_splits=70))


def test_causal_rows_see_only_their_prefix_and_noncausal_rows_see_all(device):
    # seq_len 2 with 3 query rows: row 0 sees nothing, row 1 key 0, row 2 keys 0..1.
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=2,
        seq_lens=[2, 40],
        query_len=3,
        block_size=16,
        fp8=True,
        seed=2,
    )
    out, lse, ref_out, ref_lse = _run(case, num_splits=2)
    assert torch.isneginf(lse[0]).all() and torch.isfinite(lse[1:]).all()
    _assert_close(out, lse, ref_out, ref_lse)
    _assert_close(*_run(case, num_splits=2, causal=False))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_strided_cache_view_is_read_through_its_strides(device, fp8):
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=4,
        seq_lens=[33],
        query_len=1,
        block_size=16,
        fp8=fp8,
        seed=3,
        strided_cache=True,
    )
    assert not case["kv_cache"].is_contiguous()
    _assert_close(*_run(case, num_splits=2))


def test_preallocated_workspace_and_splits_give_the_same_result(device):
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=4,
        seq_lens=[50, 17],
        query_len=1,
        block_size=16,
        fp8=False,
        seed=4,
    )
    q = case["q"]
    ws = MlaDecodeWorkspace.allocate(q.shape[0], q.shape[1], 3, 256, device=device)
    out = torch.empty(q.shape[0], q.shape[1], 256, dtype=q.dtype, device=device)
    args = (q, case["kv_cache"], case["block_table"], case["seq_lens"], out)
    kw = dict(softmax_scale=case["softmax_scale"], kv_lora_rank=256)
    mla_decode(*args, **kw, workspace=ws, num_splits=3)
    first = out.clone()
    mla_decode(*args, **kw, num_splits=3)
    assert torch.equal(first, out)
    ref_out, _ = mla_decode_reference(
        q.cpu(), case["kv_cache"].cpu(), case["block_table"].cpu(), case["seq_lens"].cpu(), **kw
    )
    torch.testing.assert_close(first.float().cpu(), ref_out, atol=OUT_ATOL, rtol=OUT_RTOL)
    with pytest.raises(ValueError, match="workspace"):
        mla_decode(*args, **kw, workspace=ws, num_splits=4)


def test_splits_past_a_short_request_are_neither_written_nor_read(device):
    # As a CUDA graph captured for the longest context replays its split count at short
    # contexts: 40 splits over 3 and 50 keys. Scratch rows of the splits that hold no key are
    # left as NaN; the output is finite and right only if the merge never reads them.
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=4,
        seq_lens=[3, 50],
        query_len=1,
        block_size=16,
        fp8=False,
        seed=5,
    )
    q = case["q"]
    splits = 40
    ws = MlaDecodeWorkspace.allocate(q.shape[0], q.shape[1], splits, 256, device=device)
    ws.o_part.fill_(float("nan"))
    ws.l_part.fill_(float("nan"))
    result = _run(case, num_splits=splits, workspace=ws)
    rows = q.shape[0] * q.shape[1] * splits
    parts = ws.l_part[:rows].view(q.shape[0], q.shape[1], splits)
    assert torch.isnan(parts[0, :, 1:]).all(), "splits past request 0's 3 keys were written"
    outs = ws.o_part[:rows].view(q.shape[0], q.shape[1], splits, -1)
    assert torch.isnan(outs[0, :, 1:]).all(), "splits past request 0's 3 keys wrote outputs"
    assert not torch.isnan(outs[0, :, 0]).any(), "the split holding request 0's keys is unwritten"
    _assert_close(*result)


@pytest.mark.parametrize(
    "change, exc, match",
    [
        (dict(kv_lora_rank=128), ValueError, "kv_lora_rank"),
        (dict(fp8_without_scale=True), ValueError, "k_scale"),
        (dict(query_len=9), ValueError, "query_len"),
        (dict(seq_lens_int64=True), TypeError, "seq_lens"),
        (dict(kv_fp16=True), TypeError, "kv_cache"),
        (dict(fp8_odd_stride=True), ValueError, "kv_cache: expected .*even page and token"),
        # A strided view would be read as other entries; other devices are refused by name.
        (dict(seq_lens_strided=True), ValueError, "seq_lens: expected unit stride"),
        (dict(seq_lens_meta=True), ValueError, "seq_lens: expected a tensor on"),
        (dict(block_table_meta=True), ValueError, "block_table: expected a tensor on"),
        (dict(scale_meta=True), ValueError, "k_scale: expected a tensor on"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(device, change, exc, match):
    case = _make_case(
        device=device,
        kv_lora_rank=256,
        num_heads=2,
        seq_lens=[4, 5],
        query_len=1,
        block_size=16,
        fp8=False,
        seed=5,
    )
    q, kv, seq = case["q"], case["kv_cache"], case["seq_lens"]
    scale = None
    rank = change.get("kv_lora_rank", 256)
    if change.get("fp8_without_scale"):
        kv = kv.to(torch.float8_e4m3fn)
    if change.get("seq_lens_int64"):
        seq = seq.long()
    if change.get("kv_fp16"):
        kv = kv.half()
    if change.get("seq_lens_strided"):
        seq = torch.stack([seq, seq], 1)[:, 0]
    if change.get("seq_lens_meta"):
        seq = seq.to("meta")
    block_table = case["block_table"]
    if change.get("block_table_meta"):
        block_table = block_table.to("meta")
    if change.get("scale_meta"):
        scale = torch.tensor([1.0], device="meta")
    if change.get("fp8_odd_stride"):
        # Rows 289 bytes apart: the fp8 kernel's 16-bit pairs would straddle two tokens.
        wide = torch.zeros(kv.shape[0], kv.shape[1], kv.shape[2] + 1, device=device)
        kv = wide.to(torch.float8_e4m3fn)[..., : kv.shape[2]]
        scale = torch.tensor([1.0], device=device)
    out = torch.empty(q.shape[0], q.shape[1], 256, dtype=q.dtype, device=device)
    with pytest.raises(exc, match=match):
        mla_decode(
            q,
            kv,
            block_table,
            seq,
            out,
            softmax_scale=0.1,
            kv_lora_rank=rank,
            query_len=change.get("query_len", 1),
            k_scale=scale,
        )


def test_planner_fills_the_gpu_for_one_long_and_many_short_requests():
    h200 = DeviceInfo("H200", (9, 0), num_sms=132, smem_per_block=232_448)
    long_plan = plan_mla_decode(1, 16, 131072, 1, h200)
    one_long = long_plan.num_splits
    # one request spreads over all SMs
    assert one_long * long_plan.config.block_m >= 16 and one_long >= 132
    many_short = plan_mla_decode(256, 16, 4096, 1, h200).num_splits
    assert many_short == 1  # 256 programs already fill 132 SMs
    tiny = plan_mla_decode(1, 16, 100, 1, h200).num_splits
    assert tiny == 1  # splitting 100 keys would cost more in the merge than it gains
    assert plan_mla_decode(1, 16, 10**7, 1, h200).num_splits <= MAX_SPLITS
    # A workspace sized by for_plans fits every plan up to its batch size.
    ws = MlaDecodeWorkspace.for_plans(64, 16, 131072, 1, 512, "cpu", info=h200)
    for b in (1, 2, 7, 64):
        s = plan_mla_decode(b, 16, 131072, 1, h200).num_splits
        assert s == 1 or ws.capacity_rows >= b * 16 * s
    # ... and every plan of up to 64 tokens of verify blocks up to 4 tokens long, at the
    # longest context it was sized for and at shorter ones (fewer keys never split more).
    ws = MlaDecodeWorkspace.for_plans(64, 16, 131072, 4, 512, "cpu", info=h200)
    for ctx in (131072, 100_000, 32768, 5000, 700):
        for q in (1, 2, 3, 4):
            for b in range(1, 64 // q + 1):
                s = plan_mla_decode(b, 16, ctx, q, h200).num_splits
                assert s == 1 or ws.capacity_rows >= b * q * 16 * s, (ctx, q, b, s)


def test_few_request_launches_take_the_few_program_entry():
    """Few requests: the split plan fills the GPU, and the class's few-program entry (fp8 on
    Hopper) serves them; from FEW_PROGRAMS programs on, and elsewhere, the main table."""
    few = MLA_DECODE_FEW_PROGRAM_CONFIGS["sm90"]["fp8"][16]
    main = MLA_DECODE_CONFIGS["sm90"]["fp8"][16]
    assert few != main
    assert _table_config("sm90", "fp8", 16, 1) == few
    assert _table_config("sm90", "fp8", 16, FEW_PROGRAMS) == few
    assert _table_config("sm90", "fp8", 16, FEW_PROGRAMS + 1) == main
    assert _table_config("sm90", "bf16", 16, 1) == MLA_DECODE_CONFIGS["sm90"]["bf16"][16]
    assert _table_config("sm120", "fp8", 16, 1) == MLA_DECODE_CONFIGS["sm120"]["fp8"][16]
    # The planner and a launch given its split count agree on the config.
    h200 = DeviceInfo("H200", (9, 0), num_sms=132, smem_per_block=232_448)
    for batch in (1, FEW_PROGRAMS, FEW_PROGRAMS + 1, 64):
        cfg = plan_mla_decode(batch, 16, 32768, 1, h200, kv_dtype=torch.float8_e4m3fn).config
        assert cfg == _table_config("sm90", "fp8", 16, batch)


def test_config_table_covers_every_device_class_and_row_tile():
    for cls in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120", "default"):
        for tag in ("bf16", "fp8"):
            assert set(MLA_DECODE_CONFIGS[cls][tag]) == set(ROW_TILES), (cls, tag)
            few = MLA_DECODE_FEW_PROGRAM_CONFIGS.get(cls, {}).get(tag, {})
            assert set(few) <= set(ROW_TILES), (cls, tag)
            for rows, cfg in [*MLA_DECODE_CONFIGS[cls][tag].items(), *few.items()]:
                assert cfg.block_m <= max(rows, 16) and cfg.block_n >= 16
    assert CPU_DEVICE_INFO.device_class == "cpu"


def test_gluon_kernel_takes_only_what_it_is_built_for():
    """`gluon_supported`: a contiguous bf16 query over a bf16 or fp8 e4m3 cache with latent
    512 + rope 64; anything else stays on the Triton kernel of the same config."""
    bf16, fp16, fp8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
    q = torch.zeros(2, 128, 576, dtype=bf16)
    assert query_is_tma_readable(q)
    assert not query_is_tma_readable(q.transpose(0, 1))  # rows not contiguous
    assert gluon_supported(bf16, bf16, 512, True) == GLUON_AVAILABLE
    assert gluon_supported(bf16, fp8, 512, True) == GLUON_AVAILABLE
    assert not gluon_supported(fp16, fp16, 512, True)  # fp16: the Triton kernel
    assert not gluon_supported(bf16, fp16, 512, True)  # neither bf16 nor fp8
    assert not gluon_supported(fp16, fp8, 512, True)
    assert not gluon_supported(bf16, bf16, 512, False)  # rows TMA cannot read
    assert not gluon_supported(bf16, bf16, 256, True)  # half width
    sm90 = MLA_DECODE_TMA_CONFIGS["sm90"]
    assert sm90["bf16"][64].gluon and sm90["fp8"][64].gluon


def test_every_variant_is_named_and_the_device_rule_picks_each_where_it_applies():
    """The rule, on Hopper facts: a gathered 16-bit cache -> triton, a gathered fp8 cache ->
    triton_fp8, a 64-row TMA entry -> gluon where the Gluon kernel runs, else triton_tma."""
    assert VARIANTS == ("triton", "triton_fp8", "triton_tma", "gluon")
    h200 = _class_info("sm90")
    plan = functools.partial(plan_mla_decode, max_seq_len=32768, query_len=1, device_info=h200)
    fp8 = torch.float8_e4m3fn
    chosen = {
        "triton": plan(64, 16),
        "triton_fp8": plan(64, 16, kv_dtype=fp8),
        "triton_tma": plan(64, 128, tma_page_size=64, query_tma_readable=False),
        "gluon": plan(64, 128, tma_page_size=64),
    }
    for variant, p in chosen.items():
        want = "triton_tma" if variant == "gluon" and not GLUON_AVAILABLE else variant
        assert isinstance(p, MlaDecodePlan) and p.variant == want, (variant, p)
    assert set(chosen) == set(VARIANTS)
    # A forced variant runs the plan's config, or is refused naming the argument.
    tma_cfg = chosen["gluon"].config
    forced = plan(64, 128, tma_page_size=64, variant="triton_tma")
    assert forced.variant == "triton_tma" and forced.config == tma_cfg
    with pytest.raises(ValueError, match="variant: expected 'triton_fp8'"):
        plan(64, 16, variant="triton_fp8")  # a bf16 cache
    with pytest.raises(ValueError, match="variant: expected one of"):
        plan(64, 16, variant="cutlass")
    # The plan is a value: equal facts give equal plans.
    assert plan(64, 16) == plan(64, 16) and hash(plan(64, 16)) == hash(plan(64, 16))


@pytest.mark.parametrize("variant", ["triton", "triton_fp8", "triton_tma"])
def test_each_triton_variant_planned_and_launched_matches_reference(device, variant):
    """plan_mla_decode(variant=...) then launch_mla_decode: the reference's output, and
    bit for bit what `mla_decode` gives for the same plan."""
    case = _make_case(
        device=device, kv_lora_rank=256, num_heads=16, seq_lens=[70, 5], query_len=2,
        block_size=32, fp8=variant == "triton_fp8", seed=12,
    )  # fmt: skip
    q, kv = case["q"], case["kv_cache"]
    config = MlaDecodeConfig(16, 32, 4, 2, 1, 128, tma=variant == "triton_tma")
    plan = plan_for_tensors(
        q, kv, case["seq_lens"], kv_lora_rank=256, query_len=2, num_splits=3, config=config,
        variant=variant,
    )  # fmt: skip
    assert plan.variant == variant and plan.num_splits == 3
    out = torch.empty(q.shape[0], q.shape[1], 256, dtype=q.dtype, device=device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=device)
    ws = MlaDecodeWorkspace.allocate(q.shape[0], q.shape[1], 3, 256, device=device)
    launch_mla_decode(
        plan, q, kv, case["block_table"], case["seq_lens"], out,
        softmax_scale=case["softmax_scale"], k_scale=case["k_scale"], lse_out=lse, workspace=ws,
    )  # fmt: skip
    standalone = _run(case, 3, config=config, variant=variant)
    assert torch.equal(out.float().cpu(), standalone[0]) and torch.equal(lse.cpu(), standalone[1])
    _assert_close(*standalone)


def test_launches_name_every_kernel_parameter_without_running():
    """`mla_decode_launches`: each kernel of a plan with its grid and every parameter by name
    (what offline compile checks read), the merge only where the plan splits."""
    case = _make_case(
        device="cpu", kv_lora_rank=256, num_heads=4, seq_lens=[40, 9], query_len=1,
        block_size=16, fp8=True, seed=13,
    )  # fmt: skip
    q = case["q"]
    out = torch.empty(q.shape[0], q.shape[1], 256, dtype=q.dtype)
    for splits in (1, 3):
        plan = plan_for_tensors(
            q, case["kv_cache"], case["seq_lens"], kv_lora_rank=256, num_splits=splits
        )
        launches = mla_decode_launches(
            plan, q, case["kv_cache"], case["block_table"], case["seq_lens"], out,
            softmax_scale=0.1, k_scale=case["k_scale"],
        )  # fmt: skip
        assert len(launches) == (1 if splits == 1 else 2)
        assert launches[0].grid == plan.grid and launches[0].kwargs["INT_WIDEN"] == 0
        for launch in launches:
            names = list(inspect.signature(launch.kernel.fn).parameters)
            assert sorted(launch.kwargs) == sorted(names), launch.kernel


# ------------------------------------------------------------------------ GPU (real size) ----


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("kv_lora_rank", [512, 256])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize(
    "num_heads, seq_lens, query_len, block_size, num_splits",
    [
        (16, [4097, 1, 777, 0], 1, 64, None),
        (16, [20000], 1, 64, None),  # planner picks many splits
        (128, [3000, 1500], 1, 16, None),  # two 64-row tiles per request
        (128, [3000, 1500, 65], 1, 64, None),  # 64-row tiles, TMA-read on Hopper
        (16, [5000, 3, 130], 4, 64, 7),  # MTP rows, 64-row tiles, TMA-read on Hopper
        (16, [5000, 3], 4, 32, 7),  # MTP rows, causal
        (8, [2049, 100], 8, 1, 3),  # page size 1
        (32, [1000], 2, 64, 1),  # single split: fused epilogue
    ],
)
def test_real_sizes_match_reference(
    kv_lora_rank, fp8, num_heads, seq_lens, query_len, block_size, num_splits
):
    case = _make_case(
        device="cuda",
        kv_lora_rank=kv_lora_rank,
        num_heads=num_heads,
        seq_lens=seq_lens,
        query_len=query_len,
        block_size=block_size,
        fp8=fp8,
        seed=len(seq_lens) + num_heads,
    )
    _assert_close(*_run(case, num_splits))


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("int_widen", [INT_WIDEN_VALUES, INT_WIDEN_BOTH])
@pytest.mark.parametrize("tile", [16, 32])
@pytest.mark.parametrize("seq_lens", [[4097, 1, 777, 0], [20000]], ids=["ragged", "long"])
def test_fp8_values_widened_in_integer_ops_at_real_sizes(tile, seq_lens, int_widen):
    """The device's fp8 pair-kernel entries with each `int_widen` level, at real sizes."""
    import dataclasses

    cfg = MLA_DECODE_CONFIGS[device_info("cuda").device_class]["fp8"][tile]
    case = _make_case(
        device="cuda", kv_lora_rank=512, num_heads=tile, seq_lens=seq_lens, query_len=1,
        block_size=64, fp8=True, seed=tile,
    )  # fmt: skip
    _assert_close(*_run(case, None, config=dataclasses.replace(cfg, int_widen=int_widen)))


@gpu_only
@pytest.mark.gpu
def test_hopper_reads_64_row_tiles_of_a_paged_bf16_cache_through_tma():
    """On sm90 a 128-head bf16 decode over 64-token pages takes the TMA entry (bulk tensor
    copies in its PTX) and stays right with stale values past the keys; 16-token pages
    gather."""
    if device_info("cuda").device_class != "sm90":
        pytest.skip("the TMA entry is Hopper's; this GPU gathers every tile")
    for block_size, takes_tma in ((64, True), (16, False)):
        case = _make_case(
            device="cuda", kv_lora_rank=512, num_heads=128, seq_lens=[2000, 77, 1],
            query_len=1, block_size=block_size, fp8=False, seed=8,
        )  # fmt: skip
        _fill_page_tails(case, 1e4)
        compiled: list = []
        _assert_close(*_run(case, 2, compiled=compiled))
        assert ("cp.async.bulk.tensor" in compiled[0].asm["ptx"]) == takes_tma, block_size


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("kv_lora_rank", [512, 256])
def test_fp8_cache_through_tma_tiles_matches_reference(kv_lora_rank):
    """An fp8 cache read by a forced TMA config (the 16-bit kernel, tiles widened to bf16) at
    real size, page tails stale; no table entry takes this path yet."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs sm90+")
    case = _make_case(
        device="cuda", kv_lora_rank=kv_lora_rank, num_heads=128, seq_lens=[3000, 65, 1],
        query_len=1, block_size=64, fp8=True, seed=9,
    )  # fmt: skip
    _fill_page_tails(case, 448.0)
    cfg = MlaDecodeConfig(64, 64, 8, 2, 1, 128, tma=True)
    compiled: list = []
    _assert_close(*_run(case, 3, config=cfg, compiled=compiled))
    assert "cp.async.bulk.tensor" in compiled[0].asm["ptx"]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize(
    "fp8, num_heads", [(True, 16), (False, 128)], ids=["fp8-16-heads", "bf16-128-heads-tma"]
)
def test_cuda_graph_replay_with_workspace_matches_eager(fp8, num_heads):
    case = _make_case(
        device="cuda",
        kv_lora_rank=512,
        num_heads=num_heads,
        seq_lens=[3000, 200],
        query_len=1,
        block_size=64,
        fp8=fp8,
        seed=7,
    )
    q = case["q"]
    ws = MlaDecodeWorkspace.allocate(q.shape[0], num_heads, 8, 512, device="cuda")
    out = torch.empty(q.shape[0], num_heads, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(q.shape[0], num_heads, dtype=torch.float32, device="cuda")

    def step():
        mla_decode(
            q,
            case["kv_cache"],
            case["block_table"],
            case["seq_lens"],
            out,
            softmax_scale=case["softmax_scale"],
            kv_lora_rank=512,
            k_scale=case["k_scale"],
            lse_out=lse,
            workspace=ws,
            num_splits=8,
        )

    step()  # compile outside capture
    eager = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    # Replayed at shorter lengths, as vLLM replays a graph captured for longer contexts: the
    # splits past a request's keys are neither written nor read, so NaN left in their scratch
    # never reaches the output.
    case["seq_lens"].copy_(torch.tensor([700, 5], dtype=torch.int32))
    ws.o_part.fill_(float("nan"))
    ws.l_part.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed, replayed_lse = out.clone(), lse.clone()
    step()
    assert torch.equal(replayed, out) and torch.equal(replayed_lse, lse)
    ref_out, ref_lse = mla_decode_reference(
        q.cpu(), case["kv_cache"].cpu(), case["block_table"].cpu(), case["seq_lens"].cpu(),
        softmax_scale=case["softmax_scale"], kv_lora_rank=512, query_len=1,
        k_scale=case["k_scale"].cpu() if fp8 else None,
    )  # fmt: skip
    _assert_close(replayed.float().cpu(), replayed_lse.cpu(), ref_out, ref_lse)


GLUON_CONFIG = MlaDecodeConfig(64, 64, 8, 2, 1, 128, tma=True, gluon=True)


@gpu_only
@pytest.mark.gpu
@settings(max_examples=12, deadline=None)
@given(
    heads_and_query_len=st.sampled_from([(128, 1), (64, 2), (16, 4), (20, 3), (128, 8)]),
    seq_lens=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
    pages_per_tile=st.sampled_from([1, 2]),
    num_splits=st.sampled_from([None, 1, 3, 7]),
    causal=st.booleans(),
    fp8=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(
    heads_and_query_len=(20, 3), seq_lens=[2, 0, 1500], pages_per_tile=2, num_splits=7,
    causal=True, fp8=False, seed=1,
)  # fmt: skip
@example(
    heads_and_query_len=(128, 1), seq_lens=[1], pages_per_tile=1, num_splits=1, causal=False,
    fp8=False, seed=2,
)  # fmt: skip
@example(
    heads_and_query_len=(16, 4), seq_lens=[2900, 65, 0], pages_per_tile=1, num_splits=3,
    causal=True, fp8=True, seed=3,
)  # fmt: skip
def test_gluon_kernel_matches_reference_with_stale_page_tails(
    heads_and_query_len, seq_lens, pages_per_tile, num_splits, causal, fp8, seed
):
    """The Gluon split kernel on Hopper: 64-row tiles of heads x query tokens (row tiles that
    cross into the next request's rows or past the tensor included), causal or not, one to
    seven splits, bf16 or fp8 caches, pages of one or two tiles whose stale tails hold large
    values."""
    if device_info("cuda").device_class != "sm90":
        pytest.skip("the Gluon kernel is Hopper's")
    num_heads, query_len = heads_and_query_len
    case = _make_case(
        device="cuda", kv_lora_rank=512, num_heads=num_heads, seq_lens=seq_lens,
        query_len=query_len, block_size=64 * pages_per_tile, fp8=fp8, seed=seed,
    )  # fmt: skip
    _fill_page_tails(case, 448.0 if fp8 else 1e4)  # e4m3's largest finite value
    compiled: list = []
    _assert_close(*_run(case, num_splits, causal, config=GLUON_CONFIG, compiled=compiled))
    assert compiled[0].name == "_mla_decode_gluon_kernel"


@gpu_only
@pytest.mark.gpu
def test_gluon_widening_gives_every_e4m3_byte_its_bf16_value():
    """The Gluon kernel's integer e4m3 -> bf16 widening, on all 256 bytes: bit for bit what
    torch's conversion gives (signed zeros and subnormals included); the two NaN bytes come
    out as +-480, as documented."""
    if device_info("cuda").device_class != "sm90" or not GLUON_AVAILABLE:
        pytest.skip("the Gluon kernel is Hopper's")
    src = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    out = torch.empty(256, dtype=torch.bfloat16, device="cuda")
    _widen_bytes_kernel[(1,)](src, out, 256, num_warps=1)
    expected = src.to(torch.bfloat16)
    nan = expected.isnan()
    assert nan.sum().item() == 2
    assert torch.equal(out[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    assert out[nan].float().abs().tolist() == [480.0, 480.0]


@gpu_only
@pytest.mark.gpu
def test_hopper_128_head_bf16_decode_runs_the_gluon_kernel_and_agrees_with_triton():
    """The table's Hopper bf16 64-row entry launches the Gluon kernel; a query whose rows are
    not contiguous takes the Triton kernel of the same entry, within bf16 rounding of it."""
    if device_info("cuda").device_class != "sm90":
        pytest.skip("the Gluon kernel is Hopper's")
    case = _make_case(
        device="cuda", kv_lora_rank=512, num_heads=128, seq_lens=[4000, 130, 1],
        query_len=1, block_size=64, fp8=False, seed=11,
    )  # fmt: skip
    for splits in (1, 5):
        compiled: list = []
        out, lse, ref_out, ref_lse = _run(case, splits, compiled=compiled)
        _assert_close(out, lse, ref_out, ref_lse)
        assert compiled[0].name == "_mla_decode_gluon_kernel"
        strided = dict(case, q=case["q"].transpose(0, 1).contiguous().transpose(0, 1))
        compiled = []
        t_out, t_lse, *_ = _run(strided, splits, compiled=compiled)
        assert compiled[0].name == "_mla_decode_split_kernel"
        torch.testing.assert_close(t_out, out, atol=2e-2, rtol=0)
        torch.testing.assert_close(t_lse, lse, atol=LSE_ATOL, rtol=0)
