"""FlashMLA's dense decode as a benchmark peer: `flashmla` in the MLA decode table.

FlashMLA (deepseek-ai/FlashMLA) is the MLA decode kernel vLLM picks on Hopper. It ships as
source only, and its one extension builds 27 CUDA files (sparse decode, sparse prefill, sm100
prefill and backward) against CUTLASS. The benchmark needs its sm90 dense decode alone, so
`scripts/fetch_flashmla_peer.sh` packs those sources and CUTLASS's headers from a FlashMLA
checkout into `.peer_flashmla/flashmla-src.tar.xz` (about 1 MiB), and `load_flashmla(dir)`
builds them on the GPU machine with torch's extension builder (nvcc, sm_90a; about a minute
on the H200 machine the first time, cached in `dir/build`), bound by `flashmla_dense_decode.cpp`
beside this file.

This build's dense decode takes bf16 / fp16 caches with 64-token pages (fp8 only in its
sparse, DSA decode, a different cache format): fp8 rows say so in the table instead of a
figure. Where vLLM's CUDA wheel is installed, the benchmark takes vLLM's FlashMLA build instead
(`benchmarks/vllm_cuda_peers.py`), which also decodes fp8 caches.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.vllm_peer import PeerMissing

FETCH_HINT = "scripts/fetch_flashmla_peer.sh FLASHMLA_CHECKOUT .peer_flashmla"
ARCHIVE = "flashmla-src.tar.xz"
BINDING = Path(__file__).with_name("flashmla_dense_decode.cpp")
# FlashMLA's own build (its setup.py), restricted to the sm90 dense decode in bf16.
SOURCES = (
    "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "smxx/decode/combine/combine.cu",
    "sm90/decode/dense/instantiations/bf16.cu",
)
INCLUDES = ("", "kerutils/include", "sm90", "cutlass/include", "cutlass/tools/util/include")
CXX_FLAGS = ["-O3", "-std=c++20", "-DNDEBUG", "-DFLASH_MLA_DISABLE_FP16"]
NVCC_FLAGS = [
    *CXX_FLAGS,
    "-D_USE_MATH_DEFINES",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-gencode",
    "arch=compute_90a,code=sm_90a",
]


class PeerRefuses(ValueError):
    """The peer has no kernel for this case (the message says why)."""


def load_flashmla(peer_dir: str) -> Any:
    """Build (once) and import FlashMLA's dense decode from the sources under `peer_dir`."""
    folder = Path(peer_dir).resolve()
    csrc = folder / "src" / "csrc"
    if not csrc.is_dir():
        archive = folder / ARCHIVE
        if not archive.is_file():
            raise PeerMissing(f"{peer_dir!r} holds neither FlashMLA's sources nor {ARCHIVE}: "
                              f"run {FETCH_HINT}")  # fmt: skip
        with tarfile.open(archive) as tar:
            tar.extractall(folder / "src", filter="data")
    from torch.utils.cpp_extension import CUDA_HOME, load

    build = folder / "build"
    build.mkdir(exist_ok=True)
    includes = [str(csrc / i) for i in INCLUDES]
    # CUDA 13 keeps libcu++ (cuda/std/...) under include/cccl: nvcc finds it, the host
    # compiler of the binding needs it named.
    cccl = Path(CUDA_HOME or "/usr/local/cuda") / "include" / "cccl"
    if cccl.is_dir():
        includes.append(str(cccl))
    return load(
        name="flashmla_dense_decode",
        sources=[str(BINDING), *(str(csrc / s) for s in SOURCES)],
        extra_include_paths=includes,
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=str(build),
    )


class FlashMla:
    """FlashMLA's `dense_decode_fwd`, called as its `flash_mla_with_kvcache` calls it."""

    name = "flashmla"

    def __init__(self, peer_dir: str) -> None:
        self.ext = load_flashmla(peer_dir)

    def make(self, *, q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
             seq_lens: torch.Tensor, query_len: int, rank: int, softmax_scale: float,
             k_scale: torch.Tensor | None = None):  # fmt: skip
        """`q` [tokens, heads, rank + rope], `cache` [pages, 64, rank + rope]; a timed callable
        returning (output, lse, ...). `k_scale` is for fp8 caches, which this build refuses."""
        if cache.dtype not in (torch.bfloat16, torch.float16):
            raise PeerRefuses(
                f"FlashMLA's dense decode takes bf16/fp16 caches, not {cache.dtype} "
                "(its fp8 path is the sparse DSA decode, another cache format)"
            )
        batch = block_table.shape[0]
        q4 = q.view(batch, query_len, q.shape[1], q.shape[2])
        k4 = cache.unsqueeze(2)  # [pages, page, 1 KV head, rank + rope]
        causal = query_len > 1
        # The first call plans the split schedule; timed calls reuse it, as vLLM's do.
        _, _, meta, splits = self.ext.dense_decode_fwd(
            q4, k4, rank, seq_lens, block_table, softmax_scale, causal, None, None
        )
        return lambda: self.ext.dense_decode_fwd(
            q4, k4, rank, seq_lens, block_table, softmax_scale, causal, meta, splits
        )
