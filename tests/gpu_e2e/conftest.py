"""Real vLLM 0.32 engines on a GPU, our backends against vLLM's own, CUDA graphs on.

The test modules skip, with the reason, where there is no CUDA GPU or no CUDA build of vLLM
(CI, the CPU test path): `skip_without_cuda_vllm()`. On a GPU machine without a registry,
`scripts/gpu_kit.sh` brings vLLM there; then `scripts/gpu_kit.sh run python -m pytest
tests/gpu_e2e`.

Every engine of the suite is one job (`vllm_blackwell_ext.demo.engine_job` in its own
process, which starts vLLM's engine core and worker as users see them). The session fixture
starts them all, a few at a time on the one GPU (`BWX_GPU_E2E_JOBS`, default 3): each engine
gets a fixed KV-cache size, so vLLM's memory profiling never reads another engine's usage.
"""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import run_engine_job
from vllm_blackwell_ext import components
from vllm_blackwell_ext.switches import FRESH_PREFILL
from vllm_blackwell_ext.vllm_compat import has_speculative_method_registry

from . import checkpoints

CONCURRENT_JOBS = int(os.environ.get("BWX_GPU_E2E_JOBS", "3"))
# A comma-separated list of job names to run instead of all (a short GPU lease); the tests of
# the others skip, naming the variable.
ONLY_JOBS_ENV = "BWX_GPU_E2E_ONLY"

# CUDA graphs as vLLM captures them for decode (and spec-verify) batches: full graphs of the
# attention backend's forward. Mixed prefill batches run eagerly. torch.compile is off so an
# engine starts in seconds; `benchmarks/bench_engine.py` runs vLLM's full defaults.
BASE_LLM_KWARGS: dict[str, Any] = {
    "skip_tokenizer_init": True,
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.1,
    "kv_cache_memory_bytes": 4 << 30,
    "seed": 0,
    "enable_chunked_prefill": True,
    # Prompts of up to ~1500 tokens are prefilled in 512-token chunks next to decoding rows:
    # batches mix prefill chunks that have cached context with decode rows.
    "max_num_batched_tokens": 512,
    "max_num_seqs": 16,
    "disable_log_stats": False,
    "compilation_config": {
        "mode": 0,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128],
    },
}


def skip_without_cuda_vllm() -> None:
    """Skip the calling test module unless a CUDA GPU and the CUDA build of vLLM are here."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("GPU engine tests need a CUDA GPU", allow_module_level=True)
    vllm = pytest.importorskip("vllm", reason="GPU engine tests need the CUDA build of vLLM")
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        pytest.skip(
            f"GPU engine tests need the CUDA build of vLLM, found {vllm.__version__} for "
            f"{current_platform.device_type}",
            allow_module_level=True,
        )


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, checkpoints.VOCAB - 1) for _ in range(n)] for n in lengths]


# Long prompts (chunked, with cached context) decoding beside short ones.
PROMPTS = _prompts(0, [1500, 900, 300, 40, 7, 1200, 520, 64])
GREEDY = {"max_tokens": 24, "temperature": 0.0, "logprobs": 2, "ignore_eos": True}
TEACHER_FORCED = {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}


def job_spec(model: Path, **llm_kwargs: Any) -> dict[str, Any]:
    kwargs = {**BASE_LLM_KWARGS, **llm_kwargs}
    return {
        "model": str(model),
        "llm_kwargs": kwargs,
        "runs": [
            {"name": "mixed", "prompts": PROMPTS, "sampling": GREEDY},
            {"name": "teacher_forced", "prompts": PROMPTS, "sampling": TEACHER_FORCED},
        ],
    }


def _models(root: Path) -> dict[str, Path]:
    return {
        "qwen3": checkpoints.write_qwen3_8b_shaped(root / "qwen3-8b-shaped"),
        "sliding": checkpoints.write_sliding_window_llama(root / "sliding-window"),
        "mla": checkpoints.write_deepseek_v2_lite_shaped(root / "deepseek-v2-lite-shaped"),
        "mla128": checkpoints.write_deepseek_v2_lite_shaped(root / "deepseek-128-heads", heads=128),
        "draft": checkpoints.write_dflash_draft(root / "dflash-draft"),
        "draft_mixed": checkpoints.write_dflash_draft(
            root / "dflash-draft-mixed", layer_types=("sliding_attention", "full_attention")
        ),
    }


def _jobs(models: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Every engine the suite compares, by name: (model, backend, KV dtype, speculation)."""
    qwen3, sliding, mla, mla128 = (
        models["qwen3"],
        models["sliding"],
        models["mla"],
        models["mla128"],
    )
    dflash = {
        "method": "dflash",
        "model": str(models["draft"]),
        "num_speculative_tokens": 7,
        # vLLM picks the draft's backend on its own unless told (FLASH_ATTN on the H200).
        "attention_backend": "BWX_ATTN",
    }
    jobs = {
        "qwen3-flash_attn": job_spec(qwen3, attention_backend="FLASH_ATTN"),
        "qwen3-triton_attn": job_spec(qwen3, attention_backend="TRITON_ATTN"),
        "qwen3-bwx_attn": job_spec(qwen3, attention_backend="BWX_ATTN"),
        "qwen3-bwx_attn-paged": job_spec(qwen3, attention_backend="BWX_ATTN"),
        "qwen3-triton_attn-fp8": job_spec(
            qwen3, attention_backend="TRITON_ATTN", kv_cache_dtype="fp8"
        ),
        "qwen3-bwx_attn-fp8": job_spec(qwen3, attention_backend="BWX_ATTN", kv_cache_dtype="fp8"),
        "sliding-flash_attn": job_spec(sliding, attention_backend="FLASH_ATTN"),
        "sliding-triton_attn": job_spec(sliding, attention_backend="TRITON_ATTN"),
        "sliding-bwx_attn": job_spec(sliding, attention_backend="BWX_ATTN"),
        # vLLM's own choice on this GPU (FLASH_ATTN_MLA on sm90), its Triton MLA, and ours.
        "mla-default": job_spec(mla),
        "mla-triton_mla": job_spec(mla, attention_backend="TRITON_MLA"),
        "mla-bwx_mla": job_spec(mla, attention_backend="BWX_MLA"),
        "mla-triton_mla-fp8": job_spec(mla, attention_backend="TRITON_MLA", kv_cache_dtype="fp8"),
        "mla-bwx_mla-fp8": job_spec(mla, attention_backend="BWX_MLA", kv_cache_dtype="fp8"),
        # 128 heads (DeepSeek-V3 at TP1): BWX_MLA's 64-row decode tiles, TMA-read on Hopper.
        "mla128-default": job_spec(mla128),
        "mla128-triton_mla": job_spec(mla128, attention_backend="TRITON_MLA"),
        "mla128-bwx_mla": job_spec(mla128, attention_backend="BWX_MLA"),
        "mla128-triton_mla-fp8": job_spec(
            mla128, attention_backend="TRITON_MLA", kv_cache_dtype="fp8"
        ),
        "mla128-bwx_mla-fp8": job_spec(mla128, attention_backend="BWX_MLA", kv_cache_dtype="fp8"),
        "dflash-bwx_attn": job_spec(qwen3, attention_backend="BWX_ATTN", speculative_config=dflash),
        "dflash-bwx_attn-fp8": job_spec(
            qwen3, attention_backend="BWX_ATTN", kv_cache_dtype="fp8", speculative_config=dflash
        ),
        # A z-lab mixed draft (sliding causal + full non-causal layers): vLLM's V1 runner
        # refuses it, its V2 runner (the default on CUDA) takes it.
        "dflash_mixed-bwx_attn": job_spec(
            qwen3,
            attention_backend="BWX_ATTN",
            speculative_config=dict(dflash, model=str(models["draft_mixed"])),
        ),
    }
    if has_speculative_method_registry():
        # vLLM 0.34+: the same draft through our registered speculative method.
        method = dict(dflash, method=components.DFLASH_METHOD)
        jobs["dflash_method-bwx_attn"] = job_spec(
            qwen3, attention_backend="BWX_ATTN", speculative_config=method
        )
    return jobs


# Engine environments beyond the defaults, by job: the TMA path for fresh prompts switched off.
JOB_ENV = {"qwen3-bwx_attn-paged": {FRESH_PREFILL.name: "0"}}


def _run_job(name: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One engine job; a failure is kept as the job's result, so the other jobs still run."""
    started = time.perf_counter()
    try:
        result = run_engine_job(spec, workdir, JOB_ENV.get(name), cpu=False, spawn=True)
    except (AssertionError, OSError) as exc:
        return {"error": f"{name}: {exc}"}
    wall = time.perf_counter() - started
    print(f"[gpu_e2e] {name}: {wall:.0f} s (load {result['load_s']:.0f} s)", flush=True)
    return result


@pytest.fixture(scope="session")
def engines(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Results of every engine job, run a few at a time; a failed job holds its log tail."""
    root = Path(os.environ.get("BWX_GPU_E2E_DIR") or tmp_path_factory.mktemp("gpu-e2e"))
    models = _models(root / "models")
    jobs = _jobs(models)
    only = os.environ.get(ONLY_JOBS_ENV)
    if only:
        wanted = set(only.split(","))
        if wanted - set(jobs):
            raise ValueError(f"{ONLY_JOBS_ENV}: no such jobs {sorted(wanted - set(jobs))}")
        jobs = {name: spec for name, spec in jobs.items() if name in wanted}
    with ThreadPoolExecutor(max_workers=CONCURRENT_JOBS) as pool:
        futures = {n: pool.submit(_run_job, n, s, root / "jobs" / n) for n, s in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    (root / "summary.md").write_text(summarise(results))
    return results


# Pairs whose teacher-forced gap the summary reports: vLLM's own noise first, then ours.
SUMMARY_PAIRS = [
    ("qwen3-flash_attn", "qwen3-triton_attn"),
    ("qwen3-bwx_attn", "qwen3-flash_attn"),
    ("qwen3-bwx_attn-paged", "qwen3-flash_attn"),
    ("qwen3-triton_attn-fp8", "qwen3-flash_attn"),
    ("qwen3-bwx_attn-fp8", "qwen3-flash_attn"),
    ("sliding-flash_attn", "sliding-triton_attn"),
    ("sliding-bwx_attn", "sliding-flash_attn"),
    ("mla-default", "mla-triton_mla"),
    ("mla-bwx_mla", "mla-default"),
    ("mla-bwx_mla", "mla-triton_mla"),
    ("mla-bwx_mla-fp8", "mla-triton_mla-fp8"),
    ("mla128-default", "mla128-triton_mla"),
    ("mla128-bwx_mla", "mla128-default"),
    ("mla128-bwx_mla-fp8", "mla128-triton_mla-fp8"),
    ("dflash-bwx_attn", "qwen3-bwx_attn"),
    ("dflash-bwx_attn-fp8", "qwen3-bwx_attn-fp8"),
    ("dflash_mixed-bwx_attn", "qwen3-bwx_attn"),
]


def summarise(engines: dict[str, dict[str, Any]]) -> str:
    """Markdown: every engine's backends and timings, and the teacher-forced gaps (nats)."""
    lines = ["| engine | served by | load s | generate s |", "|---|---|---|---|"]
    for name, r in engines.items():
        if "error" in r:
            lines.append(f"| {name} | FAILED | - | - |")
            continue
        served = ", ".join(sorted(served_by(r)))
        lines.append(f"| {name} | {served} | {r['load_s']:.0f} | {r['generate_s']:.2f} |")
    lines += ["", "| run | against | max | mean |", "|---|---|---|---|"]
    for a, b in SUMMARY_PAIRS:
        if "error" in engines.get(a, {"error": 1}) or "error" in engines.get(b, {"error": 1}):
            continue
        d = teacher_forced_deltas(engines[a], engines[b])
        lines.append(f"| {a} | {b} | {max(d):.3f} | {sum(d) / len(d):.4f} |")
    return "\n".join(lines) + "\n"


def result_of(engines: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    if name not in engines:
        pytest.skip(f"engine job {name} not run ({ONLY_JOBS_ENV}={os.environ[ONLY_JOBS_ENV]})")
    result = engines[name]
    if "error" in result:
        raise AssertionError(f"engine job failed: {result['error']}")
    return result


def served_by(result: dict[str, Any]) -> set[str]:
    """Attention backend names serving the layers, over all workers."""
    return {name.split(" ")[0] for worker in result["attention_backends"] for name in worker}


def teacher_forced_deltas(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """|delta| of every prompt token's log-probability between two runs."""
    rows = zip(a["runs"]["teacher_forced"], b["runs"]["teacher_forced"], strict=True)
    return [
        abs(x - y)
        for ra, rb in rows
        for x, y in zip(ra["prompt_logprobs"], rb["prompt_logprobs"], strict=True)
    ]


def backend_noise(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """Max and mean teacher-forced gap between two of vLLM's own backends on the same model:
    what bf16 rounding alone (different tile orders, different kernels) moves it."""
    deltas = teacher_forced_deltas(a, b)
    return max(deltas), sum(deltas) / len(deltas)


# Slack on top of twice vLLM's own backend-to-backend noise, in nats.
MAX_SLACK, MEAN_SLACK = 0.05, 0.01
# Where the reference's best token leads the runner-up by less than this (plus twice the noise),
# rounding may pick the other token and the rows are compared no further.
NEAR_TIE_NATS = 0.1


def assert_matches_within_noise(
    ours: dict[str, Any], reference: dict[str, Any], noise: tuple[float, float]
) -> None:
    """Teacher-forced log-probabilities within 2x noise + slack (max and mean); greedy rows
    token for token, each token's log-probability within the same bound, a different token
    allowed only at a near tie (the row is then compared no further)."""
    noise_max, noise_mean = noise
    bound_max, bound_mean = 2 * noise_max + MAX_SLACK, 2 * noise_mean + MEAN_SLACK
    deltas = teacher_forced_deltas(reference, ours)
    assert len(deltas) == sum(len(p) - 1 for p in PROMPTS)
    assert max(deltas) <= bound_max, (max(deltas), bound_max, noise)
    assert sum(deltas) / len(deltas) <= bound_mean, (sum(deltas) / len(deltas), bound_mean)
    compared = total = 0
    tie = NEAR_TIE_NATS + 2 * noise_max
    for ref_row, row in zip(reference["runs"]["mixed"], ours["runs"]["mixed"], strict=True):
        total += len(ref_row["token_ids"])
        for step, (ref_tok, tok) in enumerate(
            zip(ref_row["token_ids"], row["token_ids"], strict=True)
        ):
            if tok != ref_tok:
                best, runner_up = ref_row["top_logprobs"][step][:2]
                assert best - runner_up <= tie, (step, best - runner_up, tie, ref_row, row)
                break
            delta = abs(ref_row["logprobs"][step] - row["logprobs"][step])
            assert delta <= bound_max, (step, delta, bound_max)
            compared += 1
    assert 4 * compared >= total, f"only {compared} of {total} greedy steps were compared"
