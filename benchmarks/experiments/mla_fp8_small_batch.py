"""Experiment: launch configs of the fp8 MLA split kernel for small batches (16 heads).

The table's 16-row fp8 entry (32 keys, 4 warps, 5 stages, planned for two programs per SM)
was picked on large batches; single requests plan twice the splits with it and pay in the
merge. This times that entry against fewer splits (more keys per split, or one program per
SM in the plan) and the 64-key 8-warp tile, as CUDA-graph replays, as `bench_mla_decode.py`.

    python benchmarks/experiments/mla_fp8_small_batch.py
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks.bench_mla_decode import (  # noqa: E402
    Caches,
    Case,
    graph_us,
    kv_bytes,
    make_inputs,
    ours_fn,
)
from benchmarks.harness import copy_roofline_gbps  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig as C  # noqa: E402

CONFIGS = [
    C(16, 32, 4, 5, 2, 128),
    C(16, 32, 4, 5, 2, 256),
    C(16, 32, 4, 5, 2, 512),
    C(16, 32, 4, 5, 1, 128),
    C(16, 64, 8, 5, 1, 128),
    C(16, 64, 8, 5, 1, 256),
]
CASES = [(1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (64, 4096)]


def main() -> None:
    copy = copy_roofline_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    caches = Caches("cuda")
    for batch, ctx in CASES:
        case = Case(f"h16 fp8 B={batch} ctx={ctx // 1024}k", 16, batch, ctx, True)
        x = make_inputs(case, caches)
        for cfg in CONFIGS:
            fn = ours_fn(case, x, config=cfg)
            us = graph_us(fn)
            gbps = kv_bytes(case) / us / 1e3
            print(
                f"{case.name}: n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                f"cps{cfg.ctas_per_sm} min_keys={cfg.min_split_keys} splits={fn.splits:3d} "
                f"{us:7.1f} us {gbps:6.0f} GB/s {gbps / copy:.3f} of copy",
                flush=True,
            )
        del x


if __name__ == "__main__":
    main()
