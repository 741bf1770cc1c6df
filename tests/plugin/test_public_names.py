"""`tests/` and `benchmarks/` use only the package's public names.

import-linter (`lint-imports`, contracts in pyproject.toml) checks which modules import which;
it cannot see names. This test reads every `.py` under `tests/` and `benchmarks/` with `ast`
(nothing is imported) and lists, file:line, each place that reaches past the public surface of
`vllm_blackwell_ext`:

- `from vllm_blackwell_ext.x import _name`, and any import of a private module
  (`vllm_blackwell_ext._private`, `import vllm_blackwell_ext.x._y`, `import_module(...)`);
- `<alias>._name`, where the alias (or an attribute chain from it) is a module of the package;
- assignments to an attribute of such a module (`pa.LAUNCHER = ...`, `del pa.X`,
  `setattr(pa, ...)`, `monkeypatch.setattr(pa, ...)`, `monkeypatch.setattr("pkg.x.Y", ...)`,
  `mock.patch("pkg....")`, `mock.patch.object(pa, ...)`): patching module globals, anywhere in
  `benchmarks/` and in `kernels/` or `ops` from anywhere (a kernel variant is chosen through
  its plan's public API). A test may stand in for the environment an adapter reads (vLLM's
  platform, a version probe) by patching a public name of `attention/`, `registration` or the
  like: vLLM's own tests do the same with `current_platform`.

A name is private when it starts with one underscore (dunder names such as `__version__` are
public). An exception goes into ALLOWED with the reason beside it; it is empty on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "vllm_blackwell_ext"
PACKAGE_DIR = ROOT / "src" / PACKAGE
SCANNED = ("tests", "benchmarks")

# "path/relative/to/root.py:line" -> why it may stay. Keep this empty: fix the code instead.
ALLOWED: dict[str, str] = {}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(dotted: str) -> bool:
    """Whether a dotted name of the package is one of its modules or packages (read from src/)."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return False
    path = PACKAGE_DIR.joinpath(*parts[1:])
    return (path / "__init__.py").is_file() or path.with_suffix(".py").is_file()


def _private_parts(dotted: str) -> list[str]:
    return [p for p in dotted.split(".")[1:] if _is_private(p)]


class _Finder(ast.NodeVisitor):
    """Collects (line, what) for one file. Aliases are tracked per file, not per scope: a name
    bound to a package module anywhere in the file counts everywhere in it."""

    def __init__(self, lab: bool = False) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module of the package
        self.found: list[tuple[int, str]] = []
        self.lab = lab  # a file of benchmarks/: it patches nothing of the package

    def patch_forbidden(self, module: str, attr: str) -> bool:
        """Whether patching `module.attr` here reaches past the public surface."""
        kernels_or_ops = module.split(".")[1:2] in (["kernels"], ["ops"])
        return self.lab or kernels_or_ops or _is_private(attr)

    # -- bindings ---------------------------------------------------------------------------
    def bind_imports(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != PACKAGE:
                        continue
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        self.aliases[PACKAGE] = PACKAGE
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_module(full):
                        self.aliases[alias.asname or alias.name] = full

    def dotted(self, node: ast.AST) -> str | None:
        """The package path an expression names (`pa.X.y` -> 'vllm_blackwell_ext....X.y')."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def module_of(self, node: ast.AST) -> str | None:
        dotted = self.dotted(node)
        return dotted if dotted and _is_module(dotted) else None

    # -- imports ------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == PACKAGE and _private_parts(alias.name):
                self.found.append((node.lineno, f"import {alias.name}"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] != PACKAGE:
            return
        if _private_parts(node.module):
            names = ", ".join(a.name for a in node.names)
            self.found.append((node.lineno, f"from {node.module} import {names}"))
            return
        for alias in node.names:
            if _is_private(alias.name):
                self.found.append((node.lineno, f"from {node.module} import {alias.name}"))

    # -- attribute reads and writes ----------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        module = self.module_of(node.value)
        # writes are reported as such (_write); this reports reads
        if module and _is_private(node.attr) and isinstance(node.ctx, ast.Load):
            self.found.append((node.lineno, f"{module}.{node.attr}"))
        self.generic_visit(node)

    def _write(self, target: ast.AST, how: str) -> None:
        if isinstance(target, ast.Attribute):
            module = self.module_of(target.value)
            if module and self.patch_forbidden(module, target.attr):
                self.found.append((target.lineno, f"{how} {module}.{target.attr}"))
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._write(element, how)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._write(target, "assigns")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._write(node.target, "assigns")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._write(node.target, "assigns")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._write(target, "deletes")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        text = first.value if isinstance(first, ast.Constant) else None
        if name in ("setattr", "delattr", "object") and first is not None:
            # setattr(mod, ...), monkeypatch.setattr(mod, ...), mock.patch.object(mod, ...)
            module = self.module_of(first)
            if module:
                attr = node.args[1].value if len(node.args) > 1 else "?"
                attr = attr if isinstance(attr, str) else "?"
                if self.patch_forbidden(module, attr):
                    self.found.append((node.lineno, f"{name}({module}, {attr!r})"))
        if isinstance(text, str) and text.split(".")[0] == PACKAGE:
            module, _, attr = text.rpartition(".")
            if name in ("setattr", "delattr", "patch") and self.patch_forbidden(module, attr):
                # monkeypatch.setattr("pkg.mod.NAME", ...), mock.patch("pkg.mod.NAME")
                self.found.append((node.lineno, f"{name}({text!r})"))
            elif name == "import_module" and _private_parts(text):
                self.found.append((node.lineno, f"import_module({text!r})"))
        self.generic_visit(node)


def find_offenders(root: Path = ROOT) -> list[str]:
    """Every place under tests/ and benchmarks/ that uses a non-public name, as 'path:line what'."""
    offenders = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if any(part.startswith(".") for part in Path(rel).parts):
                continue
            tree = ast.parse(path.read_text(), filename=rel)
            finder = _Finder(lab=top == "benchmarks")
            finder.bind_imports(tree)
            finder.visit(tree)
            for line, what in sorted(set(finder.found)):
                if f"{rel}:{line}" not in ALLOWED:
                    offenders.append(f"{rel}:{line} {what}")
    return offenders


def test_allowed_list_stays_short():
    assert len(ALLOWED) <= 5, "fix the code, do not grow the allow-list"


def test_finder_sees_each_kind_of_reach(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tests" / "t.py").write_text(
        "import vllm_blackwell_ext.kernels.paged_attention as pa\n"
        "from vllm_blackwell_ext.kernels import mla_decode\n"
        "from vllm_blackwell_ext.kernels.launch_cache import _hidden, CachedLauncher\n"
        "from vllm_blackwell_ext import _registration\n"
        "import vllm_blackwell_ext\n"
        "pa._ATTN_LAUNCHER = None\n"
        "pa.PUBLIC = 1\n"
        "x = mla_decode._plan(1)\n"
        "y = vllm_blackwell_ext.kernels.paged_attention._validate\n"
        "def f(monkeypatch):\n"
        "    monkeypatch.setattr(pa, 'select_config', None)\n"
        "    monkeypatch.setattr('vllm_blackwell_ext.ops.kv_gather', None)\n"
        "z = pa.paged_attention\n"
        "from vllm_blackwell_ext.attention import bwx_attn\n"
        "def g(monkeypatch):\n"
        "    monkeypatch.setattr(bwx_attn, 'current_platform', None)\n"
        "    monkeypatch.setattr(bwx_attn, '_cache', None)\n"
    )
    (tmp_path / "benchmarks" / "b.py").write_text(
        "from vllm_blackwell_ext.attention import bwx_attn\nbwx_attn.current_platform = None\n"
    )
    found = find_offenders(tmp_path)
    expected = [
        "tests/t.py:3 from vllm_blackwell_ext.kernels.launch_cache import _hidden",
        "tests/t.py:4 from vllm_blackwell_ext import _registration",
        "tests/t.py:6 assigns vllm_blackwell_ext.kernels.paged_attention._ATTN_LAUNCHER",
        "tests/t.py:7 assigns vllm_blackwell_ext.kernels.paged_attention.PUBLIC",
        "tests/t.py:8 vllm_blackwell_ext.kernels.mla_decode._plan",
        "tests/t.py:9 vllm_blackwell_ext.kernels.paged_attention._validate",
        "tests/t.py:11 setattr(vllm_blackwell_ext.kernels.paged_attention, 'select_config')",
        "tests/t.py:12 setattr('vllm_blackwell_ext.ops.kv_gather')",
        "tests/t.py:17 setattr(vllm_blackwell_ext.attention.bwx_attn, '_cache')",
        "benchmarks/b.py:2 assigns vllm_blackwell_ext.attention.bwx_attn.current_platform",
    ]
    assert found == expected


def test_tests_and_benchmarks_use_only_public_names():
    offenders = find_offenders()
    assert not offenders, (
        f"{len(offenders)} uses of non-public names of {PACKAGE} "
        "(use the package's public API, or make the name public):\n" + "\n".join(offenders)
    )
