"""The plugin's on/off environment switches, each read one way (`Switch.enabled`).

A switch takes 1/0, true/false, on/off or yes/no (any case, surrounding spaces ignored); unset
or empty means its default. Anything else is refused with a ValueError naming the variable,
what it takes and what it got, so a misspelt value never leaves a feature silently on or off.
`vllm-bwx doctor` reads the same switches and reports a bad value as a problem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Switch:
    """One BWX_* on/off variable: its name, its value when unset, and what it turns on."""

    name: str
    default: bool
    what: str

    def enabled(self, env: Mapping[str, str] | None = None) -> bool:
        """The switch's value in `env` (the process environment when None)."""
        raw = (os.environ if env is None else env).get(self.name)
        return parse_flag(self.name, raw, self.default)

    def describe(self, env: Mapping[str, str] | None = None) -> str:
        """One line for `vllm-bwx doctor`: the value in force and where it came from."""
        raw = (os.environ if env is None else env).get(self.name)
        state = "on" if self.enabled(env) else "off"
        source = "default" if raw is None or not raw.strip() else f"{self.name}={raw!r}"
        return f"{state} ({source}): {self.what}"


def parse_flag(name: str, raw: str | None, default: bool) -> bool:
    """`raw`, the value of variable `name`, as a bool (`default` when unset or empty)."""
    if raw is None or not raw.strip():
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name}: expected one of {'/'.join(TRUE_WORDS)} (on) or {'/'.join(FALSE_WORDS)} (off), "
        f"got {raw!r}"
    )


FRESH_PREFILL = Switch(
    "BWX_ATTN_FRESH_PREFILL",
    True,
    "BWX_ATTN prefills prompts without cached context with the fresh-prefill (TMA) kernel "
    "where the device and layer allow",
)
DEBUG_BOUNDS = Switch(
    "BWX_DEBUG_BOUNDS",
    False,
    "the KV gather ops check block_table / token_to_seq entries on the host before each "
    "launch (a device sync per call)",
)
DFLASH_TAKEOVER = Switch(
    "BWX_DFLASH",
    False,
    "checkpoints of vLLM's own DFlash architecture (DFlashDraftModel) load this plugin's draft",
)
PLATFORM = Switch(
    "BWX_PLATFORM",
    True,
    "vLLM's CUDA and CPU platforms come with our refusals: an --attention-backend BWX_ATTN / "
    "BWX_MLA that cannot serve the model is refused in the process that builds the config",
)
SWITCHES = (FRESH_PREFILL, DEBUG_BOUNDS, DFLASH_TAKEOVER, PLATFORM)
