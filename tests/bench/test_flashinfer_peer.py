"""The FlashInfer peer loader: without FlashInfer and without its wheels it says what to run."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks.flashinfer_peer import FETCH_HINT, load_flashinfer
from benchmarks.vllm_peer import PeerMissing


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None,
    reason="flashinfer is installed here: the loader imports it without looking for wheels",
)
def test_no_flashinfer_and_no_wheels_is_refused_with_the_command_that_fetches_them(tmp_path):
    with pytest.raises(PeerMissing, match="holds no wheels") as err:
        load_flashinfer(str(tmp_path))
    assert FETCH_HINT in str(err.value)
