"""Print the requirements a vLLM CUDA wheel declares, less the GPU-only kernel packages.

    python scripts/cuda_wheel/requirements.py vllm-0.34.0-...whl > requirements.txt

Those packages are not needed to import vLLM's Python code on a machine without a GPU, and
some of them do not resolve from the package registry (flashinfer-python==0.7.3 for 0.34).
torch is left out too: the caller pins the version the wheel asks for.
"""

from __future__ import annotations

import re
import sys
import zipfile

GPU_ONLY = {
    "torch",
    "torchaudio",
    "torchcodec",
    "pynvvideocodec",
    "flashinfer-python",
    "apache-tvm-ffi",
    "tilelang",
    "nvidia-cudnn-frontend",
    "nvtx",
    "fastsafetensors",
    "instanttensor",
    "nvidia-cutlass-dsl",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
}


def requirements(wheel: str) -> tuple[list[str], str]:
    """The kept requirements, and the torch requirement the wheel states."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    kept, torch_req = [], ""
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name == "torch":
            torch_req = req.split(";")[0].replace(" ", "")
        if name not in GPU_ONLY:
            kept.append(req)
    return kept, torch_req


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("--requirements", "--torch"):
        sys.exit("usage: requirements.py --requirements|--torch WHEEL")
    kept, torch_req = requirements(sys.argv[2])
    print("\n".join(kept) if sys.argv[1] == "--requirements" else torch_req)
