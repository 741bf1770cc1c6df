"""FlashInfer as a benchmark peer: `flashinfer` (paged GQA) and `flashinfer-mla` in the tables.

FlashInfer is what vLLM picks on Blackwell for paged attention and among its MLA decode choices
(on Hopper vLLM 0.32 puts FlashAttention 3 and FlashMLA first:
`benchmarks/vllm_cuda_peers.py`). On a GPU machine without a package registry, carry
`.peer_flashinfer/` as `scripts/fetch_flashinfer_peer.sh` fills it (flashinfer-python's files
as one xz archive and the apache-tvm-ffi wheel, about 20 MiB: the 62 MiB wheel itself does not
fit one command's carry beside the checkout); `load_flashinfer(dir)` unpacks and installs them
into `dir/site` once (no dependencies) and imports FlashInfer. Its other requirements at import
(nvidia-ml-py, einops, tabulate, ninja, cuda-bindings) are in the H200 image. FlashInfer
compiles each kernel with nvcc on first use (cached under ~/.cache/flashinfer): about 2.5
minutes for every kind the benchmarks use on the H200, run in parallel.

Each peer gets FlashInfer's own cache layout, with the benchmark's values and page table:
paged GQA an NHD cache `[pages, 2, page, kv_heads, head]`, MLA its split form (latent and rope
parts, each contiguous). `plan()` runs once per case, outside the timed CUDA-graph replay.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.vllm_peer import PeerMissing

FETCH_HINT = "scripts/fetch_flashinfer_peer.sh .peer_flashinfer"
SITE_ARCHIVE = "flashinfer-site.tar.xz"
WORKSPACE_BYTES = 256 << 20


def load_flashinfer(peer_dir: str) -> Any:
    """Import FlashInfer, first unpacking / installing what `peer_dir` holds where it is missing.

    `peer_dir` holds what `scripts/fetch_flashinfer_peer.sh` writes: `flashinfer-site.tar.xz`
    (the flashinfer-python wheel's files) and wheels (apache-tvm-ffi; a flashinfer-python
    wheel works too); both go into `peer_dir/site` once.
    """
    try:
        import flashinfer

        return flashinfer
    except ImportError:
        pass
    folder = Path(peer_dir)
    site = folder / "site"
    if not (site / "flashinfer").is_dir():
        archive = folder / SITE_ARCHIVE
        wheels = sorted(str(w) for w in folder.glob("*.whl"))
        if not archive.is_file() and not wheels:
            raise PeerMissing(f"flashinfer is not installed and {peer_dir!r} holds neither "
                              f"{SITE_ARCHIVE} nor wheels: run {FETCH_HINT}")  # fmt: skip
        # Wheels first: `site/flashinfer` marks a finished install (from the archive or a wheel).
        if wheels:
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                 str(site), *wheels],
                check=True,
            )  # fmt: skip
        if archive.is_file():
            with tarfile.open(archive) as tar:
                tar.extractall(site, filter="data")
    sys.path.insert(0, str(site))
    import flashinfer

    return flashinfer


def _last_page_lens(seq_lens: torch.Tensor, page: int) -> torch.Tensor:
    return ((seq_lens - 1) % page + 1).to(torch.int32)


class FlashInferPaged:
    """FlashInfer's paged decode (tensor cores) for one-token rows, its paged prefill else."""

    name = "flashinfer"

    def __init__(self, peer_dir: str, device: str = "cuda") -> None:
        self.fi = load_flashinfer(peer_dir)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def make(self, *, kv: torch.Tensor, q: torch.Tensor, cu_seqlens_q: torch.Tensor,
             seq_lens: torch.Tensor, block_table: torch.Tensor, max_seqlen_q: int, causal: bool,
             window: int | None, k_scale: float | None, v_scale: float | None):  # fmt: skip
        """`kv` is vLLM's cache [blocks, kv_heads, page, 2 * head]; returns a timed callable."""
        blocks, kv_heads, page, two_head = kv.shape
        head = two_head // 2
        cache = kv.view(blocks, kv_heads, page, 2, head).permute(0, 3, 2, 1, 4).contiguous()
        batch, pages = block_table.shape
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=kv.device) * pages
        indices = block_table.reshape(-1).contiguous()
        last = _last_page_lens(seq_lens, page)
        common = {
            "q_data_type": q.dtype,
            "kv_data_type": kv.dtype,
            "sm_scale": head**-0.5,
            "window_left": window - 1 if window is not None else -1,
        }
        scales = {"k_scale": k_scale, "v_scale": v_scale} if k_scale is not None else {}
        if max_seqlen_q == 1:
            w = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=True
            )
            w.plan(indptr, indices, last, q.shape[1], kv_heads, head, page, **common)
        else:
            w = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
            w.plan(cu_seqlens_q, indptr, indices, last, q.shape[1], kv_heads, head, page,
                   causal=causal, **common)  # fmt: skip
        return lambda: w.run(q, cache, **scales)


class FlashInferMla:
    """FlashInfer's MLA decode (`BatchMLAPagedAttentionWrapper`, backend chosen by FlashInfer)."""

    name = "flashinfer-mla"

    def __init__(self, peer_dir: str, device: str = "cuda") -> None:
        self.fi = load_flashinfer(peer_dir)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._split: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _split_cache(self, cache: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        # One contiguous latent / rope pair per page pool (the benchmark's pools are shared).
        key = cache.data_ptr()
        if key not in self._split:
            self._split[key] = (cache[..., :rank].contiguous(), cache[..., rank:].contiguous())
        return self._split[key]

    def make(self, *, q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
             seq_lens: torch.Tensor, query_len: int, rank: int, softmax_scale: float,
             k_scale: float | None):  # fmt: skip
        """`q` [tokens, heads, rank + rope], `cache` [pages, page, rank + rope]."""
        ckv, kpe = self._split_cache(cache, rank)
        q_nope, q_pe = q[..., :rank].contiguous(), q[..., rank:].contiguous()
        batch = block_table.shape[0]
        w = self.fi.mla.BatchMLAPagedAttentionWrapper(self.workspace)
        w.plan(
            cum_seq_lens_q=torch.arange(batch + 1, dtype=torch.int32, device=q.device) * query_len,
            block_tables=block_table,
            seq_lens=seq_lens,
            num_heads=q.shape[1],
            head_dim_ckv=rank,
            head_dim_kpe=q.shape[2] - rank,
            page_size=cache.shape[1],
            causal=query_len > 1,
            sm_scale=softmax_scale,
            q_data_type=q.dtype,
            kv_data_type=cache.dtype,
            max_q_len=query_len,
        )
        scales = {"ckv_scale": k_scale, "kpe_scale": k_scale} if k_scale is not None else {}
        return lambda: w.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), **scales)
