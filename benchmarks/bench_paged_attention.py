"""Benchmark of BWX_ATTN's paged-attention kernel against vLLM 0.32's Triton unified attention.

Qwen3-8B shapes (32 query heads, 8 KV heads, head 128, pages of 16 unless a case names 128,
shuffled). Cases cover the serving shapes that matter: decode (bf16 and fp8 KV), spec-verify
and DFlash draft blocks (query 8/16, causal and not), the sliding-window draft layer and
prefill, over cached context too (chunks, prefix-cache hits). GB/s counts the KV
bytes a case must read (in the cache dtype) per second; the copy roofline is measured in the
same run, and so is a read-only stream (the ceiling of a kernel that only reads). Peers:
`vllm-triton-unified` (vLLM's kernel via `benchmarks/vllm_peer.py`, scratch sized as vLLM's
TritonAttentionMetadataBuilder sizes it), `vllm-fa3` (vLLM's FlashAttention 3, its default on
Hopper, where vLLM's CUDA wheel is installed: `benchmarks/vllm_cuda_peers.py`), `flashinfer`
(`benchmarks/flashinfer_peer.py`) and, for prefill, torch SDPA on contiguous K/V as torch
dispatches it (`sdpa`) and pinned to its FlashAttention and cuDNN backends (`sdpa-flash`,
`sdpa-cudnn`). Every peer's output is checked against ours once per case (the notes give,
per row, max |peer - ours| over the RMS of our row). The `host` cases time eager calls
instead: host wall time per call without synchronising, back-to-back eager time per call, and
the CUDA-graph replay, each its own metric.

    python benchmarks/bench_paged_attention.py [--out-dir DIR] [--peer-dir .peer] [--only SUBSTR]
        [--sweep SECONDS] [--flashinfer-dir .peer_flashinfer] [--no-flashinfer]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.flashinfer_peer import FlashInferPaged
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
from benchmarks.vllm_cuda_peers import FlashAttn3Paged
from benchmarks.vllm_peer import load_vllm_peer, peer_not_run_note
from vllm_blackwell_ext.kernels.device import device_info
from vllm_blackwell_ext.kernels.fresh_prefill import (
    FRESH_PREFILL_MIN_QUERY_LEN,
    fresh_prefill_config,
    fresh_prefill_supported,
    launch_fresh_prefill,
    plan_fresh_prefill,
)
from vllm_blackwell_ext.kernels.paged_attention import (
    AttnConfig,
    AttnShape,
    LayerOptions,
    SplitKVWorkspace,
    launch_paged_attention,
    paged_cache_layout,
    plan_paged_attention,
)

HQ, HKV, D, BS = 32, 8, 128, 16
PEER = "vllm-triton-unified"


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    ctx: int  # KV length of each request, its query tokens included
    q_len: int
    causal: bool = True
    window: int | None = None
    fp8: bool = False
    metric: str = "GB/s"
    prefill: int = 0  # > 0: request 0 brings this many query tokens (a mixed batch)
    host: bool = False  # host-time case: eager launch cost, not kernel speed
    page: int = BS  # tokens per cache page


def cases() -> list[Case]:
    cs: list[Case] = []
    for kv in ("bf16", "fp8"):
        fp8 = kv == "fp8"
        for b, ctx in ((1, 32768), (1, 131072), (8, 32768), (64, 32768), (256, 8192)):
            cs.append(Case(f"decode {kv} B={b} ctx={ctx // 1024}k", b, ctx, 1, fp8=fp8))
    for ctx in (8192, 131072):
        for q, causal in ((8, True), (16, True), (16, False)):
            kind = "verify causal" if causal else "draft non-causal"
            cs.append(Case(f"{kind} q={q} B=1 ctx={ctx // 1024}k", 1, ctx, q, causal))
    for q, causal in ((16, True), (16, False)):
        kind = "verify causal" if causal else "draft non-causal"
        cs.append(Case(f"{kind} q={q} B=8 ctx=32k", 8, 32768, q, causal))
    for ctx in (4096, 131072):
        cs.append(Case(f"draft non-causal W=2048 q=16 B=1 ctx={ctx // 1024}k", 1, ctx, 16, False,
                       window=2048, metric="us"))  # fmt: skip
    cs.append(Case("prefill causal B=1 L=8k", 1, 8192, 8192, metric="TFLOP/s"))
    cs.append(Case("prefill causal B=4 L=4k", 4, 4096, 4096, metric="TFLOP/s"))
    cs.append(Case("prefill chunk 2k after 14k ctx B=1", 1, 16384, 2048, metric="TFLOP/s"))
    # Pages of 128, what BWX_ATTN asks vLLM for on Hopper: whole TMA prefill tiles.
    for name, b, ctx, q in (
        ("prefill chunk 2k after 14k ctx B=1", 1, 16384, 2048),
        ("prefill chunk 8k after 24k ctx B=1", 1, 32768, 8192),
        ("prefill chunk 512 after 7.5k ctx B=4", 4, 8192, 512),
    ):
        cs.append(Case(f"{name} page=128", b, ctx, q, metric="TFLOP/s", page=128))
    for c in (
        Case("decode bf16 B=64 ctx=32k", 64, 32768, 1),
        Case("decode fp8 B=64 ctx=32k", 64, 32768, 1, fp8=True),
        Case("verify causal q=16 B=1 ctx=8k", 1, 8192, 16),
        Case("mixed 2k prefill chunk + 63 decodes ctx=8k", 64, 8192, 1, prefill=2048),
        Case(
            "mixed 2k prefill chunk + 63 decodes ctx=8k page=128",
            64,
            8192,
            1,
            prefill=2048,
            page=128,
        ),
        Case("prefill causal B=4 L=4k page=128", 4, 4096, 4096, page=128),
    ):
        cs.append(replace(c, name="host " + c.name, metric="us", host=True))
    return cs


def query_lens(c: Case) -> list[int]:
    return [c.prefill or c.q_len] + [c.q_len] * (c.batch - 1)


def keys_read(c: Case) -> int:
    """Keys each request's attention must read (the whole visible range, once per KV head)."""
    if c.window is not None:
        return min(c.ctx, c.window + c.q_len - 1)
    return c.ctx


def flops(c: Case) -> float:
    """2 matmuls x 2 flops per (query head, query, visible key, dim)."""
    ctx0 = c.ctx - c.q_len
    if c.causal:
        visible = c.q_len * ctx0 + c.q_len * (c.q_len + 1) // 2
    else:
        visible = c.q_len * c.ctx
    return 4.0 * HQ * D * visible * c.batch


class Inputs:
    """Paged inputs in vLLM 0.32's layout for one case."""

    def __init__(self, c: Case, device: str = "cuda") -> None:
        pages = -(-c.ctx // c.page)
        nb = c.batch * pages
        kv = torch.empty(nb, HKV, c.page, 2 * D, dtype=torch.bfloat16, device=device)
        kv.normal_()
        if c.fp8:
            kv8 = torch.empty(kv.shape, dtype=torch.float8_e4m3fn, device=device)
            for i in range(0, nb, 65536):  # chunked: no second full-size temporary
                kv8[i : i + 65536] = kv[i : i + 65536].to(torch.float8_e4m3fn)
            del kv
            kv = kv8
        self.kv = kv
        self.k, self.v = kv.transpose(1, 2).split(D, dim=-1)
        self.block_table = torch.randperm(nb, device=device, dtype=torch.int32).view(c.batch, pages)
        q_lens = torch.tensor([0, *query_lens(c)], dtype=torch.int32)
        self.max_seqlen_q = int(q_lens.max())
        self.q = torch.randn(int(q_lens.sum()), HQ, D, dtype=torch.bfloat16, device=device)
        self.out = torch.empty_like(self.q)
        self.cu = q_lens.cumsum(0, dtype=torch.int32).to(device)
        self.seq_lens = torch.full((c.batch,), c.ctx, dtype=torch.int32, device=device)
        self.k_scale = torch.tensor([0.7], device=device) if c.fp8 else None
        self.v_scale = torch.tensor([0.9], device=device) if c.fp8 else None


def fresh_kv(c: Case, x: Inputs) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's own K/V, [tokens, HKV, D] each, where BWX_ATTN's forward would hand a case's
    prompts (no cached context) to `fresh_prefill`; None where it would not."""
    takes = fresh_prefill_supported(
        device_info(x.q.device), q_dtype=x.q.dtype, kv_dtype=x.k.dtype, num_q_heads=HQ,
        num_kv_heads=HKV, head_size=D, head_size_v=D, causal=c.causal,
        sliding_window=c.window, has_sinks=False, softcap=0.0,
    )  # fmt: skip
    if not takes or c.prefill or c.q_len != c.ctx or c.q_len < FRESH_PREFILL_MIN_QUERY_LEN:
        return None
    pages = x.block_table.long()
    return tuple(
        t[pages].reshape(c.batch, -1, HKV, D)[:, : c.ctx].reshape(-1, HKV, D).contiguous()
        for t in (x.k, x.v)
    )


def ours_fn(
    c: Case,
    x: Inputs,
    ws: SplitKVWorkspace,
    *,
    config: AttnConfig | None = None,
    num_splits: int | None = None,
    compiled: list | None = None,
):
    """What BWX_ATTN runs: the batch's plan made once (as its metadata builder does), then
    launched over the cache's layout made once (as each layer's forward does), and
    `fresh_prefill` for prompts without cached context where the device takes it (the paged
    kernel then skips them; every case's requests are alike, so a case the fresh kernel takes
    leaves the paged kernel nothing and launches it not). `config` and `num_splits` override
    the plan's (tuning); `compiled`, a list, receives the compiled handles."""
    fresh = fresh_kv(c, x)
    info = device_info(x.q.device)
    layout = paged_cache_layout(x.k, x.v)
    plan = plan_paged_attention(
        AttnShape.of_layout(info, x.q, layout), num_tokens=x.q.shape[0],
        max_seqlen_q=x.max_seqlen_q, max_seqlen_k=c.ctx, num_splits=num_splits, config=config,
        max_splits=ws.max_splits, max_rows=ws.max_rows,
    )  # fmt: skip
    layer = LayerOptions(
        D**-0.5, causal=c.causal, sliding_window=c.window, k_scale=x.k_scale, v_scale=x.v_scale
    )
    fresh_plan = plan_fresh_prefill(info, num_q_heads=HQ, num_kv_heads=HKV, head_size=D)
    handles = compiled if compiled is not None else []

    def fn() -> None:
        if fresh is None:
            handles[:] = launch_paged_attention(
                plan, x.q, layout, x.out, x.cu, x.seq_lens, x.block_table, layer, workspace=ws
            )
        else:
            handles[:] = [
                launch_fresh_prefill(fresh_plan, x.q, *fresh, x.out, x.cu, x.seq_lens, D**-0.5)
            ]

    fn.plan = plan  # type: ignore[attr-defined]
    return fn


class PeerVllm:
    """vLLM 0.32's `unified_attention` with scratch sized like its metadata builder."""

    def __init__(self, peer_dir: str, device: str = "cuda") -> None:
        load_vllm_peer(peer_dir)
        from vllm.v1.attention.ops.triton_unified_attention import (  # type: ignore
            unified_attention,
        )
        from vllm.v1.kv_cache_interface import KVQuantMode  # type: ignore

        self.fn = unified_attention
        self.fp8_mode = KVQuantMode.FP8_PER_TENSOR
        self.none_mode = KVQuantMode.NONE
        # TritonAttentionMetadataBuilder: threshold = 128 // num_kv_heads sequences, 16 segments.
        self.seq_threshold_3d = 128 // HKV
        self.segments = 16
        rows = self.seq_threshold_3d
        self.segm_out = torch.empty(rows, HQ, self.segments, D, dtype=torch.float32, device=device)
        self.segm_max = torch.empty(rows, HQ, self.segments, dtype=torch.float32, device=device)
        self.segm_expsum = torch.empty(rows, HQ, self.segments, dtype=torch.float32, device=device)

    def make(self, c: Case, x: Inputs):
        if c.window is None:
            window = (-1, -1)
        else:  # as vLLM's TritonAttentionImpl: non-causal applies the window both ways
            window = (c.window - 1, 0) if c.causal else (c.window - 1, c.window - 1)
        one = torch.ones(1, device=x.q.device)

        def fn() -> None:
            self.fn(
                q=x.q, k=x.k, v=x.v, out=x.out, cu_seqlens_q=x.cu, max_seqlen_q=x.max_seqlen_q,
                seqused_k=x.seq_lens, max_seqlen_k=c.ctx, softmax_scale=D**-0.5,
                causal=c.causal, window_size=window, block_table=x.block_table, softcap=0,
                q_descale=None,
                k_descale=x.k_scale if c.fp8 else one, v_descale=x.v_scale if c.fp8 else one,
                seq_threshold_3D=self.seq_threshold_3d,
                num_par_softmax_segments=self.segments, softmax_segm_output=self.segm_out,
                softmax_segm_max=self.segm_max, softmax_segm_expsum=self.segm_expsum,
                kv_quant_mode=self.fp8_mode if c.fp8 else self.none_mode,
            )  # fmt: skip

        return fn


SDPA_BACKENDS = {"sdpa": None, "sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}


def sdpa_fn(c: Case, x: Inputs, backend: str | None = None):
    """SDPA on contiguous K/V (prefill without context only), as torch dispatches it or pinned
    to one backend; returns the output in our token-major layout."""
    if c.q_len != c.ctx or c.fp8:
        return None
    pages = x.block_table.long()
    k = x.k[pages].reshape(c.batch, c.ctx, HKV, D).transpose(1, 2)
    v = x.v[pages].reshape(c.batch, c.ctx, HKV, D).transpose(1, 2)
    k = k.repeat_interleave(HQ // HKV, dim=1).contiguous()
    v = v.repeat_interleave(HQ // HKV, dim=1).contiguous()
    q = x.q.view(c.batch, c.q_len, HQ, D).transpose(1, 2).contiguous()
    f = torch.nn.functional.scaled_dot_product_attention
    if backend is None:
        return lambda: f(q, k, v, is_causal=True, scale=D**-0.5)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pinned = getattr(SDPBackend, backend)

    def run() -> torch.Tensor:
        with sdpa_kernel(pinned):
            return f(q, k, v, is_causal=True, scale=D**-0.5)

    return run


def as_tokens(c: Case, out: torch.Tensor) -> torch.Tensor:
    """An SDPA output [batch, heads, len, head] in our [tokens, heads, head] order."""
    return out.transpose(1, 2).reshape(c.batch * c.q_len, HQ, D)


def graph_us(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median microseconds of `fn` replayed from a CUDA graph, as vLLM runs decode steps.

    Eager timing of a few-microsecond kernel measures Python launch overhead instead (both
    ours and vLLM's took ~110 us eagerly on the window case); replay measures the GPU.
    """
    fn()  # compile and warm up outside capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return bench_us(graph.replay, warmup_ms, rep_ms)


def figure(c: Case, us: float) -> float:
    if c.metric == "us":
        return us
    if c.metric == "TFLOP/s":
        return flops(c) / (us * 1e-6) / 1e12
    return kv_bytes(c) / (us * 1e-6) / 1e9


def kv_bytes(c: Case) -> int:
    """Bytes of K and V a case must read, in the cache dtype."""
    return c.batch * keys_read(c) * HKV * 2 * D * (1 if c.fp8 else 2)


def compiled_stats(c: Case, x: Inputs, ws: SplitKVWorkspace) -> str:
    if fresh_kv(c, x) is not None:
        cfg = fresh_prefill_config(device_info(x.q.device))
        return f"prompts through fresh_prefill (TMA) alone: {cfg}"
    handles: list = []
    fn = ours_fn(c, x, ws, compiled=handles)
    fn()
    h = handles[0]
    cfg, splits = fn.plan.config, fn.plan.num_splits
    return (f"{cfg} splits={splits} shared={h.metadata.shared} regs={getattr(h, 'n_regs', '?')} "
            f"spills={getattr(h, 'n_spills', '?')}")  # fmt: skip


def sweep(ws: SplitKVWorkspace, budget_s: float) -> None:
    """Time config/split variants on the decisive cases (for tuning the config table)."""
    t0 = time.time()
    picks = [
        Case("verify q=16 B=1 8k", 1, 8192, 16),
        Case("draft W=2048 q=16 B=1 4k", 1, 4096, 16, causal=False, window=2048),
        Case("decode fp8 B=64 32k", 64, 32768, 1, fp8=True),
        Case("decode fp8 B=8 32k", 8, 32768, 1, fp8=True),
        Case("verify q=16 B=8 32k", 8, 32768, 16),
        Case("decode bf16 B=1 32k", 1, 32768, 1),
    ]
    for c in picks:
        x = Inputs(c)
        planned = ours_fn(c, x, ws).plan
        plan, base = planned.num_splits, planned.config
        variants = [(base, plan)]
        if c.fp8:
            for tile in (64, 128, 256):
                for f16 in (True, False):
                    variants.append((replace(base, tile_n=tile, fp8_dot_fp16=f16), plan))
        elif c.batch == 1 and c.q_len > 1:
            # Short single-request blocks: where the fixed split + merge cost goes.
            variants += [(base, sp) for sp in (1, 2, 4, 8, 16, 64) if sp != plan]
            for tile, warps, stages in ((32, 4, 3), (64, 4, 3), (32, 8, 2), (128, 8, 2)):
                cfg = replace(base, tile_n=tile, num_warps=warps, num_stages=stages)
                variants += [(cfg, plan), (cfg, max(1, plan // 2))]
        else:
            for tile in (32, 64, 128):
                variants.append((replace(base, tile_n=tile), plan))
            for sp in (max(1, plan // 2), min(64, plan * 2)):
                variants.append((base, sp))
        for cfg, splits in variants:
            if time.time() - t0 > budget_s:
                print("sweep: time budget spent", flush=True)
                return
            try:
                us = graph_us(ours_fn(c, x, ws, config=cfg, num_splits=splits), 10, 40)
                print(
                    f"sweep {c.name}: tile={cfg.tile_n} st={cfg.num_stages} w={cfg.num_warps} "
                    f"f16dot={cfg.fp8_dot_fp16} splits={splits}: {us:.1f} us "
                    f"{figure(c, us):.0f} GB/s",
                    flush=True,
                )
            except Exception as e:  # out of shared memory and the like: report, go on
                print(f"sweep {c.name}: {cfg} failed: {e!r:.160}")
        del x
        gc.collect()
        torch.cuda.empty_cache()


def host_us(fn, n: int = 40, repeats: int = 7) -> float:
    """Host wall time of one eager call, without synchronising (what a step's CPU pays).

    The best of `repeats` bursts of `n` calls, the GPU drained between bursts: the host is
    shared with other processes, and a burst that meets one of them is not the call's cost.
    """
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


def eager_us(fn, n: int = 200) -> float:
    """Wall time per call of `n` back-to-back eager calls, GPU included (CUDA events)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def host_rows(
    c: Case, x: Inputs, ws: SplitKVWorkspace, peer: PeerVllm | None, fa3: FlashAttn3Paged | None
) -> list[Row]:
    """Host time, back-to-back eager time and CUDA-graph replay of ours and the peers."""
    fns = {"ours": ours_fn(c, x, ws)}
    if peer is not None:
        fns[PEER] = peer.make(c, x)
    if fa3 is not None:
        fns[fa3.name] = fa3_fn(fa3, c, x)
    host = {k: host_us(f) for k, f in fns.items()}
    eager = {k: eager_us(f) for k, f in fns.items()}
    graph = {k: graph_us(f) for k, f in fns.items()}
    ratio = {k: eager[k] / graph[k] for k in fns}
    print(f"{c.name}: host us {host}, eager us/call {eager}, graph us {graph}", flush=True)

    def row(suffix: str, metric: str, d: dict[str, float]) -> Row:
        return Row(
            f"{c.name}: {suffix}", metric, d["ours"], {k: v for k, v in d.items() if k != "ours"}
        )

    rows = [
        row("host per call", "host us", host),
        row("eager per call", "eager us", eager),
        row("graph replay", "us", graph),
    ]
    print(f"{c.name}: eager/graph ours {ratio['ours']:.2f} "
          f"peer {ratio.get(PEER, float('nan')):.2f}", flush=True)  # fmt: skip
    return rows


def flashinfer_fn(fi: FlashInferPaged, c: Case, x: Inputs):
    return fi.make(
        kv=x.kv, q=x.q, cu_seqlens_q=x.cu, seq_lens=x.seq_lens, block_table=x.block_table,
        max_seqlen_q=x.max_seqlen_q, causal=c.causal, window=c.window,
        k_scale=float(x.k_scale) if c.fp8 else None, v_scale=float(x.v_scale) if c.fp8 else None,
    )  # fmt: skip


def fa3_fn(fa3: FlashAttn3Paged, c: Case, x: Inputs):
    return fa3.make(
        kv=x.kv, q=x.q, cu_seqlens_q=x.cu, seq_lens=x.seq_lens, block_table=x.block_table,
        max_seqlen_q=x.max_seqlen_q, max_seqlen_k=c.ctx, causal=c.causal, window=c.window,
        k_scale=x.k_scale, v_scale=x.v_scale,
    )  # fmt: skip


def run_case(
    c: Case,
    ws: SplitKVWorkspace,
    peer: PeerVllm | None,
    roof: float,
    dev: str,
    fi: FlashInferPaged | None = None,
    notes: list[str] | None = None,
    fa3: FlashAttn3Paged | None = None,
) -> list[Row]:
    notes = notes if notes is not None else []
    x = Inputs(c, dev)
    if c.host:
        return host_rows(c, x, ws, peer, fa3)
    stats = compiled_stats(c, x, ws)
    us = graph_us(ours_fn(c, x, ws))
    ours_out = x.out.clone()
    # name -> a callable returning its output in our layout (None: it wrote x.out)
    makers = {}
    if peer is not None:
        makers[PEER] = lambda: peer.make(c, x)
    if fa3 is not None:
        makers[fa3.name] = lambda: fa3_fn(fa3, c, x)
    if fi is not None:
        makers[fi.name] = lambda: flashinfer_fn(fi, c, x)
    if c.metric == "TFLOP/s":
        for name, backend in SDPA_BACKENDS.items():
            if sdpa_fn(c, x, backend) is not None:
                makers[name] = lambda b=backend: sdpa_fn(c, x, b)
    peers: dict[str, float] = {}
    gaps: dict[str, float] = {}
    for name, make in makers.items():
        try:
            fn = make()
            result = fn()
            out = x.out if result is None else result
            gaps[name] = output_gap(ours_out, as_tokens(c, out) if "sdpa" in name else out)
            peers[name] = figure(c, graph_us(fn))
        except Exception as e:  # a kind a peer refuses: say so in the notes, go on
            note = peer_not_run_note(name, f"{c.name}: {type(e).__name__}: {e}"[:300])
            print(note, flush=True)
            notes.append(note)
    if gaps:
        notes.append(gap_note(c.name, gaps))
        print(notes[-1], flush=True)
    if c.metric == "GB/s":
        # A read of the same bytes alone, timed alike: what launch and ramp leave of the
        # device's rate at this size (short contexts are far from the 2 GiB stream's).
        same = read_roofline_gbps(dev, kv_bytes(c))
        mib, share = kv_bytes(c) / 2**20, figure(c, us) / same
        notes.append(f"{c.name}: a read-only stream of the same {mib:.0f} MiB ran at "
                     f"{same:.0f} GB/s; ours {share:.3f} of that")  # fmt: skip
        print(notes[-1], flush=True)
    rows = [Row(c.name, c.metric, figure(c, us), peers, roof if c.metric == "GB/s" else None)]
    if c.metric == "us":  # also eagerly: what a run without CUDA graphs pays per call
        eager = {PEER: bench_us(peer.make(c, x))} if peer is not None else {}
        if fa3 is not None:
            eager[fa3.name] = bench_us(fa3_fn(fa3, c, x))
        rows.append(Row(c.name + " (eager)", "eager us", bench_us(ours_fn(c, x, ws)), eager))
    for r in rows:
        print(f"{r.case}: ours {r.ours:.1f} {r.metric} ({us:.1f} us); peers "
              f"{ {k: round(v, 1) for k, v in r.peers.items()} }; {stats}", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_paged_attention.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument(
        "--peer-dir", default=".peer", help="vLLM kernels from scripts/fetch_vllm_peer.sh"
    )
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--sweep", type=float, default=0.0, help="seconds of config sweep after")
    ap.add_argument(
        "--flashinfer-dir",
        default=".peer_flashinfer",
        help="FlashInfer from scripts/fetch_flashinfer_peer.sh (where it is not installed)",
    )
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("paged-attention benchmark needs a CUDA GPU")
        return 1
    dev = "cuda"
    roof = copy_roofline_gbps(dev)
    print(f"copy roofline: {roof:.0f} GB/s", flush=True)
    peer_notes: list[str] = []
    # vLLM's CUDA kernels first: where they import, vLLM's own Triton kernel is the peer below
    # (no stand-ins shadow the installed vLLM).
    fa3: FlashAttn3Paged | None = None
    try:
        fa3 = FlashAttn3Paged()
    except Exception as e:  # no vLLM CUDA wheel here (the native image): the others anyway
        peer_notes.append(peer_not_run_note(FlashAttn3Paged.name, f"{type(e).__name__}: {e}"))
        print(peer_notes[-1], flush=True)
    peer: PeerVllm | None = None
    try:
        peer = PeerVllm(args.peer_dir, dev)
    except Exception as e:  # missing, or the stand-ins lag a newer kernel file: ours anyway
        peer_notes.append(peer_not_run_note(PEER, f"{type(e).__name__}: {e}"))
        print(peer_notes[-1], flush=True)
    fi: FlashInferPaged | None = None
    if args.no_flashinfer:
        peer_notes.append(peer_not_run_note(FlashInferPaged.name, "--no-flashinfer"))
    else:
        try:
            fi = FlashInferPaged(args.flashinfer_dir, dev)
        except Exception as e:  # not installed and no wheels, or it does not import here
            peer_notes.append(peer_not_run_note(FlashInferPaged.name, f"{type(e).__name__}: {e}"))
            print(peer_notes[-1], flush=True)
    read_roof = read_roofline_gbps(dev)
    print(f"read-only stream: {read_roof:.0f} GB/s", flush=True)
    ws = SplitKVWorkspace.for_device(HQ, HKV, D, device=dev)
    rows: list[Row] = []
    todo = [c for c in cases() if args.only is None or args.only in c.name]
    for c in progress(todo, "paged attention"):
        try:
            rows.extend(run_case(c, ws, peer, roof, dev, fi, peer_notes, fa3))
        except Exception as e:  # one broken case must not lose the others' figures
            print(f"{c.name}: FAILED {e!r}", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    command = "python benchmarks/bench_paged_attention.py " + " ".join(argv or sys.argv[1:])
    report(
        rows,
        gpu_slug(),
        "paged-attention",
        command.strip(),
        args.out_dir,
        notes=[
            *peer_notes,
            f"copy roofline {roof:.0f} GB/s (read + written); GB/s rows count KV bytes read; "
            f"a read-only stream ran at {read_roof:.0f} GB/s in the same run",
            "Qwen3-8B shapes: 32 q heads, 8 KV heads, head 128, pages of 16 (of 128 where named), "
            "shuffled",
            "times are CUDA-graph replays (as vLLM runs decode) for ours and every peer; "
            "'(eager)' rows are plain Python launches",
            "window rows: peer applies the window both ways in non-causal mode (vLLM 0.32)",
        ],
    )
    if args.sweep > 0:
        sweep(ws, args.sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
