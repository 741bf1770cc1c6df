"""The package's shape limits (the architecture issue's): no module over 700 lines, no host
function over 80 lines (`@triton.jit` / `@gluon.jit` kernels and their helpers exempt)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vllm_blackwell_ext"
MAX_MODULE_LINES = 700
MAX_HOST_FUNCTION_LINES = 80


def _is_jit(node: ast.FunctionDef) -> bool:
    """Decorated with `triton.jit`, `gluon.jit` or a call of either."""
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def long_host_functions(tree: ast.AST, path: Path) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_jit(node):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_HOST_FUNCTION_LINES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines})")
    return found


def test_no_module_over_700_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_host_function_over_80_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_host_functions(ast.parse(path.read_text()), path)
    assert not found, f"host functions over {MAX_HOST_FUNCTION_LINES} lines: {found}"


def test_the_shape_check_sees_a_long_function_and_exempts_jit_kernels():
    body = "\n".join(["    x = 1"] * 90)
    tree = ast.parse(f"def host():\n{body}\n\n@triton.jit\ndef kernel():\n{body}\n")
    assert long_host_functions(tree, PACKAGE / "m.py") == ["m.py:1 host (91)"]
