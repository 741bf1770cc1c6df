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

from vllm_blackwell_ext.switches import PLATFORM
from vllm_blackwell_ext.vllm_compat import installed_vllm_version, is_supported_vllm

logger = logging.getLogger("vllm_blackwell_ext")

# vLLM's platform class -> ours, which subclasses it.
OUR_PLATFORMS = {
    "vllm.platforms.cuda.CudaPlatform": "vllm_blackwell_ext.platforms.cuda.BwxCudaPlatform",
    "vllm.platforms.cpu.CpuPlatform": "vllm_blackwell_ext.platforms.cpu.BwxCpuPlatform",
}


def platform() -> str | None:
    """Our platform's qualified name where vLLM's own choice is one we extend, else None."""
    try:
        enabled = PLATFORM.enabled()
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
