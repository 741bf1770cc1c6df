"""Decode context parallelism over real ranks: `torch.distributed`, one process per rank.

Each rank holds the tokens vLLM places on it (global position p on rank ``(p // I) % N``), runs
`mla_decode` with LSE over its shard and `dcp_merge` (all-gather of the LSEs, rescale by
``exp(lse_r - lse_global)``, reduce-scatter over heads); its heads must equal the single-process
full-context `mla_decode`, the fp32 reference and the single-process merge oracle. The chunked
context prefill gather (each rank's padded local layout through `gather_and_maybe_dequant_cache`,
all-gather, reorder) must equal the single-rank gather exactly. Cases per world size: interleave
1 and 16, bf16 and fp8 caches, sequences shorter than N (and N * I): empty shards, LSE -inf)
and one of length 0 (every shard empty: output 0, no NaN). See `_dcp_worker.py`.

Backends: ``gloo`` on the CPU with ``TRITON_INTERPRET=1`` and tiny shapes (always runs, one
spawn per world size, ~10 s each); ``nccl`` with one GPU per rank and real shapes (marked
``gpu``, skipped when fewer GPUs than ranks).

Tolerances. One `mla_decode` is within ``2e-2 abs + 2e-2 rel`` of the fp32 reference and its LSE
within 1e-3 (bf16 P and output roundings; see tests/kernels/test_mla_decode.py). The merge adds,
per output element, the bf16 rounding of each rescaled partial (weight <= 1, error <= 2^-9 of
max|o_r|) and at most N - 1 bf16 roundings of running sums in the reduce-scatter (each <= 2^-9
of max|o_r|, since the weights sum to 1): together <= (N + 1) * 2^-9 * max|o_r|. Hence: vs the
merge oracle (same partials, fp32, one process) ``(N + 1) * 2^-9 * max(1, max|o_r|)`` absolute;
vs the full-context kernel and the reference ``2e-2 + that`` abs and 2e-2 rel. LSEs: the global
LSE is a logsumexp of per-shard LSEs, each within 1e-3 of the truth, and logsumexp is 1-Lipschitz
in the max norm, so it is within 1e-3 of the reference and 2e-3 of the full-context kernel (also
1e-3 off); vs the oracle only fp32 rounding (1e-5). Gathers copy (fp8 dequantised by a power of
two into bf16, exact) and are compared bit for bit.
"""

from __future__ import annotations

import functools
import json
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed._dcp_worker import cases_for, run_rank

NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
WORLD_SIZES = (2, 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _run_ranks(backend: str, world_size: int) -> tuple[dict, ...]:
    """Spawn `world_size` ranks once per (backend, world size); every rank's per-case results."""
    with tempfile.TemporaryDirectory(prefix="bwx-dcp-") as d:
        mp.spawn(run_rank, args=(world_size, backend, _free_port(), d), nprocs=world_size)
        return tuple(json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(world_size))


def _check(backend: str, world_size: int, name: str) -> None:
    per_rank = _run_ranks(backend, world_size)
    failures = [
        f"rank {r}: {res[name].get('error', 'missing')}"
        for r, res in enumerate(per_rank)
        if not res.get(name, {}).get("ok")
    ]
    assert not failures, "\n".join(failures)
    # The cases are meant to exercise empty shards (sequences shorter than N * I).
    assert per_rank[0][name]["empty_shards"] > 0
    assert per_rank[0][name]["gather_chunks"] >= 1


def _ids(on_gpu: bool) -> list:
    return [
        pytest.param(n, c["name"], id=c["name"]) for n in WORLD_SIZES for c in cases_for(n, on_gpu)
    ]


@pytest.mark.parametrize(("world_size", "name"), _ids(on_gpu=False))
def test_gloo_ranks_merge_decode_and_gather_context_like_one_process(world_size, name):
    _check("gloo", world_size, name)


@pytest.mark.gpu
@pytest.mark.parametrize(("world_size", "name"), _ids(on_gpu=True))
def test_nccl_ranks_merge_decode_and_gather_context_like_one_gpu(world_size, name):
    if NUM_GPUS < world_size:
        pytest.skip(f"needs {world_size} CUDA GPUs (one per rank), found {NUM_GPUS}")
    _check("nccl", world_size, name)
