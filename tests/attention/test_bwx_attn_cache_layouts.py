"""BWX_ATTN over each physical KV cache layout vLLM 0.32 may resolve, as a Hopper engine sees it.

vLLM views every layer's cache as logical [blocks, kv heads, slots, K + V] over one of its
`KVCacheLayout`s (LBNHC by default when backends state no preference, as ours do). A prefill
launch on Hopper must take the same kernel variant (TMA tiles over 128-token pages) over each
of them as the JIT warm-up compiles on its contiguous scratch cache, or the engine compiles it
again while serving. Here the launches are recorded as an sm90 device would make them (no
GPU: `benchmarks/attn_offline_check.py`'s recorder) and their Triton signatures compared, in a
subprocess without TRITON_INTERPRET (whose kernels carry no signature).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from benchmarks.offline_compile import signature_of  # noqa: E402
from vllm_blackwell_ext.attention import jit_warmup  # noqa: E402
from vllm_blackwell_ext.kernels import paged_attention as pa  # noqa: E402
from vllm_blackwell_ext.kernels.device import DeviceInfo  # noqa: E402
from vllm_blackwell_ext.kernels.launch_cache import triton_version  # noqa: E402
from vllm_blackwell_ext.kernels.paged_attention import (  # noqa: E402
    PREFILL_TMA_MIN_TRITON,
    tuning_for,
)

H100 = DeviceInfo("NVIDIA H100", (9, 0), num_sms=132, smem_per_block=232_448)
HQ, HKV, HEAD, PAGE, LAYERS, BLOCKS = 32, 8, 128, tuning_for("sm90").prefill_wide_tile_n, 3, 6
LAYER = jit_warmup.AttentionLayerKind(
    q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, num_q_heads=HQ, num_kv_heads=HKV,
    head_size=HEAD, block_size=PAGE, causal=True, sliding_window=None, has_sinks=False,
    softcap=0.0,
)  # fmt: skip


def layer_view(layout: KVCacheLayout) -> torch.Tensor:
    """The middle layer's logical [blocks, kv heads, slots, K + V] view of a cache laid out
    physically in `layout` (its `stride_order` maps logical [L, B, H, N, C] axes to memory)."""
    logical = (LAYERS, BLOCKS, HKV, PAGE, 2 * HEAD)
    order = layout.stride_order
    physical = torch.zeros([logical[i] for i in order], dtype=torch.bfloat16)
    return physical.permute([order.index(i) for i in range(5)])[1]


def launched(launches: list) -> tuple:
    """Signature, constexprs, aligned arguments and options of the paged kernel's launch."""
    attn, *_ = launches
    signature, constexprs, aligned = signature_of(attn.launcher.kernel, attn.args)
    return signature, constexprs, sorted(aligned), (attn.num_warps, attn.num_stages)


def engine_prefill(kv: torch.Tensor) -> list:
    """A 300-token chunk after 500 cached tokens over one layer's view, planned as the
    metadata builder plans it and launched as `forward` launches it (not run)."""
    layout = pa.paged_cache_layout(*kv.transpose(1, 2).split(HEAD, dim=-1))
    qkv = torch.zeros(300, HQ + 2 * HKV, HEAD, dtype=torch.bfloat16)
    q = qkv[:, :HQ]
    out = torch.empty(300, HQ, HEAD, dtype=torch.bfloat16)
    shape = LAYER.shape(H100)  # the builder's shape of vLLM's layout
    pa.check_plan_fits(shape, q, layout)  # what forward checks once per cache
    plan = pa.plan_paged_attention(shape, num_tokens=300, max_seqlen_q=300, max_seqlen_k=800)
    i32 = {"dtype": torch.int32}
    return pa.planned_launches(
        plan, q, layout, out, torch.tensor([0, 300], **i32), torch.tensor([800], **i32),
        torch.arange(BLOCKS, **i32).view(1, BLOCKS), pa.LayerOptions(HEAD**-0.5),
    )  # fmt: skip


def compare(layout_name: str) -> None:
    """Assert that a prefill over `layout_name` launches the variant the warm-up compiles."""
    kv = layer_view(KVCacheLayout[layout_name])
    key_cache, value_cache = kv.transpose(1, 2).split(HEAD, dim=-1)
    assert pa.tma_page_size(key_cache, value_cache) == PAGE
    key = jit_warmup.PagedAttentionKey(LAYER, pa.SPLIT_KV_MAX_QUERY_LEN + 1)
    warm = launched(jit_warmup.paged_attention_warmup_launches(key, torch.device("cpu"), H100))
    served = launched(engine_prefill(kv))
    assert served == warm, (served, warm)
    assert warm[1]["TMA_TILES"] and warm[0]["k_desc"].startswith("tensordesc")
    print(f"{layout_name}: the warm-up's variant")


@pytest.mark.skipif(
    triton_version() < PREFILL_TMA_MIN_TRITON, reason="this Triton takes no TMA prefill tiles"
)
@pytest.mark.parametrize("layout", [layout.name for layout in KVCacheLayout])
def test_each_vllm_layout_takes_the_tma_variant_the_warmup_compiled(layout):
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), str(repo), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, __file__, layout], cwd=repo, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{layout}: the warm-up's variant" in run.stdout


if __name__ == "__main__":
    compare(sys.argv[1])
