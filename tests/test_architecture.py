"""House rules on imports, checked on the source tree (issue: a shared floor).

* A component never imports another component: shared code lives one floor down, in
  `components/common/` (and the image tags in `components/images.py`), with public names.
* Nobody imports a `_private` module or name of another package.
* Cores are pure: `kfp` is imported only by a component's KFP wrapper (`component.py`)
  and its `__init__.py`.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ROOT / "components"
SHARED = {"common", "images"}  # components.<shared> is importable by every component
KFP_ALLOWED = {"component.py", "__init__.py"}


def _imports(source: str) -> list[tuple[int, str, list[str]]]:
    """Returns (line, module, imported names) of every import, including those inside functions."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return out


def _owner(module: str) -> str | None:
    """Returns the component (or shared module) a `components.X...` module belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "components" and len(parts) > 1 else None


def violations(rel_path: str, source: str) -> list[str]:
    """Returns the import rules a file under `components/` breaks, one line each.

    Args:
        rel_path: The file's path relative to the repository root (e.g. components/x/core.py).
        source: Its text.

    Returns:
        `path:line: message` lines; empty when the file keeps the rules.
    """
    parts = Path(rel_path).parts
    own = parts[1] if len(parts) > 2 else None  # components/<own>/file.py; None for components/<file>.py
    found = []
    for line, module, names in _imports(source):
        where = f"{rel_path}:{line}"
        owner = _owner(module)
        if owner and owner not in SHARED and owner != own and own not in SHARED | {None}:
            found.append(
                f"{where}: component {own!r} imports {module} (another component); move shared code to components/common/"
            )
        elif owner and own in SHARED | {None} and owner not in SHARED:
            found.append(f"{where}: shared module imports the component module {module}")
        if owner and owner != own:
            private = [p for p in module.split(".")[1:] if p.startswith("_")] + [n for n in names if n.startswith("_")]
            if private:
                found.append(f"{where}: imports private {', '.join(private)} from {module}")
        if (module == "kfp" or module.startswith("kfp.")) and parts[-1] not in KFP_ALLOWED:
            found.append(f"{where}: imports {module} outside a KFP wrapper (cores stay pure)")
    return found


def test_components_keep_the_import_rules():
    problems = []
    for path in sorted(COMPONENTS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        problems += violations(rel, path.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("rel_path", "source", "expected"),
    [
        (
            "components/validate_data/core.py",
            "from components.evaluate.metrics import parse_findings\n",
            "another component",
        ),
        (
            "components/merge_export/core.py",
            "def f():\n    from components.train_lora.core import to_cli\n",
            "another component",
        ),
        ("components/evaluate/core.py", "from components.common.answers import _FENCE_RE\n", "private _FENCE_RE"),
        ("components/evaluate/core.py", "import components.train_lora._launch\n", "another component"),
        ("components/common/swift.py", "from components.train_lora import core\n", "shared module imports"),
        ("components/evaluate/core.py", "from kfp import dsl\n", "outside a KFP wrapper"),
    ],
)
def test_the_checker_catches_each_kind_of_reach_in(rel_path, source, expected):
    found = violations(rel_path, source)
    assert found and expected in found[0], found


@pytest.mark.parametrize(
    ("rel_path", "source"),
    [
        ("components/evaluate/core.py", "from components.common.storage import to_fuse_path\n"),
        ("components/evaluate/core.py", "from components.evaluate._report import write_report\n"),
        ("components/evaluate/component.py", "from kfp import dsl\nfrom components.images import TRAIN_IMAGE\n"),
        ("components/train_lora/core.py", "from components.train_lora import _checkpoints\n"),
    ],
)
def test_the_checker_accepts_shared_and_own_imports(rel_path, source):
    assert violations(rel_path, source) == []
