"""vLLM's own Triton kernels as benchmark peers, on a GPU machine where vLLM is not installed.

`scripts/fetch_vllm_peer.sh` copies the kernel files out of the vLLM wheel into an ignored
folder (`.peer` by default); `load_vllm_peer(peer_dir)` puts stand-ins for the few vLLM modules
those files import (platforms, triton_utils, envs, logger, kv_cache_interface) into
`sys.modules`, so `from vllm.v1.attention.ops... import ...` finds vLLM's kernel.

Only for the benchmark processes. Where vLLM is imported already (a machine with vLLM's CUDA
wheel, whose own kernels the benchmarks import first for the FA3 and FlashMLA peers), its own
kernel files are the peer and no stand-in is installed. `PeerMissing` says why a peer could not
be loaded; the benchmarks print it and write it into their table and JSON.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import types

FETCH_HINT = "scripts/fetch_vllm_peer.sh 0.32.0 .peer"


class PeerMissing(RuntimeError):
    """vLLM's kernels could not be loaded as a peer (the message says why and what to run)."""


class _Platform:
    """What vLLM's Triton kernel files ask `current_platform` (a CUDA device)."""

    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_xpu(self) -> bool:
        return False

    def fp8_dtype(self):
        import torch

        return torch.float8_e4m3fn

    def get_device_capability(self, device_id: int = 0):
        import torch

        major, minor = torch.cuda.get_device_capability(device_id)
        return types.SimpleNamespace(major=major, minor=minor, to_int=lambda: major * 10 + minor)

    def is_device_capability(self, capability: int, device_id: int = 0) -> bool:
        return self.get_device_capability(device_id).to_int() == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return self.get_device_capability(device_id).major == capability // 10


class _KVQuantMode(enum.IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def load_vllm_peer(peer_dir: str) -> None:
    """Make `import vllm.v1.attention.ops.<kernel file>` load the copies under `peer_dir`, or,
    where vLLM itself is imported already, leave vLLM's own kernel files to be imported."""
    root = os.path.abspath(os.path.join(peer_dir, "vllm"))
    loaded = sys.modules.get("vllm")
    if loaded is not None and getattr(loaded, "__path__", [None])[0] != root:
        return  # the installed vLLM: its own kernels are the peer
    if not os.path.isdir(os.path.join(root, "v1", "attention", "ops")):
        raise PeerMissing(f"no vLLM kernel files under {peer_dir!r}: run {FETCH_HINT}")
    import triton
    import triton.language as tl

    vllm = _module("vllm", __path__=[root])
    sys.modules.update(
        {
            "vllm": vllm,
            "vllm.v1": _module("vllm.v1", __path__=[os.path.join(root, "v1")]),
            "vllm.platforms": _module("vllm.platforms", current_platform=_Platform()),
            "vllm.triton_utils": _module(
                "vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=True
            ),
            "vllm.envs": _module("vllm.envs", VLLM_BATCH_INVARIANT=False),
            "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
            "vllm.v1.kv_cache_interface": _module(
                "vllm.v1.kv_cache_interface", KVQuantMode=_KVQuantMode
            ),
        }
    )
    vllm.envs = sys.modules["vllm.envs"]


def peer_not_run_note(peer: str, why: str) -> str:
    """The line a benchmark's table and JSON carry when a peer did not run."""
    return f"PEER NOT RUN: {peer}: {why}"
