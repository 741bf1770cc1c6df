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

import triton


@dataclass(frozen=True)
class OfflineCompile:
    shared: int  # bytes of shared memory per program
    registers: int  # per thread (-1: not reported)
    stack: int  # bytes of local memory per thread (-1: not reported)
    spills: bool  # local loads or stores in the SASS

    def __str__(self) -> str:
        return (
            f"registers {self.registers}, shared {self.shared} B, stack {self.stack} B, "
            f"spills {self.spills}"
        )


def compile_offline(
    kernel: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    aligned: tuple[str, ...] | list[str],
    capability: int,
    *,
    num_warps: int,
    num_stages: int,
    max_registers: int = 0,
) -> OfflineCompile:
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
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", capability, 32),
        options=options,
    )
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [bindir / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True
        ).stdout
        sass = subprocess.run(
            [bindir / "cuobjdump", "-sass", f.name], capture_output=True, text=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return OfflineCompile(
        shared=int(compiled.metadata.shared),
        registers=int(regs.group(1)) if regs else -1,
        stack=int(stack.group(1)) if stack else -1,
        spills=bool(re.search(r"\b(LDL|STL)\b", sass)),
    )
