"""What one key tile of BWX_MLA's wide-head Hopper decode issues, read from its sm90 SASS.

The 128-head decode (DeepSeek-V3 / Kimi at TP1) is compute-bound, and ran at a third of the
matmul rate (`h100-mla-decode.md` at be77380); its Nsight Compute profile showed the tensor
pipe 43 % busy with barrier and long-scoreboard stalls ahead (`h100-ncu-mla-tma.txt`). This
compiles the shipped Hopper TMA entries (`MLA_DECODE_TMA_CONFIGS["sm90"]`, 64 rows x 64 keys
on 8 warps) offline with Triton's bundled ptxas, and prints the key loop's order of wgmma issue
(HGMMA.MxNxK), wgmma waits (WARPGROUP.DEPBAR), CTA barriers (BAR.SYNC), TMA copies (UTMALDG)
and their waits (SYNCS.PHASECHK) and the softmax's exponentials (MUFU.EX2); the TTGIR's wgmma
layouts (how the warps split each dot's result); then the tensor-core work one program issues
per tile against the work the tile needs (QK^T over R + P columns, P @ V over R), both counted
from the HGMMA shapes: each instruction is issued by one warp group.

    python benchmarks/experiments/mla_loop_schedule.py [--capability 90]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import triton

from benchmarks.offline_compile import loop_schedule, sass_of, stats_of
from benchmarks.tune_mla_decode import compile_split_kernel
from vllm_blackwell_ext.kernels.mla_decode_configs import MLA_DECODE_TMA_CONFIGS

R, P = 512, 64  # DeepSeek-V3's latent and rope widths


def hgmma_flops(runs: list[tuple[str, int]]) -> int:
    """Multiply-add work (2 * M * N * K per instruction) of the HGMMA runs."""
    total = 0
    for op, count in runs:
        shape = re.fullmatch(r"HGMMA\.(\d+)x(\d+)x(\d+)", op)
        if shape:
            m, n, k = map(int, shape.groups())
            total += 2 * m * n * k * count
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capability", type=int, default=90)
    args = ap.parse_args()
    cap = divmod(args.capability, 10)
    print(f"# triton {triton.__version__}, offline compile for sm{args.capability}")
    for kv_tag, entries in MLA_DECODE_TMA_CONFIGS["sm90"].items():
        for cfg in entries.values():
            compiled = compile_split_kernel(cfg, cap, fp8=kv_tag == "fp8", kv_lora_rank=R)
            runs = loop_schedule(sass_of(compiled))
            print(f"== {kv_tag} {cfg}: {stats_of(compiled)}")
            print("   " + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in runs))
            # The wgmma layouts of the TTGIR: warps over (rows, columns) of each dot's result.
            layouts = re.findall(r"nvidia_mma<\{[^}]*warpsPerCTA = (\[[\d, ]+\]), "
                                 r"instrShape = (\[[\d, ]+\])", compiled.asm["ttgir"])  # fmt: skip
            print("   wgmma layouts: " + ", ".join(f"warps {w} instr {i}" for w, i in layouts))
            # One warp group issues each HGMMA; a program has num_warps // 4 of them.
            issued = hgmma_flops(runs) * (cfg.num_warps // 4)
            needed = 2 * cfg.block_m * cfg.block_n * ((R + P) + R)
            counts = {
                name: sum(n for op, n in runs if op.startswith(name))
                for name in ("WARPGROUP.DEPBAR", "BAR.SYNC", "UTMALDG", "SYNCS.PHASECHK")
            }
            print(
                f"   per tile: tensor-core work issued {issued / 1e6:.2f} MFLOP for "
                f"{needed / 1e6:.2f} needed ({issued / needed:.2f}x); "
                + ", ".join(f"{name} {n}" for name, n in counts.items())
            )


if __name__ == "__main__":
    main()
