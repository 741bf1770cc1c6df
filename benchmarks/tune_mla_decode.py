"""Tune the MLA decode kernel's launch configs for the GPU this runs on, or check a table offline.

GPU sweep (default): for each KV dtype (bf16, fp8) and row tile (16, 32, 64 query rows per
request), time candidate configs on a representative shape, skip those that fail to compile
or spill registers, and print the device class's table entry for
`src/vllm_blackwell_ext/kernels/mla_decode/configs.py` (rewritten there with --write, also
written as JSON with --out). Candidates run through the package's public API: a plan with the
candidate config (`plan_mla_decode(..., config=...)`), as `mla_decode(config=...)` makes it.

    python benchmarks/tune_mla_decode.py [--budget-s 240] [--only bf16:16] [--out FILE]

Offline check (no GPU needed; Triton's bundled ptxas and cuobjdump): compile every table entry
of a device class for that architecture and report shared memory against the class's
per-block limit, registers and spill (stack) bytes. Exits non-zero if an entry exceeds the
limit, spills registers inside its loop or compiles to a trap kernel. Each kernel is compiled
as a plan launches it: `mla_decode_launches` gives the kernel and every argument by name.

    python benchmarks/tune_mla_decode.py --check sm120 [--check sm90 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch
import triton

from benchmarks.offline_compile import CLASS_CAPABILITY, OfflineCompile
from vllm_blackwell_ext.kernels.device import (
    MIN_FP8_CAPABILITY,
    SMEM_LIMIT_BY_CAPABILITY,
    DeviceInfo,
)
from vllm_blackwell_ext.kernels.mla_decode import (
    INT_WIDEN_BOTH,
    INT_WIDEN_VALUES,
    MLA_DECODE_CONFIGS,
    MLA_DECODE_FEW_PROGRAM_CONFIGS,
    MLA_DECODE_TMA_CONFIGS,
    ROW_TILES,
    SUPPORTED_LATENT,
    KernelLaunch,
    MlaDecodeConfig,
    MlaDecodeWorkspace,
    launch_mla_decode,
    mla_decode_launches,
    plan_mla_decode,
)

R, P, PAGE = 512, 64, 64
W = R + P
# Representative shape per row tile: (heads, query_len, batch, context).
SHAPES = {16: (16, 1, 64, 16384), 32: (32, 1, 64, 16384), 64: (128, 1, 32, 16384)}


# A short list per (dtype, row tile) worth a GPU's minute: the table entry's neighbours that
# compile without spills (checked offline with compile_offline). --full sweeps the whole grid.
_C = MlaDecodeConfig
CURATED: dict[tuple[str, int], list[MlaDecodeConfig]] = {
    ("bf16", 16): [_C(16, 64, 4, 3), _C(16, 64, 8, 3), _C(16, 32, 4, 3), _C(16, 64, 4, 4)],
    ("bf16", 32): [_C(32, 64, 8, 3), _C(16, 64, 4, 3), _C(32, 32, 8, 3), _C(32, 64, 8, 4)],
    ("bf16", 64): [_C(64, 16, 8, 3), _C(64, 32, 8, 2), _C(32, 64, 8, 3), _C(16, 64, 4, 3),
                   _C(64, 32, 8, 3)],
    ("fp8", 16): [_C(16, 32, 4, 5), _C(16, 64, 8, 5), _C(16, 128, 8, 4), _C(16, 32, 8, 6)],
    ("fp8", 32): [_C(32, 32, 4, 5), _C(32, 64, 8, 5), _C(16, 32, 4, 5)],
    ("fp8", 64): [_C(32, 32, 4, 5), _C(32, 64, 8, 5), _C(64, 32, 8, 3)],
}  # fmt: skip


def candidates(tag: str, tile: int, full: bool = False) -> list[MlaDecodeConfig]:
    cfgs = [] if full else list(CURATED[(tag, tile)])
    if full:
        for bm in sorted({16, tile}):
            for bn in (16, 32, 64):
                for warps in (4, 8):
                    for stages in (2, 3, 4, 5):
                        if bm * R // (warps * 32) > 160:  # fp32 accumulators alone: spills
                            continue
                        cfgs.append(MlaDecodeConfig(bm, bn, warps, stages))
    if tag == "fp8":  # operands widened by the convert, or in integer ops (one or both)
        cfgs += [
            dataclasses.replace(c, int_widen=level)
            for level in (INT_WIDEN_VALUES, INT_WIDEN_BOTH)
            for c in cfgs
        ]
    return cfgs


def _candidate_fn(info: DeviceInfo, tag: str, tile: int, cfg: MlaDecodeConfig, x: dict):
    """A call of the plan with `cfg` at the tile's shape (`handles` receives each compiled
    split kernel): splits so that about two waves of programs keep the GPU full."""
    heads, q_len, batch, _ = SHAPES[tile]
    splits = max(1, (info.num_sms * 2) // (batch * triton.cdiv(heads * q_len, cfg.block_m)))
    plan = plan_mla_decode(
        batch, heads, None, q_len, info, kv_dtype=x["kv"].dtype, kv_lora_rank=R,
        tma_page_size=PAGE if cfg.tma else None, num_splits=splits, config=cfg,
    )  # fmt: skip
    ws = MlaDecodeWorkspace.allocate(batch * q_len, heads, splits, R, "cuda")
    handles: list = []

    def fn():
        handles.append(
            launch_mla_decode(
                plan,
                x["q"],
                x["kv"],
                x["bt"],
                x["seq"],
                x["out"],
                softmax_scale=W**-0.5,
                k_scale=x["scale"],
                workspace=ws,
            )  # fmt: skip
        )

    fn.handles = handles  # type: ignore[attr-defined]
    return fn


def _tune_slot(
    info: DeviceInfo, tag: str, tile: int, args: argparse.Namespace, budget_s: float, log: list
) -> MlaDecodeConfig | None:
    """The fastest candidate of a (dtype, row tile) slot that fits and does not spill, with
    the occupancy the split planner should assume; None if none ran."""
    from benchmarks.harness import bench_us

    t_end = time.time() + budget_s
    heads, q_len, batch, ctx = SHAPES[tile]
    x = _inputs(heads, q_len, batch, ctx, tag == "fp8")
    limit, best = info.smem_per_block, None
    for cfg in candidates(tag, tile, args.full):
        if time.time() > t_end:
            print("budget spent; keeping the best so far", flush=True)
            break
        fn = _candidate_fn(info, tag, tile, cfg, x)
        try:
            fn()
        except Exception as e:  # out of resources and the like: not a candidate
            print(f"{tag}:{tile} {cfg}: failed ({type(e).__name__})", flush=True)
            continue
        h = fn.handles[0]  # type: ignore[attr-defined]
        spills, shared = getattr(h, "n_spills", 0), h.metadata.shared
        us = bench_us(fn, warmup_ms=10, rep_ms=40)
        gbps = batch * ctx * W * (1 if tag == "fp8" else 2) / (us * 1e-6) / 1e9
        line = (
            f"{tag}:{tile} {cfg.block_m}x{cfg.block_n} w{cfg.num_warps} "
            f"s{cfg.num_stages}: {us:.1f} us {gbps:.0f} GB/s shared={shared} "
            f"regs={getattr(h, 'n_regs', '?')} spills={spills}"
        )
        print(line, flush=True)
        log.append(line)
        if shared > limit or spills:
            continue
        if best is None or us < best[0]:
            # Occupancy for the split planner, from what the compiler reported.
            regs = max(1, int(getattr(h, "n_regs", 0) or 1))
            occ = min(65536 // (regs * 32 * cfg.num_warps), limit // max(shared, 1))
            best = (us, dataclasses.replace(cfg, ctas_per_sm=max(1, min(occ, 4))))
    return best[1] if best else None


def tune_gpu(args: argparse.Namespace) -> int:
    from vllm_blackwell_ext.kernels.device import device_info

    info = device_info("cuda")
    slots = [f"{tag}:{tile}" for tag in ("bf16", "fp8") for tile in ROW_TILES]
    if args.only:
        slots = [s for s in slots if s in args.only.split(",")]
    # Each (dtype, tile) slot gets an equal share of the budget, so none is starved.
    slot_budget = args.budget_s / max(1, len(slots))
    entry: dict[str, dict[int, MlaDecodeConfig]] = {}
    log: list[str] = []
    for tag in ("bf16", "fp8"):
        entry[tag] = {}
        for tile in ROW_TILES:
            tuned = None
            if f"{tag}:{tile}" in slots:
                tuned = _tune_slot(info, tag, tile, args, slot_budget, log)
            entry[tag][tile] = tuned or _table_entry(info.device_class, tag, tile)
    text = _format_entry(info.device_class, entry)
    print(text)
    if args.write:
        _rewrite_table(info.device_class, text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device_class": info.device_class, "device": info.name,
                       "entry": {t: {k: vars(v) for k, v in e.items()} for t, e in entry.items()},
                       "log": log}, f, indent=1)  # fmt: skip
    return 0


def _rewrite_table(device_class: str, entry_text: str) -> None:
    """Replace the device class's block in mla_decode/configs.py with the tuned entry."""
    import vllm_blackwell_ext.kernels.mla_decode.configs as mod

    path = mod.__file__
    with open(path) as f:
        text = f.read()
    # A class block starts with `    "smXY": {` and ends at the first line that is `    },`.
    pattern = re.compile(r'^    "' + re.escape(device_class) + r'": \{\n.*?^    \},\n', re.S | re.M)
    if not pattern.search(text):
        print(f"no block for {device_class} in {path}; add this entry by hand:\n{entry_text}")
        return
    text = pattern.sub(lambda _: entry_text + "\n", text, count=1)
    with open(path, "w") as f:
        f.write(text)
    print(f"rewrote the {device_class} entry of {path}")


def _table_entry(device_class: str, tag: str, tile: int) -> MlaDecodeConfig:
    """The (large-batch) entry the sweep tunes."""
    table = MLA_DECODE_CONFIGS.get(device_class, MLA_DECODE_CONFIGS["default"])
    return table[tag][tile]


def _table_entries(device_class: str, tag: str, tile: int) -> list[MlaDecodeConfig]:
    """The entry and, where the class has them, its few-program and TMA entries."""
    extra = [
        table.get(device_class, {}).get(tag, {}).get(tile)
        for table in (MLA_DECODE_FEW_PROGRAM_CONFIGS, MLA_DECODE_TMA_CONFIGS)
    ]
    return [_table_entry(device_class, tag, tile), *[c for c in extra if c is not None]]


def _format_entry(device_class: str, entry: dict[str, dict[int, MlaDecodeConfig]]) -> str:
    lines = [f'    "{device_class}": {{']
    for tag, by_tile in entry.items():
        lines.append(f'        "{tag}": {{')
        for t, c in by_tile.items():
            int_widen = f", int_widen={c.int_widen}" if c.int_widen else ""
            lines.append(
                f"            {t}: C({c.block_m}, {c.block_n}, {c.num_warps}, {c.num_stages}, "
                f"{c.ctas_per_sm}, {c.min_split_keys}{int_widen}),"
            )
        lines.append("        },")
    lines.append("    },")
    return "\n".join(lines)


def _inputs(heads: int, q_len: int, batch: int, ctx: int, fp8: bool) -> dict:
    pages = batch * ctx // PAGE
    kv = torch.randn(pages, PAGE, W, device="cuda", dtype=torch.bfloat16)
    if fp8:
        kv = (kv * 8).to(torch.float8_e4m3fn)
    bt = torch.randperm(pages, device="cuda").view(batch, -1).to(torch.int32)
    q = torch.randn(batch * q_len, heads, W, device="cuda", dtype=torch.bfloat16)
    return dict(q=q, kv=kv, bt=bt, seq=torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
                out=torch.empty(batch * q_len, heads, R, device="cuda", dtype=torch.bfloat16),
                scale=torch.tensor([0.125], device="cuda") if fp8 else None)  # fmt: skip


def compile_offline(
    cfg: MlaDecodeConfig, capability: tuple[int, int], fp8: bool, kv_lora_rank: int = R
) -> OfflineCompile:
    """Compile the split kernel for `capability` without a GPU: what it costs."""
    from benchmarks.offline_compile import stats_of

    return stats_of(compile_split_kernel(cfg, capability, fp8, kv_lora_rank))


def offline_split_launch(
    cfg: MlaDecodeConfig,
    capability: tuple[int, int],
    kv_dtype: torch.dtype,
    kv_lora_rank: int = R,
    *,
    variant: str | None = None,
    single: bool = False,
) -> KernelLaunch:
    """The split launch a plan with `cfg` makes on a `capability` GPU, over CPU tensors of a
    20-head decode (a bf16 query, 64-token pages, an LSE output): nothing runs."""
    info = DeviceInfo("offline", capability, 132, SMEM_LIMIT_BY_CAPABILITY[capability])
    width = kv_lora_rank + SUPPORTED_LATENT[kv_lora_rank]
    # 20 heads: num_heads and the LSE stride not 16-divisible, as the least aligned launch.
    batch, heads, splits = 4, 20, 1 if single else 2
    plan = plan_mla_decode(
        batch, heads, None, 1, info, kv_dtype=kv_dtype, kv_lora_rank=kv_lora_rank,
        tma_page_size=PAGE, num_splits=splits, variant=variant, config=cfg,
    )  # fmt: skip
    q = torch.empty(batch, heads, width, dtype=torch.bfloat16)
    fp8 = kv_dtype == torch.float8_e4m3fn
    launches = mla_decode_launches(
        plan, q, torch.empty(8, PAGE, width, dtype=kv_dtype),
        torch.empty(batch, 5, dtype=torch.int32), torch.empty(batch, dtype=torch.int32),
        torch.empty(batch, heads, kv_lora_rank, dtype=torch.bfloat16), softmax_scale=W**-0.5,
        k_scale=torch.ones(1) if fp8 else None,
        lse_out=torch.empty(batch, heads), workspace=MlaDecodeWorkspace.allocate(
            batch, heads, splits, kv_lora_rank, "cpu"),
    )  # fmt: skip
    return launches[0]


def compile_launch(launch: KernelLaunch, capability: tuple[int, int], gluon: bool = False) -> Any:
    """`launch`'s kernel compiled for `capability` without a GPU, specialised as the JIT would
    specialise that launch's arguments (`offline_compile.signature_of`)."""
    from triton.backends.compiler import GPUTarget

    from benchmarks.offline_compile import compile_kernel, signature_of

    kernel = launch.kernel
    args = tuple(launch.kwargs[name] for name in kernel.arg_names)
    signature, constexprs, aligned = signature_of(kernel, args)
    for name, arg in zip(kernel.arg_names, args, strict=True):
        if arg is None:  # a descriptor the variant does not read
            signature.pop(name, None)
            constexprs[name] = None
    arch = capability[0] * 10 + capability[1]
    if not gluon:
        return compile_kernel(
            kernel, signature, constexprs, aligned, arch, num_warps=launch.num_warps,
            num_stages=launch.num_stages,
        )  # fmt: skip
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {name: "constexpr" for name in constexprs} | signature
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(
        GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=launch.num_warps),
    )


def compile_split_kernel(
    cfg: MlaDecodeConfig, capability: tuple[int, int], fp8: bool, kv_lora_rank: int = R
) -> Any:
    """The Triton split kernel as a plan with `cfg` launches it (the 16-bit kernel for TMA
    configs of either cache dtype), compiled for `capability` without a GPU."""
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    variant = "triton_tma" if cfg.tma else None  # a `gluon` entry's Triton twin
    launch = offline_split_launch(cfg, capability, kv_dtype, kv_lora_rank, variant=variant)
    return compile_launch(launch, capability)


def compile_gluon_split_kernel(
    capability: tuple[int, int],
    single: bool = False,
    kv_dtype: torch.dtype = torch.bfloat16,
    cfg: MlaDecodeConfig | None = None,
) -> Any:
    """The Gluon split kernel (a bf16 query over a `kv_dtype` cache) compiled for `capability`
    without a GPU, as a plan of the `gluon` entry `cfg` (default: sm90's) launches it."""
    tag = "fp8" if kv_dtype == torch.float8_e4m3fn else "bf16"
    cfg = cfg or MLA_DECODE_TMA_CONFIGS["sm90"][tag][64]
    launch = offline_split_launch(cfg, capability, kv_dtype, variant="gluon", single=single)
    return compile_launch(launch, capability, gluon=True)


def _check_gluon(cls: str, tag: str, cap: tuple[int, int], limit: int, cfg: MlaDecodeConfig) -> int:
    """Compile a `gluon` entry's Gluon kernel (split and single-split variants) for a `tag`
    ('bf16' | 'fp8') cache; 1 if bad."""
    from benchmarks.offline_compile import stats_of

    kv_dtype = torch.float8_e4m3fn if tag == "fp8" else torch.bfloat16
    bad = 0
    for single in (False, True):
        stats = stats_of(compile_gluon_split_kernel(cap, single, kv_dtype, cfg))
        problems = [
            *(["OVER LIMIT"] if stats.shared > limit else []),
            *(["SPILLS"] if stats.spills else []),
            *(["TRAPS"] if stats.traps else []),
        ]
        bad |= bool(problems)
        print(f"{cls} {tag} gluon kernel single_split={single}: shared={stats.shared}/{limit} "
              f"regs={stats.registers} stack={stats.stack} {' '.join(problems) or 'ok'}",
              flush=True)  # fmt: skip
    return int(bad)


def check_offline(classes: list[str]) -> int:
    bad = 0
    for cls in classes:
        cap = CLASS_CAPABILITY[cls]
        limit = SMEM_LIMIT_BY_CAPABILITY[cap]
        seen = set()
        for tag in ("bf16", "fp8") if cap >= MIN_FP8_CAPABILITY else ("bf16",):
            for tile in ROW_TILES:
                for cfg in _table_entries(cls, tag, tile):
                    for rank in (512, 256):
                        key = (tag, cfg, rank)
                        if key in seen:
                            continue
                        seen.add(key)
                        stats = compile_offline(cfg, cap, tag == "fp8", rank)
                        if cfg.gluon and rank == 512:
                            bad += _check_gluon(cls, tag, cap, limit, cfg)
                        problems = [
                            *(["OVER LIMIT"] if stats.shared > limit else []),
                            *(["SPILLS IN A LOOP"] if stats.loop_spills else []),
                            *(["TRAPS"] if stats.traps else []),
                            *(["WGMMA SERIALIZED"] if stats.wgmma_serialized else []),
                        ]
                        bad += bool(problems)
                        print(
                            f"{cls} {tag} tile {tile} latent {rank}: {cfg} "
                            f"shared={stats.shared}/{limit} regs={stats.registers} "
                            f"stack={stats.stack} {' '.join(problems) or 'ok'}",
                            flush=True,
                        )
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check",
        action="append",
        choices=sorted(CLASS_CAPABILITY),
        help="compile this device class's table offline and check shared memory",
    )
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--only", default=None, help="comma list of tag:tile, e.g. bf16:16,fp8:16")
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    ap.add_argument("--write", action="store_true", help="rewrite this class's table entry")
    ap.add_argument("--full", action="store_true", help="sweep the whole grid, not the short list")
    args = ap.parse_args(argv)
    if args.check:
        return check_offline(args.check)
    if not torch.cuda.is_available():
        print("tune_mla_decode: the sweep needs a CUDA GPU (use --check offline)", file=sys.stderr)
        return 2
    return tune_gpu(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
