"""Benchmark of BWX_MLA's decode kernel against vLLM 0.32's Triton MLA decode.

DeepSeek/Kimi shapes: latent 512 + rope 64, page size 64, pages shuffled. GB/s counts the KV
bytes a case must read (each request's context once, in the cache dtype) per second, against
the device-to-device copy roofline measured in the same run; TFLOP/s (128 heads) counts
2 * rows * context * (576 + 512) per call against a bf16 8192^3 matmul measured in the same run.
The peer `vllm-triton-mla` is vLLM's `decode_attention_fwd` (`benchmarks/vllm_peer.py`)
called as vLLM 0.32's `TritonMLAImpl.forward_mqa` calls it: its split-count formula, an fp32
`attn_logits` scratch of [rows, heads, splits, 513], query rows of a multi-token block
flattened with per-row causal extents.

`flashinfer-mla` is FlashInfer's MLA decode (`benchmarks/flashinfer_peer.py`). `flashmla` is
FlashMLA's dense decode as vLLM ships it where vLLM's CUDA wheel is installed (bf16 and fp8,
`benchmarks/vllm_cuda_peers.py`), else built from FlashMLA's source on the GPU machine
(`benchmarks/flashmla_peer.py`; bf16 rows only). Every peer's output is checked against ours
once per case (the notes give, per row, max |peer - ours| over the RMS of our row), and a
read-only stream is measured beside the copy roofline.

    python benchmarks/bench_mla_decode.py [--out-dir DIR] [--peer-dir .peer] [--only SUBSTR]
        [--flashinfer-dir .peer_flashinfer] [--flashmla-dir .peer_flashmla]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.flashinfer_peer import FlashInferMla
from benchmarks.flashmla_peer import FlashMla, PeerRefuses
from benchmarks.harness import (
    Row,
    bench_us,
    copy_roofline_gbps,
    gap_note,
    gpu_slug,
    output_gap,
    progress,
    read_roofline_gbps,
    report,
)
from benchmarks.vllm_cuda_peers import FlashMlaVllm
from benchmarks.vllm_peer import load_vllm_peer, peer_not_run_note
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.mla_decode import (
    MlaDecodeConfig,
    MlaDecodeWorkspace,
    cache_tma_page_size,
    launch_mla_decode,
    mla_cache_layout,
    mla_decode_flops,
    plan_mla_decode,
    query_is_tma_readable,
)

R, P, PAGE = 512, 64, 64
W = R + P
PEER = "vllm-triton-mla"
MAX_TOKENS = 8 * 1024 * 1024  # largest B x context benchmarked (9.7 GB of bf16 cache)


@dataclass(frozen=True)
class Case:
    name: str
    heads: int
    batch: int
    ctx: int
    fp8: bool = False
    q_len: int = 1
    metric: str = "GB/s"
    plan_ctx: int | None = None  # split plan of a CUDA graph captured for this longer context


def cases() -> list[Case]:
    cs: list[Case] = []
    for fp8 in (False, True):
        kv = "fp8" if fp8 else "bf16"
        for batch in (1, 8, 64, 256):
            for ctx in (4096, 32768, 131072):
                if batch * ctx > MAX_TOKENS:
                    continue
                cs.append(Case(f"h16 {kv} B={batch} ctx={ctx // 1024}k", 16, batch, ctx, fp8))
        cs.append(Case(f"h16 {kv} B=1 ctx=4k latency", 16, 1, 4096, fp8, metric="us"))
        cs.append(Case(f"h16 {kv} B=1 ctx=4k in a 128k graph", 16, 1, 4096, fp8, metric="us",
                       plan_ctx=131072))  # fmt: skip
        cs.append(Case(f"h32 {kv} B=64 ctx=32k", 32, 64, 32768, fp8))
        cs.append(Case(f"h16 {kv} q_len=4 B=64 ctx=32k", 16, 64, 32768, fp8, q_len=4))
        cs.append(Case(f"h128 {kv} B=64 ctx=32k", 128, 64, 32768, fp8, metric="TFLOP/s"))
    return cs


class Caches:
    """One shared page pool per cache dtype; each case takes a shuffled subset of its pages."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.pools: dict[bool, torch.Tensor] = {}
        self.k_scale = torch.tensor([0.125], dtype=torch.float32, device=device)

    def pool(self, fp8: bool) -> torch.Tensor:
        if fp8 not in self.pools:
            pages = MAX_TOKENS // PAGE + 16
            cache = torch.empty(pages, PAGE, W, dtype=torch.bfloat16, device=self.device)
            cache.normal_()
            if fp8:
                cache = _to_fp8(cache)
            self.pools[fp8] = cache
        return self.pools[fp8]


def _to_fp8(cache: torch.Tensor) -> torch.Tensor:
    # Chunked, so converting a 9.7 GB pool needs no fp32 copy of it.
    out = torch.empty(cache.shape, dtype=torch.float8_e4m3fn, device=cache.device)
    step = 4096
    for i in range(0, cache.shape[0], step):
        out[i : i + step] = (cache[i : i + step] * 8).to(torch.float8_e4m3fn)
    return out


@dataclass
class Inputs:
    q: torch.Tensor
    cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: torch.Tensor | None


def make_inputs(c: Case, caches: Caches) -> Inputs:
    dev = caches.device
    pool = caches.pool(c.fp8)
    per_seq = c.ctx // PAGE
    perm = torch.randperm(pool.shape[0], device=dev)[: c.batch * per_seq]
    bt = perm.view(c.batch, per_seq).to(torch.int32)
    q = torch.randn(c.batch * c.q_len, c.heads, W, dtype=torch.bfloat16, device=dev)
    seq = torch.full((c.batch,), c.ctx, dtype=torch.int32, device=dev)
    return Inputs(q, pool, bt, seq, caches.k_scale if c.fp8 else None)


def ours_fn(c: Case, x: Inputs, **kw):
    """Our decode of case `c` as BWX_MLA runs it: planned once (for `c.plan_ctx` where a
    graph was captured for a longer context), launched per call. `kw`: `num_splits`,
    `variant`, `config` (plan overrides) and `compiled` (a list receiving each launch's
    compiled split kernel)."""
    info = device_info(x.q.device)
    plan = plan_mla_decode(
        c.batch, c.heads, c.plan_ctx or c.ctx, c.q_len, info, kv_dtype=x.cache.dtype,
        q_dtype=x.q.dtype, kv_lora_rank=R, tma_page_size=cache_tma_page_size(x.cache, info),
        query_tma_readable=query_is_tma_readable(x.q), num_splits=kw.get("num_splits"),
        variant=kw.get("variant"), config=kw.get("config"),
    )  # fmt: skip
    ws = MlaDecodeWorkspace.allocate(x.q.shape[0], c.heads, plan.num_splits, R, x.q.device)
    out = torch.empty(x.q.shape[0], c.heads, R, dtype=x.q.dtype, device=x.q.device)
    lse = torch.empty(x.q.shape[0], c.heads, dtype=torch.float32, device=x.q.device)
    layout = mla_cache_layout(x.cache, info)
    compiled = kw.get("compiled")

    def fn() -> torch.Tensor:
        handle = launch_mla_decode(
            plan, x.q, x.cache, x.block_table, x.seq_lens, out, softmax_scale=W**-0.5,
            k_scale=x.k_scale, lse_out=lse, workspace=ws, cache_layout=layout,
        )  # fmt: skip
        if compiled is not None:
            compiled.append(handle)
        return out

    fn.plan = plan  # type: ignore[attr-defined]
    fn.splits = plan.num_splits  # type: ignore[attr-defined]
    fn.cfg = plan.config  # type: ignore[attr-defined]
    fn.out = out  # type: ignore[attr-defined]
    return fn


class PeerVllm:
    """vLLM 0.32's `decode_attention_fwd`, called as `TritonMLAImpl.forward_mqa` calls it."""

    def __init__(self, peer_dir: str) -> None:
        load_vllm_peer(peer_dir)
        from vllm.v1.attention.ops.triton_decode_attention import (  # type: ignore
            decode_attention_fwd,
        )

        self.fn = decode_attention_fwd

    @staticmethod
    def num_kv_splits(max_seq_len: int, sm_count: int) -> int:
        # triton_mla.py `_compute_num_kv_splits`: 512 keys per split, <= 2 x SMs, power of 2.
        import triton

        ideal = triton.next_power_of_2(max(1, max_seq_len // 512))
        return min(ideal, sm_count * 2)

    def make(self, c: Case, x: Inputs):
        rows = x.q.shape[0]
        splits = self.num_kv_splits(c.plan_ctx or c.ctx, device_info(x.q.device).num_sms)
        logits = torch.empty(rows, c.heads, splits, R + 1, dtype=torch.float32, device=x.q.device)
        o = torch.zeros(rows, c.heads, R, dtype=x.q.dtype, device=x.q.device)
        lse = torch.zeros(rows, c.heads, dtype=x.q.dtype, device=x.q.device)
        kv = x.cache.unsqueeze(2)
        kv_c = kv[..., :R]
        bt, seq = x.block_table, x.seq_lens
        if c.q_len > 1:
            bt = bt.repeat_interleave(c.q_len, dim=0)
            offs = torch.arange(1 - c.q_len, 1, device=seq.device, dtype=seq.dtype)
            seq = (seq.unsqueeze(1) + offs).flatten().clamp(min=0)
        one = torch.tensor(1.0, dtype=torch.float32, device=x.q.device)
        scale = x.k_scale if x.k_scale is not None else one

        def fn() -> torch.Tensor:
            self.fn(
                x.q,
                kv,
                kv_c,
                o,
                lse,
                bt,
                seq,
                logits,
                splits,
                W**-0.5,
                PAGE,
                k_scale=scale,
                v_scale=scale,
                is_mla=True,
            )
            return o

        return fn


def graph_us(fn) -> float:
    """Median time of one replay of `fn` captured in a CUDA graph.

    vLLM runs decode under CUDA graphs, so host launch cost (two Triton launches with ~35
    arguments each here, one or two for the peer) is not part of what a server pays per step;
    timing replays measures the GPU work alone, for ours and the peer alike.
    """
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up on a side stream before capture, as torch.cuda.graphs recommends
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_us(graph.replay)


def kv_bytes(c: Case) -> int:
    return c.batch * c.ctx * W * (1 if c.fp8 else 2)


def figure(c: Case, us: float) -> float:
    if c.metric == "us":
        return us
    if c.metric == "TFLOP/s":
        return mla_decode_flops(c.batch * c.q_len, c.heads, c.ctx, R) / (us * 1e-6) / 1e12
    return kv_bytes(c) / (us * 1e-6) / 1e9


def compare_configs(
    cases: Sequence[Case],
    variants: Callable[[MlaDecodeConfig], dict[str, MlaDecodeConfig]],
    copy_gbps: float | None = None,
) -> None:
    """Print each case timed with each config of `variants(the shipped config)` on the same
    values and split plan (CUDA-graph replays): kernel, registers, time and figure (and the
    fraction of `copy_gbps` for GB/s rows), then each config's largest output gap to the first's."""
    caches = Caches("cuda")
    for c in cases:
        torch.manual_seed(0)
        x = make_inputs(c, caches)
        outs = {}
        for label, cfg in variants(ours_fn(c, x).cfg).items():
            handles: list = []
            fn = ours_fn(c, x, config=cfg, compiled=handles)
            us = graph_us(fn)
            outs[label] = fn.out.float().clone()
            value = figure(c, us)
            roof = f" ({value / copy_gbps:.3f} of copy)" if copy_gbps and c.metric == "GB/s" else ""
            print(f"{c.name}: {label} ({handles[0].name}, {getattr(handles[0], 'n_regs', '?')} "
                  f"registers, splits={fn.splits}): {us:.1f} us {value:.1f} {c.metric}{roof}",
                  flush=True)  # fmt: skip
        first, *others = outs
        for label in others:
            gap = (outs[label] - outs[first]).abs().max().item()
            print(f"{c.name}: max |{label} - {first}| {gap:.2e}", flush=True)
        del x
        torch.cuda.empty_cache()


def matmul_tflops(device: str = "cuda", n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    us = bench_us(lambda: a @ b)
    return 2 * n**3 / (us * 1e-6) / 1e12


def compiled_stats(c: Case, x: Inputs) -> str:
    handles: list = []
    fn = ours_fn(c, x, compiled=handles)
    fn()
    h = handles[0]
    return (
        f"{fn.plan.variant} {fn.cfg} splits={fn.splits} "  # type: ignore[attr-defined]
        f"shared={h.metadata.shared} "
        f"regs={getattr(h, 'n_regs', '?')} spills={getattr(h, 'n_spills', '?')}"
    )


def time_peers(c: Case, x: Inputs, timer, ours_out: torch.Tensor, peers, notes: list[str]):
    """Each available peer's figure for case `c`; its output checked against ours (notes)."""
    scale = float(x.k_scale) if x.k_scale is not None else None
    makers = {}  # name -> a maker of a timed callable that returns the peer's output
    for p in peers:
        if isinstance(p, PeerVllm):
            makers[PEER] = lambda p=p: p.make(c, x)
        elif isinstance(p, FlashInferMla):
            makers[p.name] = lambda p=p: p.make(
                q=x.q, cache=x.cache, block_table=x.block_table, seq_lens=x.seq_lens,
                query_len=c.q_len, rank=R, softmax_scale=W**-0.5, k_scale=scale,
            )  # fmt: skip
        elif p is not None:  # FlashMLA, from vLLM's wheel or from source
            makers[p.name] = lambda p=p: p.make(
                q=x.q, cache=x.cache, block_table=x.block_table, seq_lens=x.seq_lens,
                query_len=c.q_len, rank=R, softmax_scale=W**-0.5, k_scale=x.k_scale,
            )  # fmt: skip
    figures: dict[str, float] = {}
    gaps: dict[str, float] = {}
    for name, make in makers.items():
        try:
            fn = make()
            result = fn()
            out = result[0] if isinstance(result, tuple) else result
            gaps[name] = output_gap(ours_out, out)
            figures[name] = figure(c, timer(fn))
        except PeerRefuses as e:  # source-built FlashMLA on fp8: once in the notes
            note = peer_not_run_note(name, f"fp8 rows: {e}")
            if note not in notes:
                notes.append(note)
        except Exception as e:  # a case a peer refuses: say so in the notes, go on
            note = peer_not_run_note(name, f"{c.name}: {type(e).__name__}: {e}"[:300])
            print(note, flush=True)
            notes.append(note)
    if gaps:
        notes.append(gap_note(c.name, gaps))
    return figures


def load_peers(args: argparse.Namespace):
    """(vLLM's Triton MLA, FlashInfer, FlashMLA, notes): each peer that loads here, else None
    with a note saying why."""
    peer_notes: list[str] = []
    # vLLM's FlashMLA first: where it imports, vLLM's own Triton MLA kernel is the peer below
    # (no stand-ins shadow the installed vLLM).
    fmla: FlashMlaVllm | FlashMla | None = None
    if args.no_peer:
        peer_notes.append(peer_not_run_note(FlashMla.name, "--no-peer"))
    else:
        try:
            fmla = FlashMlaVllm()
        except Exception as wheel_error:  # no vLLM CUDA wheel: FlashMLA's source, if carried
            try:
                fmla = FlashMla(args.flashmla_dir)
            except Exception as e:  # no sources, or they do not build here: the others anyway
                why = f"{wheel_error}; and from source: {type(e).__name__}: {e}"
                peer_notes.append(peer_not_run_note(FlashMla.name, why[:600]))
                print(peer_notes[-1], flush=True)
    peer = None
    if not args.no_peer:
        try:
            peer = PeerVllm(args.peer_dir)
        except Exception as e:  # missing, or the stand-ins lag a newer kernel file: ours anyway
            peer_notes.append(peer_not_run_note(PEER, f"{type(e).__name__}: {e}"))
            print(peer_notes[-1], flush=True)
    else:
        peer_notes.append(peer_not_run_note(PEER, "--no-peer"))
    fi: FlashInferMla | None = None
    if args.no_peer:
        peer_notes.append(peer_not_run_note(FlashInferMla.name, "--no-peer"))
    else:
        try:
            fi = FlashInferMla(args.flashinfer_dir)
        except Exception as e:  # not installed and no wheels, or it does not import here
            peer_notes.append(peer_not_run_note(FlashInferMla.name, f"{type(e).__name__}: {e}"))
            print(peer_notes[-1], flush=True)
    return peer, fi, fmla, peer_notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_mla_decode.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--peer-dir", default=".peer")
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument(
        "--flashinfer-dir",
        default=".peer_flashinfer",
        help="FlashInfer from scripts/fetch_flashinfer_peer.sh (where it is not installed)",
    )
    ap.add_argument(
        "--flashmla-dir",
        default=".peer_flashmla",
        help="FlashMLA sources from scripts/fetch_flashmla_peer.sh (built here on first use)",
    )
    ap.add_argument(
        "--eager",
        dest="graph",
        action="store_false",
        help="time eager calls (host launch included) instead of CUDA-graph replays",
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mla_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = "cuda"
    peer, fi, fmla, peer_notes = load_peers(args)
    roof_gbps = copy_roofline_gbps(dev)
    read_gbps = read_roofline_gbps(dev)
    roof_tflops = matmul_tflops(dev)
    print(
        f"copy roofline {roof_gbps:.0f} GB/s, read-only stream {read_gbps:.0f} GB/s, "
        f"bf16 matmul {roof_tflops:.0f} TFLOP/s",
        flush=True,
    )
    caches = Caches(dev)
    rows: list[Row] = []
    notes: list[str] = [
        *peer_notes,
        f"copy roofline {roof_gbps:.0f} GB/s (a read-only stream: {read_gbps:.0f} GB/s); "
        f"bf16 matmul {roof_tflops:.0f} TFLOP/s",
        "timing: " + ("CUDA-graph replays (as vLLM decodes)" if args.graph else "eager calls"),
    ]
    selected = [c for c in cases() if args.only is None or args.only in c.name]
    for c in progress(selected, "mla_decode"):
        torch.manual_seed(0)
        x = make_inputs(c, caches)
        stats = compiled_stats(c, x)
        timer = graph_us if args.graph else bench_us
        ours_call = ours_fn(c, x)
        ours = figure(c, timer(ours_call))
        ours_out = ours_call().clone()
        peers = time_peers(c, x, timer, ours_out, [peer, fi, fmla], notes)
        if c.metric == "us":
            # Where the time goes: the eager call (host launch included) and the split stage
            # alone with one split (no merge).
            eager = bench_us(ours_fn(c, x))
            one = timer(ours_fn(c, x, num_splits=1))
            stats += f" eager={eager:.1f}us one-split={one:.1f}us"
        roof = {"GB/s": roof_gbps, "TFLOP/s": roof_tflops}.get(c.metric)
        rows.append(Row(c.name, c.metric, ours, peers, roof))
        # Every figure of the row as it comes, so a run cut short still reports the rows done.
        beside = " ".join(f"{name} {value:.1f}" for name, value in peers.items())
        of_roof = f" ({ours / roof:.3f} of the roofline)" if roof else ""
        print(f"{c.name}: ours {ours:.1f} {c.metric}{of_roof} {beside} [{stats}]", flush=True)
        notes.append(f"{c.name}: {stats}")
        del x
    command = "python benchmarks/bench_mla_decode.py " + " ".join(argv or [])
    report(rows, gpu_slug(dev), "mla-decode", command.strip(), args.out_dir, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
