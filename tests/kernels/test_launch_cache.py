"""CachedLauncher: a compiled handle is reused only where Triton would pick the same binary.

On the GPU every case compares results with torch and counts cached handles: a new dtype, a
pointer off 16-byte alignment or a new value of a specialised int must each get a handle of
its own (reusing an aligned binary on an unaligned pointer would fault or load wrong
elements), while a new value of an unspecialised int must not. Under the CPU interpreter
there are no handles and every launch goes through Triton.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels import launch_cache
from vllm_blackwell_ext.kernels.launch_cache import CachedLauncher, triton_version

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="compiled handles exist only on a CUDA GPU")


@triton.jit(do_not_specialize=["scale_int"])
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, scale_int, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (x * alpha * scale_int + y).to(out_ptr.dtype.element_ty), mask=ok)


def _launch(
    launcher: CachedLauncher, x, y, out, scale_int: int = 1, alpha: float = 2.0, regs: int = 0
):
    n, block = x.numel(), 64
    launcher.launch(
        (triton.cdiv(n, block), 1, 1),
        (x, y, out, n, scale_int, alpha, block),
        num_warps=4,
        num_stages=3,
        max_registers=regs,
    )
    return out


def _check(x, y, out, scale_int: int = 1, alpha: float = 2.0) -> None:
    expected = (x.float() * alpha * scale_int + y.float()).to(out.dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_interpreter_launches_through_triton(device: str) -> None:
    launcher = CachedLauncher(_axpy_kernel)
    assert launcher.enabled == ON_GPU
    x = torch.arange(100, dtype=torch.float32, device=device)
    y = torch.ones(100, dtype=torch.float32, device=device)
    _check(x, y, _launch(launcher, x, y, torch.empty_like(x)))


@gpu_only
def test_handles_are_reused_only_for_the_same_specialisation() -> None:
    launcher = CachedLauncher(_axpy_kernel)
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(4096, device="cuda", generator=gen)
    other = torch.randn(4096, device="cuda", generator=gen)

    def run(x, y, **kw):
        out = torch.full_like(x, float("nan"))
        _launch(launcher, x, y, out, **kw)
        _check(x, y, out, **{k: v for k, v in kw.items() if k != "regs"})
        return len(launcher._handles)

    assert run(base[:1024], other[:1024]) == 1
    # New data, same layout and sizes: the cached handle serves it.
    assert run(base[1024:2048], other[2048:3072]) == 1
    # A new value of an unspecialised int or of a float: same binary (powers of two, so the
    # products are exact whether or not the compiler fuses them into an FMA).
    assert run(base[:1024], other[:1024], scale_int=4, alpha=0.5) == 1
    # One element off 16-byte alignment: a binary without the aligned vector loads.
    assert run(base[1:1025], other[:1024]) == 2
    # A specialised int that is no longer a multiple of 16.
    assert run(base[:1023], other[:1023]) == 3
    # Another dtype.
    assert run(base[:1024].half(), other[:1024].half()) == 4
    # Back to the first specialisation: its handle again, no new entry.
    assert run(base[2048:3072], other[:1024]) == 4
    # A register cap is a launch option Triton compiles with: its own binary, built with it.
    assert run(base[:1024], other[:1024], regs=24) == 5
    capped = [h for k, h in launcher._handles.items() if k[0] == (4, 3, 24)]
    assert len(capped) == 1 and capped[0].metadata.maxnreg == 24
    uncapped = [h for k, h in launcher._handles.items() if k[0] == (4, 3, 0)]
    assert len(uncapped) == 4 and all(h.metadata.maxnreg is None for h in uncapped)


@triton.jit
def _tile_copy_kernel(src_desc, out_ptr, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    row0 = tl.program_id(0) * BLOCK_R
    rows = row0 + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    tl.store(out_ptr + rows[:, None] * stride + cols[None, :], src_desc.load([row0, 0]))


def test_tensor_descriptor_launches_reencode_each_call_and_key_on_block_and_dtype(
    device: str,
) -> None:
    """A TMA descriptor argument: each launch reads the descriptor's current tensor (the
    launcher encodes it per call), and its block shape and element type pick the binary."""
    if ON_GPU and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA descriptors need sm90+")
    launcher = CachedLauncher(_tile_copy_kernel)
    gen = torch.Generator(device=device).manual_seed(0)

    def run(src: torch.Tensor, block_r: int) -> int:
        out = torch.full_like(src, float("nan"))
        desc = TensorDescriptor(src, list(src.shape), [src.shape[1], 1], [block_r, src.shape[1]])
        launcher.launch(
            (src.shape[0] // block_r, 1, 1), (desc, out, out.stride(0), block_r, src.shape[1]),
            num_warps=4, num_stages=2,
        )  # fmt: skip
        torch.testing.assert_close(out, src, rtol=0, atol=0)
        return len(launcher._handles)

    def fresh(dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(128, 64, device=device, generator=gen).to(dtype)

    counts = [run(fresh(torch.float16), 32), run(fresh(torch.float16), 32)]
    counts += [run(fresh(torch.float16), 16), run(fresh(torch.bfloat16), 16)]
    if ON_GPU:
        # New data through the same handle; a new block shape, then a new dtype, each compile.
        assert counts == [1, 1, 2, 3]


@gpu_only
def test_descriptor_encodings_follow_the_tensor_address_and_view() -> None:
    """Where descriptors are encoded once (Triton 3.7), a launch still reads what its
    descriptor names: new contents at a known address, another address, another view."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA descriptors need sm90+")
    launcher = CachedLauncher(_tile_copy_kernel)
    gen = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(256, 64, device="cuda", generator=gen).half()

    def run(view: torch.Tensor) -> None:
        out = torch.full_like(view, float("nan"))
        desc = TensorDescriptor(view, list(view.shape), [view.stride(0), 1], [32, 64])
        launcher.launch(
            (view.shape[0] // 32, 1, 1), (desc, out, out.stride(0), 32, 64),
            num_warps=4, num_stages=2,
        )  # fmt: skip
        torch.testing.assert_close(out, view, rtol=0, atol=0)

    run(src[:128])  # compiles through Triton
    run(src[:128])
    src[:128].normal_(generator=gen)  # same address and view, new contents
    run(src[:128])
    run(src[128:])  # another address
    run(src[:64])  # the first address, fewer rows
    (handle,) = launcher._handles.values()
    descriptor_launch = launcher._descriptor_launches[id(handle)]
    if triton_version() == launch_cache.DESCRIPTOR_LAUNCH_TRITON:
        assert descriptor_launch is not None and len(descriptor_launch._encodings) == 3
    else:
        assert descriptor_launch is None


class _StubRun:
    """What `DescriptorLaunch` reads from a handle's launcher."""

    launch_cooperative_grid, launch_pdl = False, False
    arg_annotations, kernel_signature = "annotations", "signature"


class _StubHandle:
    def __init__(self, tensordesc_meta: list) -> None:
        self.run = _StubRun()
        self.function, self.packed_metadata = "function", "packed"
        self.metadata = type("Metadata", (), {"tensordesc_meta": tensordesc_meta})


def test_descriptor_launch_encodes_each_descriptor_once_per_address_and_view() -> None:
    # Two descriptors amid other arguments: each is replaced in place by its encoding, which
    # is made once per (position, address, shape, strides) and dropped oldest first.
    if triton_version() != launch_cache.DESCRIPTOR_LAUNCH_TRITON:
        pytest.skip(
            f"descriptors are encoded once only on Triton {launch_cache.DESCRIPTOR_LAUNCH_TRITON}"
            f" (whose TensorDescriptor it reads); this is {triton.__version__}"
        )
    encoded: list[tuple] = []
    launched: list[tuple] = []

    def encode(d: TensorDescriptor, meta: str) -> list:
        encoded.append((d.base.data_ptr(), tuple(d.shape), meta))
        return [f"map{len(encoded)}", *d.shape, *d.strides]

    def c_launch(*args) -> None:
        launched.append(args)

    launch = launch_cache.DescriptorLaunch(
        _StubHandle(["k-meta", "v-meta"]), (1, 3), encode, c_launch, max_encodings=3
    )
    a, b = torch.zeros(64, 32, dtype=torch.float16), torch.zeros(64, 32, dtype=torch.float16)

    def descriptors(t: torch.Tensor, rows: int = 64) -> tuple:
        return tuple(TensorDescriptor(t, [rows, 32], [32, 1], [16, 32]) for _ in range(2))

    k, v = descriptors(a)
    launch((2, 1, 1), 7, (100, k, 200, v, 300))
    assert launched[-1] == (
        2, 1, 1, 7, "function", False, False, "packed", None, None, None, None, None,
        "annotations", "signature", [100, "map1", 64, 32, 32, 1, 200, "map2", 64, 32, 32, 1, 300],
    )  # fmt: skip
    launch((2, 1, 1), 7, (101, *descriptors(a)[:1], 201, descriptors(a)[1], 301))
    assert len(encoded) == 2  # same addresses and views: the encodings of the first launch
    assert launched[-1][-1][1] == "map1" and launched[-1][-1][7] == "map2"
    launch((1, 1, 1), 7, (100, descriptors(b)[0], 200, descriptors(a, 32)[1], 300))
    assert encoded[2:] == [(b.data_ptr(), (64, 32), "k-meta"), (a.data_ptr(), (32, 32), "v-meta")]
    assert len(launch._encodings) == 3  # the oldest of four was dropped


def test_register_cap_launches_under_the_interpreter_too(device: str) -> None:
    launcher = CachedLauncher(_axpy_kernel)
    x = torch.arange(100, dtype=torch.float32, device=device)
    y = torch.ones(100, dtype=torch.float32, device=device)
    _check(x, y, _launch(launcher, x, y, torch.empty_like(x), regs=32))


@gpu_only
def test_args_must_cover_the_signature() -> None:
    launcher = CachedLauncher(_axpy_kernel)
    x = torch.zeros(16, device="cuda")
    with pytest.raises(TypeError, match="all 7 parameters"):
        launcher.launch((1, 1, 1), (x, x, x, 16, 1, 1.0), num_warps=4, num_stages=3)


@gpu_only
def test_cached_launch_runs_on_the_current_stream() -> None:
    # A cached launch hands the handle the stream itself: under graph capture (a side stream)
    # a launch anywhere else would raise or run outside the graph.
    launcher = CachedLauncher(_axpy_kernel)
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    y = torch.ones(1024, dtype=torch.float32, device="cuda")
    out = torch.zeros_like(x)
    _launch(launcher, x, y, out)  # compiles: the next launches reuse its handle
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _launch(launcher, x, y, out, alpha=4.0)
    assert len(launcher._handles) == 1
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    _check(x, y, out, alpha=4.0)
    # On a busy side stream the launch must wait its turn: the default stream's snapshot,
    # taken meanwhile, still sees zeros (a launch on the default stream would precede it).
    side = torch.cuda.Stream()
    out.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # tens of milliseconds
        _launch(launcher, x, y, out, alpha=0.5)
    snapshot = out.clone()
    torch.cuda.synchronize()
    assert not snapshot.any()
    _check(x, y, out, alpha=0.5)


@gpu_only
def test_cached_launch_refuses_a_cpu_tensor_like_triton() -> None:
    # Cached launches pass addresses, which Triton's launcher no longer checks: a tensor on
    # another device must miss the cache and meet Triton's own check.
    launcher = CachedLauncher(_axpy_kernel)
    x = torch.zeros(64, device="cuda")
    _launch(launcher, x, x, torch.empty_like(x))
    with pytest.raises(ValueError, match="cpu tensor"):
        _launch(launcher, x, torch.zeros(64), torch.empty_like(x))


@gpu_only
def test_cached_launches_reach_registered_launch_hooks() -> None:
    # Cached launches skip Triton's launch metadata only while no hook would read it.
    launcher = CachedLauncher(_axpy_kernel)
    x = torch.arange(256, dtype=torch.float32, device="cuda")
    _launch(launcher, x, x, torch.empty_like(x))
    seen: list[str] = []

    def hook(metadata) -> None:
        seen.append(metadata.get()["name"])

    runtime = triton.knobs.runtime
    chain = runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        runtime.launch_enter_hook = hook
    try:
        _check(x, x, _launch(launcher, x, x, torch.empty_like(x)))
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            runtime.launch_enter_hook = chain
    assert seen == ["_axpy_kernel"]
    _launch(launcher, x, x, torch.empty_like(x))
    assert seen == ["_axpy_kernel"]  # removed: later launches take the direct path again
    assert len(launcher._handles) == 1


class _Param:
    def __init__(self, is_constexpr: bool = False, do_not_specialize: bool = False) -> None:
        self.is_constexpr = is_constexpr
        self.do_not_specialize = do_not_specialize


class _StubKernel:
    """Just what the launcher's argument classification reads from a JITFunction."""

    def __init__(self, params: list[_Param]) -> None:
        self.params = params


def test_launch_args_carry_addresses_where_the_tensors_were() -> None:
    # Tensors anywhere in the signature: each is replaced by its address in place, the rest
    # (ints, floats, constexprs) passed through; the key sees dtype, device and alignment.
    a, b = torch.zeros(8), torch.zeros(8, dtype=torch.float16)[1:]
    params = [_Param(), _Param(), _Param(do_not_specialize=True), _Param(), _Param(True)]
    launcher = CachedLauncher(_StubKernel(params))
    args = (7, a, 2**40, b, 64)
    launcher._classify(args)
    assert not launcher._tensors_lead
    ptrs = [a.data_ptr(), b.data_ptr()]
    assert launcher._with_addresses(args, ptrs) == (7, ptrs[0], 2**40, ptrs[1], 64)
    key = launcher._key((a, b), ptrs, args, (4, 3, 0))
    assert key == (
        (4, 3, 0), (7, 64),
        (torch.float32, torch.float16),
        (-1, -1),  # each tensor's device (CPU here)
        (ptrs[0] % 16, ptrs[1] % 16),
        (False,),  # 2**40 does not fit in int32
        (),  # no tensor descriptors
    )  # fmt: skip
    assert key[4][1] == 2  # a view one fp16 element in is 2 bytes off 16-byte alignment

    leading = CachedLauncher(_StubKernel([_Param(), _Param(), _Param(True)]))
    leading._classify((a, b, 16))
    assert leading._tensors_lead
    assert leading._with_addresses((a, b, 16), ptrs) == (ptrs[0], ptrs[1], 16)


def test_a_parameter_taking_a_descriptor_or_none_keys_on_which() -> None:
    # A kernel with a gathered and a TMA path takes a descriptor on one and None on the other:
    # a first call with None must not make the launcher treat that parameter as a constexpr.
    a = torch.zeros(64, 32, dtype=torch.float16)
    launcher = CachedLauncher(_StubKernel([_Param(), _Param(), _Param(True)]))
    without = (a, None, False)
    launcher._classify(without)
    ptrs = [a.data_ptr()]
    desc = TensorDescriptor(a, [64, 32], [32, 1], [16, 32])
    keys = [launcher._key((a,), ptrs, args, (4, 3, 0)) for args in (without, (a, desc, True))]
    assert keys[0][-1] == (None,) and keys[1][-1] == ((torch.float16, 16, 32, "zero"),)
    wider = TensorDescriptor(a, [64, 32], [32, 1], [32, 32])
    assert launcher._key((a,), ptrs, (a, wider, True), (4, 3, 0)) != keys[1]


@triton.jit
def _add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=ok) + 1.0, mask=ok)


def test_launch_by_name_takes_arguments_in_any_order_and_names_what_is_wrong() -> None:
    launcher = CachedLauncher(_add_kernel)
    assert launcher.arg_names == ("x_ptr", "y_ptr", "n", "BLOCK")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.arange(10.0, device=device), torch.zeros(10, device=device)
    args = {"BLOCK": 16, "n": 10, "y_ptr": y, "x_ptr": x}
    launcher.launch_by_name((1, 1, 1), args, num_warps=1, num_stages=1)
    torch.testing.assert_close(y, x + 1)
    with pytest.raises(TypeError, match=r"unknown \['BLOK'\], missing \[\]"):
        launcher.launch_by_name((1, 1, 1), {**args, "BLOK": 16}, num_warps=1, num_stages=1)
    bad = dict(args)
    bad["BLOK"] = bad.pop("BLOCK")
    with pytest.raises(TypeError, match=r"unknown \['BLOK'\], missing \['BLOCK'\]"):
        launcher.launch_by_name((1, 1, 1), bad, num_warps=1, num_stages=1)


def test_binder_orders_grouped_and_keyword_arguments_by_name() -> None:
    launcher = CachedLauncher(_add_kernel)
    bind = launcher.binder(("BLOCK",), ("y_ptr", "x_ptr"))
    assert launcher.binder(("BLOCK",), ("y_ptr", "x_ptr")) is bind  # made once
    assert bind((16,), ("y", "x"), n=10) == ("x", "y", 10, 16)
    assert launcher.binder()(BLOCK=16, n=10, y_ptr="y", x_ptr="x") == ("x", "y", 10, 16)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'n'"):
        bind((16,), ("y", "x"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'm'"):
        bind((16,), ("y", "x"), n=10, m=1)
    with pytest.raises(ValueError, match="not enough values to unpack"):
        bind((16,), ("y",), n=10)
    with pytest.raises(ValueError, match=r"unknown: \['z_ptr'\]"):
        launcher.binder(("z_ptr",))
    with pytest.raises(ValueError, match="distinct parameter names"):
        launcher.binder(("n",), ("n",))
