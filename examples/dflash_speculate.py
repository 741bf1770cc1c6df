"""DFlash speculative decoding: a block-diffusion draft proposes a whole block per step from the
target's hidden states, the target verifies it; output equals the target's own greedy output.

GPU:  python examples/dflash_speculate.py --target Qwen/Qwen3-8B \\
          --draft z-lab/Qwen3-8B-DFlash-b16 --block 16
CPU:  python examples/dflash_speculate.py
      (trains a tiny target + draft pair on the CPU first, about 2 minutes on 2 cores, cached;
      then two engines, speculative and the target alone, about 4 minutes, our kernels in
      Triton's interpreter; its acceptance is low: `python benchmarks/bench_dflash.py` trains
      the full pair and measures it properly)

Both target and draft layers run on `BWX_ATTN` (the draft's non-causal block attention too).
Prints the generated tokens and vLLM's spec-decode counters: mean acceptance length (tokens
committed per target step) and acceptance per draft position; on the CPU it then runs the
target alone and checks that speculation left the greedy output unchanged (lossless).
"""

from __future__ import annotations

import argparse
import os

import _local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model (default on the CPU: the tiny pair's)")
    parser.add_argument("--draft", help="DFlash draft model (z-lab format)")
    parser.add_argument("--block", type=int, default=4, help="draft block size")
    parser.add_argument("--verbose", action="store_true", help="vLLM's log on the terminal")
    args = parser.parse_args()
    log = _local.quiet_logs("dflash_speculate", args.verbose)
    on_gpu = _local.has_gpu()
    if not on_gpu:
        _local.cpu_setup("attn")
    if args.target is None or args.draft is None:
        dflash_pair = _local.dflash_pair_trainer()
        quick = dflash_pair.PairSettings(
            target_steps=150, draft_steps=100, distill_sequences=64, block_sizes=(args.block,)
        )
        print("training the tiny target + draft pair on the CPU (once; cached) ...", flush=True)
        pair = dflash_pair.build_pair(_local.CACHE / "dflash", quick, log=lambda _: None)
        target, draft = str(pair / "target"), str(pair / f"draft-b{args.block}")
        prompts = [{"prompt_token_ids": p} for p in dflash_pair.held_out_prompts(3)]
    else:
        target, draft = args.target, args.draft
        prompts = ["Write a haiku about paged attention.", "Explain speculative decoding."]

    from vllm import LLM, SamplingParams

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # see offline_generate
    llm = LLM(
        model=target,
        attention_backend="BWX_ATTN",
        dtype="bfloat16",
        max_model_len=512 if not on_gpu else 8192,
        enforce_eager=not on_gpu,
        skip_tokenizer_init=args.target is None,
        disable_log_stats=False,  # vLLM's spec-decode counters are stats
        seed=0,
        speculative_config={
            "method": "dflash",
            "model": draft,
            "num_speculative_tokens": args.block - 1,
            "attention_backend": "BWX_ATTN",
        },
    )
    sampling = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    for out in outputs:
        print(f"{out.outputs[0].token_ids if args.target is None else out.outputs[0].text!r}")
    counters = {m.name: m for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    drafts = counters["vllm:spec_decode_num_drafts"].value
    accepted = counters["vllm:spec_decode_num_accepted_tokens"].value
    per_pos = counters["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    print(
        f"target steps with a draft: {drafts}; mean acceptance length {1 + accepted / drafts:.2f}"
    )
    print("acceptance per draft position: " + " ".join(f"{n / drafts:.2f}" for n in per_pos))
    llm.llm_engine.engine_core.shutdown()
    if args.target is None:
        # Lossless: the target alone, greedy, must give the same tokens.
        print("the target alone, for the lossless check ...", flush=True)
        target_only = LLM(
            model=target, attention_backend="BWX_ATTN", dtype="bfloat16", max_model_len=512,
            enforce_eager=True, skip_tokenizer_init=True, seed=0,
        )  # fmt: skip
        alone = target_only.generate(prompts, sampling, use_tqdm=False)
        tokens = [[o.outputs[0].token_ids for o in run] for run in (alone, outputs)]
        same = [a == b for a, b in zip(*tokens, strict=True)]
        print(f"speculative output equals the target's own greedy output: {all(same)}")
        target_only.llm_engine.engine_core.shutdown()
        if not all(same):
            raise SystemExit("speculative decoding changed the output")
    if log:
        print(f"vLLM's log: {log}")


if __name__ == "__main__":
    main()
