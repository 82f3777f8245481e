"""The import layers (docs/architecture.md, "Layers"), read from the source: imports point down
only, no module imports itself back through a cycle, and no package needs an import-order workaround.

Every module of the three packages must be placed in ``LAYERS``; a new module that is not fails
``test_every_module_has_a_layer`` until it is given one.
"""

from __future__ import annotations

import ast
import functools
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
    ("training and tables", [["dpbudget.accountant.training"], ["dpbudget.accountant.tables"]]),
    ("audit and reports", [["dpbudget.accountant.audit"]]),
    ("query service", [["dpbudget.accountant.service"]]),  # tables and audit behind HTTP
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
                                     "dpbudget.accountant.training", "dpbudget.accountant.tables",
                                     "dpbudget.accountant.audit", "dpbudget.accountant.service",
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


# --- Every module has its test file (issue 31) --------------------------------------------------

TESTS = ROOT / "tests"
# Test files that hold behaviour of a whole layer or of the system, not of one module: they have
# no module of their own name. Keep this list short; a test of one module goes in its file.
_BEHAVIOUR = (
    "tests/system/test_*.py",  # multi-process runs: forks, interrupts, workers
    "tests/mechanisms/test_contract_*.py",  # the contract every mechanism keeps (tests/contracts.py)
    "tests/test_docs.py",  # the docs' code blocks run
    "tests/test_examples.py",  # the examples run
    "tests/test_exports.py",  # the public names of every package
    "tests/test_layers.py",  # this file: the layering of every module
    "tests/test_namespace.py",  # `import dpbudget as dp`: the one namespace
    "tests/test_no_data_in_errors.py",  # a canary fed through every error path
    "tests/test_packaging.py",  # the installed wheel
    "tests/test_startup.py",  # import time and what an import loads
)


def _test_file(path: Path) -> str:
    """The test file of library module ``path``: accountant's folders map to tests/<folder>/,
    mechanisms/ and policies/ to tests/mechanisms/ and tests/policies/; ``_name`` to ``test_name``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    folders = parts[1:-1] if parts[0] == "accountant" else parts[:-1]
    return "/".join(("tests", *folders, f"test_{parts[-1].lstrip('_')}.py"))


def _tested_modules() -> dict[str, str]:
    """Each library module (not a package's ``__init__``) by its test file's path."""
    return {_test_file(path): ".".join(["dpbudget", *path.relative_to(ROOT).with_suffix("").parts])
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            if path.name != "__init__.py"}


def _origins(name: str, base: str, attrs: tuple[str, ...] = ()) -> set[str]:
    """The modules a name imported from ``base`` (then ``.attr`` ...) comes from: ``base`` and the
    module that defines each object reached (re-exports count for the module that defines them)."""
    import importlib

    found = {base}
    try:
        obj: object = importlib.import_module(base)
        for attr in (name, *attrs) if name else attrs:
            obj = getattr(obj, attr)
            found.add(obj.__name__ if isinstance(obj, type(importlib)) else getattr(obj, "__module__", None) or base)
    except (ImportError, AttributeError):
        pass
    return found


def _helpers(tree: ast.Module) -> dict[str, ast.AST]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _imported(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module it is imported from, attribute name or "" for a module)."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = (alias.name, "")
                else:
                    names[alias.name.split(".")[0]] = (alias.name.split(".")[0], "")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


@functools.lru_cache(maxsize=None)
def _helper_tree(module: str) -> ast.Module | None:
    """The source of a helper module of the tests (``tests.support``, ``tests.contracts``, ...)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return ast.parse(path.read_text("utf-8")) if module.startswith("tests.") and path.exists() else None


def reaches(source: str, module: str,
            fixtures: dict[str, tuple[ast.AST, ast.Module]] | None = None) -> bool:
    """Whether some test function of ``source`` uses ``module``: a name (or ``name.attr...``)
    imported from it, or from a package that re-exports it, or a helper (a function or class of
    the file, a fixture of conftest.py, a function of ``tests.*``) that does. Reading an import
    alone, or naming the module in a string, is not enough: an empty file never reaches."""
    tree = ast.parse(source)
    seen: set[int] = set()

    def uses(node: ast.AST, tree: ast.Module) -> bool:
        if id(node) in seen:
            return False
        seen.add(id(node))
        imported, local = _imported(tree), _helpers(tree)
        params: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in node.args.args + node.args.kwonlyargs]
        for name in params:  # a fixture the test asks for is a helper it calls
            fixture = (local[name], tree) if name in local else (fixtures or {}).get(name)
            if fixture is not None and uses(*fixture):
                return True
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) or isinstance(sub, ast.Name):
                chain: list[str] = []
                head: ast.AST = sub
                while isinstance(head, ast.Attribute):
                    chain.insert(0, head.attr)
                    head = head.value
                if not isinstance(head, ast.Name):
                    continue
                if head.id in imported:
                    base, name = imported[head.id]
                    helper = _helper_tree(base)
                    if helper is not None:
                        target = _helpers(helper).get(name)
                        if target is not None and uses(target, helper):
                            return True
                    elif module in _origins(name, base, tuple(chain)):
                        return True
                elif head.id in local and local[head.id] is not node and uses(local[head.id], tree):
                    return True
        return False

    return any(uses(node, tree) for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"))


def _fixtures(path: Path) -> dict[str, tuple[ast.AST, ast.Module]]:
    """The fixtures of the conftest.py files above ``path`` (the nearest wins)."""
    found: dict[str, tuple[ast.AST, ast.Module]] = {}
    for folder in reversed(path.relative_to(TESTS).parents):
        conftest = TESTS / folder / "conftest.py"
        if conftest.exists():
            tree = ast.parse(conftest.read_text("utf-8"))
            found.update({name: (node, tree) for name, node in _helpers(tree).items()})
    return found


def test_every_module_has_its_test_file() -> None:
    """Tests mirror the tree: each module's file exists and one of its tests uses the module."""
    missing, hollow = [], []
    for test, module in _tested_modules().items():
        path = ROOT / test
        if not path.exists():
            missing.append(test)
        elif not reaches(path.read_text("utf-8"), module, _fixtures(path)):
            hollow.append(test)
    assert not missing, f"write the test file of each module: {missing}"
    assert not hollow, f"these test files have no test that uses their module: {hollow}"


def test_every_test_file_has_its_module() -> None:
    """A test file named after a module that no longer exists is moved or deleted with it; only
    the behaviour files listed in ``_BEHAVIOUR`` test no one module."""
    modules = _tested_modules()
    orphans = [rel for path in sorted(TESTS.rglob("test_*.py"))
               if (rel := path.relative_to(ROOT).as_posix()) not in modules
               and not any(path.relative_to(ROOT).match(pattern) for pattern in _BEHAVIOUR)]
    assert not orphans, f"name these after the module they test, or list them in _BEHAVIOUR: {orphans}"


@pytest.mark.parametrize(("source", "expected"), [
    ("", False),
    ("from dpbudget.accountant.gate.receipt import Receipt\n", False),
    ("from dpbudget.accountant.gate.receipt import Receipt\ndef test_a():\n    assert 'Receipt'\n", False),
    ("from dpbudget.accountant.gate.receipt import Receipt\ndef test_a():\n    Receipt\n", True),
    ("from dpbudget.accountant import Receipt\ndef test_a():\n    Receipt\n", True),
    ("import dpbudget as dp\ndef test_a():\n    dp.Receipt\n", True),
    ("import dpbudget as dp\ndef test_a():\n    dp.Budget\n", False),
    ("from dpbudget.accountant import Receipt\ndef _h():\n    return Receipt\ndef test_a():\n    _h()\n", True),
    ("from dpbudget.accountant import Receipt\ndef helper():\n    return Receipt\n", False),
])
def test_a_test_file_reaches_its_module_only_by_a_test_that_uses_it(source: str, expected: bool) -> None:
    """The check's own negative controls: an empty file, an import no test uses, the name in a
    string, or a helper no test calls does not satisfy it."""
    assert reaches(source, "dpbudget.accountant.gate.receipt") is expected
