"""`widen_fp8_pairs` against torch's own fp8 -> fp16 conversion, for every 16-bit pattern.

Every pair of bytes is widened both ways (even = low byte, odd = high byte) in each mode the
device offers: the shifts under the interpreter, and also the inline-asm convert on a GPU
(sm89+); the scaled e4m3 modes (integer ops, values times 2^-8) both ways as well. fp8 ->
fp16 is exact, so values must match bit for bit (signed zeros, subnormals, infinities); NaNs
must stay NaN (their payload is the converter's choice).
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from vllm_blackwell_ext.kernels.device import MIN_FP8_CAPABILITY
from vllm_blackwell_ext.kernels.fp8_pairs import (
    PAIRS_E4M3,
    PAIRS_E4M3_ASM,
    PAIRS_E4M3_SCALED,
    PAIRS_E4M3_SCALED_ASM,
    PAIRS_E5M2,
    PAIRS_SCALED_FACTOR,
    widen_fp8_pairs,
)

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
BLOCK = 1024


@triton.jit
def _widen_all(src, even_out, odd_out, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    pairs = tl.load(src + offs, mask=ok, other=0)
    tl.store(even_out + offs, widen_fp8_pairs(pairs, 0, MODE), mask=ok)
    tl.store(odd_out + offs, widen_fp8_pairs(pairs, 1, MODE), mask=ok)


def _modes() -> list:
    cases = [
        pytest.param(PAIRS_E4M3.value, torch.float8_e4m3fn, id="e4m3-shifts"),
        pytest.param(PAIRS_E5M2.value, torch.float8_e5m2, id="e5m2"),
    ]
    cases.append(pytest.param(PAIRS_E4M3_SCALED.value, torch.float8_e4m3fn, id="e4m3-scaled"))
    asm_ok = ON_GPU and torch.cuda.get_device_capability() >= MIN_FP8_CAPABILITY
    for mode, name in ((PAIRS_E4M3_ASM, "e4m3-asm"), (PAIRS_E4M3_SCALED_ASM, "e4m3-scaled-asm")):
        cases.append(
            pytest.param(
                mode.value,
                torch.float8_e4m3fn,
                id=name,
                marks=pytest.mark.skipif(
                    not asm_ok, reason="inline PTX needs a CUDA GPU of sm89 or newer"
                ),
            )
        )
    return cases


@pytest.mark.parametrize("mode,fp8_dtype", _modes())
def test_every_pair_widens_like_torch(mode: int, fp8_dtype: torch.dtype) -> None:
    codes = torch.arange(1 << 16, dtype=torch.int32)
    raw = torch.stack([codes & 0xFF, codes >> 8], dim=1).to(torch.uint8).to(DEVICE)  # lo, hi
    pairs = raw.view(torch.uint16).view(-1)
    n = pairs.numel()
    even = torch.empty(n, dtype=torch.float16, device=DEVICE)
    odd = torch.empty(n, dtype=torch.float16, device=DEVICE)
    _widen_all[(triton.cdiv(n, BLOCK),)](pairs, even, odd, n, MODE=mode, BLOCK=BLOCK)
    expected = raw.view(fp8_dtype).to(torch.float16)
    scaled = mode in (PAIRS_E4M3_SCALED.value, PAIRS_E4M3_SCALED_ASM.value)
    if scaled:  # the value times 2^-8: a power of two, so still bit for bit
        expected = (expected.float() / PAIRS_SCALED_FACTOR.value).to(torch.float16)
    # Triton's interpreter decodes e4m3fn's two NaN codes (0x7F, 0xFF) as +-480 (compiled
    # code keeps them NaN), as the scaled modes do everywhere: there only the other codes are
    # compared.
    nan_kept = (ON_GPU and not scaled) or fp8_dtype != torch.float8_e4m3fn
    for got, want in ((even, expected[:, 0]), (odd, expected[:, 1])):
        nan = torch.isnan(want)
        if nan_kept:
            assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
