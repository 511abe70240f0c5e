"""House rules on size and layering, checked on the product tree (issue 52: a house a new engineer changes in a day).

* No product file over MAX_FILE_LINES lines: one concept per file.
* No function over MAX_FUNCTION_LINES lines of code (docstring, blank and comment-only lines not counted).
* No import circle among the product's modules, counting imports inside functions too: a function-level
  import that only dodges a circle is still a circle.
* Layers: `components/` never imports `pipelines/`; `pipelines/` never reaches into a component's `_private`
  module or name; the speed-up layer (`speedups/`) imports neither.

The product tree is `components/`, `pipelines/` and `speedups/`, less the speed-up layer's own tests and GPU
benchmarks (`speedups/tests/`, `speedups/benchmarks/`: like tests/ and benchmarks/, not shipped). The import rules
between components are tests/test_architecture.py's.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("components", "pipelines", "speedups")
NOT_PRODUCT = ("speedups/tests", "speedups/benchmarks")  # beside the package, not shipped (pyproject's find)
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def product_files(root: Path = ROOT) -> dict[str, Path]:
    """Returns {dotted module name: path} of every .py file of the product tree under `root`."""
    out = {}
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if any(rel.is_relative_to(folder) for folder in NOT_PRODUCT):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of code of a function's body: its docstring, blank lines and comment-only lines not counted."""
    body = node.body
    if (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        if len(body) == 1:
            return 0
        body = body[1:]
    text = lines[body[0].lineno - 1 : node.end_lineno]
    return sum(1 for line in text if line.strip() and not line.strip().startswith("#"))


def long_functions(rel_path: str, source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Returns `path:line: name has N lines of code` for each function of `source` over `limit`."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = code_lines(node, lines)
            if n > limit:
                found.append(f"{rel_path}:{node.lineno}: {node.name} has {n} lines of code (at most {limit})")
    return found


def _resolve(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(module: str, path: Path, modules: set[str]) -> set[str]:
    """The product modules `module` imports anywhere in its file (module level or inside functions)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(_resolve(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            out.update(_resolve(f"{base}.{alias.name}", modules) for alias in node.names)
    out.discard(None)
    out.discard(module)
    return out  # type: ignore[return-value]


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module in an import graph (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return circles


def layer_problems(module: str, imported: set[str], source_names: dict[str, list[str]]) -> list[str]:
    """The layer rules a module's imports break (see the module docstring), one line each."""
    top = module.split(".")[0]
    found = []
    for target in sorted(imported):
        t_top = target.split(".")[0]
        if top in ("components", "speedups") and t_top == "pipelines":
            found.append(f"{module} imports {target}: {top}/ sits below pipelines/")
        if top == "speedups" and t_top == "components":
            found.append(f"{module} imports {target}: the speed-up layer is a package of its own")
        if top == "pipelines" and t_top == "components":
            private = [p for p in target.split(".")[1:] if p.startswith("_")]
            private += [n for n in source_names.get(target, []) if n.startswith("_")]
            if private:
                found.append(f"{module} imports private {', '.join(private)} from {target}")
    return found


def _imported_names(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.setdefault(node.module, []).extend(alias.name for alias in node.names)
    return out


def test_no_product_file_is_over_the_line_limit():
    over = []
    for path in product_files().values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            over.append(f"{path.relative_to(ROOT)}: {n} lines (at most {MAX_FILE_LINES}; split it by concept)")
    assert not over, "\n".join(over)


def test_no_product_function_is_over_the_code_line_limit():
    found = []
    for path in product_files().values():
        found += long_functions(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_product_has_no_import_circle():
    files = product_files()
    graph = {m: imported_modules(m, p, set(files)) for m, p in files.items()}
    circles = import_circles(graph)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_layers_keep_their_direction():
    files = product_files()
    found = []
    for module, path in files.items():
        found += layer_problems(module, imported_modules(module, path, set(files)), _imported_names(path))
    assert not found, "\n".join(found)


def test_the_function_checker_counts_code_not_docstrings_or_comments():
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    src = f'def f():\n    """Doc.\n\n    More doc.\n    """\n    # a comment\n\n{body}\n'
    assert long_functions("m.py", src) == ["m.py:1: f has 61 lines of code (at most 60)"]
    assert long_functions("m.py", src.replace("    x60 = 60\n", "    # x60\n")) == []


def test_the_circle_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "components" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from components.x import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("from components.x.a import name\n")
    (pkg / "d.py").write_text("from components.x import a\n")
    files = product_files(tmp_path)
    graph = {m: imported_modules(m, p, set(files)) for m, p in files.items()}
    assert import_circles(graph) == [["components.x.a", "components.x.b", "components.x.c"]]


def test_the_speed_up_layer_s_tests_and_benchmarks_are_not_product_files(tmp_path):
    for rel in ("speedups/__init__.py", "speedups/items.py", "speedups/tests/test_x.py", "speedups/benchmarks/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("from components.train_lora import core\n")
    (tmp_path / "speedups/testsuite.py").write_text("")  # a module whose name only starts like the folder
    assert sorted(product_files(tmp_path)) == ["speedups", "speedups.items", "speedups.testsuite"]


@pytest.mark.parametrize(
    ("module", "imports", "names", "expected"),
    [
        ("components.evaluate.core", {"pipelines.config"}, {}, "sits below pipelines/"),
        ("speedups.registry", {"components.common.swift"}, {}, "a package of its own"),
        ("pipelines.run", {"components.evaluate._report"}, {}, "private _report"),
        ("pipelines.run", {"components.evaluate.core"}, {"components.evaluate.core": ["_gate"]}, "private _gate"),
    ],
)
def test_the_layer_checker_catches_each_kind(module, imports, names, expected):
    found = layer_problems(module, imports, names)
    assert found and expected in found[0], found


def test_the_layer_checker_accepts_public_downward_imports():
    assert layer_problems("pipelines.run", {"components.evaluate.core", "pipelines.config"}, {}) == []
    assert layer_problems("components.train_lora.core", {"speedups.registry", "components.common.swift"}, {}) == []
