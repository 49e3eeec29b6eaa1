"""Checks on what a data description names, before a byte of it is read.

A label file, an id list or a folder tree may come from a stranger. What it names must
stay inside its root folder (symlinks resolved), must be a regular file (not a FIFO that
blocks a read forever, nor ``/dev/zero``), must have a name that is valid UTF-8 (shards
store names as Arrow strings), and its labels must be plain integers within
:data:`MAX_CLASSES`.
"""

from __future__ import annotations

import re
from typing import Any

from stoker.errors import DataError, LabelError, MissingFileError
from stoker.fs import PathOrURL, where

__all__ = [
    "MAX_CLASSES",
    "check_name_utf8",
    "parse_label",
    "read_text_file",
]

_MAX_TEXT_BYTES = 1 << 30  # a label or id file larger than this is not one

#: The most classes a data set may have; labels are ``0 .. MAX_CLASSES - 1``. A label above
#: it is almost always a mistake (an id column taken for a label) and would build a class
#: list too large for memory.
MAX_CLASSES = 10**7

_INTEGER = re.compile(r"-?[0-9]+")


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


def read_text_file(path: PathOrURL, what: str, expected: str) -> str:
    """The text of a label or id file (local or a URL): a regular file, UTF-8 (a byte-order mark is dropped).

    Raises:
        MissingFileError: it does not exist.
        LabelError: it is not a regular file, too large, or not UTF-8 text.
    """
    try:
        data = where(path).read_bytes(max_bytes=_MAX_TEXT_BYTES)
    except MissingFileError:
        raise MissingFileError(f"{path}: {what} not found") from None
    except DataError as exc:
        raise LabelError(f"{exc}; expected {expected} (the {what})") from None
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
