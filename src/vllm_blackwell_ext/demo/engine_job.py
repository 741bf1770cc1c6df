"""Run a batch of generations through a real vLLM engine and report them as JSON.

Used by `vllm-bwx demo`, the DFlash acceptance benchmark and the e2e tests, each job in a
child process so environment opt-ins apply to every vLLM process. vLLM starts its engine core
and workers in spawned processes, so this module must only do work under
`if __name__ == "__main__"` or when called.

Job spec (JSON): {"model": dir, "llm_kwargs": {...}, "register_backends": {name: class path},
"runs": [{"name": str, "prompts": [[token ids], ...], "sampling": {SamplingParams kwargs},
"one_at_a_time": bool}]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _attention_backends_of_worker(worker) -> dict[str, list[str]]:
    """Runs inside each worker (collective_rpc): backend name -> attention layers it serves."""
    context = worker.model_runner.vllm_config.compilation_config.static_forward_context
    served: dict[str, list[str]] = {}
    for layer_name, layer in context.items():
        backend = getattr(layer, "attn_backend", None)
        impl = getattr(layer, "impl", None)
        if backend is None or impl is None:
            continue
        key = f"{backend.get_name()} ({type(impl).__module__}.{type(impl).__name__})"
        served.setdefault(key, []).append(layer_name)
    return served


def layer_modes_of_worker(worker) -> dict[str, list]:
    """Runs inside each worker: [causal, window] of every layer that carries its own attention
    mode (our DFlash draft's layers), by layer name."""
    from vllm_blackwell_ext.attention.layer_overrides import LAYER_CAUSAL_ATTR, LAYER_WINDOW_ATTR

    context = worker.model_runner.vllm_config.compilation_config.static_forward_context
    return {
        name: [getattr(layer, LAYER_CAUSAL_ATTR), getattr(layer, LAYER_WINDOW_ATTR, None)]
        for name, layer in context.items()
        if hasattr(layer, LAYER_CAUSAL_ATTR)
    }


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    # Named backends the job brings along (e.g. a test-only backend), registered the way
    # register() registers ours, so that they survive vLLM's spawned processes.
    if spec.get("register_backends"):
        from vllm_blackwell_ext.registration import register_named_backend

        for name, class_path in spec["register_backends"].items():
            register_named_backend(name, class_path)
    started = time.perf_counter()
    llm = LLM(model=spec["model"], **spec.get("llm_kwargs", {}))
    try:
        return _generate(llm, spec, SamplingParams, load_s=time.perf_counter() - started)
    finally:
        # Stop the engine core and its workers now: left to garbage collection, a console
        # script (vllm-bwx demo) can wait on them forever after printing its result.
        llm.llm_engine.engine_core.shutdown()


def worker_report(llm, fn) -> list[dict[str, Any]]:
    """What `fn` reports from each worker; reporting only: never fail a generation over it."""
    try:
        return llm.collective_rpc(fn)
    except Exception as exc:
        return [{"unavailable": [repr(exc)]}]


def _generate(llm, spec: dict[str, Any], sampling_params_cls, load_s: float) -> dict[str, Any]:
    backends = worker_report(llm, _attention_backends_of_worker)
    layer_modes = worker_report(llm, layer_modes_of_worker)
    results: dict[str, Any] = {}
    generated = 0
    gen_started = time.perf_counter()
    for run in spec["runs"]:
        sampling = sampling_params_cls(**run.get("sampling", {}))
        prompts = [{"prompt_token_ids": ids} for ids in run["prompts"]]
        if run.get("one_at_a_time"):
            # each prompt alone: the batch's composition cannot depend on request timing
            outputs = [llm.generate([p], sampling, use_tqdm=False)[0] for p in prompts]
        else:
            outputs = llm.generate(prompts, sampling, use_tqdm=False)
        rows = []
        for out in outputs:
            completion = out.outputs[0]
            logprobs = top_logprobs = None
            if completion.logprobs is not None:
                logprobs = [
                    float(step[tok].logprob)
                    for step, tok in zip(completion.logprobs, completion.token_ids, strict=True)
                ]
                # each step's best log-probabilities, highest first (margins between candidates)
                top_logprobs = [
                    sorted((float(lp.logprob) for lp in step.values()), reverse=True)
                    for step in completion.logprobs
                ]
            prompt_logprobs = None
            if out.prompt_logprobs is not None:
                # teacher-forced: log-probability of each actual prompt token (first has none)
                prompt_logprobs = [
                    float(step[tok].logprob)
                    for step, tok in zip(
                        out.prompt_logprobs[1:], out.prompt_token_ids[1:], strict=True
                    )
                ]
            rows.append(
                {
                    "token_ids": list(completion.token_ids),
                    "logprobs": logprobs,
                    "top_logprobs": top_logprobs,
                    "prompt_logprobs": prompt_logprobs,
                }
            )
            generated += len(completion.token_ids)
        results[run["name"]] = rows
    gen_s = time.perf_counter() - gen_started
    metrics = _spec_decode_metrics(llm)
    return {
        "runs": results,
        "attention_backends": backends,
        "layer_modes": layer_modes,
        "load_s": load_s,
        "generate_s": gen_s,
        "generated_tokens": generated,
        "tokens_per_s": generated / gen_s if gen_s > 0 else 0.0,
        "spec_decode": metrics,
    }


def _spec_decode_metrics(llm) -> dict[str, float | list[int]]:
    """Speculative-decoding counters from vLLM's metrics (empty when not speculating); the
    per-position counters stay vectors (index i: drafts whose slot i was accepted)."""
    try:
        metrics = llm.get_metrics()
    except Exception:
        return {}
    found: dict[str, float | list[int]] = {}
    for metric in metrics:
        if metric.name.startswith("vllm:spec_decode"):
            value = getattr(metric, "value", None)
            if value is not None:
                found[metric.name] = float(value)
            elif getattr(metric, "values", None) is not None:
                found[metric.name] = [int(v) for v in metric.values]
    return found


def run_job_in_process(
    spec: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    *,
    timeout: float | None = None,
    stream: bool = False,
) -> tuple[dict[str, Any] | None, int, Path]:
    """Run a job in a fresh interpreter (so `env`'s opt-ins reach every vLLM process it
    starts), in `workdir`, its output in `workdir/log` unless `stream`.

    Returns (the result, or None when the job failed; its exit status; the log's path).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = workdir / "spec.json", workdir / "out.json", workdir / "log"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "vllm_blackwell_ext.demo.engine_job", spec_path, out_path]
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd,
            env=env,
            stdout=None if stream else log,
            stderr=None if stream else subprocess.STDOUT,
            timeout=timeout,
            cwd=workdir,
        )
    if proc.returncode != 0 or not out_path.exists():
        return None, proc.returncode, log_path
    return json.loads(out_path.read_text()), proc.returncode, log_path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m vllm_blackwell_ext.demo.engine_job SPEC.json OUT.json")
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    result = run_job(spec)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


def exit_now(status: int) -> None:
    """Leave without interpreter finalisation, once results are written and the engine is shut
    down: finalisation can abort the process ("terminate called without an active exception",
    from a native thread torn down at exit) after its work has completed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
