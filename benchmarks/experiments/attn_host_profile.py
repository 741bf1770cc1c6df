"""Where the host time of one eager `paged_attention` call goes (H200 experiment).

For decode batches, a draft block and mixed batches (pages of 16, and of 128 where a Hopper
prefill reads TMA tiles) it prints, per call, without synchronising: the whole call with and
without input checks, without them but deriving the cache's layout (`paged_cache_layout`:
TMA page size, descriptors) per call instead of once, through Triton's binder instead of
cached handles (`kernels/launch_cache.py`), with TMA descriptors encoded by Triton on every
launch instead of once per cache (where the launch has descriptors), the bare launch of the
same compiled handle three or four ways (tensors through the handle's runner, addresses
through it, addresses straight into `handle.run`: the floor below which only Triton's C
launcher and the driver remain; and descriptors encoded once), a few torch view ops for
scale, and the top of a cProfile of the call.

    python benchmarks/experiments/attn_host_profile.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "src")]

import torch

from benchmarks.bench_paged_attention import Case, Inputs, host_us, ours_fn
from vllm_blackwell_ext.kernels import paged_attention as pa

N = 40


def per_call_us(fn) -> float:
    return host_us(fn, N)


def bare_launches(call) -> None:
    """Host time of launching the attention kernel's compiled handle alone, three ways."""
    launcher = pa._ATTN_LAUNCHER
    seen: list = []
    real_launch = launcher.launch

    def spy(grid, args, **kw):
        handle = real_launch(grid, args, **kw)
        seen.append((grid, args, handle))
        return handle

    launcher.launch = spy
    try:
        call()
    finally:
        del launcher.launch
    grid, args, handle = seen[-1]
    stream = torch.cuda.current_stream().cuda_stream
    addrs = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    run = handle.run

    def tensors_runner():
        handle[grid](*args)

    def addresses_runner():
        handle[grid](*addrs, stream=stream)

    def addresses_run():
        run(*grid, stream, handle.function, handle.packed_metadata, None, None, None, *addrs)

    ways = [
        ("bare: tensors, handle[grid]", tensors_runner),
        ("bare: addresses, handle[grid]", addresses_runner),
        ("bare: addresses, handle.run", addresses_run),
    ]
    descriptor_launch = launcher._descriptor_launches.get(id(handle))
    if descriptor_launch is not None:
        ways.append(
            ("bare: descriptors encoded once", lambda: descriptor_launch(grid, stream, addrs))
        )
    for name, fn in ways:
        print(f"  {name:34s} {per_call_us(fn):7.1f} us/call")


def main() -> None:
    cases = [
        Case("decode bf16 B=64 ctx=32k", 64, 32768, 1),
        Case("decode fp8 B=64 ctx=32k", 64, 32768, 1, fp8=True),
        Case("draft W=2048 q=16 B=1 ctx=4k", 1, 4096, 16, False, window=2048),
        Case("mixed 2k chunk + 63 decodes ctx=8k", 64, 8192, 1, prefill=2048),
        Case("mixed 2k chunk + 63 decodes ctx=8k page=128", 64, 8192, 1, prefill=2048, page=128),
    ]
    for c in cases:
        x = Inputs(c)
        ws = pa.SplitKVWorkspace.for_device(32, 8, 128, "cuda")
        checked = ours_fn(c, x, ws)
        unchecked = ours_fn(c, x, ws, check_inputs=False)
        checked()
        torch.cuda.synchronize()
        print(f"== {c.name}", flush=True)
        print(f"  paged_attention checked       {per_call_us(checked):7.1f} us/call")
        print(f"  paged_attention unchecked     {per_call_us(unchecked):7.1f} us/call")
        per_call_layout = ours_fn(c, x, ws, check_inputs=False, cache_layout=None)
        print(f"  unchecked, layout per call    {per_call_us(per_call_layout):7.1f} us/call")
        launchers = (pa._ATTN_LAUNCHER, pa._MERGE_LAUNCHER)
        for launcher in launchers:
            launcher.enabled = False
        print(f"  unchecked, Triton's binder    {per_call_us(unchecked):7.1f} us/call")
        for launcher in launchers:
            launcher.enabled = True
        if any(pa._ATTN_LAUNCHER._descriptor_launches.values()):
            pa._ATTN_LAUNCHER.encode_descriptors_once = False
            print(f"  unchecked, encoded per launch {per_call_us(unchecked):7.1f} us/call")
            pa._ATTN_LAUNCHER.encode_descriptors_once = True

        def views(q=x.q, kv=x.kv):
            return q[:64], q[:64], kv.transpose(1, 2).split([128, 128], -1)

        bare_launches(unchecked)
        print(f"  forward views (q/out slice, kv split) {per_call_us(views):7.1f} us")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            unchecked()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        print("\n".join(line for line in s.getvalue().splitlines()[6:30] if line.strip()))
        del x


if __name__ == "__main__":
    main()
