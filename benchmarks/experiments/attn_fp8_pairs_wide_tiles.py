"""fp8 value pairs on the paged kernel's wider (64-128-row) tiles: do they compute right?

Each configuration runs in its own process (a miscompiled kernel may fault and poison the
CUDA context), checked against the pure-torch reference the kernel tests use, with value
pairs on and off, for the configs `select_config` picks on sm120 and on this GPU. On the
H200 (Triton 3.6) 128-row tiles with head 64 (32 pair columns) gave wrong outputs with pairs
and right ones without: one reason pairs are kept to 16-row tiles.

    python benchmarks/experiments/attn_fp8_pairs_wide_tiles.py
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# (query length, q heads, KV heads, head size), each on sm120's config and on this GPU's
CASES = ((1, 8, 2, 64), (16, 16, 2, 64), (200, 8, 2, 64), (1, 16, 1, 64), (16, 16, 2, 128),
         (16, 16, 2, 256), (200, 8, 2, 128))  # fmt: skip


def check_one(q_len: int, nq: int, nkv: int, head: int, pairs: bool, sm120: bool) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "src"), str(REPO / "tests" / "kernels")]
    import torch
    from test_paged_attention import SM120, assert_close, make_case, scales

    from vllm_blackwell_ext.kernels.paged_attention import launch_config

    kv = torch.float8_e4m3fn
    case = make_case(
        [q_len], [q_len + 600], num_q_heads=nq, num_kv_heads=nkv, head_size=head,
        block_size=16, dtype=torch.bfloat16, kv_dtype=kv,
    )  # fmt: skip
    cfg = launch_config(
        case["q"], case["key_cache"], case["value_cache"], q_len, SM120 if sm120 else None
    )
    cfg = replace(cfg, fp8_value_pairs=pairs)
    tag = f"q={q_len} heads={nq}/{nkv} head={head} {'sm120' if sm120 else 'native'} {cfg}"
    try:
        assert_close(
            case, torch.bfloat16, softmax_scale=0.125, config=cfg, num_splits=1, **scales(kv)
        )
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # a fault surfaces here
        print(f"OK   {tag}", flush=True)
    except Exception as e:  # a wrong result or a fault: reported, the next case goes on
        print(f"FAIL {tag}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)


def main() -> None:
    if len(sys.argv) == 7:
        q_len, nq, nkv, head, pairs, sm120 = (int(a) for a in sys.argv[1:])
        check_one(q_len, nq, nkv, head, bool(pairs), bool(sm120))
        return
    for case in CASES:
        for sm120 in (1, 0):
            for pairs in (1, 0):
                args = [str(v) for v in (*case, pairs, sm120)]
                subprocess.run([sys.executable, __file__, *args], check=False, timeout=300)


if __name__ == "__main__":
    main()
