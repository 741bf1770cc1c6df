"""Stand-in for the CuTe DSL (`nvidia-cutlass-dsl`) on the GPU test machine, never installed
for users: `scripts/gpu_kit.sh install` puts it in the kit of vLLM 0.34 only.

vLLM 0.34's kernel warm-up imports its MiniMax-M3 kernels at every engine start, and those
import `cutlass` and `quack` (quack-kernels) at module level. The kit does not carry those
packages (hundreds of MB), and no model the tests run uses them: every attribute, call and
submodule here is an inert object, and a decorator returns the function it wraps.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("cutlass", "quack")


class Inert:
    """Any attribute, call, subscript or base class: itself again, or nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return Inert()

    def __getattr__(self, name: str) -> Inert:
        return Inert()

    def __getitem__(self, key: Any) -> Inert:
        return Inert()

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __or__(self, other: Any) -> Inert:
        return self

    __ror__ = __or__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None):
        if name.startswith(tuple(f"{top}." for top in STUBBED)):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: Inert()
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())


def __getattr__(name: str) -> Inert:
    return Inert()
