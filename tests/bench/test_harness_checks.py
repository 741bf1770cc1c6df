"""The harness's output check and read-only stream: what flags a peer and what it reads."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks import harness


def test_output_gap_is_relative_to_ours_and_flags_a_different_computation():
    g = torch.Generator().manual_seed(0)
    ours = torch.randn(6, 4, 8, generator=g) * 0.05  # outputs averaged over many keys
    rounded = ours.to(torch.bfloat16).float()
    assert harness.output_gap(ours, rounded) < 1e-2  # bf16 rounding: far under the flag
    # Same values in another layout ([batch, len, heads, head]) compare element by element.
    assert harness.output_gap(ours, ours.view(2, 3, 4, 8)) == 0.0
    off = ours + 0.2 * ours.abs().max()
    note = harness.gap_note("case", {"good": harness.output_gap(ours, rounded),
                                     "bad": harness.output_gap(ours, off)})  # fmt: skip
    assert "bad" in note and note.count("MISMATCH") == 1
    assert "MISMATCH" in harness.gap_note("case", {"nan": float("nan")})


def test_output_gap_scales_each_row_by_its_own_size():
    # A causal prefill's first row is one value vector; later rows average many: their bf16
    # rounding is small next to their own row, not next to the RMS of the whole output.
    g = torch.Generator().manual_seed(1)
    ours = torch.randn(2048, 2, 128, generator=g) * 0.05
    ours[0] = torch.randn(2, 128, generator=g) * 3.0
    rounded = ours.to(torch.bfloat16).float()
    assert (rounded - ours).abs().max() / ours.pow(2).mean().sqrt() > harness.OUTPUT_GAP_FLAG
    # bf16 keeps 2**-9 of each value: about 0.012 of a row's RMS at its largest of 128 entries
    assert harness.output_gap(ours, rounded) < 2e-2
    # The same relative error confined to the small rows is still caught.
    off = ours.clone()
    off[1:] *= 1.3
    assert harness.output_gap(ours, off) > harness.OUTPUT_GAP_FLAG


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="the read kernel needs a GPU or Triton's interpreter",
)
def test_the_read_stream_sums_every_element_once():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = harness._READ_BLOCK * harness._READ_ITERS * 2 + 123  # a ragged last program
    x = torch.randint(0, 100, (n,), dtype=torch.int32, device=device)
    per_program = harness._READ_BLOCK * harness._READ_ITERS
    sums = torch.empty(-(-n // per_program), dtype=torch.int32, device=device)
    harness._read_kernel[(sums.numel(),)](x, sums, n, harness._READ_BLOCK, harness._READ_ITERS)
    assert int(sums.sum()) == int(x.sum())


def test_every_profiled_case_is_a_benchmark_case():
    # profile_ncu.py looks its cases up by name in the benchmarks: a renamed row would only fail
    # on the GPU machine, in the middle of a lease.
    from benchmarks import bench_mla_decode, bench_paged_attention, profile_ncu

    mla = {c.name for c in bench_mla_decode.cases()}
    paged = {c.name for c in bench_paged_attention.cases()}
    assert set(profile_ncu.MLA_CASES) <= mla, set(profile_ncu.MLA_CASES) - mla
    assert set(profile_ncu.PAGED_CASES) <= paged, set(profile_ncu.PAGED_CASES) - paged
