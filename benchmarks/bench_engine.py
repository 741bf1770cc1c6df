"""Serving benchmark: a real vLLM 0.32 engine per attention backend, same model, same prompts.

Each engine runs in its own process with vLLM's defaults (torch.compile, CUDA graphs), on a
model of a real architecture with dummy weights (`load_format="dummy"`: nothing downloaded),
and is driven offline as `vllm bench throughput` does: a batch of B prompts of P random tokens
generating N tokens each, ignoring EOS. Each case runs once untimed, then `--repeats` times
timed, on new prompts each time (no prefix cache hits), and reports the medians; Triton
compilations during the timed runs are counted (a new batch shape must never
compile mid-serving). Reported per case: output tokens/s (higher is better), median time to
first token and median inter-token latency (lower is better), ours against each peer.

    python benchmarks/bench_engine.py                       # attention: BWX_ATTN vs vLLM's
    python benchmarks/bench_engine.py --family mla          # BWX_MLA vs vLLM's MLA backends
    python benchmarks/bench_engine.py --quick               # three small cases, for a smoke run

On a GPU machine without a registry: `scripts/gpu_kit.sh run python benchmarks/bench_engine.py`.
Writes benchmarks/results/<gpu>-engine[-mla].json (harness schema; every engine's raw figures
under "extra") and draws its .md and .png from it; `--render JSON` redraws them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

from benchmarks.harness import Row, gpu_slug, progress, report
from tests.gpu_e2e.checkpoints import (
    deepseek_v2_lite_shaped_config,
    qwen3_8b_shaped_config,
)

# (batch, prompt tokens, output tokens)
CASES: list[tuple[int, int, int]] = [
    (1, 512, 256),
    (8, 512, 256),
    (64, 512, 256),
    (256, 512, 128),
    (1, 32000, 256),
    (8, 32000, 128),
]
# Decode-heavy cases for MLA (its prefill is vLLM's own path whichever backend decodes).
MLA_CASES: list[tuple[int, int, int]] = [
    (1, 512, 256),
    (64, 512, 256),
    (1, 32000, 256),
    (8, 32000, 128),
]
QUICK_CASES: list[tuple[int, int, int]] = [(1, 512, 64), (64, 512, 64), (1, 8000, 64)]
MAX_MODEL_LEN = 33000
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

# Model configs: the shapes the GPU engine tests write checkpoints of, with the real
# vocabularies (dummy weights here, so their size costs nothing to write).
ATTENTION_CONFIG = qwen3_8b_shaped_config(4, vocab=151936)
MLA_CONFIG = deepseek_v2_lite_shaped_config(4, vocab=102400, max_positions=163840)
# Engines per family: (label, attention_backend, kv_cache_dtype), in the order they run (each
# engine's figures are saved as it finishes). The first is ours.
FAMILIES: dict[str, dict[str, Any]] = {
    "attention": {
        "config": ATTENTION_CONFIG,
        "engines": [
            ("BWX_ATTN", "BWX_ATTN", "auto"),
            ("FLASH_ATTN", "FLASH_ATTN", "auto"),
            ("BWX_ATTN fp8", "BWX_ATTN", "fp8"),
            ("TRITON_ATTN", "TRITON_ATTN", "auto"),
            ("FLASH_ATTN fp8", "FLASH_ATTN", "fp8"),
        ],
        # FlashInfer is not in the kit (it JIT-compiles with nvcc at first use): not run.
        "not_run": {"FLASHINFER": "flashinfer-python is not part of the GPU kit"},
    },
    "mla": {
        "config": MLA_CONFIG,
        "engines": [
            ("BWX_MLA", "BWX_MLA", "auto"),
            ("TRITON_MLA", "TRITON_MLA", "auto"),
            ("FLASHMLA", "FLASHMLA", "auto"),
            ("FLASH_ATTN_MLA", "FLASH_ATTN_MLA", "auto"),
            ("BWX_MLA fp8", "BWX_MLA", "fp8"),
        ],
        "not_run": {"FLASHINFER_MLA": "flashinfer-python is not part of the GPU kit"},
    },
}


def _prompts(seed: int, batch: int, length: int, vocab: int) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]} for _ in range(batch)
    ]


# vLLM's JIT monitor (jit_monitor_verbose=True) logs every kernel compiled after warm-up with
# this text; the driver brackets the timed runs of each case with markers in the same log.
JIT_WARNING = "JIT compilation during inference"
TIMED_START, TIMED_END = "[bench_engine] timed run starts", "[bench_engine] timed run ends"


def _count_jit_in_timed_runs(log: str) -> list[int]:
    """Compilations vLLM's JIT monitor reported inside the timed runs of each case, in order."""
    counts, inside = [], False
    for line in log.splitlines():
        if TIMED_START in line:
            counts.append(0)
            inside = True
        elif TIMED_END in line:
            inside = False
        elif inside and JIT_WARNING in line:
            counts[-1] += 1
    return counts


def _profiled_run(llm, sampling, batch: int, prompt_len: int, vocab: int, out: Path) -> None:
    """One more run of a case (new prompts) under vLLM's torch profiler; untimed. The engine
    writes its per-kernel GPU time table to `out` (`*.profiler_out.txt`)."""
    llm.start_profile()
    llm.generate(_prompts(3, batch, prompt_len, vocab), sampling, use_tqdm=False)
    llm.stop_profile()


def _run_figures(outputs, batch: int, out_len: int, wall: float) -> dict[str, float | None]:
    """Output tokens/s of one run, and its median TTFT and inter-token latency (ms)."""
    ttft, itl = [], []
    for out in outputs:
        m = out.metrics
        n = len(out.outputs[0].token_ids)
        if m is not None:
            ttft.append(m.first_token_latency * 1e3)
            if n > 1:
                itl.append((m.last_token_ts - m.first_token_ts) / (n - 1) * 1e3)
    return {
        "tokens_per_s": batch * out_len / wall,
        "wall_s": wall,
        "ttft_ms": statistics.median(ttft) if ttft else None,
        "itl_ms": statistics.median(itl) if itl else None,
    }


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _timed_case(
    llm,
    sampling_cls,
    batch: int,
    prompt_len: int,
    out_len: int,
    vocab: int,
    repeats: int = 1,
    profile_dir: Path | None = None,
) -> dict:
    """A warm run, then `repeats` timed runs (new prompts each); each figure is the median
    over the timed runs (a run of a few hundred milliseconds varies by ~20% alone)."""
    sampling = sampling_cls(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(_prompts(1, batch, prompt_len, vocab), sampling, use_tqdm=False)
    warm_s = time.perf_counter() - started
    print(TIMED_START, flush=True)
    runs = []
    for seed in range(2, 2 + repeats):
        started = time.perf_counter()
        outputs = llm.generate(_prompts(seed, batch, prompt_len, vocab), sampling, use_tqdm=False)
        runs.append(_run_figures(outputs, batch, out_len, time.perf_counter() - started))
    time.sleep(0.5)  # let the engine core's log lines of these runs land before the marker
    print(TIMED_END, flush=True)
    if profile_dir is not None:
        _profiled_run(llm, sampling, batch, prompt_len, vocab, profile_dir)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "out_len": out_len,
        **{key: _median([r[key] for r in runs]) for key in runs[0]},
        "first_run_s": warm_s,
        "runs": runs,
    }


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine (in this process): every case, timed as `_timed_case` says."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    kwargs = {"kv_cache_dtype": spec["kv_cache_dtype"]}
    if spec["backend"]:
        kwargs["attention_backend"] = spec["backend"]
    profile_dir = Path(spec["profile_dir"]) if spec.get("profile_dir") else None
    if profile_dir is not None:
        kwargs["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(profile_dir),
            "torch_profiler_with_stack": False,
        }
    llm = LLM(
        model=spec["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
        gpu_memory_utilization=0.85,
        disable_log_stats=False,
        jit_monitor_verbose=True,
        seed=0,
        # Graphs for exactly the batch sizes the cases decode (vLLM's default list has ~50
        # sizes; capturing them all costs start-up time and changes no figure here).
        compilation_config={"cudagraph_capture_sizes": CAPTURE_SIZES},
        **kwargs,
    )
    load_s = time.perf_counter() - started
    vocab = spec["vocab"]
    batches = [case[0] for case in spec["cases"]]
    profiled = batches.index(spec["profile_batch"]) if spec.get("profile_batch") in batches else -1
    cases = [
        _timed_case(
            llm,
            SamplingParams,
            *case,
            vocab,
            spec.get("repeats", 1),
            profile_dir if i == profiled else None,
        )
        for i, case in enumerate(spec["cases"])
    ]
    llm.llm_engine.engine_core.shutdown()
    return {"label": spec["label"], "load_s": load_s, "cases": cases}


def _run_engine_process(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    spec_path, out_path = workdir / f"{spec['slug']}.json", workdir / f"{spec['slug']}.out.json"
    log_path = workdir / f"{spec['slug']}.log"
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, __file__, "--engine", str(spec_path), str(out_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text()[-3000:]
        print(f"[bench_engine] {spec['label']} failed (exit {proc.returncode}):\n{tail}")
        return {"label": spec["label"], "error": tail}
    result = json.loads(out_path.read_text())
    counts = _count_jit_in_timed_runs(log_path.read_text())
    if len(counts) == len(result["cases"]):  # else the markers were lost: leave uncounted
        for case, count in zip(result["cases"], counts, strict=True):
            case["jit_compiles_in_timed_run"] = count
    return result


def _keep_profile(profile_dir: Path, dest: Path, name: str) -> None:
    """Copy the engine's per-kernel time table (the trace itself stays in the workdir)."""
    tables = sorted(profile_dir.glob("*.profiler_out.txt"))
    if tables:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / f"{name}.txt").write_text(tables[0].read_text())
        print(f"[bench_engine] profile: {dest / f'{name}.txt'}", flush=True)


def _case_name(case: dict[str, Any]) -> str:
    ctx = f"{case['prompt_len'] // 1000}k" if case["prompt_len"] >= 1000 else case["prompt_len"]
    return f"B={case['batch']} ctx {ctx}"


def build_rows(results: list[dict[str, Any]], ours_bf16: str) -> list[Row]:
    """Rows of the harness table: ours (bf16, and fp8 against fp8 peers) against the rest."""
    by_label = {r["label"]: r for r in results if "error" not in r}
    if ours_bf16 not in by_label:
        return []
    ours_fp8 = f"{ours_bf16} fp8" if f"{ours_bf16} fp8" in by_label else None
    rows: list[Row] = []
    for i in range(len(by_label[ours_bf16]["cases"])):
        for mine in (ours_bf16, ours_fp8):
            if mine is None:
                continue
            fp8 = mine.endswith("fp8")
            peers = [label for label in by_label if label != mine and label.endswith("fp8") == fp8]
            if fp8:
                peers.append(ours_bf16)  # is fp8 faster than our own bf16?
            ours_case = by_label[mine]["cases"][i]
            suffix = " fp8" if fp8 else ""
            for key, metric, label in (
                ("tokens_per_s", "tok/s", "output"),
                ("ttft_ms", "ms", "TTFT"),
                ("itl_ms", "ms", "ITL"),
            ):
                if ours_case[key] is None:
                    continue
                rows.append(
                    Row(
                        case=f"{_case_name(ours_case)} {label}{suffix}",
                        metric=metric,
                        ours=ours_case[key],
                        peers={
                            p: by_label[p]["cases"][i][key]
                            for p in peers
                            if by_label[p]["cases"][i][key] is not None
                        },
                    )
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="attention")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="three small cases")
    parser.add_argument("--only", default="", help="comma-separated engine labels to run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per case (figures are their median)"
    )
    parser.add_argument(
        "--profile-batch",
        type=int,
        metavar="B",
        help="after the timed runs of the first case of batch B, run it once more under vLLM's "
        "torch profiler; per-kernel GPU times go to <out-dir>/profiles/",
    )
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument(
        "--render", metavar="JSON", help="redraw the table, markdown and PNG of saved results"
    )
    parser.add_argument("--engine", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        raw = saved["extra"]
        out_dir = str(Path(args.render).parent)
        render(raw["engines"], raw["family"], raw["setup"], out_dir, saved["gpu"])
        return 0
    if args.engine:
        spec = json.loads(Path(args.engine[0]).read_text())
        result = run_engine(spec)
        Path(args.engine[1]).write_text(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)  # leave without finalising vLLM's threads (see demo.engine_job)

    family = FAMILIES[args.family]
    cases = QUICK_CASES if args.quick else (MLA_CASES if args.family == "mla" else CASES)
    engines = family["engines"]
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        engines = [e for e in engines if e[0] in wanted]
    workdir = Path(tempfile.mkdtemp(prefix="bwx-bench-engine-"))
    model = workdir / "model"
    model.mkdir()
    config = {**family["config"], "num_hidden_layers": args.layers}
    if args.family == "mla":
        config["first_k_dense_replace"] = args.layers  # dense MLPs: attention is what varies
    (model / "config.json").write_text(json.dumps(config, indent=1))
    op = "engine" if args.family == "attention" else "engine-mla"
    json_path = Path(args.out_dir) / f"{gpu_slug()}-{op}.json"
    command = shlex.join(["python", "benchmarks/bench_engine.py", *(argv or sys.argv[1:])])
    # A partial re-run keeps the other engines' figures from the last run.
    saved = json.loads(json_path.read_text()) if json_path.exists() else {}
    kept = saved.get("extra", {}).get("engines", [])
    arch = config["architectures"][0]
    setup = (
        f"Model: {arch} shapes, {args.layers} layers, dummy weights, bf16; vLLM defaults "
        f"(torch.compile, CUDA graphs; capture sizes {CAPTURE_SIZES}); each case: one untimed "
        f"run, then the median of the timed runs (new prompts each; their count per engine below)."
    )
    results: list[dict[str, Any]] = []
    for label, backend, kv_dtype in progress(engines, desc="engines"):
        slug = label.lower().replace(" ", "-")
        spec = {
            "label": label,
            "slug": slug,
            "backend": backend,
            "kv_cache_dtype": kv_dtype,
            "model": str(model),
            "vocab": config["vocab_size"],
            "cases": cases,
            "repeats": args.repeats,
        }
        if args.profile_batch is not None:
            spec["profile_batch"] = args.profile_batch
            spec["profile_dir"] = str(workdir / f"profile-{slug}")
        started = time.perf_counter()
        result = _run_engine_process(spec, workdir)
        if args.profile_batch is not None:
            name = f"{gpu_slug()}-{op}-{slug}-B{args.profile_batch}"
            _keep_profile(Path(spec["profile_dir"]), Path(args.out_dir) / "profiles", name)
        print(f"[bench_engine] {label}: {time.perf_counter() - started:.0f} s", flush=True)
        results.append({**result, "command": command, "repeats": args.repeats})
        # Written after every engine, so a run cut short keeps what finished.
        ran = {r["label"] for r in results}
        merged = [r for r in kept if r["label"] not in ran] + results
        render(merged, args.family, setup, args.out_dir, gpu_slug())
    return 0 if not any("error" in r for r in results) else 1


def render(
    results: list[dict[str, Any]], family_name: str, setup: str, out_dir: str, gpu: str
) -> None:
    """Table, markdown, JSON (with every engine's raw figures) and PNG of engine results."""
    family = FAMILIES[family_name]
    op = "engine" if family_name == "attention" else "engine-mla"
    rows = build_rows(results, family["engines"][0][0])
    notes = [
        setup,
        *(f"{name} not run: {why}" for name, why in family["not_run"].items()),
        *(f"{r['label']} failed: {r['error'][-300:]}" for r in results if "error" in r),
    ]
    for r in results:
        if "error" in r:
            continue
        counts = [c.get("jit_compiles_in_timed_run") for c in r["cases"]]
        jit = "not counted" if None in counts else str(sum(counts))
        notes.append(
            f"{r['label']}: {r.get('repeats', 1)} timed run(s) per case; engine start "
            f"{r['load_s']:.0f} s; kernels vLLM's JIT monitor saw compiled during timed runs: "
            f"{jit}; run by `{r.get('command', '?')}`"
        )
    commands = sorted({r.get("command", "?") for r in results})
    extra = {"engines": results, "family": family_name, "setup": setup}
    report(rows, gpu, op, " ; ".join(commands), out_dir, notes=notes, extra=extra)


if __name__ == "__main__":
    raise SystemExit(main())
