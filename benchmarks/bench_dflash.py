"""DFlash acceptance: mean accepted length and per-position acceptance of a tiny trained
target + draft pair, for block sizes 4, 8 and 16. Runs on the CPU (or a GPU):

    python benchmarks/bench_dflash.py [--blocks 4,8,16] [--engine vllm-default|BWX_ATTN|none]

The pair is trained on first use (`benchmarks/dflash_pair.py`, fixed seed, a few minutes on the
CPU) and cached. For every block size B the draft proposes B - 1 tokens per step
(`num_speculative_tokens = B - 1`) at temperature 0 on held-out prompts, measured twice:

- the oracle: `reference/dflash.py` (z-lab's `dflash_generate`, pure torch, fp32);
- vLLM: a real engine serving the target with our DFlash draft
  (`"method": "dflash"`), acceptance read from vLLM's own spec-decode counters. Its greedy
  tokens are checked against the oracle's: in fp32 (the default with vLLM's attention) they
  must be equal; in bf16 (`--dtype bfloat16`, or `--engine BWX_ATTN`) the target's own greedy
  text drifts from the fp32 oracle's, so tau is measured on slightly different sequences.

tau (mean acceptance length) = committed tokens per verification step = 1 + accepted drafts
per step, the paper's definition. Per-position acceptance p_i = share of steps whose first i
proposals were all accepted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.dflash_pair import PairSettings, build_pair, held_out_prompts
from benchmarks.harness import Row, progress, report
from vllm_blackwell_ext.demo.engine_job import run_job_in_process

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-bwx"


def _oracle(pair: Path, block: int, prompts: list[list[int]], max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    from vllm_blackwell_ext.dflash.config import load_dflash_plan
    from vllm_blackwell_ext.dflash.loader import read_draft_tensors, read_mask_embedding
    from vllm_blackwell_ext.reference.dflash import RefDraftSpec, dflash_generate_reference

    target = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    draft = pair / f"draft-b{block}"
    plan = load_dflash_plan(draft)
    spec = RefDraftSpec(
        num_heads=plan.num_attention_heads,
        num_kv_heads=plan.num_key_value_heads,
        head_dim=plan.head_dim,
        target_layer_ids=plan.target_layer_ids,
        mask_token_id=plan.mask_token_id,
        block_size=block,
        layer_attention=tuple((lp.causal, lp.sliding_window) for lp in plan.layers),
        rms_norm_eps=plan.rms_norm_eps,
        rope_theta=plan.rope_theta,
    )
    weights = read_draft_tensors(draft, plan, dtype=torch.float32).tensors
    mask = read_mask_embedding(draft, plan)
    tokens, accepted = [], []
    for p in progress(prompts, desc=f"oracle b{block}"):
        r = dflash_generate_reference(target, spec, weights, p, max_tokens, mask_embedding=mask)
        tokens.append(r.tokens)
        accepted += [s.accepted for s in r.steps]
    return {"tokens": tokens, "accepted": accepted}


def _engine(
    pair: Path,
    block: int,
    prompts: list[list[int]],
    max_tokens: int,
    backend: str,
    tmp: Path,
    dtype: str | None = None,
) -> dict:
    """One vLLM engine (own process: vLLM spawns its workers) with our draft."""
    on_gpu = torch.cuda.is_available()
    env = dict(os.environ)
    llm_kwargs: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "max_model_len": 512,
        "seed": 0,
        # fp32 matches the oracle exactly; BWX_ATTN takes fp16/bf16 only
        "dtype": dtype or ("float32" if backend == "vllm-default" else "bfloat16"),
        "gpu_memory_utilization": 0.5 if on_gpu else 0.2,
        "enforce_eager": not on_gpu,
        "disable_log_stats": False,  # the spec-decode counters are stats
        "speculative_config": {
            "method": "dflash",
            "model": str(pair / f"draft-b{block}"),
            "num_speculative_tokens": block - 1,
        },
    }
    if not on_gpu:
        env |= {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
        if backend == "BWX_ATTN":  # the CPU platform ignores attention_backend: opt-in route
            env |= {"BWX_CPU_BACKENDS": "attn", "TRITON_INTERPRET": "1"}
    elif backend == "BWX_ATTN":
        llm_kwargs["attention_backend"] = "BWX_ATTN"
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    job = {
        "model": str(pair / "target"),
        "llm_kwargs": llm_kwargs,
        "runs": [
            {
                "name": "dflash",
                "prompts": prompts,
                "sampling": {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True},
                "one_at_a_time": True,  # steps of one request: no batching effects on timing
            }
        ],
    }
    out, status, log_path = run_job_in_process(job, tmp / f"b{block}", env)
    if out is None:
        raise RuntimeError(f"engine job for block {block} failed:\n{log_path.read_text()[-4000:]}")
    sd = out["spec_decode"]
    return {
        "tokens": [row["token_ids"] for row in out["runs"]["dflash"]],
        "drafts": int(sd.get("vllm:spec_decode_num_drafts", 0)),
        "accepted_total": int(sd.get("vllm:spec_decode_num_accepted_tokens", 0)),
        "per_pos": list(sd.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])),
        "generate_s": out["generate_s"],
    }


def oracle_stats(accepted: list[int], n_spec: int) -> tuple[float, list[float]]:
    """tau and per-position acceptance from each step's accepted-draft count."""
    steps = max(1, len(accepted))
    tau = 1.0 + sum(accepted) / steps
    return tau, [sum(a >= i for a in accepted) / steps for i in range(1, n_spec + 1)]


def engine_stats(e: dict) -> tuple[float, list[float]]:
    drafts = max(1, e["drafts"])
    return 1.0 + e["accepted_total"] / drafts, [c / drafts for c in e["per_pos"]]


def acceptance_rows(blocks: list[dict[str, Any]]) -> list[Row]:
    """Harness rows of the per-block records: tau and each position's acceptance, ours (the vLLM
    engine serving our draft) against the oracle; without an engine run, the oracle's alone."""
    rows = []
    for r in blocks:
        engine = "engine_tau" in r
        peers = {"oracle": r["oracle_tau"]} if engine else {}
        tau = r["engine_tau"] if engine else r["oracle_tau"]
        rows.append(Row(f"B={r['block']}", "tau", tau, peers))
        for i, p in enumerate(r["oracle_per_pos"], start=1):
            ours = r["engine_per_pos"][i - 1] if engine else p
            rows.append(
                Row(f"B={r['block']} p{i}", "acceptance", ours, {"oracle": p} if engine else {})
            )
    return rows


def block_notes(blocks: list[dict[str, Any]]) -> list[str]:
    """Per block: the steps each side ran and whether vLLM's greedy tokens equal the oracle's."""
    notes = []
    for r in blocks:
        line = f"B={r['block']}: oracle {r['oracle_steps']} verification steps"
        if "engine_tau" in r:
            same = "yes" if r["tokens_equal_oracle"] else "NO"
            line += f", vLLM {r['engine_drafts']}; vLLM's greedy tokens equal the oracle's: {same}"
        notes.append(line)
    return notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/bench_dflash.py", description=__doc__)
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where the pair is trained")
    ap.add_argument("--blocks", default="4,8,16", help="block sizes (each has its own draft)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--engine",
        default="vllm-default",
        choices=["vllm-default", "BWX_ATTN", "none"],
        help="attention backend of the vLLM engine run (none: oracle only)",
    )
    ap.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="engine dtype (default: float32 for vllm-default, bfloat16 for BWX_ATTN)",
    )
    ap.add_argument("--out-dir", default="benchmarks/results")
    args = ap.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    settings = PairSettings()
    unknown = sorted(set(blocks) - set(settings.block_sizes))
    if unknown:
        ap.error(f"--blocks: drafts are trained for {settings.block_sizes}; got {unknown}")

    started = time.perf_counter()
    pair = build_pair(args.cache_dir, settings)
    prompts = held_out_prompts(args.prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bwx-dflash-") as tmp:
        for b in blocks:
            oracle = _oracle(pair, b, prompts, args.max_tokens)
            tau, per_pos = oracle_stats(oracle["accepted"], b - 1)
            row: dict[str, Any] = {
                "block": b,
                "oracle_tau": tau,
                "oracle_per_pos": per_pos,
                "oracle_steps": len(oracle["accepted"]),
            }
            if args.engine != "none":
                eng = _engine(pair, b, prompts, args.max_tokens, args.engine, Path(tmp), args.dtype)
                e_tau, e_pos = engine_stats(eng)
                row |= {
                    "engine_tau": e_tau,
                    "engine_per_pos": e_pos,
                    "engine_drafts": eng["drafts"],
                    "tokens_equal_oracle": eng["tokens"] == oracle["tokens"],
                }
            rows.append(row)

    dtype = args.dtype or ("float32" if args.engine == "vllm-default" else "bfloat16")
    command = "python benchmarks/bench_dflash.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    who = (
        f"ours = a vLLM engine ({args.engine}, {dtype}) serving our DFlash draft, its acceptance "
        "read from vLLM's spec-decode counters; peer oracle = reference/dflash.py (fp32)"
        if args.engine != "none"
        else "ours = the oracle, reference/dflash.py (fp32): no engine run (--engine none)"
    )
    notes = [
        who,
        f"{args.prompts} held-out prompts of 16 tokens, {args.max_tokens} new tokens each, "
        "temperature 0, num_speculative_tokens = B - 1.",
        f"pair: {pair.name} (trained on first use with fixed seed {settings.seed}).",
        "tau = 1 + accepted drafts per verification step; acceptance 'B=b pi' = P(first i "
        "proposals accepted).",
        *block_notes(rows),
    ]
    slug = "cpu" if not torch.cuda.is_available() else "gpu"
    suffix = "" if args.engine == "vllm-default" else f"-{args.engine.lower()}"
    suffix += "" if dtype == "float32" or args.engine != "vllm-default" else f"-{dtype}"
    report(
        acceptance_rows(rows),
        slug,
        f"dflash-acceptance{suffix}",
        command.strip(),
        args.out_dir,
        notes=notes,
        extra={"blocks": rows},
    )
    print(f"done in {time.perf_counter() - started:.0f} s")
    bad = [r["block"] for r in rows if r.get("tokens_equal_oracle") is False]
    if bad and dtype == "float32":
        print(f"vLLM's greedy tokens differ from the fp32 oracle's for B={bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
