"""Experiment: fp8-cache MLA decode variants against the package's split kernel, 16 heads.

"cur" is `_mla_decode_split_kernel` with its sm90 fp8 config; "t-*" is the swap-AB kernel of
`mla_swap_ab_kernel.py` (keys as the MMA's M so Hopper's wgmma applies): "fp8dots" quantises q
(per row) and P to e4m3 and runs both products in fp8, "qkfp8" only QK^T, "f16" neither. The
correctness lines compare against the fp32 reference on a small case (3 contexts, 1 and 5
splits). H200 run: `benchmarks/results/h200-mla-fp8-variants.txt` (with the merge kernel of that
day; the split kernels dominate every case timed there).

    python benchmarks/experiments/mla_fp8_variants.py
"""

import functools
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src"), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from mla_swap_ab_kernel import _mla_split_t  # noqa: E402

from benchmarks.bench_mla_decode import graph_us  # noqa: E402
from benchmarks.harness import copy_roofline_gbps  # noqa: E402
from vllm_blackwell_ext.kernels import mla_decode as M  # noqa: E402
from vllm_blackwell_ext.kernels.device import device_info  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode_configs import MlaDecodeConfig as C  # noqa: E402
from vllm_blackwell_ext.reference.mla_decode import mla_decode_reference  # noqa: E402

R, P, PAGE, W = 512, 64, 64, 576


def launch(kern, extra, cfg, q, kv, bt, seq, out, scale, splits, ws, lse=None, causal=True):
    T, H, _ = q.shape
    B = seq.shape[0]
    ql = T // B
    rg = triton.cdiv(ql * H, cfg.block_m)
    single = splits == 1
    if single:
        o_part = l_part = out
        ps = (0,) * 5
    else:
        need = T * H * splits
        o_part = ws.o_part[:need].view(T, H, splits, R)
        l_part = ws.l_part[:need].view(T, H, splits)
        ps = (
            o_part.stride(0),
            o_part.stride(1),
            o_part.stride(2),
            l_part.stride(0),
            l_part.stride(1),
        )
    has_lse = lse is not None
    lse_arg = lse if has_lse else out
    h = kern[(rg * splits * B,)](
        q,
        kv,
        bt,
        seq,
        scale,
        o_part,
        l_part,
        out,
        lse_arg,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        kv.stride(1),
        bt.stride(0),
        *ps,
        out.stride(0),
        out.stride(1),
        lse.stride(0) if has_lse else 0,
        W**-0.5 * 1.4426950408889634,
        H,
        ql,
        splits,
        rg,
        R=R,
        P=P,
        PAGE_SIZE=PAGE,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        HAS_SCALE=True,
        SINGLE_SPLIT=single,
        HAS_LSE=has_lse,
        DOT_DTYPE=tl.float16,
        PRESCALE_Q=True,
        RELOAD_V=cfg.reload_v,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **extra,
    )
    if not single:
        block_r, block_s, merge_warps = M.merge_config(splits)
        M._mla_decode_merge_kernel[(T, H, R // block_r)](
            o_part,
            l_part,
            out,
            lse_arg,
            seq,
            *ps,
            out.stride(0),
            out.stride(1),
            lse.stride(0) if has_lse else 0,
            splits,
            ql,
            BLOCK_N=cfg.block_n,
            BLOCK_R=block_r,
            BLOCK_S=block_s,
            HAS_LSE=has_lse,
            num_warps=merge_warps,
        )
    return h


VARIANTS = {
    "cur": (M._mla_decode_split_kernel, {}, C(16, 64, 8, 3, 1, 128, True)),
    "t-fp8dots-n64w4s3": (_mla_split_t, dict(QK_FP8=True, PV_FP8=True), C(16, 64, 4, 3, 1, 128)),
    "t-fp8dots-n64w4s2": (_mla_split_t, dict(QK_FP8=True, PV_FP8=True), C(16, 64, 4, 2, 2, 128)),
    "t-fp8dots-n128w8s3": (_mla_split_t, dict(QK_FP8=True, PV_FP8=True), C(16, 128, 8, 3, 1, 128)),
    "t-fp8dots-n128w4s2": (_mla_split_t, dict(QK_FP8=True, PV_FP8=True), C(16, 128, 4, 2, 1, 128)),
    "t-qkfp8-reload-n64w4s3": (
        _mla_split_t,
        dict(QK_FP8=True, PV_FP8=False),
        C(16, 64, 4, 3, 1, 128, True),
    ),
    "t-f16-reload-n64w4s3": (
        _mla_split_t,
        dict(QK_FP8=False, PV_FP8=False),
        C(16, 64, 4, 3, 1, 128, True),
    ),
}


def main():
    dev = "cuda"
    info = device_info(torch.device(dev))
    copy = copy_roofline_gbps()
    print(f"copy {copy:.0f} GB/s", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    # correctness: small case vs fp32 reference
    B, ctxs = 4, [1, 77, 1000, 3000]
    mp0 = max(math.ceil(c / PAGE) for c in ctxs)
    pages = B * mp0 + 8
    kv8 = (torch.randn(pages, PAGE, W, device=dev, generator=g) * 8).to(torch.float8_e4m3fn)
    mp = max(math.ceil(c / PAGE) for c in ctxs)
    bt = torch.randperm(pages, device=dev)[: B * mp].view(B, mp).to(torch.int32)
    seq = torch.tensor(ctxs, device=dev, dtype=torch.int32)
    q = torch.randn(B, 16, W, device=dev, generator=g).to(torch.bfloat16)
    ks = torch.tensor([0.125], device=dev)
    ref_o, ref_l = mla_decode_reference(
        q.cpu(),
        kv8.cpu(),
        bt.cpu(),
        seq.cpu(),
        softmax_scale=W**-0.5,
        kv_lora_rank=R,
        k_scale=ks.cpu(),
    )
    ws = M.MlaDecodeWorkspace.allocate(64 * 4, 16, 256, R, dev)
    for name, (k, ex, cfg) in VARIANTS.items():
        for splits in (1, 5):
            out = torch.empty(B, 16, R, device=dev, dtype=torch.bfloat16)
            lse = torch.empty(B, 16, device=dev)
            try:
                h = launch(k, ex, cfg, q, kv8, bt, seq, out, ks, splits, ws, lse)
                torch.cuda.synchronize()
            except Exception as e:
                print(name, "FAILED", repr(e)[:300])
                break
            eo = (out.float().cpu() - ref_o).abs().max().item()
            el = (lse.cpu() - ref_l)[torch.isfinite(ref_l)].abs().max().item()
            print(
                f"{name:28s} splits={splits} max|out err|={eo:.4f} max|lse err|={el:.5f} "
                f"regs={h.n_regs} spills={h.n_spills} smem={h.metadata.shared}",
                flush=True,
            )
    # speed
    cases = [(64, 32768), (8, 131072), (1, 131072), (256, 4096), (64, 4096), (1, 4096)]
    maxtok = max(b * c for b, c in cases)
    pool = (
        torch.empty(maxtok // PAGE + 64, PAGE, W, device=dev, dtype=torch.uint8)
        .random_(0, 120)
        .view(torch.float8_e4m3fn)
    )
    for b, ctx in cases:
        npg = b * ctx // PAGE
        bt = torch.randperm(pool.shape[0], device=dev)[:npg].view(b, -1).to(torch.int32)
        seq = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(b, 16, W, device=dev).to(torch.bfloat16)
        out = torch.empty(b, 16, R, device=dev, dtype=torch.bfloat16)
        nbytes = b * ctx * W
        line = f"B={b:3d} ctx={ctx // 1024:3d}k"
        for name, (k, ex, cfg) in VARIANTS.items():
            for cps in (1, 2):
                cfg2 = C(
                    cfg.block_m,
                    cfg.block_n,
                    cfg.num_warps,
                    cfg.num_stages,
                    cps,
                    cfg.min_split_keys,
                    cfg.reload_v,
                )
                splits, _ = M.plan_mla_decode(
                    b, 16, ctx, 1, info, kv_dtype=torch.float8_e4m3fn, config=cfg2
                )
                ws2 = M.MlaDecodeWorkspace.allocate(b, 16, splits, R, dev) if splits > 1 else None
                try:
                    us = graph_us(
                        functools.partial(
                            launch, k, ex, cfg2, q, pool, bt, seq, out, ks, splits, ws2
                        )
                    )
                except Exception as e:
                    print(line, name, "FAILED", repr(e)[:200])
                    continue
                print(
                    f"{line} {name:28s} cps={cps} splits={splits:3d} {us:8.1f} us "
                    f"{nbytes / us / 1e3:7.0f} GB/s {nbytes / us / 1e3 / copy:.3f} of copy",
                    flush=True,
                )


if __name__ == "__main__":
    main()
