"""One DFlash draft step on the GPU, ours vs vLLM's attention.

A Qwen3-8B-shaped draft (hidden 4096, 32/8 heads of 128, MLP 12288, 5 layers, `fc` from 5
target layers, vocabulary 151936) drafting a block of 16 for one request, as vLLM's DFlash
proposer runs it: the newly committed context tokens' features go through `fc` + norm into
every layer's K/V (written to the paged cache), then the query block [bonus, MASK x 15] runs
through the 5 layers (the 4 sliding layers causal with window 2048, the full one non-causal:
z-lab's mixed-layer convention) and the shared LM head scores the 15 masks.

The step is timed as a CUDA-graph replay (as vLLM runs drafts), in bf16 with a bf16 or fp8
KV cache, at contexts 4k to 128k, twice per case: attention through our kernel, and through
vLLM 0.32's Triton `unified_attention` (`benchmarks/vllm_peer.py`),
everything else identical. Also timed: the 5 attention calls alone. Floor: the bytes a step
must read (weights + visible KV) at the copy bandwidth measured in the same run.

    python benchmarks/bench_dflash_step.py [--out-dir DIR] [--peer-dir .peer] [--ctx 4096,...]
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # run from a checkout: `benchmarks.*`, the package

import torch

from benchmarks.bench_paged_attention import PeerVllm, graph_us
from benchmarks.harness import (
    Row,
    copy_roofline_gbps,
    gpu_slug,
    progress,
    report,
)
from benchmarks.vllm_peer import peer_not_run_note
from vllm_blackwell_ext.kernels.paged_attention import SplitKVWorkspace, paged_attention

H, HQ, HKV, D, INTER, VOCAB = 4096, 32, 8, 128, 12288, 151936
LAYERS, TARGET_LAYERS, BLOCK, WINDOW, PAGE = 5, 5, 16, 2048, 16
# per draft layer: (causal, window); sliding layers first, as z-lab's mixed drafts
LAYER_ATTENTION = [(True, WINDOW)] * 4 + [(False, None)]
EPS = 1e-6


@dataclass(frozen=True)
class StepCase:
    ctx: int  # KV length including the 16 block tokens
    fp8: bool = False
    new_context: int = BLOCK  # context tokens committed by the last step (K/V written now)

    @property
    def name(self) -> str:
        return f"{'fp8' if self.fp8 else 'bf16'} KV ctx={self.ctx // 1024}k"


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftWeights:
    def __init__(self, dev: str) -> None:
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=dev, dtype=torch.bfloat16) / shape[-1] ** 0.5

        self.fc = w(H, TARGET_LAYERS * H)
        self.norms = torch.ones(H, device=dev, dtype=torch.bfloat16)
        self.head_norm = torch.ones(D, device=dev, dtype=torch.bfloat16)
        self.qkv = [w((HQ + 2 * HKV) * D, H) for _ in range(LAYERS)]
        self.o = [w(H, HQ * D) for _ in range(LAYERS)]
        self.gate_up = [w(2 * INTER, H) for _ in range(LAYERS)]
        self.down = [w(H, INTER) for _ in range(LAYERS)]
        self.lm_head = w(VOCAB, H)

    def nbytes(self) -> int:
        ts = [self.fc, self.lm_head, *self.qkv, *self.o, *self.gate_up, *self.down]
        return sum(t.numel() * t.element_size() for t in ts)


class DraftStep:
    """Preallocated inputs and caches of one case; `step(attn)` runs the draft step."""

    def __init__(self, c: StepCase, wts: DraftWeights, dev: str) -> None:
        self.c, self.wts = c, wts
        pages = -(-c.ctx // PAGE)
        cache_dtype = torch.float8_e4m3fn if c.fp8 else torch.bfloat16
        self.kv = []
        for _ in range(LAYERS):
            kv = torch.empty(pages, HKV, PAGE, 2 * D, dtype=torch.bfloat16, device=dev)
            kv.normal_()
            self.kv.append(kv.to(cache_dtype))
            del kv
        self.views = [kv.transpose(1, 2).split(D, dim=-1) for kv in self.kv]
        self.block_table = torch.randperm(pages, device=dev, dtype=torch.int32)[None]
        self.seq_lens = torch.tensor([c.ctx], dtype=torch.int32, device=dev)
        self.cu = torch.tensor([0, BLOCK], dtype=torch.int32, device=dev)
        self.k_scale = torch.tensor([0.5], device=dev) if c.fp8 else None
        self.v_scale = torch.tensor([0.5], device=dev) if c.fp8 else None
        # slots of the new context tokens and of the block (the last 16 + new_context positions)
        first = c.ctx - BLOCK - c.new_context
        pos = torch.arange(first, c.ctx, device=dev)
        pages_of = self.block_table[0].long()[pos // PAGE]
        self.ctx_slots = (pages_of[: c.new_context], (pos % PAGE)[: c.new_context])
        self.blk_slots = (pages_of[c.new_context :], (pos % PAGE)[c.new_context :])
        inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
        ang = pos.float()[:, None] * inv
        emb = torch.cat([ang, ang], -1)[:, None, :]
        self.cos, self.sin = emb.cos().bfloat16(), emb.sin().bfloat16()
        self.features = torch.randn(c.new_context, TARGET_LAYERS * H, device=dev).bfloat16()
        self.block_emb = torch.randn(BLOCK, H, device=dev, dtype=torch.bfloat16)
        self.q = torch.empty(BLOCK, HQ, D, device=dev, dtype=torch.bfloat16)
        self.attn_out = torch.empty_like(self.q)
        self.logits = torch.empty(BLOCK - 1, VOCAB, device=dev, dtype=torch.bfloat16)

    def _store(self, layer: int, slots, k: torch.Tensor, v: torch.Tensor) -> None:
        kc, vc = self.views[layer]
        if self.c.fp8:  # per-tensor scale, as vLLM's cache write quantises
            k, v = (k.float() / self.k_scale).to(kc.dtype), (v.float() / self.v_scale).to(kc.dtype)
        kc[slots] = k
        vc[slots] = v

    def step(self, attention) -> None:
        w, n = self.wts, self.c.new_context
        cos_c, sin_c, cos_b, sin_b = self.cos[:n], self.sin[:n], self.cos[n:], self.sin[n:]
        ctx = _rms(self.features @ w.fc.T, w.norms)
        h = self.block_emb
        for i in range(LAYERS):
            # context tokens: K/V only
            ckv = (ctx @ w.qkv[i][HQ * D :].T).view(n, 2 * HKV, D)
            ck, cv = ckv[:, :HKV], ckv[:, HKV:]
            self._store(i, self.ctx_slots, _rope(_rms(ck, w.head_norm), cos_c, sin_c), cv)
            # query block
            x = _rms(h, w.norms)
            qkv = (x @ w.qkv[i].T).view(BLOCK, HQ + 2 * HKV, D)
            q, k, v = qkv[:, :HQ], qkv[:, HQ : HQ + HKV], qkv[:, HQ + HKV :]
            self.q.copy_(_rope(_rms(q, w.head_norm), cos_b, sin_b))
            self._store(i, self.blk_slots, _rope(_rms(k, w.head_norm), cos_b, sin_b), v)
            attention(i)
            h = h + self.attn_out.view(BLOCK, HQ * D) @ w.o[i].T
            x = _rms(h, w.norms)
            gate, up = (x @ w.gate_up[i].T).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ w.down[i].T
        torch.matmul(_rms(h[1:], w.norms), w.lm_head.T, out=self.logits)

    def ours(self, ws: SplitKVWorkspace):
        def attention(i: int) -> None:
            causal, window = LAYER_ATTENTION[i]
            k, v = self.views[i]
            paged_attention(
                self.q, k, v, self.attn_out, self.cu, self.seq_lens, self.block_table,
                max_seqlen_q=BLOCK, max_seqlen_k=self.c.ctx, softmax_scale=D**-0.5,
                causal=causal, sliding_window=window, k_scale=self.k_scale,
                v_scale=self.v_scale, workspace=ws,
            )  # fmt: skip

        return attention

    def peer(self, p: PeerVllm):
        one = torch.ones(1, device=self.q.device)

        def attention(i: int) -> None:
            causal, window = LAYER_ATTENTION[i]
            k, v = self.views[i]
            p.fn(
                q=self.q, k=k, v=v, out=self.attn_out, cu_seqlens_q=self.cu,
                max_seqlen_q=BLOCK, seqused_k=self.seq_lens, max_seqlen_k=self.c.ctx,
                softmax_scale=D**-0.5, causal=causal,
                window_size=(-1, -1) if window is None else (window - 1, 0),
                block_table=self.block_table, softcap=0, q_descale=None,
                k_descale=self.k_scale if self.c.fp8 else one,
                v_descale=self.v_scale if self.c.fp8 else one,
                seq_threshold_3D=p.seq_threshold_3d, num_par_softmax_segments=p.segments,
                softmax_segm_output=p.segm_out, softmax_segm_max=p.segm_max,
                softmax_segm_expsum=p.segm_expsum,
                kv_quant_mode=p.fp8_mode if self.c.fp8 else p.none_mode,
            )  # fmt: skip

        return attention

    def kv_bytes_read(self) -> int:
        elem = 1 if self.c.fp8 else 2
        keys = sum(
            self.c.ctx if win is None else min(self.c.ctx, win + BLOCK - 1)
            for _, win in LAYER_ATTENTION
        )
        return keys * HKV * 2 * D * elem


def run_case(c: StepCase, wts: DraftWeights, ws, peer, copy_gbps: float, dev: str) -> list[Row]:
    s = DraftStep(c, wts, dev)
    ours_attn = s.ours(ws)
    step_us = graph_us(lambda: s.step(ours_attn))
    s.step(ours_attn)
    ours_logits = s.logits.float().clone()
    attn_us = graph_us(lambda: [ours_attn(i) for i in range(LAYERS)])
    step_peers: dict[str, float] = {}
    attn_peers: dict[str, float] = {}
    if peer is not None:
        peer_attn = s.peer(peer)
        step_peers["step with vllm-triton-unified"] = graph_us(lambda: s.step(peer_attn))
        attn_peers["vllm-triton-unified"] = graph_us(lambda: [peer_attn(i) for i in range(LAYERS)])
        s.step(peer_attn)
        diff = (s.logits.float() - ours_logits).abs().max().item()
        print(f"{c.name}: draft logits ours vs peer attention: max |diff| {diff:.3g}", flush=True)
    floor_us = (wts.nbytes() + s.kv_bytes_read()) / (copy_gbps * 1e3)
    attn_floor_us = s.kv_bytes_read() / (copy_gbps * 1e3)
    print(f"{c.name}: step {step_us:.1f} us (peers {step_peers}), attention {attn_us:.1f} us "
          f"(peers {attn_peers}), floor {floor_us:.1f} us", flush=True)  # fmt: skip
    return [
        Row(f"draft step {c.name}", "us", step_us, step_peers, floor_us),
        Row(f"attention x5 {c.name}", "us", attn_us, attn_peers, attn_floor_us),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_dflash_step.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument(
        "--peer-dir", default=".peer", help="vLLM kernels from scripts/fetch_vllm_peer.sh"
    )
    ap.add_argument("--ctx", default="4096,8192,16384,32768,65536,131072")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the DFlash draft-step benchmark needs a CUDA GPU")
        return 1
    dev = "cuda"
    torch.manual_seed(0)
    copy_gbps = copy_roofline_gbps(dev)
    print(f"copy roofline: {copy_gbps:.0f} GB/s", flush=True)
    peer = None
    peer_notes: list[str] = []
    try:
        peer = PeerVllm(args.peer_dir, dev)
    except Exception as e:  # missing, or the stand-ins lag a newer kernel file: ours anyway
        peer_notes.append(peer_not_run_note("vLLM unified_attention", f"{type(e).__name__}: {e}"))
        print(peer_notes[-1], flush=True)
    wts = DraftWeights(dev)
    ws = SplitKVWorkspace.for_device(HQ, HKV, D, device=dev)
    ctxs = [int(x) for x in args.ctx.split(",")]
    rows: list[Row] = []
    for c in progress([StepCase(x, fp8) for fp8 in (False, True) for x in ctxs], "draft step"):
        try:
            rows.extend(run_case(c, wts, ws, peer, copy_gbps, dev))
        except Exception as e:  # keep the other cases' figures
            print(f"{c.name}: FAILED {e!r}", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    flat = []
    for kv in ("bf16", "fp8"):
        steps = {r.case: r for r in rows if r.case.startswith(f"draft step {kv}")}
        if len(steps) >= 2:
            first, last = list(steps.values())[0], list(steps.values())[-1]
            line = f"{kv} KV: step time {last.case[11:]} / {first.case[11:]} = "
            line += f"{last.ours / first.ours:.3f} (ours)"
            for p, v in last.peers.items():
                line += f", {v / first.peers[p]:.3f} ({p})" if p in first.peers else ""
            flat.append(line)
    command = "python benchmarks/bench_dflash_step.py " + " ".join(argv or sys.argv[1:])
    report(
        rows,
        gpu_slug(),
        "dflash-step",
        command.strip(),
        args.out_dir,
        notes=[
            *peer_notes,
            *flat,
            f"copy roofline {copy_gbps:.0f} GB/s; floor = (weights {wts.nbytes() / 1e9:.2f} GB "
            "+ visible KV) / copy bandwidth",
            "Qwen3-8B-shaped draft: 5 layers (4 sliding W=2048 causal, 1 full non-causal), "
            "block 16, batch 1, 16 new context tokens per step, CUDA-graph replays",
            "the peer runs the identical step with vLLM 0.32's unified_attention",
        ],
    )
    for line in flat:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
