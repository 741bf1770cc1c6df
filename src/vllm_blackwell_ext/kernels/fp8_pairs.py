"""fp8 cache tiles read as 16-bit pairs of neighbouring columns, widened to fp16 in registers.

Triton reads an 8-bit tensor-core operand whose reduction axis is not its contiguous one (the
value tile of P @ V: keys x columns) from shared memory one byte at a time; read as 16-bit
elements, the same bytes load with ldmatrix in either operand order. A pair holds column 2i in
its low byte and 2i + 1 in its high byte, so a product over the columns splits into an even
and an odd half-width product (two accumulators for P @ V, interleaved once at the end).
The cache's row strides and address must be even (the callers' validation says so).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# How `widen_fp8_pairs` widens (a constexpr): e4m3 on the GPU takes one byte permute and one
# e4m3x2 -> f16x2 convert per two values (sm89+, the floor of fp8 caches); the interpreter has
# no inline asm and takes shifts and a bitcast; an e5m2 byte is the high byte of its fp16.
# (What Triton emits for the e4m3 shifts takes about twice the instructions, and the decode
# loops that widen are bound by instruction issue.)
PAIRS_E4M3_ASM = tl.constexpr(1)
PAIRS_E4M3 = tl.constexpr(2)
PAIRS_E5M2 = tl.constexpr(3)
# e4m3 widened in integer ops, off the conversion pipe that the convert above runs on: the sign
# and the 7 magnitude bits placed in an fp16 give the value times 2^-8, exact for normal and
# subnormal e4m3 values alike (NaN codes come out as +-480 * 2^-8). The caller multiplies by
# PAIRS_SCALED_FACTOR where it is cheap (an accumulator's final scale). On a GPU: one byte
# permute and three logic / shift ops per two values (inline asm); the interpreter: shifts.
PAIRS_E4M3_SCALED_ASM = tl.constexpr(4)
PAIRS_E4M3_SCALED = tl.constexpr(5)
PAIRS_SCALED_FACTOR = tl.constexpr(256.0)


def pair_mode(kv_dtype: torch.dtype, on_gpu: bool) -> int:
    """The `widen_fp8_pairs` mode of an fp8 cache dtype."""
    if kv_dtype == torch.float8_e5m2:
        return PAIRS_E5M2.value
    return PAIRS_E4M3_ASM.value if on_gpu else PAIRS_E4M3.value


@triton.jit
def widen_fp8_pairs(pairs, SELECT: tl.constexpr, MODE: tl.constexpr):
    """The low (SELECT 0, even columns) or high (1, odd columns) fp8 byte of each uint16 pair,
    as fp16 (exact: e4m3 and e5m2 values are all fp16 values; the SCALED modes give the value
    times 1 / PAIRS_SCALED_FACTOR, exact too)."""
    if MODE == PAIRS_E4M3_ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; .reg .b16 lo, hi;\n"
            f"prmt.b32 t, $1, 0, {0x20 + 0x11 * SELECT};\n"
            "mov.b32 {lo, hi}, t;\n"
            "cvt.rn.f16x2.e4m3x2 $0, lo; }",
            "=r,r",
            [pairs],
            dtype=tl.float16,
            is_pure=True,
            pack=2,
        )
    elif MODE == PAIRS_E4M3:
        byte = (pairs >> (8 * SELECT)).to(tl.uint8)
        return byte.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    elif MODE == PAIRS_E4M3_SCALED_ASM:
        # The selected bytes to the high byte of each 16-bit lane, then the magnitude bits
        # one place right into the fp16's exponent and mantissa; the sign stays at bit 15.
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, m;\n"
            f"prmt.b32 t, $1, 0, {0x2404 + 0x1010 * SELECT};\n"
            "shr.b32 m, t, 1;\n"
            "and.b32 m, m, 0x3F803F80;\n"
            "and.b32 t, t, 0x80008000;\n"
            "or.b32 $0, t, m; }",
            "=r,r",
            [pairs],
            dtype=tl.float16,
            is_pure=True,
            pack=2,
        )
    elif MODE == PAIRS_E4M3_SCALED:
        byte = (pairs >> (8 * SELECT)) & 0xFF
        bits = ((byte & 0x80) << 8) | ((byte & 0x7F) << 7)
        return bits.to(tl.uint16).to(tl.float16, bitcast=True)
    else:
        if SELECT == 0:
            high = (pairs << 8).to(tl.uint16)
        else:
            high = (pairs & 0xFF00).to(tl.uint16)
        return high.to(tl.float16, bitcast=True)
