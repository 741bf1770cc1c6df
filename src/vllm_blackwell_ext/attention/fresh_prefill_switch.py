"""Whether BWX_ATTN hands prompts without cached context to `fresh_prefill` (TMA).

On unless BWX_ATTN_FRESH_PREFILL=0 in the engine's environment (it applies where the device and
the layer allow: `kernels/fresh_prefill`'s `fresh_prefill_supported`). The switch exists to
compare against the paged kernel and to step around the TMA path if it ever misbehaves. One
switch for the metadata builder, which plans it, and the JIT warm-up, which compiles it.
"""

from __future__ import annotations

import os

FRESH_PREFILL_ENV = "BWX_ATTN_FRESH_PREFILL"


def fresh_prefill_enabled() -> bool:
    return os.environ.get(FRESH_PREFILL_ENV, "1") != "0"
