"""The one interface to a folder or file named by the user, local or at a URL: :class:`Location`.

Readers ask a Location what they need (join, list, read, size) and never ask which kind
it is; where a reader truly needs a file on local disk (to memory-map it), it asks
:attr:`Location.local_path` once, in one place. Two implementations:
:class:`~stoker.fs.local.LocalLocation` (the operating system, with stoker's safety
checks) and :class:`~stoker.fs.remote.RemoteLocation` (an fsspec filesystem).
"""

from __future__ import annotations

import fnmatch
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Union

from stoker.types import PathLike

__all__ = ["PATH_OR_URL_TYPES", "FileKinds", "Location", "PathOrURL", "is_url", "join", "local_path", "parent", "walk_kinds"]

PathOrURL = Union[PathLike, "Location"]  # what every reader of a folder or file takes

FileKinds = dict[str, str]  # entry name -> "file", "link", "dir" or "other"

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_FILE_URL = "file://"


def walk_kinds(kinds_of: Callable[[str], FileKinds], prune: Callable[[str], bool] | None = None) -> Iterator[tuple[str, FileKinds]]:
    """``(folder, kinds)`` from ``""`` down, depth first in name order, below a folder ``prune`` does not refuse.

    ``kinds_of(rel)`` lists one folder (relative to the top, ``""`` for the top); the
    order and the pruning are the same for every kind of location.
    """

    def visit(rel: str) -> Iterator[tuple[str, FileKinds]]:
        kinds = kinds_of(rel)
        yield rel, kinds
        for name in sorted(n for n, kind in kinds.items() if kind == "dir"):
            below = f"{rel}/{name}" if rel else name
            if prune is None or not prune(below):
                yield from visit(below)

    return visit("")


def is_url(path: str | os.PathLike[str] | Location) -> bool:
    """True for ``scheme://...`` and chained ``a::b://...`` URLs (``file://`` included); the one test of "is this a URL".

    A :class:`Location` answers with its own kind (a local one is not a URL).
    """
    if isinstance(path, Location):
        return not path.is_local
    text = os.fspath(path)
    return isinstance(text, str) and (bool(_URL_RE.match(text)) or ("::" in text and "://" in text))


def local_path(path: str | os.PathLike[str]) -> Path | None:
    """The local path of a plain path or a ``file://`` URL; None for any other URL."""
    text = os.fspath(path)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if not is_url(text):
        return Path(text)
    if text.startswith(_FILE_URL):
        return Path(text[len(_FILE_URL) :])
    return None


def join(base: str | os.PathLike[str], *names: str) -> str:
    """``base/name/...`` for a path or a URL (a URL keeps its ``//``)."""
    local = local_path(base)
    if local is not None and not os.fspath(base).startswith(_FILE_URL):
        return str(local.joinpath(*names))
    text = os.fspath(base)
    return "/".join([text.rstrip("/"), *(n.strip("/") for n in names)])


def parent(path: str | os.PathLike[str]) -> str:
    """The folder holding ``path`` (a URL keeps its scheme)."""
    local = local_path(path)
    if local is not None and not os.fspath(path).startswith(_FILE_URL):
        return str(local.parent)
    head, _, _ = os.fspath(path).rstrip("/").rpartition("/")
    return head


class Location(ABC):
    """A folder or file named by the user: on local disk or on an fsspec filesystem.

    Make one with :func:`stoker.fs.where`. Methods that take ``name`` ask about
    ``self/name`` (a file in this folder) without making a Location for it.

    Attributes:
        url: how it is named: the URL, or the local path as given (what messages show).
        storage_options: the fsspec options of a URL (empty for a local path).
    """

    url: str
    storage_options: dict[str, Any]

    # -- what kind of place (ask once, where a reader needs a local file) -----------------
    @property
    @abstractmethod
    def local_path(self) -> Path | None:
        """The path on local disk, or None at a URL (read it through :meth:`open`, or download it first)."""

    @property
    def is_local(self) -> bool:
        """True when the bytes are on local disk (they can be memory-mapped in place)."""
        return self.local_path is not None

    # -- naming ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The last part of the path (like ``Path.name``)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        """The file name's extension (``.txt``), like ``Path.suffix``."""
        return os.path.splitext(self.name)[1]

    @property
    @abstractmethod
    def parent(self) -> Location:
        """The folder holding this one."""

    @abstractmethod
    def child(self, *names: str) -> Location:
        """The location ``self/name/...``."""

    def __truediv__(self, name: str) -> Location:
        return self.child(name)

    def url_of(self, name: str | None = None) -> str:
        """How ``name`` inside this folder (or this location) is named: a URL, or a local path."""
        return self.url if not name else join(self.url, name)

    @abstractmethod
    def resolve(self) -> Location:
        """The same place with symbolic links resolved (local: an absolute path; a URL is its own)."""

    @abstractmethod
    def contains(self, other: Location) -> bool:
        """True if ``other`` is this folder or lies below it (symbolic links resolved)."""

    # -- questions ------------------------------------------------------------------------
    @abstractmethod
    def exists(self, name: str | None = None) -> bool:
        """True if the file or folder exists."""

    @abstractmethod
    def is_file(self, name: str | None = None) -> bool:
        """True if this is a file."""

    @abstractmethod
    def is_dir(self, name: str | None = None) -> bool:
        """True if this is a folder (on object stores: a prefix with objects under it)."""

    @abstractmethod
    def size(self, name: str | None = None) -> int | None:
        """Bytes of one file, or None if there is none (or the store cannot say, like plain HTTP)."""

    # -- reading --------------------------------------------------------------------------
    @abstractmethod
    def open(self, name: str | None = None) -> IO[bytes]:
        """The file open for reading bytes (only a regular file: never a FIFO or device).

        Raises:
            MissingFileError: there is no such file.
            DataError: it is not a regular file, or cannot be read.
        """

    @abstractmethod
    def read_bytes(self, name: str | None = None, max_bytes: int | None = None) -> bytes:
        """The bytes of this file (or of ``name`` inside this folder).

        Raises:
            MissingFileError: there is no such file.
            DataError: it is not a regular file, cannot be read, or is larger than ``max_bytes``.
        """

    def sha256(self, name: str | None = None) -> str | None:
        """The SHA-256 (hex) the store itself keeps for this file, where it keeps a trustworthy one; else None.

        None here (a local disk keeps none): read the bytes to check them. See
        :meth:`stoker.fs.remote.RemoteLocation.sha256` for the stores that do.
        """
        return None

    def read_text(self, encoding: str = "utf-8") -> str:
        """The text of this file."""
        return self.read_bytes().decode(encoding)

    # -- listing --------------------------------------------------------------------------
    @abstractmethod
    def kinds(self) -> FileKinds:
        """What each entry directly in this folder is (``file``, ``dir``, ``link``, ``other``), from one listing.

        Raises:
            DataError: the folder cannot be read (permissions).
        """

    @abstractmethod
    def walk(self, prune: Callable[[str], bool] | None = None) -> Iterator[tuple[str, FileKinds]]:
        """``(folder, kinds)`` for this folder (``""``) and each folder below, parents first, in name order.

        Links to folders are not followed (they could loop). ``folder`` is relative
        (``a/b``). A folder for which ``prune(folder)`` is true is left out, with all
        below it (locally it is never read). A URL is listed once, recursively.
        """

    @abstractmethod
    def sizes(self) -> dict[str, int]:
        """``{name: bytes}`` of the regular files directly in this folder (one listing; empty if none)."""

    @abstractmethod
    def list_dirs(self) -> list[str]:
        """Names of the folders directly in this one, sorted (empty if it is not a folder)."""

    def walk_files(self) -> list[str]:
        """Every regular file under this folder, as sorted paths relative to it (``a/b.png``)."""
        return sorted(f"{folder}/{n}" if folder else n for folder, kinds in self.walk() for n, k in kinds.items() if k == "file")

    def glob(self, pattern: str) -> list[Location]:
        """The entries directly in this folder whose name matches ``pattern`` (sorted)."""
        return [self.child(name) for name in sorted(self.kinds()) if fnmatch.fnmatch(name, pattern)]

    @abstractmethod
    def file_inside(self, name: str, where: str, kinds: FileKinds | None = None) -> str | None:
        """The path or URL of the file ``name`` (untrusted: from a label or id file) in this folder; None if absent.

        The name must stay inside this folder (locally: with symbolic links resolved;
        this folder must be resolved already) and be a regular file. ``kinds`` (from
        :meth:`kinds`) answers plain names without another call.

        Raises:
            LabelError: the name is absolute, climbs out, or resolves outside this folder.
            DataError: it is not a regular file (a folder, FIFO or device).
        """

    # -- writing --------------------------------------------------------------------------
    @abstractmethod
    def upload(self, local: str | os.PathLike[str], name: str) -> None:
        """Copy a local file to ``name`` in this folder (whole: a reader never sees half of it on an object store)."""

    @abstractmethod
    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small file whole."""

    @abstractmethod
    def remove(self, name: str) -> None:
        """Delete ``name`` if it is there."""

    @abstractmethod
    def invalidate(self) -> None:
        """Forget cached listings (other processes may have written here)."""

    # -- plumbing -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (self.url, self.storage_options) == (other.url, other.storage_options)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.url)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


#: What names one place (not a list of them): for ``isinstance(x, PATH_OR_URL_TYPES)``.
PATH_OR_URL_TYPES = (str, os.PathLike, Location)

