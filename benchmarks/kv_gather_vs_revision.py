"""The paged-KV gather kernel of this checkout against the same kernel at another git revision,
in one process on the same inputs: what a kernel change costs (GPU).

Both versions are replayed from CUDA graphs (device time, no host launch cost), in two rounds of
opposite order, and each figure is the mean of its two rounds' medians.

    python benchmarks/kv_gather_vs_revision.py --rev 4356063    # before the index masks
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks.bench_kv_gather import Case, _graphed, make_inputs
from benchmarks.harness import bench_us
from vllm_blackwell_ext.kernels import kv_gather as current

KERNEL_PATH = "src/vllm_blackwell_ext/kernels/kv_gather.py"
CASES = [(1, 256), (1, 2048), (4, 2048), (1, 4096), (1, 32768), (8, 4096), (8, 32768), (64, 32768)]


def kernel_at(rev: str):
    """The gather kernel module as it was at `rev` (its relative imports made absolute)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{KERNEL_PATH}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    source = source.replace("from .", "from vllm_blackwell_ext.kernels.")
    path = Path(tempfile.mkdtemp(prefix="bwx-rev-")) / f"kv_gather_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"kv_gather_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _graphed_gather(module, x: dict, case: Case):
    """`module`'s gather on the inputs `x`, captured in a CUDA graph (its replay callable)."""
    rest = (x["bt"], x["cu"], x["t2s"], x["num_tokens"], case.kv, x["scale"], None)

    def gather() -> None:
        module.gather_and_maybe_dequant_cache(x["src"], x["dst"], *rest)

    gather()
    return _graphed(gather)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="git revision of the kernel to compare against")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kv_gather_vs_revision: needs a CUDA GPU", file=sys.stderr)
        return 2
    base = kernel_at(args.rev)
    print(f"case | {args.rev} us | this checkout us | this/{args.rev}")
    for batch, ctx in CASES:
        case = Case(batch, ctx)
        x = make_inputs(case, "cuda")
        runs = {"base": _graphed_gather(base, x, case), "this": _graphed_gather(current, x, case)}
        order = [("base", "this"), ("this", "base")]
        us = {"base": 0.0, "this": 0.0}
        for round_order in order:
            for name in round_order:
                us[name] += bench_us(runs[name], rep_ms=args.rep_ms) / len(order)
        print(f"{case.name} | {us['base']:.2f} | {us['this']:.2f} | {us['this'] / us['base']:.3f}")
        del x, runs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
