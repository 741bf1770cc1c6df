"""This checkout's kernels against the same kernels at another git revision, side by side.

What a restructuring or a kernel change costs, per case, on one GPU: in one process and on the
same inputs, each op of this checkout and the same op as it was at `--rev` (default 87dcf05,
the state before the one-package-per-op restructuring) are captured in CUDA graphs and their
replays timed (device time) in two rounds of opposite order (old then new, new then old); each
figure is the mean of its two rounds' medians. Both sides' outputs are compared with
torch.equal once per case. Ops, through their public entry points (the same import path and
keyword names at both revisions):

- paged_attention  `kernels.paged_attention.paged_attention` (Qwen3-8B: 32/8 heads, head 128)
- mla_decode       `kernels.mla_decode.mla_decode` (DeepSeek: latent 512 + rope 64, page 64)
- kv_gather        `ops.gather_and_maybe_dequant_cache` (fp8 MLA pages -> bf16)

The old revision is loaded as its own package: `git archive <rev> src/vllm_blackwell_ext` is
unpacked into a temporary folder, the package renamed `vllm_blackwell_ext_at_<rev>` and every
`vllm_blackwell_ext` in its files rewritten to that name (its torch.library namespace too, so
its ops do not collide with this checkout's), then imported. Where git or the revision is not
at hand, prepare a copy beforehand and pass it with `--old-src`:

    git archive 87dcf05 src/vllm_blackwell_ext | tar -x -C .old_rev     # mkdir .old_rev first
    python benchmarks/vs_revision.py [--rev 87dcf05] [--old-src .old_rev] [--ops OP ...]
        [--quick] [--out-dir benchmarks/results]
    python benchmarks/vs_revision.py --check     # no GPU: tiny cases, outputs must be equal

Writes `<out-dir>/<gpu>-vs-revision.{json,md,png}` through `benchmarks.harness.report`
("ours" = this checkout, the peer named after the revision). `--check` runs tiny shapes under
Triton's CPU interpreter (on a GPU when one is there), times nothing and fails on any output
that is not bit-identical.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if "--check" in sys.argv[1:]:
    # Before triton is imported: without a GPU the check runs under the interpreter.
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

PACKAGE = "vllm_blackwell_ext"
DEFAULT_REV = "87dcf05"
OPS = ("paged_attention", "mla_decode", "kv_gather")
NEW = "this checkout"
Runner = tuple[Callable[[], Any], list[torch.Tensor]]


# ---- the old revision as an importable package ----


def _archive(rev: str, dest: Path) -> Path:
    """`git archive rev src/vllm_blackwell_ext` unpacked under `dest`; the package's path."""
    try:
        done = subprocess.run(
            ["git", "archive", "--format=tar", rev, f"src/{PACKAGE}"],
            cwd=REPO,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError as e:
        done = subprocess.CompletedProcess([], 1, b"", str(e).encode())
    if done.returncode:
        raise RuntimeError(
            f"git archive {rev} failed here ({done.stderr.decode().strip()}): where the history "
            f"is, run `mkdir .old_rev && git archive {rev} src/{PACKAGE} | tar -x -C .old_rev` "
            "and pass --old-src .old_rev"
        )
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src" / PACKAGE


def _package_in(old_src: Path) -> Path:
    """The package folder in an extracted copy: DIR/src/<pkg>, DIR/<pkg> or DIR itself."""
    for cand in (old_src / "src" / PACKAGE, old_src / PACKAGE, old_src):
        if (cand / "__init__.py").is_file() and (cand / "kernels").is_dir():
            return cand
    raise FileNotFoundError(f"--old-src: expected src/{PACKAGE} under {old_src}, found none")


def load_revision(rev: str, old_src: str | Path | None = None) -> ModuleType:
    """The package as it was at `rev` (or as found in `old_src`), imported under its own name."""
    name = PACKAGE + "_at_" + re.sub(r"\W", "_", rev)
    if name in sys.modules:
        return sys.modules[name]
    root = Path(tempfile.mkdtemp(prefix="bwx-rev-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    source = _package_in(Path(old_src)) if old_src else _archive(rev, root / "archive")
    target = root / "pkgs" / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    word = re.compile(rf"\b{PACKAGE}\b")
    for path in target.rglob("*.py"):
        path.write_text(word.sub(name, path.read_text()))
    sys.path.insert(0, str(root / "pkgs"))
    return importlib.import_module(name)


def revision_available(rev: str) -> bool:
    """Whether git is here and knows `rev` (what loading it without --old-src needs)."""
    try:
        done = subprocess.run(
            ["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True
        )
    except FileNotFoundError:
        return False
    return done.returncode == 0


def module_of(pkg: ModuleType, sub: str) -> ModuleType:
    return importlib.import_module(f"{pkg.__name__}.{sub}")


# ---- paged attention (Qwen3-8B shapes) ----


@dataclass(frozen=True)
class AttnCase:
    name: str
    batch: int
    ctx: int  # KV length of each request, its query tokens included
    q_len: int
    fp8: bool = False
    page: int = 16
    hq: int = 32
    hkv: int = 8
    d: int = 128


class PagedAttention:
    op = "paged_attention"

    @staticmethod
    def cases(quick: bool) -> list[AttnCase]:
        if quick:
            return [
                AttnCase("decode bf16 B=8 ctx=8k", 8, 8192, 1),
                AttnCase("decode fp8 B=8 ctx=8k", 8, 8192, 1, fp8=True),
                AttnCase("verify causal q=16 B=8 ctx=8k", 8, 8192, 16),
                AttnCase("prefill causal B=1 L=2k fresh", 1, 2048, 2048),
                AttnCase("prefill chunk 512 after 1.5k ctx page=128", 1, 2048, 512, page=128),
            ]
        cs = [AttnCase(f"decode bf16 B={b} ctx={c // 1024}k", b, c, 1)
              for b, c in ((1, 32768), (8, 32768), (64, 32768), (1, 131072))]  # fmt: skip
        cs += [AttnCase(f"decode fp8 B={b} ctx=32k", b, 32768, 1, fp8=True) for b in (8, 64)]
        return [
            *cs,
            AttnCase("verify causal q=16 B=8 ctx=32k", 8, 32768, 16),
            AttnCase("prefill causal B=1 L=8k fresh", 1, 8192, 8192),
            AttnCase("prefill chunk 2k after 14k ctx page=16", 1, 16384, 2048),
            AttnCase("prefill chunk 2k after 14k ctx page=128", 1, 16384, 2048, page=128),
        ]

    @staticmethod
    def check_cases() -> list[AttnCase]:
        small = {"hq": 4, "hkv": 2, "d": 64}
        return [
            AttnCase("decode bf16 B=2 ctx=40", 2, 40, 1, **small),
            AttnCase("decode fp8 B=2 ctx=33", 2, 33, 1, fp8=True, **small),
            AttnCase("prefill chunk 20 after 30 ctx", 1, 50, 20, **small),
        ]

    @staticmethod
    def inputs(c: AttnCase, device: str) -> dict:
        torch.manual_seed(0)
        pages = -(-c.ctx // c.page)
        nb = c.batch * pages
        kv = torch.empty(nb, c.hkv, c.page, 2 * c.d, dtype=torch.bfloat16, device=device)
        kv.normal_()
        if c.fp8:
            kv8 = torch.empty(kv.shape, dtype=torch.float8_e4m3fn, device=device)
            for i in range(0, nb, 65536):  # chunked: no second full-size temporary
                kv8[i : i + 65536] = kv[i : i + 65536].to(torch.float8_e4m3fn)
            kv = kv8
        k, v = kv.transpose(1, 2).split(c.d, dim=-1)  # vLLM's layout: [blocks, page, heads, d]
        q_lens = torch.tensor([0] + [c.q_len] * c.batch, dtype=torch.int32)
        scale = (lambda s: torch.tensor([s], device=device)) if c.fp8 else (lambda s: None)
        return {
            "q": torch.randn(c.batch * c.q_len, c.hq, c.d, dtype=torch.bfloat16, device=device),
            "k": k,
            "v": v,
            "bt": torch.randperm(nb, device=device).to(torch.int32).view(c.batch, pages),
            "cu": q_lens.cumsum(0, dtype=torch.int32).to(device),
            "seq_lens": torch.full((c.batch,), c.ctx, dtype=torch.int32, device=device),
            "k_scale": scale(0.7),
            "v_scale": scale(0.9),
        }

    @staticmethod
    def runner(pkg: ModuleType, c: AttnCase, x: dict) -> Runner:
        mod = module_of(pkg, "kernels.paged_attention")
        ws = mod.SplitKVWorkspace.for_device(c.hq, c.hkv, c.d, x["q"].device)
        out = torch.zeros_like(x["q"])

        def fn() -> None:
            mod.paged_attention(
                x["q"], x["k"], x["v"], out, x["cu"], x["seq_lens"], x["bt"],
                max_seqlen_q=c.q_len, max_seqlen_k=c.ctx, softmax_scale=c.d**-0.5, causal=True,
                k_scale=x["k_scale"], v_scale=x["v_scale"], workspace=ws,
            )  # fmt: skip

        return fn, [out]


# ---- MLA decode (DeepSeek shapes) ----


@dataclass(frozen=True)
class MlaCase:
    name: str
    heads: int
    batch: int
    ctx: int
    fp8: bool = False
    q_len: int = 1
    page: int = 64
    rank: int = 512
    rope: int = 64


class MlaDecode:
    op = "mla_decode"

    @staticmethod
    def cases(quick: bool) -> list[MlaCase]:
        if quick:
            return [
                MlaCase("h16 bf16 B=8 ctx=8k", 16, 8, 8192),
                MlaCase("h16 fp8 B=8 ctx=8k", 16, 8, 8192, fp8=True),
                MlaCase("h16 bf16 q_len=4 B=8 ctx=8k", 16, 8, 8192, q_len=4),
                MlaCase("h128 bf16 B=8 ctx=8k", 128, 8, 8192),
            ]
        return [
            MlaCase("h16 bf16 B=64 ctx=32k", 16, 64, 32768),
            MlaCase("h16 bf16 B=8 ctx=32k", 16, 8, 32768),
            MlaCase("h16 bf16 B=64 ctx=4k", 16, 64, 4096),
            MlaCase("h16 bf16 B=1 ctx=16k", 16, 1, 16384),
            MlaCase("h16 fp8 B=64 ctx=32k", 16, 64, 32768, fp8=True),
            MlaCase("h16 bf16 q_len=4 B=64 ctx=8k", 16, 64, 8192, q_len=4),
            MlaCase("h128 bf16 B=64 ctx=32k", 128, 64, 32768),
        ]

    @staticmethod
    def check_cases() -> list[MlaCase]:
        return [
            MlaCase("h4 bf16 B=2 ctx=40", 4, 2, 40, page=16),
            MlaCase("h4 fp8 q_len=2 B=2 ctx=33", 4, 2, 33, fp8=True, q_len=2, page=16),
        ]

    @staticmethod
    def inputs(c: MlaCase, device: str) -> dict:
        torch.manual_seed(0)
        per_seq = -(-c.ctx // c.page)
        pages = c.batch * per_seq + 16
        cache = torch.empty(pages, c.page, c.rank + c.rope, dtype=torch.bfloat16, device=device)
        cache.normal_()
        if c.fp8:
            fp8 = torch.empty(cache.shape, dtype=torch.float8_e4m3fn, device=device)
            for i in range(0, pages, 4096):  # chunked: no fp32 copy of the cache
                fp8[i : i + 4096] = (cache[i : i + 4096] * 8).to(torch.float8_e4m3fn)
            cache = fp8
        perm = torch.randperm(pages, device=device)[: c.batch * per_seq]
        rows = c.batch * c.q_len
        return {
            "q": torch.randn(rows, c.heads, c.rank + c.rope, dtype=torch.bfloat16, device=device),
            "cache": cache,
            "bt": perm.view(c.batch, per_seq).to(torch.int32),
            "seq_lens": torch.full((c.batch,), c.ctx, dtype=torch.int32, device=device),
            "k_scale": torch.tensor([0.125], device=device) if c.fp8 else None,
        }

    @staticmethod
    def runner(pkg: ModuleType, c: MlaCase, x: dict) -> Runner:
        mod = module_of(pkg, "kernels.mla_decode")
        q = x["q"]
        out = torch.zeros(q.shape[0], c.heads, c.rank, dtype=q.dtype, device=q.device)
        lse = torch.zeros(q.shape[0], c.heads, dtype=torch.float32, device=q.device)

        def fn() -> None:
            # No workspace: mla_decode plans from max_seq_len and sizes its own scratch (in
            # the graph's pool when captured), as a standalone call does at both revisions.
            mod.mla_decode(
                q, x["cache"], x["bt"], x["seq_lens"], out,
                softmax_scale=(c.rank + c.rope) ** -0.5, kv_lora_rank=c.rank,
                query_len=c.q_len, k_scale=x["k_scale"], lse_out=lse, max_seq_len=c.ctx,
            )  # fmt: skip

        return fn, [out, lse]


# ---- the paged-KV gather op ----


@dataclass(frozen=True)
class GatherCase:
    name: str
    batch: int
    ctx: int
    kv: str = "fp8"  # kv_cache_dtype, or "cp" for cp_gather_cache's raw copy
    block: int = 64
    entry: tuple[int, ...] = (576,)
    starts: bool = False


def _gather_case(batch: int, ctx: int) -> GatherCase:
    label = f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)
    return GatherCase(f"fp8->bf16 B={batch} ctx={label}", batch, ctx)


class KvGather:
    op = "kv_gather"

    @staticmethod
    def cases(quick: bool) -> list[GatherCase]:
        if quick:
            return [_gather_case(b, c) for b, c in ((1, 2048), (8, 4096), (8, 32768))]
        shapes = [(1, 256), (1, 2048), (4, 2048), (1, 4096), (1, 32768), (8, 4096), (8, 32768),
                  (64, 32768)]  # fmt: skip
        return [_gather_case(b, c) for b, c in shapes]

    @staticmethod
    def check_cases() -> list[GatherCase]:
        return [
            GatherCase("fp8->bf16 B=3 ctx=50 seq_starts", 3, 50, block=16, starts=True),
            GatherCase("bf16 [2, 2, 16] B=2 ctx=30", 2, 30, kv="auto", block=16, entry=(2, 2, 16)),
            GatherCase("cp_gather u8 B=2 ctx=40 seq_starts", 2, 40, kv="cp", block=16, starts=True),
        ]

    @staticmethod
    def inputs(c: GatherCase, device: str) -> dict:
        gen = torch.Generator(device=device).manual_seed(0)
        pages = -(-(c.ctx + c.block) // c.block)  # room for a start offset under one page
        num_blocks = c.batch * pages + 16
        shape = (num_blocks, c.block, *c.entry)
        if c.kv == "auto":
            src = torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)
        else:
            src = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8)
            if c.kv != "cp":
                src[(src & 0x7F) == 0x7F] = 0  # no e4m3 NaN encodings: outputs compare equal
        starts = torch.arange(c.batch, dtype=torch.int32, device=device) * 7 % c.block
        lens = torch.full((c.batch,), c.ctx, dtype=torch.int32, device=device)
        cu = torch.zeros(c.batch + 1, dtype=torch.int32, device=device)
        cu[1:] = lens.cumsum(0)
        perm = torch.randperm(num_blocks, generator=gen, device=device)[: c.batch * pages]
        batch_ids = torch.arange(c.batch, dtype=torch.int32, device=device)
        return {
            "src": src,
            "bt": perm.view(c.batch, pages).to(torch.int32),
            "cu": cu,
            "t2s": torch.repeat_interleave(batch_ids, lens),
            "tokens": c.batch * c.ctx,
            "scale": torch.tensor([0.0371], dtype=torch.float32, device=device),
            "starts": starts if c.starts else None,
        }

    @staticmethod
    def runner(pkg: ModuleType, c: GatherCase, x: dict) -> Runner:
        ops = module_of(pkg, "ops")
        dtype = x["src"].dtype if c.kv == "cp" else torch.bfloat16
        dst = torch.zeros(x["tokens"], *c.entry, dtype=dtype, device=x["src"].device)
        if c.kv == "cp":
            return (
                lambda: ops.cp_gather_cache(x["src"], dst, x["bt"], x["cu"], c.batch, x["starts"]),
                [dst],
            )
        rest = (x["t2s"], x["tokens"], c.kv, x["scale"], x["starts"])

        def fn() -> None:
            ops.gather_and_maybe_dequant_cache(x["src"], dst, x["bt"], x["cu"], *rest)

        return fn, [dst]


BENCHES = {b.op: b for b in (PagedAttention, MlaDecode, KvGather)}


# ---- running both sides ----


def _mismatches(case: str, old: Sequence[torch.Tensor], new: Sequence[torch.Tensor]) -> list[str]:
    return [
        f"{case}: output {i} differs ({NEW} vs the revision)"
        for i, (a, b) in enumerate(zip(old, new, strict=True))
        if not torch.equal(a, b)
    ]


def run_check(
    rev: str = DEFAULT_REV,
    ops: Sequence[str] = OPS,
    old_src: str | Path | None = None,
    device: str | None = None,
) -> list[str]:
    """Run every op's tiny check cases on both sides; the cases whose outputs differ."""
    import vllm_blackwell_ext

    device = device or ("cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
    sides = {"old": load_revision(rev, old_src), "new": vllm_blackwell_ext}
    bad: list[str] = []
    for op in ops:
        bench = BENCHES[op]
        for case in bench.check_cases():
            x = bench.inputs(case, device)
            outs = {}
            for label, pkg in sides.items():
                fn, outs[label] = bench.runner(pkg, case, x)
                fn()
            found = _mismatches(f"{op}: {case.name}", outs["old"], outs["new"])
            if not any(bool(o.count_nonzero()) for o in outs["new"]):
                found.append(f"{op}: {case.name}: wrote nothing (the outputs stayed zero)")
            print(f"{op}: {case.name}: " + ("DIFFERS" if found else "equal"), flush=True)
            bad += found
    return bad


def _graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured in a CUDA graph (after a warm-up on a side stream); its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay  # the bound method keeps the graph (and its memory pool) alive


@dataclass
class Timing:
    op: str
    case: str
    old_us: float
    new_us: float
    equal: bool

    @property
    def ratio(self) -> float:
        return self.new_us / self.old_us


def time_case(bench: Any, case: Any, sides: dict[str, ModuleType], rep_ms: float) -> Timing:
    """Both sides of one case: outputs compared once, then two rounds of graph replays."""
    from benchmarks.harness import bench_us

    x = bench.inputs(case, "cuda")
    fns, outs = {}, {}
    for label, pkg in sides.items():
        fns[label], outs[label] = bench.runner(pkg, case, x)
        fns[label]()  # compiles, outside the capture
    torch.cuda.synchronize()
    equal = not _mismatches(case.name, outs["old"], outs["new"])
    replays = {label: _graphed(fn) for label, fn in fns.items()}
    medians: dict[str, list[float]] = {label: [] for label in sides}
    for order in (("old", "new"), ("new", "old")):
        for label in order:
            medians[label].append(bench_us(replays[label], rep_ms=rep_ms))
    return Timing(
        bench.op,
        case.name,
        statistics.fmean(medians["old"]),
        statistics.fmean(medians["new"]),
        equal,
    )


# ---- host time of BWX_ATTN's per-layer launch ----

HOST_CASES = [
    AttnCase("decode bf16 B=8 ctx=8k", 8, 8192, 1),
    AttnCase("decode fp8 B=64 ctx=8k", 64, 8192, 1, fp8=True),
    AttnCase("verify causal q=16 B=8 ctx=8k", 8, 8192, 16),
    AttnCase("prefill chunk 512 after 1.5k ctx page=128", 1, 2048, 512, page=128),
]


def forward_launch(pkg: ModuleType, c: AttnCase, x: dict) -> Callable[[], Any]:
    """What BWX_ATTN's forward launches per layer at `pkg`'s revision, the batch's plan made
    beforehand (by the metadata builder, once per batch): with the plan API, the plan's launch;
    before it, the kernel call with the builder's split count, inputs checked already."""
    mod = module_of(pkg, "kernels.paged_attention")
    info = module_of(pkg, "kernels.device").device_info(x["q"].device)
    ws = mod.SplitKVWorkspace.for_device(c.hq, c.hkv, c.d, x["q"].device)
    out = torch.zeros_like(x["q"])
    layout = mod.paged_cache_layout(x["k"], x["v"])
    tokens = x["q"].shape[0]
    if hasattr(mod, "launch_paged_attention"):
        shape = mod.AttnShape.of_layout(info, x["q"], layout)
        plan = mod.plan_paged_attention(
            shape, num_tokens=tokens, max_seqlen_q=c.q_len, max_seqlen_k=c.ctx,
            max_splits=ws.max_splits, max_rows=ws.max_rows,
        )  # fmt: skip
        layer = mod.LayerOptions(c.d**-0.5, k_scale=x["k_scale"], v_scale=x["v_scale"])
        args = (plan, x["q"], layout, out, x["cu"], x["seq_lens"], x["bt"], layer)
        return lambda: mod.launch_paged_attention(*args, workspace=ws)
    splits = mod.plan_split_kv(
        tokens, c.q_len, c.ctx, c.hkv, info, kv_elem=x["k"].element_size()
    )  # fmt: skip
    return lambda: mod.paged_attention(
        x["q"], x["k"], x["v"], out, x["cu"], x["seq_lens"], x["bt"], max_seqlen_q=c.q_len,
        max_seqlen_k=c.ctx, softmax_scale=c.d**-0.5, k_scale=x["k_scale"], v_scale=x["v_scale"],
        workspace=ws, num_splits=splits, check_inputs=False, cache_layout=layout,
    )  # fmt: skip


def host_us(fn: Callable[[], Any], n: int = 50, repeats: int = 9) -> float:
    """Host wall time of one eager call, no synchronisation: the best of `repeats` bursts of
    `n` calls, the GPU drained between bursts."""
    import time

    fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best / n * 1e6


def time_host(case: AttnCase, sides: dict[str, ModuleType]) -> Timing:
    """Host time per layer of BWX_ATTN's launch at both revisions, in alternating rounds."""
    x = PagedAttention.inputs(case, "cuda")
    fns = {label: forward_launch(pkg, case, x) for label, pkg in sides.items()}
    best: dict[str, float] = {label: float("inf") for label in sides}
    for order in (("old", "new"), ("new", "old"), ("old", "new")):
        for label in order:
            best[label] = min(best[label], host_us(fns[label]))
    return Timing("paged_attention host", case.name, best["old"], best["new"], True)


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _notes(rev: str, timings: Sequence[Timing]) -> list[str]:
    head = _git("rev-parse", "--short", "HEAD") or "commit unknown"
    dirty = " with uncommitted changes under src/" if _git("status", "--porcelain", "src") else ""
    notes = [
        f"ours = this checkout ({head}{dirty}); {rev} = src/{PACKAGE} as it was at {rev}, "
        "loaded beside it in the same process, on the same inputs",
        "us = device time of one CUDA-graph replay: the median of do_bench (L2 flushed) in "
        "each of two rounds (old then new, new then old), the two medians averaged",
        "paged_attention host rows (--host): host wall time of one eager per-layer launch as "
        "BWX_ATTN's forward makes it at each revision (batch planned beforehand), the best of "
        "9 bursts of 50 calls in three alternating rounds",
    ]
    for op in dict.fromkeys(t.op for t in timings):
        rs = [t.ratio for t in timings if t.op == op]
        gm = math.exp(statistics.fmean(math.log(r) for r in rs))
        notes.append(f"{op}: new/old geometric mean {gm:.3f}, range {min(rs):.3f}-{max(rs):.3f}")
    slower = [f"{t.op}: {t.case} ({t.ratio:.3f})" for t in timings if t.ratio > 1.02]
    notes.append("rows slower than 2%: " + (", ".join(slower) if slower else "none"))
    differ = [f"{t.op}: {t.case}" for t in timings if not t.equal]
    notes.append("outputs not bit-identical: " + (", ".join(differ) if differ else "none"))
    return notes


def run_timing(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import vllm_blackwell_ext
    from benchmarks.harness import Row, gpu_slug, report

    sides = {"old": load_revision(args.rev, args.old_src), "new": vllm_blackwell_ext}
    print(f"case | {args.rev} us | {NEW} us | new/old | outputs", flush=True)
    timings: list[Timing] = []
    for op in args.ops:
        bench = BENCHES[op]
        for case in bench.cases(args.quick):
            if args.only and args.only not in f"{op}: {case.name}":
                continue
            t = time_case(bench, case, sides, args.rep_ms)
            timings.append(t)
            same = "equal" if t.equal else "DIFFER"
            print(f"{op}: {t.case} | {t.old_us:.2f} | {t.new_us:.2f} | {t.ratio:.3f} | {same}",
                  flush=True)  # fmt: skip
            torch.cuda.empty_cache()
    for case in HOST_CASES if args.host else []:
        t = time_host(case, sides)
        timings.append(t)
        print(f"{t.op}: {t.case} | {t.old_us:.2f} | {t.new_us:.2f} | {t.ratio:.3f} | host",
              flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    rows = [Row(f"{t.op}: {t.case}", "us", t.new_us, {args.rev: t.old_us}) for t in timings]
    # Where the files go does not change them: leave --out-dir out of the recorded command.
    shown = [a for i, a in enumerate(argv) if a != "--out-dir" and argv[i - 1 : i] != ["--out-dir"]]
    command = " ".join(["python benchmarks/vs_revision.py", *shown])
    report(
        rows,
        args.gpu or gpu_slug(),
        "vs-revision",
        command,
        args.out_dir,
        _notes(args.rev, timings),
    )
    return 0 if all(t.equal for t in timings) else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python benchmarks/vs_revision.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rev", default=DEFAULT_REV, help="git revision to compare against")
    ap.add_argument(
        "--old-src", default=None, help=f"an extracted copy of the revision's src/{PACKAGE}"
    )
    ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    ap.add_argument("--only", default=None, help="only cases whose 'op: case' has this substring")
    ap.add_argument(
        "--check", action="store_true", help="tiny cases, no timing: outputs must be bit-identical"
    )
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument(
        "--host", action="store_true", help="also the host time of BWX_ATTN's per-layer launch"
    )
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--gpu", default=None, help="name in the result files (default: detected)")
    args = ap.parse_args(argv)
    if args.check:
        bad = run_check(args.rev, args.ops, args.old_src)
        print("\n".join(bad) if bad else f"check: every output equals {args.rev}'s")
        return 1 if bad else 0
    if not torch.cuda.is_available():
        print("vs_revision: timing needs a CUDA GPU (--check runs without one)", file=sys.stderr)
        return 2
    return run_timing(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
