"""Compile BWX_ATTN's kernels for each device class's own architecture, without a GPU.

For each launch shape family BWX_ATTN makes (head sizes, GQA, single-token decode, verify and
draft blocks, prefill; 2-byte and fp8 caches; split or not; the feature sets of the model
families it serves), `paged_attention` picks its config as it would on a GPU of that class.
The launches it would make are recorded instead of run and compiled for that architecture with
Triton's bundled ptxas (`benchmarks/offline_compile.py`). Each distinct compile must build, not
be a trap kernel, fit the class's shared memory per block and spill no registers inside its
loops (a value ptxas parks in local memory once per program costs nothing that matters); the
exit status is non-zero otherwise.

    python benchmarks/attn_offline_check.py --check sm120 [--check sm100 ...] [--verbose]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
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
from vllm_blackwell_ext.kernels import paged_attention as pa
from vllm_blackwell_ext.kernels.device import (
    MIN_FP8_CAPABILITY,
    SMEM_LIMIT_BY_CAPABILITY,
    DeviceInfo,
    device_class_of,
)
from vllm_blackwell_ext.kernels.paged_attention_configs import (
    PREFILL_TMA_CLASSES,
    PREFILL_WIDE_TILE_N,
)

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
# Prefill on the classes that read whole page tiles through TMA also runs on such pages.
TMA_PAGE = PREFILL_WIDE_TILE_N
KERNELS = {"attn": pa._paged_attn_kernel, "merge": pa._split_kv_merge_kernel}
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


class _Recorder:
    """Stands in for a kernel launcher: keeps the launches instead of making them."""

    def __init__(self) -> None:
        self.launches: list[tuple[object, tuple, dict]] = []

    def launch(self, grid, args, **options) -> None:
        self.launches.append((grid, args, options))


@contextlib.contextmanager
def _recording_as(info: DeviceInfo) -> Iterator[tuple[_Recorder, _Recorder]]:
    """`paged_attention` deciding as on `info`'s device class, recording its two launchers."""
    saved = pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER, pa._device_info
    attn, merge = _Recorder(), _Recorder()
    pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER = attn, merge  # type: ignore[assignment]
    pa._device_info = lambda device_index: info  # type: ignore[assignment]
    pa._kernel_constants.cache_clear()
    try:
        yield attn, merge
    finally:
        pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER, pa._device_info = saved
        pa._kernel_constants.cache_clear()


def cases(capability: tuple[int, int], quick: bool = False) -> Iterator[Case]:
    fp8s = (False, True) if capability >= MIN_FP8_CAPABILITY else (False,)
    pairs = QUICK if quick else list(itertools.product(HEADS, FEATURES))
    for (head, features), (q_len, gqa), fp8 in itertools.product(pairs, SHAPES, fp8s):
        decode_shaped = q_len <= pa.SPLIT_KV_MAX_QUERY_LEN
        if features == "non-causal+window" and not decode_shaped:
            continue
        for n in (QUICK_SPLITS if quick else SPLITS) if decode_shaped else (1,):
            yield Case(head, q_len, gqa, fp8, n, features)
        if not decode_shaped and device_class_of(capability) in PREFILL_TMA_CLASSES:
            yield Case(head, q_len, gqa, fp8, 1, features, TMA_PAGE)


def record(case: Case) -> None:
    """One `paged_attention` call of `case` on CPU tensors (its launches are recorded)."""
    head_k, head_v = case.head
    batch = 2
    kv_dtype = torch.float8_e4m3fn if case.fp8 else torch.bfloat16
    page = case.page
    blocks = batch * CONTEXT // page
    # vLLM's layout: [blocks, kv heads, page, K + V], K and V views of it
    kv = torch.empty(blocks, NUM_KV_HEADS, page, head_k + head_v, dtype=kv_dtype)
    key_cache, value_cache = kv.transpose(1, 2).split([head_k, head_v], dim=-1)
    heads = NUM_KV_HEADS * case.gqa
    q = torch.empty(batch * case.q_len, heads, head_k, dtype=torch.bfloat16)
    out = torch.empty(batch * case.q_len, heads, head_v, dtype=torch.bfloat16)
    scale = torch.ones(1) if case.fp8 else None
    pa.paged_attention(
        q, key_cache, value_cache, out,
        torch.arange(batch + 1, dtype=torch.int32) * case.q_len,
        torch.full((batch,), CONTEXT, dtype=torch.int32),
        torch.zeros(batch, CONTEXT // page, dtype=torch.int32),
        max_seqlen_q=case.q_len, max_seqlen_k=CONTEXT, softmax_scale=head_k**-0.5,
        causal=case.features != "non-causal+window",
        sliding_window=None if case.features == "causal" else 1024,
        sinks=torch.zeros(heads) if case.features == "sinks+window" else None,
        softcap=30.0 if case.features == "softcap+window" else 0.0,
        k_scale=scale, v_scale=scale, num_splits=case.splits, check_inputs=False,
    )  # fmt: skip


def check_class(device_class: str, *, quick: bool = False, jobs: int = 1,
                verbose: bool = False) -> int:  # fmt: skip
    """Compile every distinct launch of `device_class`; the number of failures."""
    capability = CLASS_CAPABILITY[device_class]
    limit = SMEM_LIMIT_BY_CAPABILITY[capability]
    info = DeviceInfo(device_class, capability, num_sms=132, smem_per_block=limit)
    compiles: dict[tuple, tuple[Case, str, tuple]] = {}
    with _recording_as(info) as recorders:
        for case in cases(capability, quick):
            for recorder in recorders:
                recorder.launches.clear()
            record(case)
            for name, recorder in zip(KERNELS, recorders, strict=True):
                for _, args, options in recorder.launches:
                    signature, constexprs, aligned = signature_of(KERNELS[name], args)
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
