"""The FlashInfer peer loader: without FlashInfer and without its wheels it says what to run."""

from __future__ import annotations

import importlib.util
import sys
import tarfile

import pytest

from benchmarks.flashinfer_peer import FETCH_HINT, SITE_ARCHIVE, load_flashinfer
from benchmarks.vllm_peer import PeerMissing


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None,
    reason="flashinfer is installed here: the loader imports it without looking for wheels",
)
def test_no_flashinfer_and_nothing_fetched_is_refused_with_the_command_that_fetches_it(tmp_path):
    with pytest.raises(PeerMissing, match="holds neither") as err:
        load_flashinfer(str(tmp_path))
    assert FETCH_HINT in str(err.value)


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None,
    reason="flashinfer is installed here: the loader imports it without looking at the archive",
)
def test_the_fetched_archive_is_unpacked_into_site_and_imported(tmp_path, monkeypatch):
    # A stand-in package in the archive's layout (the wheel's files at the top level).
    pkg = tmp_path / "build" / "flashinfer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = 'stand-in'\n")
    peer = tmp_path / "peer"
    peer.mkdir()
    with tarfile.open(peer / SITE_ARCHIVE, "w:xz") as tar:
        tar.add(pkg, arcname="./flashinfer")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader prepends peer/site
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    module = load_flashinfer(str(peer))
    assert module.__version__ == "stand-in"
    assert (peer / "site" / "flashinfer" / "__init__.py").is_file()
    del sys.modules["flashinfer"]  # the stand-in must not outlive the test
