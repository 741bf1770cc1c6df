"""Decode context parallelism (DCP) benchmark: BWX_MLA decode on each rank's shard + the LSE merge,
against one GPU holding the whole context.

Each rank holds ``context / N`` tokens of every request (vLLM's placement, interleave `-I`), runs
`mla_decode` with LSE for all `--heads` heads over its shard, then `dcp_merge` (all-gather of the
LSEs, rescale, reduce-scatter over heads: vLLM's ``cp_lse_ag_out_rs``). The step time is the
slowest rank's median (the L2 is flushed before every iteration; every rank runs the same
number of iterations, since each holds collectives). The peer ``1gpu-full`` is one GPU decoding
the whole context; ``decode-only`` / ``merge-only`` split our step into its two parts. Ratios
below 1 (ours / 1gpu-full, in us) mean DCP is faster. Latent 512 + rope 64, page size 64.

    python benchmarks/bench_dcp_decode.py                      # spawns N = 2 and 4 ranks itself
    torchrun --nproc-per-node 2 benchmarks/bench_dcp_decode.py  # one world size per launch
    python benchmarks/bench_dcp_decode.py --cpu-smoke --out-dir /tmp/x   # gloo, tiny, no GPU

Under torchrun, rows of other world sizes already in the results JSON are kept (so launches
with 2 and then 4 ranks fill one table). NCCL's NVLink multicast (NVLS) is left off.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # `benchmarks.*`, tests/, the package

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

R, P, PAGE = 512, 64, 64
W = R + P
OP = "dcp-decode"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_dcp_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", default="2,4", help="self-spawn mode: comma-separated N")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=128 * 1024)
    ap.add_argument("--heads", type=int, default=128, help="query heads each rank attends with")
    ap.add_argument("--kv", default="bf16,fp8", help="cache dtypes: bf16, fp8")
    ap.add_argument("-I", "--interleave", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="gloo + Triton interpreter, tiny shapes: checks the script runs (no GPU needed)",
    )
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.context, args.heads, args.iters, args.warmup = 96, 4, 2, 1
        args.batches = "1,2"
    return args


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _timed(fn: Callable[[], object], iters: int, warmup: int, device, collective: bool) -> float:
    """Median us per call of `fn` on this rank (max over ranks when `collective`)."""
    for _ in range(warmup):
        fn()
    on_gpu = device.type == "cuda"
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if on_gpu else None
    times = []
    if on_gpu:
        torch.cuda.synchronize(device)
    if collective:
        dist.barrier()
    for _ in range(iters):
        if on_gpu:
            flush.zero_()  # the L2 holds nothing of the cache when the call starts
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    if on_gpu:
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) * 1e3 for s, e in times]
    med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    if collective:
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


class _Decode:
    """Inputs and scratch of one `mla_decode` call over `seq_len` tokens of each of `batch`
    requests (sequential pages; content random), planned once so calls never sync."""

    def __init__(self, q, seq_len: int, batch: int, fp8: bool, device) -> None:
        from vllm_blackwell_ext.kernels.device import device_info
        from vllm_blackwell_ext.kernels.mla_decode import (
            MlaDecodeWorkspace,
            cache_tma_page_size,
            plan_mla_decode,
            query_is_tma_readable,
        )

        pages = max(1, -(-seq_len // PAGE))
        cache = torch.randn(batch * pages, PAGE, W, device=device)
        self.cache = (cache * 8).to(torch.float8_e4m3fn) if fp8 else cache.to(torch.bfloat16)
        del cache
        self.k_scale = torch.tensor([0.125], device=device) if fp8 else None
        self.bt = torch.arange(batch * pages, dtype=torch.int32, device=device).view(batch, pages)
        self.seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
        self.q = q
        heads = q.shape[1]
        self.out = torch.empty(batch, heads, R, dtype=q.dtype, device=device)
        self.lse = torch.empty(batch, heads, dtype=torch.float32, device=device)
        info = device_info(device)
        self.plan = plan_mla_decode(
            batch, heads, seq_len, 1, info, kv_dtype=self.cache.dtype, q_dtype=q.dtype,
            kv_lora_rank=R, tma_page_size=cache_tma_page_size(self.cache, info),
            query_tma_readable=query_is_tma_readable(q),
        )  # fmt: skip
        self.splits = self.plan.num_splits
        self.ws = MlaDecodeWorkspace.allocate(batch, heads, self.splits, R, device)

    def __call__(self) -> None:
        from vllm_blackwell_ext.kernels.mla_decode import launch_mla_decode

        launch_mla_decode(
            self.plan,
            self.q,
            self.cache,
            self.bt,
            self.seq_lens,
            self.out,
            softmax_scale=W**-0.5,
            k_scale=self.k_scale,
            lse_out=self.lse,
            workspace=self.ws,
        )


def bench_rank(rank: int, world_size: int, args: argparse.Namespace, device) -> list[dict]:
    """Every case on this rank; rank 0 returns the rows (as dicts), the others []."""
    from tests.distributed.dcp_layout import dcp_local_seq_lens
    from tests.distributed.dcp_merge import dcp_merge

    rows = []
    for kv in args.kv.split(","):
        for batch in _ints(args.batches):
            fp8 = kv == "fp8"
            torch.manual_seed(0)  # same q on every rank (DCP all-gathers q before attention)
            q = torch.randn(batch, args.heads, W, device=device).to(torch.bfloat16)
            local_len = int(dcp_local_seq_lens([args.context], world_size, rank, args.interleave))
            local = _Decode(q, local_len, batch, fp8, device)

            def step(local=local) -> None:
                local()
                dcp_merge(local.out, local.lse)

            def merge_only(local=local) -> None:
                dcp_merge(local.out, local.lse)

            step_us = _timed(step, args.iters, args.warmup, device, collective=True)
            decode_us = _timed(local, args.iters, args.warmup, device, collective=False)
            decode_us_max = torch.tensor([decode_us], dtype=torch.float64, device=device)
            dist.all_reduce(decode_us_max, op=dist.ReduceOp.MAX)
            merge_us = _timed(merge_only, args.iters, args.warmup, device, collective=True)
            del local
            full_us = float("nan")
            if rank == 0:
                full = _Decode(q, args.context, batch, fp8, device)
                full_us = _timed(full, args.iters, args.warmup, device, collective=False)
                del full
            if device.type == "cuda":
                torch.cuda.empty_cache()
            dist.barrier()
            if rank == 0:
                ctx = f"{args.context // 1024}k" if args.context >= 1024 else str(args.context)
                case = f"N{world_size}-B{batch}-ctx{ctx}-{kv}-I{args.interleave}"
                rows.append(
                    dict(
                        case=case,
                        metric="us",
                        ours=step_us,
                        peers={
                            "1gpu-full": full_us,
                            "decode-only": float(decode_us_max.item()),
                            "merge-only": merge_us,
                        },
                        roofline=None,
                    )
                )
                print(
                    f"{case}: DCP step {step_us:.1f} us (decode {decode_us_max.item():.1f}, "
                    f"merge {merge_us:.1f}); one GPU {full_us:.1f} us; "
                    f"ratio ours/1gpu {step_us / full_us:.3f}",
                    flush=True,
                )
    return rows


def _init(rank: int, world_size: int, backend: str, init_method: str | None, device) -> None:
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=600),
        **kwargs,
    )


def _device_for(rank: int, smoke: bool) -> torch.device:
    if smoke:
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _spawned(rank: int, world_size: int, args, port: int, out: str) -> None:
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        torch.set_num_threads(1)
    device = _device_for(rank, args.cpu_smoke)
    backend = "gloo" if args.cpu_smoke else "nccl"
    _init(rank, world_size, backend, f"tcp://127.0.0.1:{port}", device)
    try:
        rows = bench_rank(rank, world_size, args, device)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _report(rows: list[dict], args, command: str, merge_existing: bool) -> None:
    from benchmarks.harness import Row, gpu_slug, report

    gpu = "cpu" if args.cpu_smoke else gpu_slug(0)
    path = Path(args.out_dir, f"{gpu}-{OP}.json")
    if merge_existing and path.exists():
        mine = {r["case"] for r in rows}
        rows = [r for r in json.loads(path.read_text())["rows"] if r["case"] not in mine] + rows
    notes = [
        f"heads {args.heads}, latent {R} + rope {P}, page {PAGE}, interleave {args.interleave}; "
        "ours = slowest rank's median of (decode on its shard + dcp_merge), L2 flushed",
        "1gpu-full: one GPU decoding the whole context; ours/1gpu-full < 1 means DCP is faster",
        "decode-only: slowest rank's shard decode; merge-only: all-gather LSE + rescale + "
        "reduce-scatter over heads",
    ]
    report([Row(**r) for r in rows], gpu, OP, command, out_dir=args.out_dir, notes=notes)


def _refuse(world_size: int, found: int) -> int:
    print(
        f"bench_dcp_decode: world size {world_size} needs {world_size} CUDA GPUs (one per rank), "
        f"found {found}; run on a machine with enough GPUs, pass --world-sizes, or --cpu-smoke",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    command = "python benchmarks/bench_dcp_decode.py " + " ".join(sys.argv[1:])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        world_size = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        if not args.cpu_smoke and found < world_size:
            return _refuse(world_size, found)
        if args.cpu_smoke:
            os.environ["TRITON_INTERPRET"] = "1"
        device = _device_for(int(os.environ.get("LOCAL_RANK", rank)), args.cpu_smoke)
        _init(rank, world_size, "gloo" if args.cpu_smoke else "nccl", "env://", device)
        try:
            rows = bench_rank(rank, world_size, args, device)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            torchrun = f"torchrun --nproc-per-node {world_size} benchmarks/bench_dcp_decode.py"
            _report(rows, args, " ".join([torchrun, *sys.argv[1:]]), merge_existing=True)
        return 0
    world_sizes = _ints(args.world_sizes)
    if not args.cpu_smoke:
        for n in world_sizes:
            if found < n:
                return _refuse(n, found)
    rows: list[dict] = []
    for n in world_sizes:
        with tempfile.TemporaryDirectory(prefix="bwx-dcp-bench-") as d:
            out = os.path.join(d, "rows.json")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(_spawned, args=(n, args, port, out), nprocs=n)
            rows += json.loads(Path(out).read_text())
    _report(rows, args, command, merge_existing=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
