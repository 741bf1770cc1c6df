"""register(): version gate, idempotence, the CPU opt-in, and named backends that survive
pickling into a fresh process (the way vLLM ships its config to spawned processes)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import textwrap

import pytest

from vllm_blackwell_ext import registration as reg

pytest.importorskip("vllm", reason="registration tests need vLLM installed")


@pytest.mark.parametrize(
    "version, supported",
    [
        ("0.32.0", True),
        ("0.32.3+cpu", True),
        ("0.33.0", True),
        ("0.34.0+cu130", True),
        ("0.32.1.dev3+g123abc", True),
        ("0.34.9rc1", True),
        ("0.35.0", False),
        ("0.35.0.dev12", False),
        ("0.31.9", False),
        ("dev", False),
        (None, False),
    ],
)
def test_version_gate_accepts_the_032_to_034_series(version, supported):
    assert reg.is_supported_vllm(version) is supported


def test_unsupported_vllm_warns_once_and_registers_nothing(caplog):
    called = []
    registration = reg.Registration(
        read_version=lambda: "0.35.0", register_components=lambda *a: called.append(a)
    )
    with caplog.at_level(logging.WARNING, logger="vllm_blackwell_ext"):
        registration.run()
        registration.run()
    supported = "supports vLLM 0.32.x, 0.33.x, 0.34.x"
    warnings = [r for r in caplog.records if supported in r.getMessage()]
    assert len(warnings) == 1
    assert "found 0.35.0" in warnings[0].getMessage()
    assert called == []
    assert registration.registered == {} and not registration.done


def test_register_is_idempotent():
    calls = []
    registration = reg.Registration(
        read_version=lambda: "0.32.0",
        register_components=lambda o: calls.append(o) or {"x": {}},
    )
    registration.run()
    registration.run()
    assert len(calls) == 1 and registration.registered == {"x": {}}


def test_the_process_registration_is_what_register_and_registered_components_use():
    reg.register()
    reg.register()
    assert reg.PROCESS_REGISTRATION.done
    assert reg.registered_components() == reg.PROCESS_REGISTRATION.registered
    assert "BWX_ATTN" in reg.registered_components()["backends"]


@pytest.mark.parametrize(
    "value, expected",
    [(None, ()), ("", ()), ("none", ()), ("attn", ("attn",)), ("attn, mla", ("attn", "mla"))],
)
def test_cpu_override_values(value, expected):
    assert reg.parse_cpu_override(value) == expected


def test_unknown_cpu_override_names_accepted_values(monkeypatch):
    monkeypatch.setenv(reg.CPU_OVERRIDE_ENV, "attn,flash")
    with pytest.raises(ValueError, match=r"BWX_CPU_BACKENDS.*'flash'.*\['attn', 'mla'\]"):
        reg.Registration().run()


def test_a_bad_dflash_opt_in_is_refused_before_anything_is_registered():
    # A fresh interpreter: this process registered BWX_* members already.
    script = textwrap.dedent("""
        import os
        os.environ["BWX_DFLASH"] = "maybe"
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm_blackwell_ext import registration as reg
        try:
            reg.register()
        except ValueError as e:
            print("refused:", "BWX_DFLASH" in str(e))
        print("registered:", "BWX_ATTN" in AttentionBackendEnum.__members__,
              reg.registered_components())
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["refused: True", "registered: False {}"]


_UNPICKLE_IN_FRESH_PROCESS = textwrap.dedent(
    """
    import pickle, sys
    member = pickle.loads(sys.stdin.buffer.read())
    print(member.name, member.get_path())
    """
)


def _unpickle_elsewhere(payload: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _UNPICKLE_IN_FRESH_PROCESS],
        input=payload,
        capture_output=True,
        timeout=300,
    )


def test_named_backend_unpickles_in_a_process_that_never_registered_it():
    member = reg.register_named_backend("BWX_PICKLE_PROBE", "some.module.ProbeBackend")
    done = _unpickle_elsewhere(pickle.dumps(member))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["BWX_PICKLE_PROBE", "some.module.ProbeBackend"]
    assert pickle.loads(pickle.dumps(member)) is member


def test_plain_enum_registration_fails_to_unpickle_elsewhere():
    # The trap register_named_backend exists for (facts.md): the control case must fail.
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    member = AttentionBackendEnum.register("BWX_PLAIN_PROBE", "some.module.PlainBackend")
    done = _unpickle_elsewhere(pickle.dumps(member))
    assert done.returncode != 0
    assert b"is not a valid AttentionBackendEnum" in done.stderr
