"""Compile a Triton kernel for a GPU architecture without a GPU, and read what it costs.

Triton's bundled ptxas and cuobjdump do the work, so register counts, shared memory and spills
of a launch config can be checked on a CPU machine before a GPU run (and for GPUs not at hand).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from triton.runtime.jit import mangle_type

# Device classes (`DeviceInfo.device_class`) and the capability each compiles for.
CLASS_CAPABILITY = {"sm80": (8, 0), "sm86": (8, 6), "sm89": (8, 9), "sm90": (9, 0),
                    "sm100": (10, 0), "sm120": (12, 0)}  # fmt: skip


def signature_of(kernel: Any, args: tuple) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """`compile_offline`'s (signature, constexprs, aligned) for a launch of `kernel` with
    `args` (every parameter in signature order, as `CachedLauncher.launch` takes them): each
    runtime argument typed as Triton's JIT types it; tensors 16-byte aligned, ints 16-divisible
    where they are and the kernel lets them specialise."""
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    aligned: list[str] = []
    for param, arg in zip(kernel.params, args, strict=True):
        if param.is_constexpr:
            constexprs[param.name] = arg
            continue
        signature[param.name] = mangle_type(arg)
        if isinstance(arg, torch.Tensor) or (
            isinstance(arg, int)
            and not isinstance(arg, bool)
            and arg % 16 == 0
            and not param.do_not_specialize
        ):
            aligned.append(param.name)
    return signature, constexprs, aligned


@dataclass(frozen=True)
class OfflineCompile:
    shared: int  # bytes of shared memory per program
    registers: int  # per thread (-1: not reported)
    stack: int  # bytes of local memory per thread (-1: not reported)
    spills: bool  # local loads or stores in the SASS
    # Some of them inside a loop (between a backward branch and its target), so they run on
    # every tile rather than once per program.
    loop_spills: bool = False
    # The kernel traps: Triton lowers a program it cannot build for the target (e.g. tensor
    # memory accumulators past sm100's 512 columns) to `trap`, with no compile error.
    traps: bool = False
    # Hopper: ptxas waits after every wgmma instead of once per group (it does so for the whole
    # kernel when it cannot keep the asynchronous pipeline's registers apart), so no tensor-core
    # work overlaps anything.
    wgmma_serialized: bool = False

    def __str__(self) -> str:
        where = " (in a loop)" if self.loop_spills else " (outside loops)" if self.spills else ""
        return (
            f"registers {self.registers}, shared {self.shared} B, stack {self.stack} B, "
            f"spills {self.spills}{where}"
            + (", TRAPS (the kernel is a trap)" if self.traps else "")
            + (", wgmma SERIALIZED (a wait after each)" if self.wgmma_serialized else "")
        )


def _wgmma_serialized(sass: str) -> bool:
    """Whether the SASS waits on the wgmma pipeline about as often as it issues to it (a group
    of k-steps normally shares one wait)."""
    issued = len(re.findall(r"\bHGMMA\.", sass))
    waits = len(re.findall(r"\bWARPGROUP\.DEPBAR", sass))
    return issued > 0 and 2 * waits > issued


def _addressed(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of each SASS instruction."""
    return [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ]


def _loops(addressed: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """Address ranges (target, branch) of the backward branches: the loops."""
    loops = []
    for address, text in addressed:
        branch = re.search(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\d+,\s*)?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            loops.append((int(branch.group(1), 16), address))
    return loops


# What `loop_schedule` lists: tensor-core issue and waits, CTA barriers, TMA copies and their
# waits, and the softmax's exponentials.
_SCHEDULE_OPS = re.compile(
    r"\b(HGMMA\.\w+|WARPGROUP\.DEPBAR|BAR\.SYNC|UTMALDG\.\w+|SYNCS\.PHASECHK|MUFU\.EX2)"
)


def loop_schedule(sass: str) -> list[tuple[str, int]]:
    """The order of `_SCHEDULE_OPS` in the loop that issues the most wgmma, as runs of one
    opcode: [('HGMMA.64x32x16', 8), ('WARPGROUP.DEPBAR', 1), ...]. Empty without such a loop."""
    addressed = _addressed(sass)
    loops = _loops(addressed)
    if not loops:
        return []

    def in_loop(loop: tuple[int, int]) -> list[str]:
        ops = (_SCHEDULE_OPS.search(text) for address, text in addressed
               if loop[0] <= address <= loop[1])  # fmt: skip
        return [op.group(1) for op in ops if op]

    def wgmma_issued(ops: list[str]) -> int:
        return sum(op.startswith("HGMMA") for op in ops)

    ops = max((in_loop(loop) for loop in loops), key=wgmma_issued)
    runs: list[tuple[str, int]] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1] = (op, runs[-1][1] + 1)
        else:
            runs.append((op, 1))
    return runs


def _local_memory_in_loops(sass: str) -> bool:
    """Whether a local load or store (LDL/STL) of `sass` lies inside a loop's address range."""
    addressed = _addressed(sass)
    loops = _loops(addressed)
    return any(
        start <= address <= end
        for address, text in addressed
        if re.search(r"\b(LDL|STL)\b", text)
        for start, end in loops
    )


def compile_offline(*args: Any, **kwargs: Any) -> OfflineCompile:
    """What `compile_kernel(*args, **kwargs)`'s kernel costs (`stats_of`)."""
    return stats_of(compile_kernel(*args, **kwargs))


def compile_kernel(
    kernel: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    aligned: tuple[str, ...] | list[str],
    capability: int,
    *,
    num_warps: int,
    num_stages: int,
    max_registers: int = 0,
) -> Any:
    """Compile `kernel` for sm`capability` (e.g. 90) with the JIT's 16-divisibility
    specialisation on the `aligned` arguments (16-byte pointers, strides that are multiples
    of 16: without it the compiler can neither vectorise nor pipeline loads). `signature`
    types every runtime argument as Triton spells them ('*bf16', 'i32', 'tensordesc<...>');
    constexprs are typed 'constexpr' here. `max_registers` caps registers per thread
    (Triton's maxnreg; 0: no cap)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {name: "constexpr" for name in constexprs} | dict(signature)
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    options: dict[str, int] = dict(num_warps=num_warps, num_stages=num_stages)
    if max_registers:
        options["maxnreg"] = max_registers
    return triton.compile(
        ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", capability, 32),
        options=options,
    )


def _cuobjdump(compiled: Any, flag: str) -> str:
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run(
            [bindir / "cuobjdump", flag, f.name], capture_output=True, text=True
        ).stdout


def sass_of(compiled: Any) -> str:
    """The SASS of a kernel compiled by `triton.compile` for an NVIDIA target."""
    return _cuobjdump(compiled, "-sass")


def stats_of(compiled: Any) -> OfflineCompile:
    """What a kernel compiled by `triton.compile` for an NVIDIA target costs, read from its
    cubin with Triton's bundled cuobjdump."""
    usage = _cuobjdump(compiled, "-res-usage")
    sass = sass_of(compiled)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return OfflineCompile(
        shared=int(compiled.metadata.shared),
        registers=int(regs.group(1)) if regs else -1,
        stack=int(stack.group(1)) if stack else -1,
        spills=bool(re.search(r"\b(LDL|STL)\b", sass)),
        loop_spills=_local_memory_in_loops(sass),
        traps=bool(re.search(r"^\s*trap;", compiled.asm["ptx"], re.MULTILINE)),
        wgmma_serialized=_wgmma_serialized(sass),
    )
