"""The benchmark harness every benchmark uses.

A benchmark times our kernel (or engine), its peers (vLLM's kernel, a ``torch.compile`` of the
reference, ...) and the device's copy roofline in one process on the same inputs, collects one
`Row` per case and hands the rows to `report`. Results are data: `report` writes the JSON
first, ``<out_dir>/<gpu>-<op>.json``, then draws ``.md`` and ``.png`` from that file alone
(`draw`), so a table or plot never holds a figure the JSON lacks and can be redrawn at any time
(``python benchmarks/harness.py draw benchmarks/results/*.json``). One schema for every
benchmark (`SCHEMA`, checked by `load_results`)::

    {"schema": 1, "gpu": ..., "op": ..., "command": ..., "notes": [...], "rows": [
        {"case": ..., "metric": <one of METRICS>, "ours": x, "peers": {"<peer>": x, ...},
         "roofline": x | null}],
     "provenance": "...",                 # optional: machine, environment, code of the run
     "extra": {...}}                      # optional: a benchmark's raw records, not drawn

Higher is better for GB/s, TFLOP/s, tok/s (serving throughput), tau (DFlash tokens per
verification step) and acceptance (a share of steps), lower for the times: us (GPU time,
CUDA-graph replays), eager us (back-to-back eager calls), host us (CPU time of one call) and ms
(serving latencies), each summarised apart. tqdm and matplotlib are optional: without them there
is no progress bar and no PNG (`draw` makes it later from the JSON).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

SCHEMA = 1
METRICS = ("GB/s", "TFLOP/s", "us", "eager us", "host us", "tok/s", "ms", "tau", "acceptance")
HIGHER_IS_BETTER = {
    "GB/s": True,
    "TFLOP/s": True,
    "us": False,
    "eager us": False,
    "host us": False,
    "tok/s": True,
    "ms": False,
    "tau": True,
    "acceptance": True,
}
RESULT_KEYS = ("gpu", "op", "command", "notes", "rows")
ROW_KEYS = ("case", "metric", "ours", "peers", "roofline")
# A peer whose output is further than this from ours (per output row, max |peer - ours| over
# the RMS of our row) is flagged in the notes: same inputs, so beyond rounding it is a different
# computation (a peer that quantises the query to fp8, as vLLM does for FA3 and FlashMLA over
# fp8 caches, is one), and its figure does not compare as like for like.
OUTPUT_GAP_FLAG = 0.1
T = TypeVar("T")


@dataclass
class Row:
    """One case of a benchmark: our figure, each peer's, and the roofline, in `metric`."""

    case: str
    metric: str
    ours: float
    peers: dict[str, float] = field(default_factory=dict)
    roofline: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric: expected one of {METRICS}, got {self.metric!r}")


def progress(iterable: Iterable[T], desc: str = "") -> Iterator[T]:
    """A tqdm bar over `iterable` when tqdm is installed; else the items, with a line each."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        items = list(iterable)
        for i, item in enumerate(items):
            print(f"{desc} [{i + 1}/{len(items)}]", flush=True)
            yield item
        return
    yield from tqdm(iterable, desc=desc)


def bench_us(fn: Callable[[], Any], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of `fn()` in microseconds (triton.testing.do_bench, L2 flushed per rep).

    Without a CUDA device: a wall-clock median of a few calls, only to smoke-test a benchmark.
    """
    if not torch.cuda.is_available():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3


def copy_roofline_gbps(device: str | torch.device = "cuda", nbytes: int = 2 << 30) -> float:
    """Device-to-device copy of `nbytes`: bytes read + written per second, in GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    src = dst = None  # free both before the benchmark allocates its own inputs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e-6) / 1e9


def read_roofline_gbps(device: str | torch.device = "cuda", nbytes: int = 2 << 30) -> float:
    """A read-only stream of `nbytes` (summed into one int per program), bytes read per second.

    Reading alone runs faster than a copy's mixed read and write: the ceiling a kernel that
    only reads its inputs (attention decode) can approach.
    """
    x = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    x.random_(0, 1 << 16)
    per_program = _READ_BLOCK * _READ_ITERS
    sums = torch.empty(triton.cdiv(x.numel(), per_program), dtype=torch.int32, device=device)
    grid = (sums.numel(),)
    us = bench_us(
        lambda: _read_kernel[grid](x, sums, x.numel(), _READ_BLOCK, _READ_ITERS, num_warps=8)
    )
    x = sums = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return nbytes / (us * 1e-6) / 1e9


_READ_BLOCK, _READ_ITERS = 4096, 8  # 128 KiB per program


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def output_gap(ours: torch.Tensor, peer: torch.Tensor) -> float:
    """Largest over output rows (the last dim) of max |peer - ours| / RMS(our row), on the same
    elements (`peer` reshaped). Per row, since rows differ in scale: a causal prefill's first
    rows are single values, many times the RMS of rows that average thousands of keys, so one
    global RMS would call their bf16 rounding a mismatch (0.09 at 8k keys, bf16 output alone).
    """
    ref = ours.float()
    diff = (peer.reshape(ours.shape).float() - ref).abs().amax(-1)
    row_rms = ref.pow(2).mean(-1).sqrt().clamp_min(1e-30)
    return (diff / row_rms).max().item()


def gap_note(case: str, gaps: dict[str, float]) -> str:
    """One notes line: each peer's `output_gap` for `case`, flagged past OUTPUT_GAP_FLAG."""
    cells = [
        f"{name} {gap:.1e}" + (" (MISMATCH)" if not gap <= OUTPUT_GAP_FLAG else "")
        for name, gap in gaps.items()
    ]
    return f"output check, {case}: per row, max |peer - ours| / RMS(our row): " + ", ".join(cells)


def gpu_slug(device: str | torch.device | int | None = None) -> str:
    """Short lower-case GPU name for result files: 'NVIDIA H200' -> 'h200'."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for drop in ("nvidia", "geforce", "tesla"):
        name = name.replace(drop, "")
    name = name.strip()
    return "-".join(name.split()[:1]) or "gpu"


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _ratio(ours: float, other: float | None) -> float | None:
    if other is None or not other or math.isnan(other):
        return None
    return ours / other


def format_table(rows: Sequence[Row]) -> str:
    """Markdown table: each figure, then ours/peer for every peer and ours/roofline."""
    peers: list[str] = []
    for r in rows:
        peers += [p for p in r.peers if p not in peers]
    head = [
        "case",
        "metric",
        "ours",
        *peers,
        "roofline",
        *(f"ours/{p}" for p in peers),
        "ours/roofline",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.case,
            r.metric,
            _fmt(r.ours),
            *(_fmt(r.peers.get(p)) for p in peers),
            _fmt(r.roofline),
        ]
        cells += [_fmt(_ratio(r.ours, r.peers.get(p))) for p in peers]
        cells.append(_fmt(_ratio(r.ours, r.roofline)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per metric: geometric-mean ratios ours/peer and ours/roofline."""
    out: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        rs = [r for r in rows if r.metric == metric]
        if not rs:
            continue
        ratios: dict[str, list[float]] = {}
        for r in rs:
            for name, other in [*r.peers.items(), ("roofline", r.roofline)]:
                q = _ratio(r.ours, other)
                if q is not None and q > 0:
                    ratios.setdefault(name, []).append(q)
        out[metric] = {k: statistics.geometric_mean(v) for k, v in ratios.items()}
    return out


def plot_json(json_path: str | Path, png_path: str | Path | None = None) -> Path | None:
    """Bar chart of a results JSON (one panel per metric); None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written")
        return None
    data = load_results(json_path)
    png = Path(png_path) if png_path else Path(json_path).with_suffix(".png")
    metrics = [m for m in METRICS if any(r["metric"] == m for r in data["rows"])]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(12, 4.5 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=False):
        rows = [r for r in data["rows"] if r["metric"] == metric]
        series = ["ours"] + sorted({p for r in rows for p in r["peers"]})
        width = 0.8 / len(series)
        xs = range(len(rows))
        for k, name in enumerate(series):
            vals = [
                r["ours"] if name == "ours" else r["peers"].get(name, float("nan")) for r in rows
            ]
            ax.bar([x + k * width for x in xs], vals, width, label=name)
        roof = [r["roofline"] for r in rows]
        if any(v is not None for v in roof):
            ax.scatter(
                [x + 0.4 - width / 2 for x in xs],
                [float("nan") if v is None else v for v in roof],
                marker="_",
                s=600,
                color="black",
                label="roofline",
                zorder=3,
            )
        ax.set_xticks([x + 0.4 - width / 2 for x in xs])
        ax.set_xticklabels([r["case"] for r in rows], rotation=30, ha="right", fontsize=8)
        better = "higher" if HIGHER_IS_BETTER[metric] else "lower"
        ax.set_ylabel(f"{metric} ({better} is better)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{data['op']} on {data['gpu']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def load_results(json_path: str | Path) -> dict[str, Any]:
    """A results JSON, checked against the schema; ValueError names what does not fit."""
    path = Path(json_path)
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema", SCHEMA) != SCHEMA:
        raise ValueError(f"{path}: schema: expected {SCHEMA}, got {data.get('schema')!r}")
    missing = [k for k in RESULT_KEYS if k not in data]
    unknown = sorted(set(data) - {*RESULT_KEYS, "schema", "provenance", "extra"})
    if missing or unknown:
        raise ValueError(f"{path}: keys: missing {missing}, unexpected {unknown} (use 'extra')")
    for i, row in enumerate(data["rows"]):
        if sorted(row) != sorted(ROW_KEYS):
            raise ValueError(f"{path}: rows[{i}]: expected keys {ROW_KEYS}, got {sorted(row)}")
        Row(**row)  # checks the metric
    return data


def markdown(data: dict[str, Any]) -> str:
    """The Markdown page of a results JSON: title, command, table, ratios, notes."""
    rows = [Row(**r) for r in data["rows"]]
    md = [f"# {data['op']} on {data['gpu']}", "", f"Command: `{data['command']}`"]
    md += [data["provenance"], ""] if data.get("provenance") else [""]
    md += [format_table(rows), "", *_ratio_lines(rows)]
    if data["notes"]:
        md += ["", *[f"- {n}" for n in data["notes"]]]
    return "\n".join(md) + "\n"


def draw(json_path: str | Path) -> tuple[Path, Path | None]:
    """Write ``.md`` and ``.png`` beside a results JSON, from that JSON alone."""
    path = Path(json_path)
    data = load_results(path)
    md = path.with_suffix(".md")
    md.write_text(markdown(data))
    return md, plot_json(path, path.with_suffix(".png"))


def _ratio_lines(rows: Sequence[Row]) -> list[str]:
    return [
        f"- {metric}: "
        + ", ".join(f"ours/{k} = {v:.3f}" for k, v in rs.items())
        + " (geometric mean over cases)"
        for metric, rs in summary(rows).items()
    ]


def report(
    rows: Sequence[Row],
    gpu: str,
    op: str,
    command: str,
    out_dir: str | Path = "benchmarks/results",
    notes: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> Path:
    """Print the table with ratios, write ``<gpu>-<op>.json``, then draw its ``.md`` and
    ``.png`` from that JSON. `extra` keeps a benchmark's raw records in the JSON (not drawn)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(format_table(rows))
    print("\n".join(_ratio_lines(rows)))
    for note in notes:
        print(f"- {note}")
    payload: dict[str, Any] = {
        "schema": SCHEMA,
        "gpu": gpu,
        "op": op,
        "command": command,
        "notes": list(notes),
        "rows": [asdict(r) for r in rows],
    }
    if extra:
        payload["extra"] = extra
    json_path = out / f"{gpu}-{op}.json"
    json_path.write_text(json.dumps(payload, indent=1) + "\n")
    md, png = draw(json_path)
    print(f"wrote {json_path}, {md}" + (f", {png}" if png else ""))
    return json_path


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python benchmarks/harness.py", description="Redraw .md and .png from results JSON."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    draw_p = sub.add_parser("draw", help="write each JSON's .md and .png beside it")
    draw_p.add_argument("json", nargs="+")
    check_p = sub.add_parser("check", help="check each JSON against the schema")
    check_p.add_argument("json", nargs="+")
    args = parser.parse_args(argv)
    for path in args.json:
        if args.command == "draw":
            md, png = draw(path)
            print(f"drew {md}" + (f", {png}" if png else ""))
        else:
            load_results(path)
    return 0


if __name__ == "__main__":
    import sys

    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    raise SystemExit(main())
