"""The import layers (docs/architecture.md, "Layers"), read from the source: imports point down
only, no module imports itself back through a cycle, and no package needs an import-order workaround.

Every module of the three packages must be placed in ``LAYERS``; a new module that is not fails
``test_every_module_has_a_layer`` until it is given one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dpbudget", "accountant", "mechanisms", "policies")

# Bottom to top. Within a layer, the groups listed together are siblings that must not import each
# other (mechanisms describe, composition rules interpret: neither knows the other).
LAYERS: list[tuple[str, list[list[str]]]] = [
    ("values and errors", [["accountant.errors", "accountant._numeric", "accountant._validate",
                            "accountant.budget", "accountant.charge", "accountant.rdp",
                            "accountant.html"]]),
    ("mechanisms and composition rules", [["mechanisms"], ["accountant.composition"]]),
    ("ledger", [["accountant.ledger"]]),
    ("policies", [["policies"]]),
    ("gate", [["accountant.planner", "accountant.receipt", "accountant.session",
               "accountant.refusals", "accountant.step", "accountant.continuity",
               "accountant.owner_key",
               "accountant.policy_record", "accountant.gate", "accountant.pipeline",
               "accountant.opening", "accountant.core", "accountant.unnamed"]]),
    ("training", [["accountant.training", "accountant.estimator"]]),
    ("audit and reports", [["accountant.sources", "accountant.audit_report",
                            "accountant.audit_chain", "accountant.audit_policy",
                            "accountant.audit_release", "accountant.audit_tally", "accountant.audit_text",
                            "accountant.audit_time", "accountant.audit",
                            "accountant.report", "accountant.transfer", "accountant.plot",
                            "accountant.plot_blocks",
                            "accountant.logs"]]),
    ("cli", [["accountant.cli"]]),
    ("public face", [["accountant"]]),  # the package's own __init__: re-exports, loaded lazily
    ("one namespace", [["dpbudget"]]),  # `import dpbudget as dp`: everything, loaded lazily
]


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
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
                found.update(a.name for a in child.names if a.name.split(".")[0] in PACKAGES)
            elif isinstance(child, ast.ImportFrom) and (top or not eager_only):
                base = child.module or ""
                if child.level == 0 and base.split(".")[0] in PACKAGES:
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        found.add(sub if sub in MODULES else base)
            visit(child, inner)

    visit(tree, True)
    found.discard(module)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if _place(m) is None]
    assert not unplaced, f"give these modules a layer in LAYERS: {unplaced}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    layer, group = _place(module)  # type: ignore[misc]
    for target in sorted(_imports(module)):
        if target == "accountant" and module != "accountant":
            pytest.fail(f"{module} imports the package face 'accountant'; import the module "
                        "that defines the name instead")
        where = _place(target)
        assert where is not None, f"{module} imports {target}, which has no layer"
        assert where[0] <= layer, (f"{module} ({LAYERS[layer][0]}) imports {target} "
                                   f"({LAYERS[where[0]][0]}): imports must point down")
        if where[0] == layer and module != "accountant":
            assert where[1] == group, (f"{module} imports its sibling {target}: "
                                       f"{LAYERS[layer][0]} do not know each other")


def test_no_import_cycles() -> None:
    graph = {m: _imports(m) for m in MODULES if m != "accountant"}
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


@pytest.mark.parametrize("package", ["accountant", "mechanisms", "policies",
                                     "accountant.composition", "accountant.ledger"])
def test_package_init_loads_only_lower_layers(package: str) -> None:
    """A package's ``__init__`` runs whenever any of its modules is imported: what it loads
    eagerly must sit at or below every module of the package (the face of ``accountant`` loads
    only the values; the rest of its names are loaded on first use)."""
    lowest = min(_place(m)[0] for m in MODULES  # type: ignore[index]
                 if m.startswith(package + ".") or m == package)
    if package == "accountant":
        lowest = 0
    for target in _imports(package, eager_only=True):
        assert _place(target)[0] <= lowest, (  # type: ignore[index]
            f"{package}/__init__.py loads {target} when any of its modules is imported")


@pytest.mark.parametrize("first", ["mechanisms", "policies", "accountant.ledger",
                                   "accountant.composition", "accountant.audit", "accountant.cli"])
def test_each_package_imports_alone_in_a_fresh_interpreter(first: str) -> None:
    """No import-order workaround: any package imported first, alone, loads; and the lower layers
    never drag in the gate."""
    code = (f"import sys, {first}\n"
            "from accountant import Accountant, Budget\n"
            "from mechanisms import Laplace\n"
            "print(sorted(m for m in sys.modules if m in ('accountant.gate', 'accountant.core')))")
    lower = first in ("mechanisms", "policies", "accountant.ledger", "accountant.composition")
    if lower:
        code = f"import sys, {first}\nprint(sorted(m for m in sys.modules " \
               "if m.startswith(('accountant.gate', 'accountant.core', 'accountant.planner'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ("[]" if lower else "['accountant.core', 'accountant.gate']")
