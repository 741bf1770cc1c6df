"""`platform()`: what vLLM's `vllm.platform_plugins` entry point calls to pick its platform.

Where vLLM would pick its own CUDA or CPU platform (and the installed vLLM is one this
package supports), it gets the same platform with one addition: `check_and_update_config`,
which vLLM runs while it builds the configuration in the process the user started, refuses
an `--attention-backend BWX_ATTN` / `BWX_MLA` that cannot serve the model or its cache with
our reason (`attention.asked_backend`). Without it that reason is raised in a worker and
the user's process reports only that the engine failed to start. Everywhere else (other
platforms, `BWX_PLATFORM=0`) this returns None and vLLM runs its own platform untouched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from vllm_blackwell_ext.switches import PLATFORM
from vllm_blackwell_ext.vllm_compat import installed_vllm_version, is_supported_vllm

logger = logging.getLogger("vllm_blackwell_ext")

# vLLM's platform class -> ours, which subclasses it.
OUR_PLATFORMS = {
    "vllm.platforms.cuda.CudaPlatform": "vllm_blackwell_ext.platforms.cuda.BwxCudaPlatform",
    "vllm.platforms.cpu.CpuPlatform": "vllm_blackwell_ext.platforms.cpu.BwxCpuPlatform",
}


ENTRY_POINT = "vllm_blackwell_ext.platforms:platform"


def platform(env: Mapping[str, str] | None = None) -> str | None:
    """Our platform's qualified name where vLLM's own choice is one we extend, else None
    (`env`: the process environment when None, as vLLM calls it)."""
    try:
        enabled = PLATFORM.enabled(env)
    except ValueError as error:  # vLLM would swallow it into a debug line: say it here
        logger.warning("%s; vLLM's own platform is used", error)
        return None
    if not enabled or not is_supported_vllm(installed_vllm_version()):
        return None
    return OUR_PLATFORMS.get(vllm_builtin_platform())


def vllm_builtin_platform() -> str | None:
    """The platform vLLM's built-in detection picks here, as it picks it (None: not one)."""
    from vllm.platforms import builtin_platform_plugins

    found = []
    for detect in builtin_platform_plugins.values():
        try:
            qualname = detect()
        except Exception:  # as vLLM does: a detection that fails finds nothing
            qualname = None
        if qualname is not None:
            found.append(qualname)
    return found[0] if len(found) == 1 else None


def platform_status(env: Mapping[str, str] | None = None) -> str:
    """One line for `vllm-bwx doctor`: which platform vLLM takes here, and so where an ask our
    backends cannot serve is refused."""
    from importlib.metadata import entry_points

    env = os.environ if env is None else env
    in_worker = "refusals in the worker"
    if not any(ep.value == ENTRY_POINT for ep in entry_points(group="vllm.platform_plugins")):
        return f"entry point NOT FOUND (reinstall): {in_worker}"
    if env.get("VLLM_TARGET_DEVICE", "").strip().lower() == "cpu":
        return f"not consulted (VLLM_TARGET_DEVICE=cpu): {in_worker}"
    try:
        ours = platform(env)
    except Exception as error:  # no vLLM, a detection that cannot run here
        return f"vLLM's own ({type(error).__name__}: {error}): {in_worker}"
    if ours is None:
        return f"vLLM's own (BWX_PLATFORM off, or a platform we do not extend): {in_worker}"
    return f"{ours.rsplit('.', 1)[1]}: refusals where vLLM builds its config"
