"""Local-vs-remote is answered in one place, :mod:`stoker.fs`: no other module asks it itself.

Outside ``stoker/fs/`` a module must not test "is this a URL" by hand (``"://" in path``,
``path.startswith("file://")``, ``path.split("://")``: use :func:`stoker.fs.is_url`,
:func:`stoker.fs.local_path` or :func:`stoker.fs.where`), nor branch on the kind of a
location (``isinstance(place, Location)``, ``LocalLocation``, ``RemoteLocation``): ask
the :class:`~stoker.fs.Location` what is needed, or ``place.local_path`` where a local
file is truly needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).resolve().parent
LOCATION_CLASSES = {"Location", "LocalLocation", "RemoteLocation"}
_STRING_TESTS = {"startswith", "endswith", "removeprefix", "split", "rsplit", "partition", "rpartition", "find", "index"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _is_scheme_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and "://" in node.value


def location_questions(source: str, where: str) -> list[str]:
    """``file:line: what`` for each place ``source`` asks local-vs-remote itself."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, where)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = _names(node.args[1]) & LOCATION_CLASSES
            if kinds:
                found.append(f"{where}:{line}: isinstance(..., {', '.join(sorted(kinds))}): ask the Location instead")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if _is_scheme_text(node.left):
                found.append(f"{where}:{line}: '://' in ...: use stoker.fs.is_url / local_path / where")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STRING_TESTS:
            if any(_is_scheme_text(arg) for arg in node.args):
                found.append(f"{where}:{line}: .{node.func.attr}('...://'): use stoker.fs.is_url / local_path / where")
    return found


def test_no_module_outside_fs_asks_local_or_remote_itself() -> None:
    problems: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        if rel.startswith("stoker/fs/"):
            continue
        problems.extend(location_questions(path.read_text(encoding="utf-8"), rel))
    assert not problems, "local-vs-remote answered outside stoker.fs:\n" + "\n".join(problems)


def test_the_guard_sees_each_way_of_asking() -> None:
    source = (
        "def f(path, place):\n"
        "    if '://' in path and not path.startswith('file://'):\n"
        "        pass\n"
        "    if isinstance(place, Location) or isinstance(place, (str, fs.RemoteLocation)):\n"
        "        pass\n"
        "    scheme = path.split('://', 1)[0]\n"
        "    return 's3://bucket' if isinstance(place, Path) else place.local_path\n"  # not questions: a message, a Path
    )
    found = location_questions(source, "x.py")
    assert sorted(item.split(": ", 1)[0] for item in found) == ["x.py:2", "x.py:2", "x.py:4", "x.py:4", "x.py:6"], found
