"""MLA decode attention over a paged latent KV cache, in Triton (and Gluon on Hopper).

Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM) decodes with absorbed queries: every
head attends over the same latent cache line `[kv_lora_rank latent | rope_dim rope]` (576 or 288
values), the latent part doubling as the value. So the whole head group of one request shares
each KV tile, and the kernels are built around that:

- one program takes a tile of query rows of one request (heads x query tokens, up to 64) and
  multiplies it against each KV tile on tensor cores (`tl.dot`), so a KV tile is read from
  memory once per row tile, not once per head as a per-head kernel would;
- the sequence is cut into splits (split-KV); the split count is planned on the host from the
  batch size, the rows, the longest context and the SM count (`plan_mla_decode`), so one long
  request and many short ones both fill the GPU; a second kernel merges the splits by their
  log-sum-exp (one split writes the output directly and skips the merge); splits past a
  request's keys are skipped by both, so a CUDA graph captured with the longest context's
  split count stays cheap when it replays short contexts;
- an fp8 e4m3 cache has its own split kernel: each tile is loaded once as fp8 (half the
  bytes), viewed as 16-bit pairs of columns so both products read it from shared memory with
  ldmatrix, and widened in registers to fp16 (a byte permute and one convert per two values);
  the query is multiplied by softmax scale x log2(e) x the per-tensor scale before it is
  rounded to fp16, and the per-tensor scale also multiplies the final output, not every
  element;
- on Hopper a 16-bit or fp8 cache stored contiguously with pages a multiple of 64 tokens
  (vLLM's layout; BWX_MLA asks for 64-token pages) takes 64-key tiles read by TMA copies for
  64-row tiles (`MLA_DECODE_TMA_CONFIGS`), run by a Gluon kernel that computes each score
  tile once where the Triton kernel computes it in both warp groups: the same programs,
  splits, outputs and merge; other caches are gathered per thread with `cp.async`;
- query_len up to 8 rows per request (MTP / speculative verification), causal within the rows;
- capture-safe: with a preallocated `MlaDecodeWorkspace` and a planned split count, a launch
  neither allocates nor synchronises with the host.

Layout of the package: jit code in `split_kernel`, `split_fp8_kernel`, `merge_kernel` and
`gluon_kernel`; tuned configs as data in `configs`; `plan` (the one rule: device, table,
variant, splits), `launch` (a plan plus tensors, arguments by name), `checks` (all
validation), `layout` (TMA facts and descriptors of a cache), `workspace`; `decode` holds the
standalone `mla_decode` (check, plan, launch).
"""

from vllm_blackwell_ext.kernels.mla_decode.checks import (
    check_layout_serves_plan,
    check_mla_decode_inputs,
)
from vllm_blackwell_ext.kernels.mla_decode.configs import (
    FEW_PROGRAMS,
    INT_WIDEN_BOTH,
    INT_WIDEN_VALUES,
    MLA_DECODE_CONFIGS,
    MLA_DECODE_FEW_PROGRAM_CONFIGS,
    MLA_DECODE_TMA_CONFIGS,
    PREFERRED_BLOCK_SIZE,
    ROW_TILES,
    MlaDecodeConfig,
)
from vllm_blackwell_ext.kernels.mla_decode.decode import (
    mla_decode,
    mla_decode_flops,
    plan_for_tensors,
)
from vllm_blackwell_ext.kernels.mla_decode.gluon_kernel import GLUON_AVAILABLE
from vllm_blackwell_ext.kernels.mla_decode.launch import (
    KernelLaunch,
    launch_mla_decode,
    mla_decode_launches,
)
from vllm_blackwell_ext.kernels.mla_decode.layout import (
    MlaCacheLayout,
    cache_tma_page_size,
    device_reads_tma,
    mla_cache_layout,
    query_is_tma_readable,
)
from vllm_blackwell_ext.kernels.mla_decode.limits import (
    MAX_QUERY_LEN,
    MAX_SPLITS,
    SUPPORTED_LATENT,
    VARIANTS,
    WIDE_MERGE_SPLITS,
)
from vllm_blackwell_ext.kernels.mla_decode.plan import (
    MlaDecodePlan,
    gluon_supported,
    merge_config,
    plan_mla_decode,
)
from vllm_blackwell_ext.kernels.mla_decode.workspace import MlaDecodeWorkspace

__all__ = [
    "FEW_PROGRAMS",
    "GLUON_AVAILABLE",
    "INT_WIDEN_BOTH",
    "INT_WIDEN_VALUES",
    "MAX_QUERY_LEN",
    "MAX_SPLITS",
    "MLA_DECODE_CONFIGS",
    "MLA_DECODE_FEW_PROGRAM_CONFIGS",
    "MLA_DECODE_TMA_CONFIGS",
    "PREFERRED_BLOCK_SIZE",
    "ROW_TILES",
    "SUPPORTED_LATENT",
    "VARIANTS",
    "WIDE_MERGE_SPLITS",
    "KernelLaunch",
    "MlaCacheLayout",
    "MlaDecodeConfig",
    "MlaDecodePlan",
    "MlaDecodeWorkspace",
    "cache_tma_page_size",
    "check_layout_serves_plan",
    "check_mla_decode_inputs",
    "device_reads_tma",
    "gluon_supported",
    "launch_mla_decode",
    "merge_config",
    "mla_cache_layout",
    "mla_decode",
    "mla_decode_flops",
    "mla_decode_launches",
    "plan_for_tensors",
    "plan_mla_decode",
    "query_is_tma_readable",
]
