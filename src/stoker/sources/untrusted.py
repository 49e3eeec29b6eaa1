"""Checks on what a data description names, before a byte of it is read.

A label file, an id list or a folder tree may come from a stranger. What it names must
stay inside its root folder (symlinks resolved), must be a regular file (not a FIFO that
blocks a read forever, nor ``/dev/zero``), must have a name that is valid UTF-8 (shards
store names as Arrow strings), and its labels must be plain integers within
:data:`MAX_CLASSES`.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from stoker.errors import DataError, LabelError, MissingFileError
from stoker.fs import Location, PathOrURL, where

__all__ = [
    "MAX_CLASSES",
    "FileKinds",
    "check_name_utf8",
    "parse_label",
    "read_text_file",
    "resolve_inside",
    "scan_kinds",
]

_MAX_TEXT_BYTES = 1 << 30  # a label or id file larger than this is not one

#: The most classes a data set may have; labels are ``0 .. MAX_CLASSES - 1``. A label above
#: it is almost always a mistake (an id column taken for a label) and would build a class
#: list too large for memory.
MAX_CLASSES = 10**7

_INTEGER = re.compile(r"-?[0-9]+")

FileKinds = dict[str, str]  # entry name -> "file", "link", "dir" or "other"


def parse_label(value: Any, where: str) -> int:
    """A label as written in a label file, CSV or JSON: a plain integer ``0 .. MAX_CLASSES - 1``.

    Strings must be digits only (``"3"``; not ``"+3"``, ``"1_0"``, ``" 3"`` or ``"3.0"``);
    JSON numbers must be integers (not ``3.0`` or ``true``).

    Raises:
        LabelError: naming ``where`` (file and line, or file and id).
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise LabelError(f"{where}: label {value!r} is not an integer; write labels as whole numbers >= 0")
    if isinstance(value, str):
        if not _INTEGER.fullmatch(value):
            raise LabelError(f"{where}: label {value!r} is not an integer; write labels as whole numbers >= 0 (digits only)")
        if len(value) > 12:  # int() of a huge digit string is slow, and it is over the limit anyway
            raise LabelError(f"{where}: label {value[:20]}... is larger than {MAX_CLASSES - 1:,}; labels are class numbers")
        value = int(value)
    if value < 0:
        raise LabelError(f"{where}: label {value} is negative; labels must be integers >= 0")
    if value >= MAX_CLASSES:
        raise LabelError(
            f"{where}: label {value} is larger than {MAX_CLASSES - 1:,}; labels are class numbers "
            f"0..{MAX_CLASSES - 1:,} (is an id column being read as the label?)"
        )
    return value


def check_name_utf8(name: str, where: str) -> None:
    """A file name must be valid UTF-8 (os gives undecodable bytes as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise DataError(f"{where}: file name {shown!r} is not valid UTF-8; rename the file") from None


def scan_kinds(folder: Path) -> FileKinds:
    """What each entry of ``folder`` is, from one directory scan (no stat per file).

    Raises:
        DataError: the folder cannot be read (permissions).
    """
    kinds: FileKinds = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink():
                    kinds[entry.name] = "link"
                elif entry.is_file(follow_symlinks=False):
                    kinds[entry.name] = "file"
                elif entry.is_dir(follow_symlinks=False):
                    kinds[entry.name] = "dir"
                else:
                    kinds[entry.name] = "other"
    except PermissionError:
        raise DataError(f"{folder}: cannot read the folder (permission denied); fix its permissions") from None
    except OSError as exc:
        raise DataError(f"{folder}: cannot read the folder ({exc.strerror or exc})") from None
    return kinds


def resolve_inside(root: Path, name: str, where: str, kinds: FileKinds | None = None) -> str | None:
    """The absolute path of ``root/name`` if it is a regular file inside ``root``; None if it does not exist.

    ``root`` must already be resolved. ``kinds`` (from :func:`scan_kinds` of ``root``)
    answers plain names without a system call; names with folders, and symlinks, are
    resolved and must stay inside ``root``.

    Raises:
        LabelError: the name is absolute, climbs out of ``root``, or resolves outside it.
        DataError: it is not a regular file (a folder, FIFO or device).
    """
    plain = "/" not in name and "\\" not in name and name not in ("", ".", "..")
    if plain and kinds is not None:
        kind = kinds.get(name)
        if kind is None:
            return None
        if kind == "file":
            return str(root / name)
        if kind != "link":
            raise DataError(f"{where}: {root / name} is not a regular file ({kind}); only regular files are data")
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise LabelError(f"{where}: {name!r} points outside the data folder {root}; name files relative to it")
    path = os.path.realpath(root / name)
    if path != str(root) and not path.startswith(str(root).rstrip(os.sep) + os.sep):
        raise LabelError(
            f"{where}: {name!r} resolves to {path}, outside the data folder {root} (a symlink?); "
            "copy the file into the folder"
        )
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataError(f"{where}: cannot read {path} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{where}: {path} is not a regular file; only regular files are data")
    return path


def read_text_file(path: PathOrURL, what: str, expected: str) -> str:
    """The text of a label or id file (local or a URL): a regular file, UTF-8 (a byte-order mark is dropped).

    Raises:
        MissingFileError: it does not exist.
        LabelError: it is not a regular file, too large, or not UTF-8 text.
    """
    place = where(path)
    if isinstance(place, Location):
        try:
            data = place.read_bytes()
        except FileNotFoundError:
            raise MissingFileError(f"{path}: {what} not found") from None
        return _decode_text(data, path, what, expected)
    path = place
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise MissingFileError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise LabelError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise LabelError(f"{path}: the {what} is not a regular file; expected {expected}")
    if info.st_size > _MAX_TEXT_BYTES:
        raise LabelError(f"{path}: the {what} is larger than {_MAX_TEXT_BYTES >> 20} MiB; expected {expected}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LabelError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    return _decode_text(data, path, what, expected)


def _decode_text(data: bytes, path: PathOrURL, what: str, expected: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LabelError(
            f"{path}:{line}: the {what} is not UTF-8 text (byte {data[exc.start]:#04x}); "
            f"save it as UTF-8; expected {expected}"
        ) from None
