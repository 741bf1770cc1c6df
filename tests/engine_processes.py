"""How a test's vLLM engine lays out its processes.

Users run vLLM's engine core and worker in spawned processes; the tests that check what that
layout implies (register() in every process, a named backend crossing processes) and the user-
facing examples run it so. The other CPU engine tests run the same engine code inside the
job's process: V1 multiprocessing off (the engine core in the front end's process) and the
"uni" executor (the worker in the engine core's). Each interpreter start imports torch and
vLLM again, about 15 s on the CI machine, and an engine's shutdown waits for its processes.
"""

from __future__ import annotations

from typing import Any

IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
IN_PROCESS_LLM_KWARGS = {"distributed_executor_backend": "uni"}


def in_process(
    llm_kwargs: dict[str, Any], env: dict[str, str] | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The LLM kwargs and environment of an engine in one process (a test's own values win)."""
    return {**IN_PROCESS_LLM_KWARGS, **llm_kwargs}, {**IN_PROCESS_ENV, **(env or {})}
