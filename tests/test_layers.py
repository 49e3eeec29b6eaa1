"""Lower layers never import higher ones: every import of every module under src/stoker is checked.

The layers, low to high (a module may import its own layer and the ones below)::

    errors, decode, _tomllib, mixing, order, fs  ->  loading  ->  sources  ->  pipes  ->  shards
        ->  data (open_data: sources, pipes, shards)  ->  train, bench  ->  cli

Imports inside functions count (a lazy import is still a dependency); imports under
``if TYPE_CHECKING:`` do not (they never run). ``stoker/__init__.py`` (the package's
face) and ``demo.py`` (a tour of everything) are exempt. A new top-level module or
subpackage must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "errors": 0,
    "decode": 0,
    "jpeg": 0,  # reduced-scale and on-device JPEG decoding, beside decode
    "_tomllib": 0,
    "mixing": 0,
    "order": 0,  # the order of an epoch: seed rule, permutation, buffer shuffle, split (numpy only)
    "fs": 0,  # paths and URLs (stoker.fs): every reader of a folder or file, above only errors
    "lifetime": 0,  # workers die with their parent (pack, verify)
    "_lazy": 0,  # public names imported on first use
    "fuzz": 0,  # crafted inputs and a guarded runner (decode, errors)
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
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                found.append((node.lineno, _resolve(base, alias.name)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(line, name) for line, name in found if name == "stoker" or name.startswith("stoker.")]


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
        "def f():\n    from stoker.shards.dataset import ShardDataset\n"
        "from . import skips\n"
    )
    found = [name for _, name in _imports(ast.parse(code), "stoker.loading")]
    assert found == ["stoker.shards.dataset", "stoker.loading.skips"]
