"""The plugin inside a real vLLM engine: loaded in every process, named backends survive
spawned processes."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import BASE_LLM_KWARGS, run_engine_job

PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300]]
TEST_BACKEND = "tests.e2e.bwx_test_backend.BwxTestAttentionBackend"


@pytest.fixture(scope="module")
def named_backend_run(tiny_models, tmp_path_factory):
    """One engine: a plugin-registered backend name selected with attention_backend=..."""
    spec = {
        "model": str(tiny_models["qwen3"]),
        "llm_kwargs": {**BASE_LLM_KWARGS, "attention_backend": "BWX_TEST"},
        "register_backends": {"BWX_TEST": TEST_BACKEND},
        "runs": [
            {
                "name": "greedy",
                "prompts": PROMPTS,
                "sampling": {"max_tokens": 6, "temperature": 0.0},
            }
        ],
    }
    return run_engine_job(spec, tmp_path_factory.mktemp("named-backend"), spawn=True)


def test_register_runs_in_every_vllm_process(named_backend_run):
    trace = named_backend_run["trace"]
    names = {record["process_name"] for record in trace}
    # the front end (MainProcess), the engine core and its worker all ran register()
    assert "EngineCore" in names, names
    assert any(name.startswith("VllmWorker") for name in names), names
    pids = {record["pid"] for record in trace}
    assert len(pids) == len(trace), "register() wrote twice in one process"
    assert len(pids) >= 3, trace


def test_named_backend_selection_survives_spawned_processes(named_backend_run):
    # The config (attention_backend=BWX_TEST, a member created at run time) was unpickled in
    # the engine core and the worker; generation finished there.
    outputs = named_backend_run["runs"]["greedy"]
    assert [len(o["token_ids"]) for o in outputs] == [6, 6]
    assert "is not a valid AttentionBackendEnum" not in named_backend_run["log"]
