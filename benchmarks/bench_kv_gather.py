"""Benchmark of the paged-KV gather.

MLA caches (576-wide entries: 512 latent + 64 rope), block size 64, random block tables, fp8
e4m3 -> bf16 by default, B in {1, 8, 64} and contexts 4k..128k. Figures are effective
bandwidth: cache bytes read + dst bytes written, per second. Peers, timed in the same process
on the same inputs: vLLM's own CUDA gather (`torch.ops._C_cache_ops`, where a CUDA vLLM is
installed; otherwise the table says PEER NOT RUN), `torch.compile` of the vectorised torch gather
(reference/kv_gather.py), and the device-to-device copy roofline. Every implementation is timed
as a CUDA-graph replay (GPU time); small gathers are reported in microseconds, with a second
row of eager calls (host launch included) for each.

    python benchmarks/bench_kv_gather.py [--out-dir DIR] [--batches 1 8] [--tune] (see --help)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.harness import (
    Row,
    bench_us,
    copy_roofline_gbps,
    gpu_slug,
    progress,
    report,
)
from benchmarks.vllm_peer import peer_not_run_note
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.kv_gather import (
    GatherConfig,
    GatherPlan,
    format_entry,
    launch_kv_gather,
    plan_kv_gather,
)
from vllm_blackwell_ext.kernels.kv_gather import configs as gather_configs

ENTRY = 576
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
COMPILE_PEER = "torch.compile"
VLLM_PEER = "vLLM CUDA"
COPY_PEER = "d2d copy, same bytes"


@dataclass(frozen=True)
class Case:
    batch: int
    ctx: int
    kv: str = "fp8"  # "fp8", "fp8_e5m2", "auto" (bf16 cache) or "cp" (raw copy of fp8 bytes)
    block_size: int = 64

    @property
    def name(self) -> str:
        kind = {
            "fp8": "fp8->bf16",
            "fp8_e5m2": "e5m2->bf16",
            "auto": "bf16->bf16",
            "cp": "cp_gather u8",
        }[self.kv]
        ctx = f"{self.ctx // 1024}k" if self.ctx % 1024 == 0 else str(self.ctx)
        return f"{kind} B={self.batch} ctx={ctx}"

    @property
    def tokens(self) -> int:
        return self.batch * self.ctx

    def bytes_moved(self) -> int:
        src_b = 2 if self.kv == "auto" else 1
        dst_b = 1 if self.kv == "cp" else 2
        return self.tokens * ENTRY * (src_b + dst_b)


def make_inputs(case: Case, device: str, seed: int = 0) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = -(-case.ctx // case.block_size)
    num_blocks = case.batch * pages + 16
    shape = (num_blocks, case.block_size, ENTRY)
    if case.kv == "auto":
        src = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    else:
        src = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8)
        # Clear NaN/inf encodings so results compare with torch.equal.
        nan_bits = 0x7C if case.kv == "fp8_e5m2" else 0x7F
        src[(src & nan_bits) == nan_bits] = 0
    # Random page order: a request's pages are scattered over the whole cache.
    bt = torch.randperm(num_blocks, generator=gen, device=device)[: case.batch * pages]
    bt = bt.view(case.batch, pages).to(torch.int32)
    lens = torch.full((case.batch,), case.ctx, dtype=torch.int32, device=device)
    cu = torch.zeros(case.batch + 1, dtype=torch.int32, device=device)
    cu[1:] = lens.cumsum(0)
    t2s = torch.repeat_interleave(torch.arange(case.batch, dtype=torch.int32, device=device), lens)
    dst_dtype = torch.uint8 if case.kv == "cp" else torch.bfloat16
    return dict(
        src=src,
        bt=bt,
        cu=cu,
        t2s=t2s,
        num_tokens=case.tokens,
        scale=torch.tensor([0.0371], dtype=torch.float32, device=device),
        dst=torch.empty(case.tokens, ENTRY, dtype=dst_dtype, device=device),
    )


def plan_for(case: Case, x: dict, config: GatherConfig | None = None) -> GatherPlan:
    """The plan the op makes for `case` (`config`: forced instead of the device's entry)."""
    kv = None if case.kv == "cp" else case.kv
    info = device_info(x["src"].device)
    return plan_kv_gather(kv, x["src"].dtype, ENTRY, False, info, config=config)


def _ours(case: Case, x: dict, config: GatherConfig | None = None):
    """The op as vLLM calls it; with `config`, the same gather planned with that config."""
    from vllm_blackwell_ext import ops

    if config is not None:
        plan = plan_for(case, x, config)
        t2s = None if case.kv == "cp" else x["t2s"]
        rows = x["dst"].shape[0] if case.kv == "cp" else x["num_tokens"]
        return lambda: launch_kv_gather(
            plan, x["src"], x["dst"], x["bt"], x["cu"], t2s, None, x["scale"],
            num_rows=rows, batch_size=case.batch,
        )  # fmt: skip
    if case.kv == "cp":
        return lambda: ops.cp_gather_cache(x["src"], x["dst"], x["bt"], x["cu"], case.batch)
    return lambda: ops.gather_and_maybe_dequant_cache(
        x["src"], x["dst"], x["bt"], x["cu"], x["t2s"], x["num_tokens"], case.kv, x["scale"]
    )


def load_vllm_gather():
    """vLLM's CUDA cache ops (`torch.ops._C_cache_ops`), or None and the reason they are absent."""
    try:
        import vllm._custom_ops  # noqa: F401  (loads vllm._C and its cache ops)

        cache_ops = torch.ops._C_cache_ops
        cache_ops.gather_and_maybe_dequant_cache  # noqa: B018
        cache_ops.cp_gather_cache  # noqa: B018
    except (ImportError, AttributeError, RuntimeError) as e:
        return None, f"no CUDA vLLM with its gather ops here ({type(e).__name__}: {e})"
    return cache_ops, ""


def _vllm(case: Case, x: dict, cache_ops):
    if case.kv == "cp":
        return lambda: cache_ops.cp_gather_cache(
            x["src"], x["vllm_dst"], x["bt"], x["cu"], case.batch, None
        )
    return lambda: cache_ops.gather_and_maybe_dequant_cache(
        x["src"], x["vllm_dst"], x["bt"], x["cu"], x["t2s"], x["num_tokens"], case.kv,
        x["scale"], None,
    )  # fmt: skip


def _peer(case: Case, x: dict, compiled):
    kv = "auto" if case.kv == "cp" else case.kv
    out_dtype = x["dst"].dtype
    return lambda: compiled(
        x["src"], x["bt"], x["cu"], x["t2s"], x["num_tokens"], kv, x["scale"], None, out_dtype
    )


def _graphed(fn):
    """`fn` captured in a CUDA graph, returned as a replay callable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


TUNE_SHAPES = [(4, 512, 2), (4, 512, 4), (8, 512, 2), (8, 512, 4), (16, 512, 4), (16, 512, 8),
               (32, 512, 8), (64, 512, 8), (32, 128, 4), (32, 64, 4),
               (4, 512, 2, True), (8, 512, 4, True), (16, 512, 4, True)]  # fmt: skip


def tune(device: str, cases: list[Case]) -> GatherConfig:
    """Time candidate launch configs on a few large cases; print them, return the one with the
    best geometric-mean bandwidth. Every candidate's output must equal the device's current
    config's (a tile-shape bug shows here)."""
    cands = [GatherConfig(*s) for s in TUNE_SHAPES]
    score: dict[GatherConfig, list[float]] = {c: [] for c in cands}
    default = None
    for case in cases:
        x = make_inputs(case, device)
        default = plan_for(case, x).config
        want = torch.empty_like(x["dst"])
        _ours(case, {**x, "dst": want}, default)()
        for cfg in progress(cands, f"tune {case.name}"):
            fn = _ours(case, x, cfg)
            fn()
            ok = torch.equal(x["dst"], want)
            us = bench_us(fn, warmup_ms=10, rep_ms=40)
            score[cfg].append(case.bytes_moved() / us / 1e3 if ok else float("nan"))
        x = want = None
        torch.cuda.empty_cache()
    ranked = sorted(
        (
            (statistics.geometric_mean(v) if all(q == q for q in v) else 0.0, c)
            for c, v in score.items()
        ),
        key=lambda r: -r[0],
    )
    print(f"tuning on {[c.name for c in cases]} (current {default}); GB/s per case, geo-mean:")
    for gm, cfg in ranked:
        print(f"  {' '.join(f'{q:8.1f}' for q in score[cfg])}  {gm:8.1f}  {cfg}")
    return ranked[0][1]


def write_entry(device_class: str, config: GatherConfig) -> None:
    """Put `config` in kernels/kv_gather/configs.py as `device_class`'s line."""
    path = Path(gather_configs.__file__)
    entry = format_entry(device_class, config)
    lines = path.read_text().splitlines(keepends=True)
    key = f'    "{device_class}": '
    at = [i for i, line in enumerate(lines) if line.startswith(key)]
    if at:
        lines[at[0]] = entry + "\n"
    else:  # a new class: after the table's opening line
        start = next(i for i, line in enumerate(lines) if line.startswith("GATHER_CONFIGS"))
        lines.insert(start + 1, entry + "\n")
    path.write_text("".join(lines))
    print(f"wrote {entry.strip()} to {path}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python benchmarks/bench_kv_gather.py", description=__doc__)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--gpu", default=None, help="name in the result files (default: detected)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768, 131072])
    ap.add_argument("--small-tokens", type=int, nargs="+", default=[256, 2048, 8192])
    ap.add_argument(
        "--extra",
        type=int,
        nargs=2,
        default=[8, 32768],
        metavar=("B", "CTX"),
        help="batch and context of the e5m2, bf16 and cp_gather cases (0 0: none)",
    )
    ap.add_argument(
        "--tune",
        action="store_true",
        help="sweep launch configs first; the run then uses the fastest",
    )
    ap.add_argument(
        "--write",
        action="store_true",
        help="with --tune: put the fastest config in kernels/kv_gather/configs.py",
    )
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--device", default="cuda", help="'cpu' only smoke-tests (TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("kv-gather benchmark: needs a CUDA GPU", file=sys.stderr)
        return 2
    on_gpu = device != "cpu"
    from vllm_blackwell_ext.reference.kv_gather import gather_vectorised

    # Default dynamism: the first shape compiles static, later ones mark only what changed
    # dynamic (token count, batch), so the entry width and block size stay constants.
    compiled = torch.compile(gather_vectorised)
    notes: list[str] = []
    config = None
    device_class = device_info(torch.device(device)).device_class
    if args.tune:
        # The sweep then runs with the fastest config; --write keeps it in configs.py.
        config = tune(device, [Case(8, 32768), Case(1, 131072)] if on_gpu else [Case(1, 256)])
        print("configs.py entry:\n" + format_entry(device_class, config))
        if args.write:
            write_entry(device_class, config)
    shown_config = config or gather_configs.gather_config(device_class)
    notes.append(f"launch config: {shown_config}")
    cache_ops, why = load_vllm_gather() if on_gpu else (None, "CPU run")
    if cache_ops is None:
        notes.append(peer_not_run_note(VLLM_PEER, why))
        print(notes[-1])

    roof = copy_roofline_gbps(device, 2 << 30 if on_gpu else 1 << 24)
    print(f"device copy roofline: {roof:.1f} GB/s (read + write)")
    cases = [Case(b, c) for b in args.batches for c in args.contexts]
    if args.extra[0] > 0:
        cases += [Case(*args.extra, kv) for kv in ("fp8_e5m2", "auto", "cp")]
    small = [Case(1 if n <= 2048 else 4, n if n <= 2048 else n // 4) for n in args.small_tokens]

    rows: list[Row] = []
    for case in progress(cases + small, "kv-gather"):
        x = make_inputs(case, device)
        ours, peer = _ours(case, x, config), _peer(case, x, compiled)
        ours()
        want = peer()
        if not torch.equal(x["dst"], want):
            notes.append(f"{case.name}: ours != {COMPILE_PEER} output")
        fns = {"ours": ours, COMPILE_PEER: peer}
        if cache_ops is not None:
            x["vllm_dst"] = torch.empty_like(x["dst"])
            fns[VLLM_PEER] = _vllm(case, x, cache_ops)
            fns[VLLM_PEER]()
            if not torch.equal(x["dst"], x["vllm_dst"]):
                notes.append(f"{case.name}: ours != {VLLM_PEER} output")
        # GPU time: every implementation replayed from a CUDA graph, so a small gather's figure
        # is the device's work, not Python's launch cost (a serving step's launches overlap
        # earlier GPU work); eager calls (host launch included) get their own row.
        t = {k: bench_us(_graphed(f) if on_gpu else f, rep_ms=args.rep_ms) for k, f in fns.items()}
        t_ours, t_peer, t_vllm = t["ours"], t[COMPILE_PEER], t.get(VLLM_PEER)
        nbytes = case.bytes_moved()
        if case in small:
            label = f"{case.name} ({case.tokens} tok)"
            peers = {k: v for k, v in t.items() if k != "ours"}
            rows.append(Row(label, "us", t_ours, peers, nbytes / (roof * 1e3)))
            if on_gpu:
                eager = {k: bench_us(f, rep_ms=args.rep_ms) for k, f in fns.items()}
                rows.append(Row(label + " (eager)", "eager us", eager.pop("ours"), eager, None))
        else:
            # A plain device copy moving the same bytes: what a kernel of this size can reach.
            half = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
            other = torch.empty_like(half)
            copy = lambda: other.copy_(half)  # noqa: B023, E731
            t_copy = bench_us(_graphed(copy) if on_gpu else copy, rep_ms=args.rep_ms)
            half = other = copy = None
            gbps = lambda us, n=nbytes: n / us / 1e3  # noqa: E731
            size = f", out {case.tokens * ENTRY * x['dst'].element_size() / 2**20:.0f} MiB"
            peers = {VLLM_PEER: gbps(t_vllm)} if t_vllm is not None else {}
            peers.update({COMPILE_PEER: gbps(t_peer), COPY_PEER: gbps(t_copy)})
            rows.append(Row(case.name + size, "GB/s", gbps(t_ours), peers, roof))
        del x, want
        if on_gpu:
            torch.cuda.empty_cache()

    notes.append(
        f"roofline: device-to-device copy of 2 GiB, {roof:.1f} GB/s (read + write), same run"
    )
    notes.append(
        "GB/s = (cache bytes read + dst bytes written) / median time of a CUDA-graph replay "
        "(do_bench, L2 flushed)"
    )
    notes.append("us rows: roofline = the same bytes at the copy bandwidth")
    # Where the files go does not change them: leave --out-dir out of the recorded command.
    shown = [
        a for i, a in enumerate(argv) if a != "--out-dir" and (i == 0 or argv[i - 1] != "--out-dir")
    ]
    command = "python benchmarks/bench_kv_gather.py " + " ".join(shown)
    report(rows, args.gpu or gpu_slug(), "kv-gather", command.strip(), args.out_dir, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
