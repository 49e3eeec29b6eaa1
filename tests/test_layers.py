"""Lower layers never import higher ones: every import of every module under src/stoker is checked.

The layers, low to high (a module may import its own layer and the ones below)::

    errors, decode, _tomllib, mixing, order, fs  ->  loading  ->  sources  ->  pipes  ->  shards
        ->  data (open_data: sources, pipes, shards)  ->  train, bench  ->  cli

Imports inside functions count (a lazy import is still a dependency); imports under
``if TYPE_CHECKING:`` do not (they never run). ``stoker/__init__.py`` (the package's
face) and ``demo.py`` (a tour of everything) are exempt. A new top-level module or
subpackage must be given a layer here.

Nor may modules import each other in a loop, within a layer as across (``a`` imports
``b``, which imports ``a``). A lazy import inside a function only hides a loop from
import time, so it counts; and a loop that a lazy import closes counts even when the way
back is an ``if TYPE_CHECKING:`` import (the lower module calls up into one that names
it). A loop of module-level imports closed by a type-only import alone is the usual
idiom for annotations and is allowed. Break a loop by putting the code where it belongs:
a function two modules use goes to the lower one (or becomes public in a module both
import), or the caller passes it in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "errors": 0,
    "decode": 0,  # one file's bytes to a tensor: decode.image, decode.jpeg, decode.headers
    "_tomllib": 0,
    "mixing": 0,
    "order": 0,  # the order of an epoch: seed rule, permutation, buffer shuffle, split (numpy only)
    "fs": 0,  # paths and URLs (stoker.fs): every reader of a folder or file, above only errors
    "lifetime": 0,  # workers die with their parent (pack, verify)
    "cores": 0,  # how many cores this process may use: every default that counts them
    "terminal": 0,  # whether a progress bar is drawn (a terminal, not --quiet)
    "_lazy": 0,  # public names imported on first use
    "types": 0,  # the type names shared by every layer (PathLike, Transform)
    "loading": 1,
    "sources": 2,
    "pipes": 3,
    "shards": 4,
    "data": 5,
    "packer": 5,  # stoker.pack: open_data, then the shard writer
    "train": 6,
    "bench": 6,
    "demo": 6,  # the tour (exempt itself); only the CLI imports it
    "cli": 7,
    "__main__": 7,  # `python -m stoker`: the CLI
}
EXEMPT = {"stoker/__init__.py", "stoker/demo.py"}

# Known upward imports, as (importing file, imported module): to be removed, not added to.
ALLOWED: set[tuple[str, str]] = set()  # known violations, each with the reason; none left


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every import that runs, with ``from X import name`` resolved to ``X.name`` where it is a module."""
    return [(line, name) for line, name, kind in _all_imports(tree, package) if kind != "type"]


def _all_imports(tree: ast.AST, package: str) -> list[tuple[int, str, str]]:
    """``(line, module, kind)`` of every import of a stoker module; kind is ``"top"`` (runs when
    the module is imported), ``"lazy"`` (inside a function) or ``"type"`` (under ``if TYPE_CHECKING:``)."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "type")
            for child in node.orelse:
                visit(child, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "top":
            kind = "lazy"
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, kind) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                found.append((node.lineno, _resolve(base, alias.name), kind))
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, "top")
    return [(line, name, kind) for line, name, kind in found if name == "stoker" or name.startswith("stoker.")]


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _resolve(base: str, name: str) -> str:
    """``from base import name``: the module it reads (``base.name`` when that is a module)."""
    if _is_module(f"{base}.{name}"):
        return f"{base}.{name}"
    if base == "stoker":  # the package's face: the name's home module
        homes: dict[str, str] = getattr(stoker, "_HOMES", {})
        return homes.get(name, "stoker.errors")  # the face imports only errors (and __version__) eagerly
    return base


def _layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "stoker"


def _violations() -> tuple[list[str], set[tuple[str, str]], list[str]]:
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    unplaced: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        if rel in EXEMPT:
            continue
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        own = _layer_of(module)
        if own not in LAYERS:
            unplaced.append(rel)
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for line, imported in _imports(ast.parse(path.read_text(encoding="utf-8"), rel), package):
            target = _layer_of(imported)
            if target == "stoker" or target not in LAYERS:
                if target not in LAYERS and target != "stoker":
                    unplaced.append(f"{rel}:{line} imports {imported}")
                continue
            if LAYERS[target] > LAYERS[own]:
                if (rel, imported) in ALLOWED:
                    seen.add((rel, imported))
                else:
                    problems.append(f"{rel}:{line}: {own} (layer {LAYERS[own]}) imports {imported} (layer {LAYERS[target]})")
    return problems, seen, unplaced


Graph = dict[str, list[tuple[str, int, str, str]]]  # module -> (file, line, imported module, kind)


def _graph() -> Graph:
    """Every stoker module's imports of other stoker modules (the package faces included)."""
    graph: Graph = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = _all_imports(ast.parse(path.read_text(encoding="utf-8"), rel), package)
        graph[module] = [(rel, line, imported, kind) for line, imported, kind in found if imported != module]
    return graph


def _path_back(graph: Graph, start: str, goal: str, kinds: set[str]) -> list[tuple[str, int, str, str]] | None:
    """The imports (of the given kinds) that lead from ``start`` to ``goal``, or ``None`` (breadth first: the shortest)."""
    came: dict[str, tuple[str, int, str, str] | None] = {start: None}
    todo = [start]
    while todo:
        nxt: list[str] = []
        for module in todo:
            if module == goal:
                path = []
                while (edge := came[module]) is not None:
                    path.append(edge)
                    module = edge[0].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                return path[::-1]
            for edge in graph.get(module, []):
                if edge[3] in kinds and edge[2] not in came:
                    came[edge[2]] = edge
                    nxt.append(edge[2])
        todo = nxt
    return None


def _cycles(graph: Graph) -> list[str]:
    """Each import that closes a loop (see the module docstring), with the way back, as one line each."""
    loops: dict[frozenset[str], str] = {}
    for module, edges in graph.items():
        for rel, line, imported, kind in edges:
            if kind == "type":
                continue
            back = _path_back(graph, imported, module, {"top", "lazy"} if kind == "top" else {"top", "lazy", "type"})
            if back is None:
                continue
            members = frozenset([module, imported, *(e[2] for e in back)])
            steps = " -> ".join(f"{e[2]} ({e[0]}:{e[1]}{', ' + e[3] if e[3] != 'top' else ''})" for e in back)
            text = f"{rel}:{line} imports {imported}{' (lazy)' if kind == 'lazy' else ''}, which leads back: {steps}"
            loops.setdefault(members, text)
    return sorted(loops.values())


def test_no_modules_import_each_other_in_a_loop() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (move the shared code to the lower module, or pass it in):\n" + "\n".join(cycles)


def test_the_cycle_finder_sees_lazy_loops_and_allows_type_only_ones() -> None:
    lazy = {  # registry.py calling up into pipe.py, which imports it
        "p.pipe": [("p/pipe.py", 3, "p.registry", "top")],
        "p.registry": [("p/registry.py", 9, "p.pipe", "lazy")],
    }
    found = _cycles(lazy)
    assert len(found) == 1 and "p/pipe.py:3" in found[0] and "p/registry.py:9, lazy" in found[0]
    typed = {  # a lazy import whose way back is type-only still closes a loop
        "b.results": [("b/results.py", 93, "b.report", "lazy")],
        "b.report": [("b/report.py", 29, "b.results", "type")],
    }
    assert len(_cycles(typed)) == 1
    annotations = {  # module-level import one way, type-only the other: the annotation idiom
        "s.reader": [("s/reader.py", 32, "s.cache", "top")],
        "s.cache": [("s/cache.py", 46, "s.reader", "type")],
    }
    assert _cycles(annotations) == []
    three = {"a": [("a.py", 1, "b", "top")], "b": [("b.py", 1, "c", "top")], "c": [("c.py", 5, "a", "lazy")]}
    found = _cycles(three)
    assert len(found) == 1 and all(f"{m}.py:" in found[0] for m in "abc")
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import pipe\ndef f():\n    from . import stages\n")
    assert [(name, kind) for _, name, kind in _all_imports(tree, "stoker.pipes")] == [
        ("stoker.pipes.pipe", "type"), ("stoker.pipes.stages", "lazy")]


def test_no_module_imports_a_higher_layer() -> None:
    problems, _, _ = _violations()
    assert not problems, "upward imports (move the code down, or pass the dependency in):\n" + "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    _, _, unplaced = _violations()
    assert not unplaced, "give these a layer in tests/test_layers.py LAYERS:\n" + "\n".join(unplaced)


def test_the_allow_list_holds_only_real_violations() -> None:
    _, seen, _ = _violations()
    fixed = sorted((rel, imported) for rel, imported in ALLOWED - seen if (SRC.parent / rel).is_file())
    assert not fixed, f"these upward imports are gone; remove them from ALLOWED: {fixed}"


def test_the_checker_sees_lazy_imports_and_skips_type_checking_ones() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from stoker.train import fit\n"
        "def f():\n    from stoker.shards.read.dataset import ShardDataset\n"
        "from . import skips\n"
    )
    found = [name for _, name in _imports(ast.parse(code), "stoker.loading")]
    assert found == ["stoker.shards.read.dataset", "stoker.loading.skips"]
