"""`register()`: what vLLM's `vllm.general_plugins` entry point calls in every process.

vLLM calls it in the front end, the engine core, every worker and the model-registry
subprocess, so it is idempotent and cheap; everything vLLM-specific is imported inside it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_blackwell_ext import components
from vllm_blackwell_ext.vllm_compat import (
    has_speculative_method_registry,
    installed_vllm_version,
    is_supported_vllm,
    supported_vllm_text,
)

logger = logging.getLogger("vllm_blackwell_ext")

# Opt-in: point vLLM's CPU attention entries at our backends, so a CPU engine (which ignores
# --attention-backend) runs our code. Comma-separated subset of CPU_OVERRIDE_TARGETS.
CPU_OVERRIDE_ENV = "BWX_CPU_BACKENDS"
# Diagnostics: when set to a directory, every process that runs register() writes a small
# JSON record there (pid, process name, what was registered). The e2e tests read it.
TRACE_DIR_ENV = "BWX_TRACE_DIR"


def parse_cpu_override(value: str | None) -> tuple[str, ...]:
    """Parse BWX_CPU_BACKENDS: '', 'none', or a comma list of 'attn' and 'mla'."""
    if value is None or value.strip().lower() in ("", "none", "0"):
        return ()
    chosen = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    accepted = tuple(components.CPU_OVERRIDE_TARGETS)
    unknown = [part for part in chosen if part not in accepted]
    if unknown:
        raise ValueError(
            f"{CPU_OVERRIDE_ENV}={value!r}: unknown value(s) {unknown}; accepted values are a "
            f"comma-separated subset of {list(accepted)}, or 'none'"
        )
    return chosen


def register() -> None:
    """Register every component this package has with vLLM (idempotent, cheap)."""
    PROCESS_REGISTRATION.run()


def registered_components() -> dict[str, dict[str, str]]:
    """What register() registered in this process (empty before it ran or when refused)."""
    return dict(PROCESS_REGISTRATION.registered)


def register_components(cpu_overrides: tuple[str, ...]) -> dict[str, dict[str, str]]:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    # Everything that can refuse (the opt-ins, what this build holds) is settled before the
    # first registration: a refusal leaves vLLM as it was.
    for target in cpu_overrides:
        backend = components.CPU_OVERRIDE_TARGETS[target]
        if not components.module_exists(backend.class_path.rsplit(".", 1)[0]):
            raise ValueError(
                f"{CPU_OVERRIDE_ENV} asks for {target!r}, but {backend.name} is not part of "
                "this build of vllm-blackwell-ext"
            )
    models = components.available_models()
    result: dict[str, dict[str, str]] = {
        "backends": {},
        "cpu_overrides": {},
        "models": {},
        "speculative_methods": {},
    }
    for backend in components.available_backends():
        register_named_backend(backend.name, backend.class_path)
        result["backends"][backend.name] = backend.class_path
    for target in cpu_overrides:
        backend = components.CPU_OVERRIDE_TARGETS[target]
        for member_name in backend.cpu_members:
            register_backend(AttentionBackendEnum[member_name], backend.class_path)
            result["cpu_overrides"][member_name] = backend.class_path
    if models:
        from vllm import ModelRegistry

        for arch, qualname in models.items():
            ModelRegistry.register_model(arch, qualname)
            result["models"][arch] = qualname
        if has_speculative_method_registry():
            from vllm.v1.worker.gpu.spec_decode.speculator_config import (
                register_speculative_method,
            )

            # By qualified name: vLLM imports the config only when the method is asked for.
            register_speculative_method(components.DFLASH_METHOD, components.DFLASH_METHOD_CONFIG)
            result["speculative_methods"][components.DFLASH_METHOD] = (
                components.DFLASH_METHOD_CONFIG
            )
    return result


@dataclass
class Registration:
    """One process's registration with vLLM: made once, the version warning given once.

    `read_version` and `register_components` are what it consults and does (the installed
    vLLM's version, the registries' calls); a test passes its own.
    """

    read_version: Callable[[], str | None] = installed_vllm_version
    register_components: Callable[[tuple[str, ...]], dict] = register_components
    done: bool = False
    warned: bool = False
    registered: dict[str, dict[str, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def run(self) -> None:
        """Register once; on an unsupported vLLM warn once and register nothing."""
        with self.lock:
            if self.done:
                return
            version = self.read_version()
            if not is_supported_vllm(version):
                if not self.warned:
                    self.warned = True
                    logger.warning(
                        "vllm-blackwell-ext supports vLLM %s, found %s: registering nothing, "
                        "vLLM runs as if the plugin were not installed.",
                        supported_vllm_text(),
                        version,
                    )
                return
            # Validate the opt-ins before touching vLLM, so a typo fails before anything
            # changes (BWX_DFLASH in `register_components`, ahead of its first registration).
            cpu_overrides = parse_cpu_override(os.environ.get(CPU_OVERRIDE_ENV))
            self.registered = self.register_components(cpu_overrides)
            self.done = True
            _write_trace(self.registered)
            logger.debug("vllm-blackwell-ext registered: %s", self.registered)


# This process's registration (vLLM calls `register()` once or more per process).
PROCESS_REGISTRATION = Registration()


def register_named_backend(name: str, class_path: str):
    """Register (or re-point) a named attention backend that survives spawned processes.

    vLLM pickles its config, attention backend member included, to the engine core and the
    workers, and an Enum member pickles by value: unpickling `AttentionBackendEnum(<class
    path>)` fails in a child where the name was not registered yet, which it never is, since
    plugins load after the config arrives. So the member we create pickles as a call to
    `restore_named_backend(name, class_path)`, which registers it in the child first.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    member = AttentionBackendEnum.__members__.get(name)
    if member is None:
        register_backend(name, class_path)
        member = AttentionBackendEnum[name]
    elif member.get_path() != class_path:
        register_backend(member, class_path)
    # Instance attribute, looked up by pickle before the class's Enum.__reduce_ex__: the one
    # attribute we set on a vLLM object, and only on the BWX_* members registered above.
    member.__reduce_ex__ = _NamedBackendReducer(name, class_path)
    return member


class _NamedBackendReducer:
    """Picklable-by-reference `__reduce_ex__` for a plugin-registered backend member."""

    def __init__(self, name: str, class_path: str) -> None:
        self.name, self.class_path = name, class_path

    def __call__(self, protocol: int):
        return restore_named_backend, (self.name, self.class_path)


def restore_named_backend(name: str, class_path: str):
    """Unpickling side of register_named_backend: runs in the child before vLLM's plugins."""
    return register_named_backend(name, class_path)


def _write_trace(registered: dict) -> None:
    trace_dir = os.environ.get(TRACE_DIR_ENV)
    if not trace_dir:
        return
    os.makedirs(trace_dir, exist_ok=True)
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process_name": multiprocessing.current_process().name,
        "argv0": sys.argv[0] if sys.argv else "",
        "registered": registered,
    }
    with open(os.path.join(trace_dir, f"register-{os.getpid()}.json"), "w") as f:
        json.dump(record, f)
