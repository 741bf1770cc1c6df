"""The BWX_* on/off switches: one parser, the same answer wherever a switch is read."""

from __future__ import annotations

import pytest

from vllm_blackwell_ext.switches import (
    DEBUG_BOUNDS,
    DFLASH_TAKEOVER,
    FALSE_WORDS,
    FRESH_PREFILL,
    SWITCHES,
    TRUE_WORDS,
    parse_flag,
)


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.name)
def test_every_switch_reads_each_spelling_of_on_and_off(switch) -> None:
    for word in TRUE_WORDS:
        for raw in (word, word.upper(), f" {word} "):
            assert switch.enabled({switch.name: raw}) is True, raw
    for word in FALSE_WORDS:
        for raw in (word, word.capitalize(), f"{word}\n"):
            assert switch.enabled({switch.name: raw}) is False, raw
    assert switch.enabled({}) is switch.default
    assert switch.enabled({switch.name: "  "}) is switch.default


@pytest.mark.parametrize("raw", ["maybe", "2", "enable", "-1", "o n"])
@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.name)
def test_any_other_value_is_refused_naming_the_variable_what_it_takes_and_what_came(
    switch, raw
) -> None:
    with pytest.raises(ValueError) as info:
        switch.enabled({switch.name: raw})
    message = str(info.value)
    assert message.startswith(f"{switch.name}: expected one of 1/true/on/yes (on)")
    assert "0/false/off/no (off)" in message and repr(raw) in message


def test_defaults_and_the_doctor_line_say_where_the_value_came_from() -> None:
    assert (FRESH_PREFILL.default, DEBUG_BOUNDS.default, DFLASH_TAKEOVER.default) == (
        True,
        False,
        False,
    )
    assert FRESH_PREFILL.describe({}).startswith("on (default): ")
    assert FRESH_PREFILL.describe({FRESH_PREFILL.name: "off"}).startswith(
        "off (BWX_ATTN_FRESH_PREFILL='off'): "
    )
    assert parse_flag("X", None, True) is True and parse_flag("X", "", False) is False


def test_the_switch_of_each_feature_is_the_one_its_code_reads(monkeypatch) -> None:
    # The fresh prefill's builder and warm-up, the gather's bounds check and the DFlash
    # registration read these objects: a bad value reaches each of them as the same error.
    from vllm_blackwell_ext.dflash.registration import dflash_architectures
    from vllm_blackwell_ext.kernels.kv_gather import debug_bounds_enabled

    monkeypatch.setenv(DEBUG_BOUNDS.name, "off")
    assert debug_bounds_enabled() is False
    monkeypatch.setenv(DEBUG_BOUNDS.name, "maybe")
    with pytest.raises(ValueError, match="BWX_DEBUG_BOUNDS: expected"):
        debug_bounds_enabled()
    assert "DFlashDraftModel" in dflash_architectures({DFLASH_TAKEOVER.name: "on"})
    with pytest.raises(ValueError, match="BWX_DFLASH: expected"):
        dflash_architectures({DFLASH_TAKEOVER.name: "maybe"})
