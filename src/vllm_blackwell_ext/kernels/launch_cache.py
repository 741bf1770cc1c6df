"""Launch a Triton kernel through its compiled handle instead of Triton's per-call binder.

`kernel[grid](*args)` re-derives the specialisation of every argument on every call (dtype,
16-byte alignment, int divisibility and width), hashes it and looks the binary up: for our
kernels' 30-50 arguments that is most of an eager launch's host time (measured: see
benchmarks/README.md, "Routes tried"). Eager launches are what vLLM runs for mixed
prefill/decode batches on every attention layer.

`CachedLauncher` keys each compiled handle by a superset of what Triton specialises on (each
tensor's dtype, device and offset from 16-byte alignment, each TMA tensor descriptor's element
type and block shape, the value of every constexpr and specialised int, the int width of the
others, the launch options), so a cached handle is reused only where
Triton would have picked the same binary; any other call goes through Triton once and its
handle joins the cache. A
cached launch calls the handle's C launcher itself with each tensor's address as an int
(which the key has already read) and the current stream of the tensors' device: Triton's
handle would otherwise call `data_ptr()` and ask the driver about every pointer again
(`cuPointerGetAttribute`), look the device and stream up in Python and build launch metadata
for hooks that, unless a profiler registered one, do nothing (each of those steps costs
host time on every eager launch). While a launch hook is registered (Triton's profilers),
launches go through `handle[grid]` so the hooks see them. Under the CPU interpreter (no
compiled handles) and on Triton older than 3.4 (whose launchers take arguments differently)
every call goes through Triton.

TMA tensor descriptors: Triton's launcher encodes each one (a `CUtensorMap`) on every launch,
in a Python loop over all the kernel's arguments. A descriptor's encoding depends only on its
tensor's address, shape and strides and on what the handle compiled (block shape, element
type, swizzle), so `DescriptorLaunch` encodes each once per handle and address and calls the
C launcher with the encoded arguments. That follows the layout of Triton 3.7's CUDA launcher
(`triton/backends/nvidia/driver.py`), which differs in 3.6 and 3.8: on any other Triton,
descriptors go to the handle as they are and Triton encodes them per launch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

# Handles take every argument, constexprs included, in signature order from Triton 3.3 on;
# launch hooks live in `triton.knobs` from 3.4 on.
_MIN_TRITON = (3, 4)
# Triton's default pipelining depth on NVIDIA GPUs, for kernels that need no other: launches
# pass num_stages explicitly, so the cache keys on what Triton compiles with.
DEFAULT_NUM_STAGES = 3
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_DTYPE = attrgetter("dtype")
_GET_DEVICE = torch.Tensor.get_device
_DATA_PTR = torch.Tensor.data_ptr
_OFF_16_BYTES = (15).__and__
# The Triton whose CUDA launcher `DescriptorLaunch` calls with encoded descriptors.
DESCRIPTOR_LAUNCH_TRITON = (3, 7)
# Encodings kept per handle before the oldest are dropped: a KV cache's K and V per layer
# stay, while descriptors of per-step tensors (queries) come and go.
MAX_ENCODINGS = 1024


def _getter(indices: Sequence[int]) -> Callable[[tuple], tuple]:
    """A C-speed picker of `indices` from an args tuple that always returns a tuple."""
    if len(indices) == 1:
        (i,) = indices
        return lambda args: (args[i],)
    if not indices:
        return lambda args: ()
    return itemgetter(*indices)


def _launch_hooks_registered() -> bool:
    """Whether a Triton launch hook (e.g. a profiler's) would see our launches."""
    runtime = triton.knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        # A HookChain (Triton 3.5+) is active when it holds calls; older ones hold a callable.
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def triton_version() -> tuple[int, int]:
    """(major, minor) of the Triton in use."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def _make_binder(
    kernel_name: str, arg_names: tuple[str, ...], groups: tuple[tuple[str, ...], ...]
) -> Callable:
    """`CachedLauncher.binder`'s function for a kernel of parameters `arg_names`."""
    grouped = [name for group in groups for name in group]
    unknown = sorted(set(grouped) - set(arg_names))
    if unknown or len(set(grouped)) != len(grouped):
        raise ValueError(
            f"groups: expected distinct parameter names of the kernel, got {groups} "
            f"(unknown: {unknown})"
        )
    group_params = [f"group{i}" for i in range(len(groups))]
    keywords = [name for name in arg_names if name not in set(grouped)]
    name = f"{kernel_name.strip('_')}_arguments"
    params = [*group_params, *(["*", *keywords] if keywords else [])]
    lines = [f"def {name}({', '.join(params)}):"]
    # Unpacking a group checks its length and binds its values to their parameters' names.
    lines += [f"    ({''.join(n + ', ' for n in group)}) = {param}"
              for param, group in zip(group_params, groups, strict=True) if group]  # fmt: skip
    lines.append(f"    return ({''.join(n + ', ' for n in arg_names)})")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines) + "\n", "<launch binder>", "exec"), namespace)  # noqa: S102
    return namespace[name]


class DescriptorLaunch:
    """Launches one compiled handle with its TMA descriptors encoded once per address and view.

    `positions` are the arguments that hold descriptors in this handle's signature (the others
    go as given, tensors as addresses); `encode` is Triton's per-launch encoder and `c_launch`
    its C launcher. Built only where Triton 3.7's launcher layout holds (`for_handle`); a
    launch does what the handle's own does.
    """

    def __init__(
        self,
        handle: Any,
        positions: tuple[int, ...],
        encode: Callable,
        c_launch: Callable,
        max_encodings: int = MAX_ENCODINGS,
    ) -> None:
        run = handle.run
        self._function, self._metadata = handle.function, handle.packed_metadata
        self._flags = (run.launch_cooperative_grid, run.launch_pdl)
        self._signature = (run.arg_annotations, run.kernel_signature)
        self._c_launch = c_launch
        self._positions = positions
        self._meta = handle.metadata.tensordesc_meta
        self._encode = encode
        self._encodings: dict[tuple, list] = {}
        self._max_encodings = max_encodings

    @classmethod
    def for_handle(cls, handle: Any, args: tuple) -> DescriptorLaunch | None:
        """The launch for `handle` (first called with `args`), or None where it does not apply:
        no descriptor, another Triton, descriptors not lowered to TMA, or launch scratch."""
        positions = tuple(i for i, a in enumerate(args) if isinstance(a, TensorDescriptor))
        if not positions or triton_version() != DESCRIPTOR_LAUNCH_TRITON:
            return None
        run, meta = handle.run, getattr(handle.metadata, "tensordesc_meta", None)
        if not meta or len(meta) != len(positions) or any(m is None for m in meta):
            return None
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None
        from triton.backends.nvidia.driver import make_tensordesc_arg

        c_launch = triton.runtime.driver.active.utils.launch
        return cls(handle, positions, make_tensordesc_arg, c_launch)

    def _encoded(self, n: int, d: TensorDescriptor) -> list:
        key = (n, d.base.data_ptr(), *d.shape, *d.strides, d.round_f32_to_tf32)
        encoded = self._encodings.get(key)
        if encoded is None:
            if len(self._encodings) >= self._max_encodings:
                del self._encodings[next(iter(self._encodings))]
            encoded = self._encodings[key] = self._encode(d, self._meta[n])
        return encoded

    def __call__(self, grid: tuple, stream: int, args: tuple) -> None:
        kernel_args: list = []
        start = 0
        for n, p in enumerate(self._positions):
            kernel_args += args[start:p]
            kernel_args += self._encoded(n, args[p])
            start = p + 1
        kernel_args += args[start:]
        self._c_launch(
            grid[0], grid[1], grid[2], stream, self._function, *self._flags, self._metadata,
            None, None, None, None, None, *self._signature, kernel_args,
        )  # fmt: skip


class CachedLauncher:
    """Launches one `@triton.jit` kernel, reusing compiled handles across calls.

    Each parameter must receive the same kind of value on every call (a tensor, an int, a
    float, a TMA tensor descriptor or None); `args` holds every parameter in signature order,
    constexprs included.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._handles: dict[tuple, Any] = {}
        # By id of the handle (cheaper to hash than its key): handles live as long as this.
        self._descriptor_launches: dict[int, DescriptorLaunch | None] = {}
        # Whether descriptors are encoded once per address (`DescriptorLaunch`) where it applies.
        self.encode_descriptors_once = True
        # Under TRITON_INTERPRET=1 `triton.jit` makes an InterpretedFunction: no handles.
        self.enabled = (
            isinstance(kernel, triton.runtime.JITFunction) and triton_version() >= _MIN_TRITON
        )
        self._tensors: Callable[[tuple], tuple] = _getter(())
        self._tensor_indices: tuple[int, ...] = ()
        self._tensors_lead = False  # the tensors are the first parameters (all our kernels)
        self._current_stream: Callable[[int], int] | None = None
        self._values: Callable[[tuple], tuple] = _getter(())  # constexprs, specialised ints
        self._widths: Callable[[tuple], tuple] = _getter(())  # other ints: only their width
        self._descriptors: Callable[[tuple], tuple] = _getter(())  # TMA tensor descriptors
        self._classified = False
        # A C-speed picker of a keyword map's values in signature order (`launch_by_name`),
        # made on first use.
        self._in_signature_order: Callable[[Mapping[str, Any]], tuple] | None = None
        self._binders: dict[tuple[tuple[str, ...], ...], Callable[..., tuple]] = {}

    def _classify(self, args: tuple) -> None:
        params = self.kernel.params
        if len(params) != len(args):
            raise TypeError(
                f"{self.kernel.fn.__name__}: args must hold all {len(params)} parameters in "
                f"signature order, got {len(args)}"
            )
        tensors, values, widths, descriptors = [], [], [], []
        for i, (p, a) in enumerate(zip(params, args, strict=True)):
            if isinstance(a, torch.Tensor):
                tensors.append(i)
            elif isinstance(a, TensorDescriptor) or a is None:
                descriptors.append(i)  # a descriptor where a kernel's path reads it, else None
            elif p.is_constexpr or (isinstance(a, int) and not p.do_not_specialize):
                values.append(i)
            elif isinstance(a, int):
                widths.append(i)
            # floats: always passed as fp32, nothing to specialise
        self._tensor_indices = tuple(tensors)
        self._tensors_lead = self._tensor_indices == tuple(range(len(tensors)))
        self._tensors, self._values, self._widths = (
            _getter(tensors),
            _getter(values),
            _getter(widths),
        )
        self._descriptors = _getter(descriptors)
        self._classified = True

    def _key(self, tensors: tuple, ptrs: list[int], args: tuple, options: tuple) -> tuple:
        """What the handle for these arguments is looked up by; C-level maps where they serve.

        Each tensor's device too, not only the launch's: a CPU tensor among CUDA ones must miss
        the cache and reach Triton, which refuses it. Pointers enter by their offset from
        16-byte alignment (finer than Triton's aligned-or-not: never joins two it tells apart).
        """
        return (
            options,
            self._values(args),
            tuple(map(_DTYPE, tensors)),
            tuple(map(_GET_DEVICE, tensors)),
            tuple(map(_OFF_16_BYTES, ptrs)),
            tuple([_INT32_MIN <= v <= _INT32_MAX for v in self._widths(args)]),
            # What Triton types a descriptor by: its element type and block shape.
            tuple(
                [d and (d.base.dtype, *d.block_shape, d.padding) for d in self._descriptors(args)]
            ),
        )

    def _with_addresses(self, args: tuple, ptrs: list[int]) -> tuple:
        """`args` with every tensor replaced by its address."""
        if self._tensors_lead:
            return (*ptrs, *args[len(ptrs) :])
        out = list(args)
        for i, p in zip(self._tensor_indices, ptrs, strict=True):
            out[i] = p
        return tuple(out)

    def _through_triton(
        self, grid: tuple, args: tuple, num_warps: int, num_stages: int, max_registers: int
    ):
        """`kernel[grid](*args)` with the launch options (`maxnreg` only when capped)."""
        options = {"num_warps": num_warps, "num_stages": num_stages}
        if max_registers:
            options["maxnreg"] = max_registers
        return self.kernel[grid](*args, **options)

    @functools.cached_property
    def arg_names(self) -> tuple[str, ...]:
        """The kernel's parameter names in signature order."""
        return tuple(inspect.signature(self.kernel.fn).parameters)

    def binder(self, *groups: tuple[str, ...]) -> Callable[..., tuple]:
        """A function that orders a launch's arguments by name, made once per `groups`.

        Each group names parameters whose values a caller fixes together and keeps (a plan's
        constexprs, a layer's options, a cache's pointers and strides); the function takes
        one tuple of values per group, in the group's order, and every other parameter of
        the kernel by keyword, and returns them all in signature order, as `launch` takes
        them. A missing or unknown keyword raises Python's own TypeError naming it, a group
        of the wrong length a ValueError. Generated code, made once: a call costs about what
        building the positional tuple by hand does, plus a keyword's match per keyword.
        """
        bind = self._binders.get(groups)
        if bind is None:
            bind = _make_binder(self.kernel.fn.__name__, self.arg_names, groups)
            self._binders[groups] = bind
        return bind

    def launch_by_name(
        self,
        grid: tuple[int, int, int],
        args: Mapping[str, Any],
        *,
        num_warps: int,
        num_stages: int,
        max_registers: int = 0,
    ):
        """`launch` with every parameter given by name (`args` maps each of `arg_names`).

        A missing or unknown name raises TypeError naming both lists (a misspelt argument
        would otherwise never reach the kernel).
        """
        if self._in_signature_order is None:
            self._in_signature_order = itemgetter(*self.arg_names)
        try:
            ordered = self._in_signature_order(args)
        except KeyError:
            ordered = None
        if ordered is None or len(args) != len(self.arg_names):
            unknown = sorted(set(args) - set(self.arg_names))
            missing = sorted(set(self.arg_names) - set(args))
            raise TypeError(
                f"{self.kernel.fn.__name__}: args must name each parameter once; "
                f"unknown {unknown}, missing {missing}"
            )
        return self.launch(
            grid, ordered, num_warps=num_warps, num_stages=num_stages, max_registers=max_registers
        )

    def launch(
        self,
        grid: tuple[int, int, int],
        args: tuple,
        *,
        num_warps: int,
        num_stages: int,
        max_registers: int = 0,
    ):
        """Launch on `grid` (three ints); returns the compiled handle (None when interpreted).

        `max_registers` caps the registers per thread (Triton's `maxnreg`; 0: no cap).
        """
        if not self.enabled:
            return self._through_triton(grid, args, num_warps, num_stages, max_registers)
        if not self._classified:
            self._classify(args)
        tensors = self._tensors(args)
        ptrs = list(map(_DATA_PTR, tensors))
        key = self._key(tensors, ptrs, args, (num_warps, num_stages, max_registers))
        handle = self._handles.get(key)
        if handle is None:
            # Through Triton: it checks every pointer, compiles or finds the binary.
            handle = self._through_triton(grid, args, num_warps, num_stages, max_registers)
            self._handles[key] = handle
            self._descriptor_launches[id(handle)] = DescriptorLaunch.for_handle(handle, args)
            self._current_stream = triton.runtime.driver.active.get_current_stream
            return handle
        device = tensors[0].get_device() if tensors else torch.cuda.current_device()
        stream = self._current_stream(device)
        addressed = self._with_addresses(args, ptrs)
        descriptor_launch = self._descriptor_launches[id(handle)]
        if _launch_hooks_registered():
            handle[grid](*addressed, stream=stream)
        elif descriptor_launch is not None and self.encode_descriptors_once:
            descriptor_launch(grid, stream, addressed)
        else:
            # What `handle[grid]` runs, without the launch metadata only hooks read.
            handle.run(
                grid[0], grid[1], grid[2], stream, handle.function, handle.packed_metadata,
                None, None, None, *addressed,
            )  # fmt: skip
        return handle
