"""Host time of one eager `mla_decode` call: checked, with the layout derived per call, against
what BWX_MLA's decode launches after its first call (checks off, the cache's `MlaCacheLayout`
made once). Eager decodes are what vLLM runs for the decode rows of mixed prefill/decode
batches, on every MLA layer (61 in DeepSeek-V3).

Per case it prints the host wall time per call without synchronising (`bench_paged_attention`'s
`host_us`: best of bursts), and that both launches write the same bits.

    python benchmarks/experiments/mla_host_time.py
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks.bench_paged_attention import host_us
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.mla_decode import (
    MlaDecodeWorkspace,
    mla_cache_layout,
    mla_decode,
    mla_decode_config,
    plan_mla_decode,
)

R, W, PAGE = 512, 576, 64
# (name, heads, query tokens per request, fp8 cache); 64 requests of 4k keys each
CASES = (
    ("h16 bf16 B=64 ctx=4k", 16, 1, False),
    ("h16 fp8 B=64 ctx=4k", 16, 1, True),
    ("h16 bf16 q_len=4 B=64 ctx=4k (TMA tiles)", 16, 4, False),
    ("h128 bf16 B=64 ctx=4k (TMA tiles)", 128, 1, False),
)
BATCH, CTX = 64, 4096


def main() -> None:
    dev = torch.device("cuda")
    info = device_info(dev)
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")
    pages = BATCH * CTX // PAGE
    cache16 = torch.randn(pages, PAGE, W, dtype=torch.bfloat16, device=dev)
    cache8 = (cache16 * 8).to(torch.float8_e4m3fn)
    block_table = torch.randperm(pages, device=dev).view(BATCH, -1).to(torch.int32)
    seq_lens = torch.full((BATCH,), CTX, dtype=torch.int32, device=dev)
    k_scale = torch.tensor([0.125], dtype=torch.float32, device=dev)
    for name, heads, q_len, fp8 in CASES:
        cache = cache8 if fp8 else cache16
        q = torch.randn(BATCH * q_len, heads, W, dtype=torch.bfloat16, device=dev)
        splits, _ = plan_mla_decode(
            BATCH, heads, CTX, q_len, info, kv_dtype=cache.dtype, tma_page_size=PAGE
        )
        ws = MlaDecodeWorkspace.allocate(q.shape[0], heads, splits, R, dev)
        outs = [torch.empty(q.shape[0], heads, R, dtype=q.dtype, device=dev) for _ in range(2)]
        common = dict(
            softmax_scale=W**-0.5, kv_lora_rank=R, query_len=q_len,
            k_scale=k_scale if fp8 else None, workspace=ws, num_splits=splits,
        )  # fmt: skip
        checked = partial(mla_decode, q, cache, block_table, seq_lens, outs[0], **common)
        once = partial(
            mla_decode, q, cache, block_table, seq_lens, outs[1], **common,
            check_inputs=False, cache_layout=mla_cache_layout(cache),
        )  # fmt: skip
        checked_us, once_us = host_us(checked), host_us(once)
        same = torch.equal(outs[0], outs[1])
        cfg = mla_decode_config(cache, heads * q_len, BATCH, info)
        print(
            f"{name}: checked, layout per call {checked_us:6.1f} us/call; unchecked, layout "
            f"once {once_us:6.1f} us/call ({once_us - checked_us:+.1f}); same bits {same}; "
            f"splits={splits} tma={cfg.tma}",
            flush=True,
        )


if __name__ == "__main__":
    main()
