"""The FlashMLA peer: without its sources it says what to run; fp8 caches are refused, not run."""

from __future__ import annotations

import pytest
import torch

from benchmarks.flashmla_peer import FETCH_HINT, FlashMla, PeerRefuses, load_flashmla
from benchmarks.vllm_peer import PeerMissing


def test_no_sources_and_no_archive_is_refused_with_the_command_that_packs_them(tmp_path):
    with pytest.raises(PeerMissing, match="neither FlashMLA's sources") as err:
        load_flashmla(str(tmp_path))
    assert FETCH_HINT in str(err.value)


def test_an_fp8_cache_is_refused_before_anything_is_launched():
    peer = object.__new__(FlashMla)  # no build: the refusal must come before the extension
    cache = torch.zeros(2, 64, 576, dtype=torch.float8_e4m3fn)
    with pytest.raises(PeerRefuses, match="bf16/fp16 caches"):
        peer.make(
            q=torch.zeros(1, 16, 576, dtype=torch.bfloat16),
            cache=cache,
            block_table=torch.zeros(1, 2, dtype=torch.int32),
            seq_lens=torch.full((1,), 100, dtype=torch.int32),
            query_len=1,
            rank=512,
            softmax_scale=576**-0.5,
        )
