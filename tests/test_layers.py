"""The import layers (docs/architecture.md, "Layers"), read from the source: imports point down
only, no module imports itself back through a cycle, and no package needs an import-order workaround.

Every module of the three packages must be placed in ``LAYERS``; a new module that is not fails
``test_every_module_has_a_layer`` until it is given one.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The layers' folders: in a checkout beside dpbudget/ (which links to them), installed inside it.
FOLDERS = ("accountant", "mechanisms", "policies")

# Bottom to top. Within a layer, the groups listed together are siblings that must not import each
# other (mechanisms describe, composition rules interpret: neither knows the other).
LAYERS: list[tuple[str, list[list[str]]]] = [
    ("values and errors", [["dpbudget.accountant.values"]]),
    ("mechanisms and composition rules", [["dpbudget.mechanisms"], ["dpbudget.accountant.composition"]]),
    ("ledger", [["dpbudget.accountant.ledger"]]),
    ("policies", [["dpbudget.policies"]]),
    ("gate", [["dpbudget.accountant.gate"]]),
    ("training", [["dpbudget.accountant.training"]]),
    ("audit and reports", [["dpbudget.accountant.audit"]]),
    ("cli", [["dpbudget.accountant.cli"]]),
    ("public face", [["dpbudget.accountant"]]),  # the package's own __init__: re-exports, loaded lazily
    ("one namespace", [["dpbudget"]]),  # `import dpbudget as dp`: everything, loaded lazily
]


def _modules() -> dict[str, Path]:
    out = {"dpbudget": ROOT / "dpbudget" / "__init__.py"}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = ["dpbudget", *path.relative_to(ROOT).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _place(module: str) -> tuple[int, int] | None:
    """(layer index, sibling group index) of ``module``, by the longest listed prefix."""
    best: tuple[int, int, int] | None = None
    for i, (_, groups) in enumerate(LAYERS):
        for j, group in enumerate(groups):
            for prefix in group:
                if module == prefix or module.startswith(prefix + "."):
                    if best is None or len(prefix) > best[2]:
                        best = (i, j, len(prefix))
    return None if best is None else best[:2]


def _ours(name: str) -> bool:
    """A module of the library's layers (the examples are a user of the library, not a layer)."""
    return name.split(".")[0] == "dpbudget" and not name.startswith("dpbudget.examples")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, *, eager_only: bool = False) -> set[str]:
    """The modules of ours that ``module`` imports (``from pkg import submodule`` resolved to the
    submodule). ``eager_only``: only those run when the module is loaded (module level, outside
    ``if TYPE_CHECKING``)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                if not eager_only:
                    visit(child, top)
                continue
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.Import) and (top or not eager_only):
                found.update(a.name for a in child.names if _ours(a.name))
            elif isinstance(child, ast.ImportFrom) and (top or not eager_only):
                base = child.module or ""
                if child.level == 0 and _ours(base):
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        found.add(sub if sub in MODULES else base)
            visit(child, inner)

    visit(tree, True)
    found.discard(module)
    return found


def test_every_module_has_a_layer() -> None:
    """One folder per layer: each module sits in its layer's folder (only the package face and
    the CLI are at the top of ``accountant/``)."""
    unplaced = [m for m in MODULES if _place(m) is None]
    assert not unplaced, f"give these modules a layer in LAYERS: {unplaced}"
    loose = [m for m in MODULES if m.count(".") == 2 and m.startswith("dpbudget.accountant.")
             and m != "dpbudget.accountant.cli" and (ROOT / "accountant" / f"{m.rsplit('.', 1)[1]}.py").exists()]
    assert not loose, f"put these modules in their layer's folder: {loose}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    layer, group = _place(module)  # type: ignore[misc]
    for target in sorted(_imports(module)):
        if target == "dpbudget.accountant" and module != "dpbudget.accountant":
            pytest.fail(f"{module} imports the package face 'dpbudget.accountant'; import the module "
                        "that defines the name instead")
        where = _place(target)
        assert where is not None, f"{module} imports {target}, which has no layer"
        assert where[0] <= layer, (f"{module} ({LAYERS[layer][0]}) imports {target} "
                                   f"({LAYERS[where[0]][0]}): imports must point down")
        if where[0] == layer and module != "dpbudget.accountant":
            assert where[1] == group, (f"{module} imports its sibling {target}: "
                                       f"{LAYERS[layer][0]} do not know each other")


def test_no_import_cycles() -> None:
    graph = {m: _imports(m) for m in MODULES if m != "dpbudget.accountant"}
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node):] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            walk(nxt, path + [node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])


@pytest.mark.parametrize("package", ["dpbudget.accountant", "dpbudget.mechanisms", "dpbudget.policies",
                                     "dpbudget.accountant.values", "dpbudget.accountant.gate",
                                     "dpbudget.accountant.training", "dpbudget.accountant.audit",
                                     "dpbudget.accountant.composition", "dpbudget.accountant.ledger"])
def test_package_init_loads_only_lower_layers(package: str) -> None:
    """A package's ``__init__`` runs whenever any of its modules is imported: what it loads
    eagerly must sit at or below every module of the package (the face of ``accountant`` loads
    only the values; the rest of its names are loaded on first use)."""
    lowest = min(_place(m)[0] for m in MODULES  # type: ignore[index]
                 if m.startswith(package + ".") or m == package)
    if package == "dpbudget.accountant":
        lowest = 0
    for target in _imports(package, eager_only=True):
        assert _place(target)[0] <= lowest, (  # type: ignore[index]
            f"{package}/__init__.py loads {target} when any of its modules is imported")


@pytest.mark.parametrize("first", ["dpbudget.mechanisms", "dpbudget.policies", "dpbudget.accountant.ledger",
                                   "dpbudget.accountant.composition", "dpbudget.accountant.audit.run", "dpbudget.accountant.cli"])
def test_each_package_imports_alone_in_a_fresh_interpreter(first: str) -> None:
    """No import-order workaround: any package imported first, alone, loads; and the lower layers
    never drag in the gate."""
    code = (f"import sys, {first}\n"
            "from dpbudget.accountant import Accountant, Budget\n"
            "from dpbudget.mechanisms import Laplace\n"
            "print(sorted(m for m in sys.modules if m in ('dpbudget.accountant.gate.gate', 'dpbudget.accountant.gate.accountant')))")
    lower = first in ("dpbudget.mechanisms", "dpbudget.policies", "dpbudget.accountant.ledger", "dpbudget.accountant.composition")
    if lower:
        code = f"import sys, {first}\nprint(sorted(m for m in sys.modules " \
               "if m.startswith(('dpbudget.accountant.gate.gate', 'dpbudget.accountant.gate.accountant', 'dpbudget.accountant.gate.planner'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ("[]" if lower else "['dpbudget.accountant.gate.accountant', 'dpbudget.accountant.gate.gate']")


def test_one_import_name() -> None:
    """Every import names ``dpbudget.*``: installed, ``accountant``, ``mechanisms`` and ``policies``
    do not exist at the top level, and in a checkout importing one by its folder's name would load
    a second copy of its modules, with classes of their own."""
    # at a line's start, in a doctest, or after a newline escape in code held in a string
    bare = re.compile(r"(?:(?<![\w.])|(?<=\\n))(?<!dpbudget )(?:from|import)\s+"
                      r"(?:accountant|mechanisms|policies|dpbudget_examples)\b"
                      r"|import_module\(\s*[\"'](?:accountant|mechanisms|policies)\b")
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for folder in (*FOLDERS, "tests", "examples", "benchmarks"):
        files += (ROOT / folder).rglob("*.py")
    offenders = [str(f.relative_to(ROOT)) for f in files if bare.search(f.read_text("utf-8"))]
    assert not offenders, f"import these through dpbudget.*: {offenders}"


def test_no_module_over_its_size() -> None:
    """No module over 400 lines, and none over 300 in the storage wing (issue 31): a module that
    grows past it has taken on a second concept."""
    over = [f"{m} ({n} lines)" for m, path in MODULES.items()
            if (n := len(path.read_text("utf-8").splitlines()))
            > (300 if m.startswith("dpbudget.accountant.ledger") else 400)]
    assert not over, f"split these: {over}"
