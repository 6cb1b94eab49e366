"""matplan's layering, read from the source with ``ast`` (nothing is imported, so it runs on any CPU).

Layers, lowest first: core (with corpus beside it) < models < kernels < planner
< {dispatch, tuning_db, distributed} < cli. A module imports only from its own layer or a lower one: models
never import kernels, kernels never import the planner, and layers of one height (core and
corpus; dispatch, tuning_db and distributed) do not import each other. The package root (``matplan/__init__``)
sits above them all: it may import anything, and nothing inside imports it. There is no import
cycle among matplan's modules, and imports of matplan modules go at module top, except the few
listed in LAZY_ALLOWED, each for an optional heavy dependency.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "matplan"
PACKAGE = "matplan"
#: Height of each subpackage (or top-level module); a module may import its own layer or lower ones.
LAYERS = {"core": 0, "corpus": 0, "models": 1, "kernels": 2, "planner": 3, "dispatch": 4, "tuning_db": 4,
          "distributed": 4, "cli": 5}
#: The root package imports the public API from every layer: it is above all of them.
ROOT_HEIGHT = max(LAYERS.values()) + 1
#: Function-level imports of matplan modules that are allowed: (importer, imported module) -> the
#: reason, which must be an optional heavy dependency that the imported module pulls in at its top.
LAZY_ALLOWED: dict = {
    ("matplan.cli", "matplan.distributed"):
        "Dask (the optional distributed extra), for `matplan tune --scheduler local` only",
}
#: At most this many lazy imports, however well reasoned.
MAX_LAZY = 10


def _modules() -> dict:
    """Dotted module name -> path, for every .py file under matplan/ (a package by its __init__)."""
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _nearest(name: str) -> str | None:
    """``name`` or its closest enclosing matplan module (``matplan.kernels.get`` -> ``matplan.kernels``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node) -> list:
    """The matplan modules an import statement of ``module`` loads by name."""
    if isinstance(node, ast.Import):
        return [t for t in (_nearest(a.name) for a in node.names) if t]
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    if origin.split(".")[0] != PACKAGE:
        return []
    out = []
    for alias in node.names:   # `from pkg import mod` names the module, `from pkg import f` the package
        sub = f"{origin}.{alias.name}"
        target = sub if sub in MODULES else _nearest(origin)
        if target and target not in out:
            out.append(target)
    return out


def _imports() -> list:
    """(importer, imported module, line, inside a function) of every import of a matplan module."""
    found = []

    def visit(module, node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((module, t, child.lineno, lazy) for t in _targets(module, child) if t != module)
            visit(module, child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for module, path in MODULES.items():
        visit(module, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return found


IMPORTS = _imports()


def _layer(module: str) -> str | None:
    """The layer of a module, None for the root package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _height(module: str) -> int:
    layer = _layer(module)
    return ROOT_HEIGHT if layer is None else LAYERS[layer]


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def test_every_module_has_a_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LAYERS) - {None})
    assert not unknown, f"subpackages or top-level modules without a layer in LAYERS: {unknown}"


def test_imports_point_down():
    wrong = []
    for importer, target, line, _ in IMPORTS:
        if _layer(importer) is None:          # the root package re-exports every layer's API
            continue
        same = _layer(importer) == _layer(target)
        if not same and _height(target) >= _height(importer):
            wrong.append(f"{_where(importer, line)}: {importer} ({_layer(importer)}) imports {target} "
                         f"({_layer(target) or 'the package root'})")
    assert not wrong, "imports pointing up or sideways between layers:\n  " + "\n  ".join(wrong)


def _cycles(edges) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(MODULES):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def test_no_import_cycles():
    """Function-level imports count too: a cycle hidden in a function is still a cycle."""
    edges, lines = defaultdict(set), {}
    for importer, target, line, _ in IMPORTS:
        edges[importer].add(target)
        lines.setdefault((importer, target), line)
    found = []
    for comp in _cycles(edges):
        inside = sorted(f"{a} -> {b} ({_where(a, lines[a, b])})" for a in comp for b in edges[a] if b in comp)
        found.append(f"{len(comp)} modules: " + "; ".join(inside))
    assert not found, "import cycles:\n  " + "\n  ".join(found)


def test_matplan_imports_at_module_top():
    lazy = defaultdict(list)
    for importer, target, line, inside in IMPORTS:
        if inside:
            lazy[importer, target].append(line)
    unlisted = [f"{_where(a, lines[0])}: {a} imports {b} inside a function"
                for (a, b), lines in sorted(lazy.items()) if (a, b) not in LAZY_ALLOWED]
    stale = [f"{a} -> {b}" for a, b in sorted(LAZY_ALLOWED) if (a, b) not in lazy]
    assert not unlisted, ("function-level imports of matplan modules (move them to the top, or list one in "
                          "LAZY_ALLOWED with the optional heavy dependency it defers):\n  " + "\n  ".join(unlisted))
    assert not stale, "LAZY_ALLOWED entries no longer imported lazily (remove them): " + ", ".join(stale)
    assert len(LAZY_ALLOWED) <= MAX_LAZY
    assert all(isinstance(why, str) and why.strip() for why in LAZY_ALLOWED.values())


def test_the_checker_reads_imports():
    """The parsing above finds the imports it must (a check that finds nothing passes vacuously)."""
    assert len(MODULES) > 40 and len(IMPORTS) > 100
    pairs = {(a, b) for a, b, _, _ in IMPORTS}
    assert ("matplan.kernels.spmv.gpu", "matplan.kernels.registry") in pairs     # from ..registry import register
    assert ("matplan.kernels.spmv", "matplan.kernels.spmv.gpu") in pairs          # from . import gpu
    assert ("matplan.planner.choose", "matplan.kernels") in pairs                 # from ..kernels import kernels_for
