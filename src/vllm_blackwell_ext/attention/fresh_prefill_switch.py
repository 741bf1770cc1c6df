"""Whether BWX_ATTN hands prompts without cached context to `fresh_prefill` (TMA).

Off unless BWX_ATTN_FRESH_PREFILL=1 in the engine's environment: the kernel matches the
reference under the CPU interpreter and, as `benchmarks/experiments/attn_prefill_tma.py`, ran
at 585 TFLOP/s at causal 8k on the H200 against 369 for the paged kernel, but the backend's
path through it has not yet served inside a GPU engine. One switch for the metadata builder,
which plans it, and the JIT warm-up, which compiles it.
"""

from __future__ import annotations

import os

FRESH_PREFILL_ENV = "BWX_ATTN_FRESH_PREFILL"


def fresh_prefill_enabled() -> bool:
    return os.environ.get(FRESH_PREFILL_ENV) == "1"
