"""Compile BWX_ATTN's kernels for each device class's own architecture, without a GPU.

For each launch shape family BWX_ATTN makes (head sizes, GQA, single-token decode, verify and
draft blocks, prefill; 2-byte and fp8 caches; split or not; the feature sets of the model
families it serves), `plan_paged_attention` plans it as it would on a GPU of that class, and
the launches `planned_launches` returns for that plan are compiled, not run, for that
architecture with Triton's bundled ptxas (`benchmarks/offline_compile.py`). Each distinct
compile must build, not be a trap kernel, fit the class's shared memory per block and spill
no registers inside its loops (a value ptxas parks in local memory once per program costs
nothing that matters); the exit status is non-zero otherwise.

    python benchmarks/attn_offline_check.py --check sm120 [--check sm100 ...] [--verbose]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import multiprocessing
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.offline_compile import (
    CLASS_CAPABILITY,
    OfflineCompile,
    compile_offline,
    signature_of,
)
from vllm_blackwell_ext.kernels.device import (
    MIN_FP8_CAPABILITY,
    SMEM_LIMIT_BY_CAPABILITY,
    DeviceInfo,
    device_class_of,
)
from vllm_blackwell_ext.kernels.paged_attention import (
    SPLIT_KV_MAX_QUERY_LEN,
    AttnShape,
    KernelLaunch,
    LayerOptions,
    paged_cache_layout,
    plan_paged_attention,
    planned_launches,
    tuning_for,
)
from vllm_blackwell_ext.kernels.paged_attention.launch import ATTENTION_LAUNCHER

# (head_size, head_size_v): every padded width the kernel has, and unequal K/V heads.
HEADS = [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)]
# (query tokens per request, GQA): single-token decode (MHA, GQA 4 and 16), short verify,
# 16-token verify / DFlash draft blocks (64 and 128 rows), prefill (GQA 1 and 4).
SHAPES = [(1, 1), (1, 4), (1, 16), (4, 8), (16, 4), (16, 8), (512, 1), (512, 4)]
# Split counts of decode-shaped launches: none, few (merged in the kernel by 16-row tiles),
# many (the merge kernel).
SPLITS = [1, 4, 16]
# Optional features as model families use them: attention sinks with a window (gpt-oss), a
# soft-cap with a window (Gemma 2), non-causal blocks with a window (DFlash drafts' sliding
# layers); the last only on decode-shaped launches, as drafts are.
FEATURES = ("causal", "sinks+window", "softcap+window", "non-causal+window")
# The quick matrix (the kernel tests run it): each feature set on the head width of its family,
# the unequal pair, every tile shape, few splits.
QUICK = [((128, 128), "causal"), ((192, 128), "causal"), ((64, 64), "sinks+window"),
         ((256, 256), "softcap+window"), ((128, 128), "non-causal+window")]  # fmt: skip
QUICK_SPLITS = [1, 4]
NUM_KV_HEADS, PAGE, CONTEXT = 2, 16, 4096
# The kernels of the recorded launches by name, filled before the compile workers fork.
KERNELS: dict[str, object] = {}
# Where spills inside a loop are reported but not counted as failures. sm90: its configs stay
# as they ran on the H200 and H100 until a GPU measures an alternative, since a spill-free one
# can be slower (the 64-row fp8 verify tile spills 32 B in DFlash draft layers with a window;
# the spill-free choices ran 1.08-1.75x slower on an H100). sm100: ptxas holds many of these
# kernels at 128 registers whatever the tile (Triton 3.7.1-3.9), and which tiles then spill a
# few bytes (8-32 B) moves between releases; its configs are chosen clean under 3.7.1, vLLM
# 0.32's. Traps, shared memory and compile failures count everywhere.
LOOP_SPILLS_REPORTED_ONLY = {"sm90", "sm100"}


@dataclass(frozen=True)
class Case:
    head: tuple[int, int]
    q_len: int
    gqa: int
    fp8: bool
    splits: int
    features: str  # one of FEATURES
    page: int = PAGE

    def __str__(self) -> str:
        kv = "fp8" if self.fp8 else "bf16"
        return (
            f"head {self.head[0]}/{self.head[1]} q={self.q_len} gqa={self.gqa} {kv} "
            f"splits={self.splits} {self.features} page={self.page}"
        )


def cases(capability: tuple[int, int], quick: bool = False) -> Iterator[Case]:
    fp8s = (False, True) if capability >= MIN_FP8_CAPABILITY else (False,)
    pairs = QUICK if quick else list(itertools.product(HEADS, FEATURES))
    for (head, features), (q_len, gqa), fp8 in itertools.product(pairs, SHAPES, fp8s):
        decode_shaped = q_len <= SPLIT_KV_MAX_QUERY_LEN
        if features == "non-causal+window" and not decode_shaped:
            continue
        for n in (QUICK_SPLITS if quick else SPLITS) if decode_shaped else (1,):
            yield Case(head, q_len, gqa, fp8, n, features)
        # Prefill on the classes that read whole page tiles through TMA runs on such pages too.
        tuning = tuning_for(device_class_of(capability))
        if not decode_shaped and tuning.prefill_tma:
            yield Case(head, q_len, gqa, fp8, 1, features, tuning.prefill_wide_tile_n)


def record(case: Case, info: DeviceInfo) -> list[KernelLaunch]:
    """The launches of one call of `case` as planned on `info`'s class (CPU tensors)."""
    head_k, head_v = case.head
    batch = 2
    kv_dtype = torch.float8_e4m3fn if case.fp8 else torch.bfloat16
    page = case.page
    blocks = batch * CONTEXT // page
    # vLLM's layout: [blocks, kv heads, page, K + V], K and V views of it
    kv = torch.empty(blocks, NUM_KV_HEADS, page, head_k + head_v, dtype=kv_dtype)
    layout = paged_cache_layout(*kv.transpose(1, 2).split([head_k, head_v], dim=-1))
    heads = NUM_KV_HEADS * case.gqa
    q = torch.empty(batch * case.q_len, heads, head_k, dtype=torch.bfloat16)
    out = torch.empty(batch * case.q_len, heads, head_v, dtype=torch.bfloat16)
    scale = torch.ones(1) if case.fp8 else None
    plan = plan_paged_attention(
        AttnShape.of_layout(info, q, layout), num_tokens=q.shape[0], max_seqlen_q=case.q_len,
        max_seqlen_k=CONTEXT, num_splits=case.splits,
    )  # fmt: skip
    layer = LayerOptions(
        softmax_scale=head_k**-0.5,
        causal=case.features != "non-causal+window",
        sliding_window=None if case.features == "causal" else 1024,
        softcap=30.0 if case.features == "softcap+window" else 0.0,
        sinks=torch.zeros(heads) if case.features == "sinks+window" else None,
        k_scale=scale,
        v_scale=scale,
    )
    return planned_launches(
        plan, q, layout, out,
        torch.arange(batch + 1, dtype=torch.int32) * case.q_len,
        torch.full((batch,), CONTEXT, dtype=torch.int32),
        torch.zeros(batch, CONTEXT // page, dtype=torch.int32),
        layer,
    )  # fmt: skip


def check_class(device_class: str, *, quick: bool = False, jobs: int = 1,
                verbose: bool = False) -> int:  # fmt: skip
    """Compile every distinct launch of `device_class`; the number of failures."""
    capability = CLASS_CAPABILITY[device_class]
    limit = SMEM_LIMIT_BY_CAPABILITY[capability]
    info = DeviceInfo(device_class, capability, num_sms=132, smem_per_block=limit)
    compiles: dict[tuple, tuple[Case, str, tuple]] = {}
    for case in cases(capability, quick):
        for launch in record(case, info):
            name = "attn" if launch.launcher is ATTENTION_LAUNCHER else "merge"
            KERNELS[name] = launch.launcher.kernel
            args = launch.args  # in signature order
            options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
            if launch.max_registers:
                options["max_registers"] = launch.max_registers
            signature, constexprs, aligned = signature_of(launch.launcher.kernel, args)
            # GQA and exact head sizes change no tile: one compile per layout.
            layout = {k: v for k, v in constexprs.items() if k not in ("GQA", "HEAD_K",
                      "HEAD_V")}  # fmt: skip
            key = (name, tuple(signature.values()), tuple(layout.items()),
                   tuple(sorted(options.items())))  # fmt: skip
            job = (name, signature, constexprs, aligned, capability, options)
            compiles.setdefault(key, (case, name, job))
    ctx = multiprocessing.get_context("fork")  # the workers inherit the imported kernels
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        results = pool.map(_compile, [job for _, _, job in compiles.values()])
        bad = 0
        for (case, name, job), (stats, error) in zip(compiles.values(), results, strict=True):
            bad += _report(device_class, case, name, job, stats, error, limit, verbose)
    print(f"{device_class}: {len(compiles)} distinct compiles, {bad} failed", flush=True)
    return bad


def _compile(job: tuple) -> tuple[OfflineCompile | None, str]:
    """One offline compile (in a worker): its figures, or the compiler's error."""
    name, signature, constexprs, aligned, capability, options = job
    try:
        stats = compile_offline(
            KERNELS[name], signature, constexprs, aligned, capability[0] * 10 + capability[1],
            num_warps=options["num_warps"], num_stages=options["num_stages"],
            max_registers=options.get("max_registers", 0),
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compiler failure is this check's finding
        lines = str(e).strip().splitlines()
        return None, f"{type(e).__name__}: {lines[0][:200] if lines else ''}"
    return stats, ""


def _report(device_class, case, name, job, stats, error, limit, verbose) -> int:
    """Print a compile's line (failures always, the rest with `verbose`); 1 if it failed."""
    _, _, constexprs, _, _, options = job
    tiles = (
        f"BLOCK_M={constexprs['BLOCK_M']} TILE_N={constexprs['TILE_N']} " if name == "attn" else ""
    )
    launch = f"w{options['num_warps']} s{options['num_stages']}" + (
        f" maxnreg {options['max_registers']}" if options.get("max_registers") else ""
    )
    head = f"{device_class} {name} {case}: {tiles}{launch}"
    if stats is None:
        print(f"{head}: FAILED TO COMPILE {error}", flush=True)
        return 1
    tolerated = stats.loop_spills and device_class in LOOP_SPILLS_REPORTED_ONLY
    problems = [
        *(["over the shared memory limit"] if stats.shared > limit else []),
        *(["spills in a loop"] if stats.loop_spills and not tolerated else []),
        *(["traps"] if stats.traps else []),
        *(["wgmma serialized"] if stats.wgmma_serialized else []),
    ]
    if problems or verbose or tolerated:
        verdict = "FAIL: " + ", ".join(problems) if problems else "ok"
        verdict += " (spills in a loop: reported only on this class)" if tolerated else ""
        print(f"{head}: {stats} (limit {limit} B) {verdict}", flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="append", required=True, choices=sorted(CLASS_CAPABILITY),
                    help="a device class to compile for (repeatable)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="the kernel tests' smaller matrix")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    ap.add_argument("--verbose", action="store_true", help="print every compile, not failures")
    args = ap.parse_args(argv)
    import triton

    print(f"# triton {triton.__version__}, offline compiles", flush=True)
    bad = sum(
        check_class(c, quick=args.quick, jobs=args.jobs, verbose=args.verbose) for c in args.check
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
