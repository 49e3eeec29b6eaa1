"""A :class:`~stoker.fs.location.Location` on local disk, read with the operating system (no fsspec).

What a stranger's data names is checked here, once, for every reader: only regular files
are read (a FIFO is opened without blocking, then refused; never ``/dev/zero``), names
must stay inside their folder with symbolic links resolved, and links to folders are not
followed when walking (they could loop).

The folder check is made twice: when the index is built (:func:`resolve_inside`), and
again on the file actually opened (:func:`open_regular` with ``inside``), because a link
swapped in between the two would otherwise serve an outside file's bytes. The second
check asks the operating system where the open descriptor leads (``/proc/self/fd``),
so no later swap can change the answer.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np

from stoker.errors import DataError, LabelError, MissingFileError
from stoker.fs.location import FileKinds, Location, walk_kinds

__all__ = ["LocalLocation", "is_within", "open_regular", "read_inside", "read_inside_array", "resolve_inside", "scan_kinds"]

# O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat then refuses it.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(
    path: str | os.PathLike[str], shown: str, max_bytes: int | None = None, inside: Sequence[str] | None = None
) -> IO[bytes]:
    """``path`` open for reading bytes, if it is a regular file (of at most ``max_bytes``) inside one of ``inside``.

    Args:
        path: the file (symbolic links are followed, then checked).
        shown: how messages name it.
        max_bytes: refuse larger files.
        inside: absolute, resolved folders the file opened must lie in (checked on the
            open descriptor, not on the name: a link swapped in after indexing is caught);
            ``None``: anywhere.

    Raises:
        MissingFileError: there is no such file.
        DataError: it is not a regular file (a FIFO, device or folder), is too large,
            cannot be opened, or (``inside``) is outside every folder given.
    """
    return os.fdopen(_open_checked(path, shown, max_bytes, inside)[0], "rb")


def _open_checked(
    path: str | os.PathLike[str], shown: str, max_bytes: int | None, inside: Sequence[str] | None
) -> tuple[int, os.stat_result]:
    """The descriptor of ``path`` and its ``fstat``, with every check of :func:`open_regular` passed (else closed)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise MissingFileError(f"{shown}: not found") from None
    except OSError as exc:
        raise DataError(f"{shown}: cannot read file ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise DataError(f"{shown}: not a regular file (a FIFO, device or folder); only regular files are data")
    if inside is not None:
        opened = _opened_path(fd, path, info)
        if opened is None or not any(is_within(opened, folder) for folder in inside):
            os.close(fd)
            raise DataError(
                f"{shown}: the file opened is {opened or 'somewhere else (the path changed while it was opened)'}, "
                f"outside the data folder {inside[0]} (a symbolic link put there after the index was built?); "
                "stoker reads only files inside the folder: remove the link or copy the file in"
            )
    if max_bytes is not None and info.st_size > max_bytes:
        os.close(fd)
        raise DataError(f"{shown}: {info.st_size:,} bytes, larger than {max_bytes:,} bytes")
    return fd, info


def is_within(path: str, folder: str) -> bool:
    """Whether the absolute ``path`` is ``folder`` or below it (by name: resolve both first)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _opened_path(fd: int, path: str | os.PathLike[str], info: os.stat_result) -> str | None:
    """Where the open descriptor ``fd`` leads, with every link resolved; None if that cannot be told.

    Linux names it in ``/proc/self/fd``, macOS through ``F_GETPATH``. Elsewhere the name
    is resolved and kept only when it still leads to the very file open (same device
    and inode), so a swap between the open and the check gives None, never the wrong answer.
    """
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl

        if hasattr(fcntl, "F_GETPATH"):
            return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    except (ImportError, OSError):
        pass
    real = os.path.realpath(path)
    try:
        again = os.stat(real)
    except OSError:
        return None
    return real if (again.st_dev, again.st_ino) == (info.st_dev, info.st_ino) else None


def read_inside(path: str, shown: str, inside: Sequence[str], max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, if the file opened lies inside one of ``inside`` (see :func:`open_regular`).

    Raises:
        MissingFileError: there is no such file.
        DataError: it is not a regular file, is too large, cannot be read, or is outside the folders.
    """
    with open_regular(path, shown, max_bytes, inside) as f:
        try:
            return f.read()
        except OSError as exc:
            raise DataError(f"{shown}: cannot read file ({exc.strerror or exc})") from None


def read_inside_array(path: str, shown: str, inside: Sequence[str], max_bytes: int | None = None) -> np.ndarray:
    """:func:`read_inside`, into a new writable ``uint8`` array: the same checks, no bytes object and no copy of it.

    The file is read to its end (a file that grew since its ``fstat`` is read whole, and
    refused when it grew past ``max_bytes``); a decoder that wants writable memory
    (torchvision) takes the array as it is.

    Raises:
        MissingFileError: there is no such file.
        DataError: it is not a regular file, is too large, cannot be read, or is outside the folders.
    """
    fd, info = _open_checked(path, shown, max_bytes, inside)
    try:
        buffer = np.empty(info.st_size + 1, dtype=np.uint8)  # one byte more: a read that fills it means the file grew
        view, got = memoryview(buffer), 0  # type: ignore[arg-type]  # ndarray is a buffer (stubs < 3.12 disagree)
        while got < len(buffer):
            n = os.readv(fd, [view[got:]])
            if n == 0:
                return buffer[:got]
            got += n
        rest = _read_rest(fd, shown, max_bytes, got)
        return np.concatenate([buffer, np.frombuffer(rest, dtype=np.uint8)]) if rest else buffer
    except OSError as exc:
        raise DataError(f"{shown}: cannot read file ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _read_rest(fd: int, shown: str, max_bytes: int | None, got: int) -> bytes:
    """What a file that grew while it was read holds past the first ``got`` bytes, within ``max_bytes``."""
    chunks: list[bytes] = []
    while chunk := os.read(fd, 1 << 20):
        got += len(chunk)
        if max_bytes is not None and got > max_bytes:
            raise DataError(f"{shown}: grew to more than {max_bytes:,} bytes while it was read")
        chunks.append(chunk)
    return b"".join(chunks)


def scan_kinds(folder: str | os.PathLike[str]) -> FileKinds:
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


class LocalLocation(Location):
    """A folder or file on local disk (a plain path, or a ``file://`` URL).

    It is a :class:`os.PathLike`, so it goes wherever a path does (``open``, ``Path(...)``).
    Its :attr:`url` is the path as given (relative stays relative).

    Args:
        path: the local path.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._local = Path(path)
        self.url = str(self._local)
        self.storage_options = {}

    @property
    def local_path(self) -> Path:
        """The path on local disk."""
        return self._local

    @property
    def name(self) -> str:
        """The last part of the path (like ``Path.name``)."""
        return self._local.name

    @property
    def parent(self) -> LocalLocation:
        """The folder holding this one."""
        return LocalLocation(self._local.parent)

    def child(self, *names: str) -> LocalLocation:
        """The location ``self/name/...``."""
        return LocalLocation(self._local.joinpath(*names))

    def resolve(self) -> LocalLocation:
        """The absolute path with symbolic links resolved."""
        return LocalLocation(self._local.resolve())

    def contains(self, other: Location) -> bool:
        """True if ``other``, with links resolved, is this folder or below it (a URL never is)."""
        if other.local_path is None:
            return False
        base, target = self._local.resolve(), other.local_path.resolve()
        return target == base or base in target.parents

    def _p(self, name: str | None) -> Path:
        return self._local / name if name else self._local

    # -- questions ------------------------------------------------------------------------
    def exists(self, name: str | None = None) -> bool:
        """True if the file or folder exists (a dangling link does not)."""
        return self._p(name).exists()

    def is_file(self, name: str | None = None) -> bool:
        """True if this is a file (following links)."""
        return self._p(name).is_file()

    def is_dir(self, name: str | None = None) -> bool:
        """True if this is a folder (following links)."""
        return self._p(name).is_dir()

    def size(self, name: str | None = None) -> int | None:
        """Bytes of one file, or None if there is none."""
        try:
            return self._p(name).stat().st_size
        except OSError:
            return None

    # -- reading --------------------------------------------------------------------------
    def open(self, name: str | None = None) -> IO[bytes]:
        """The file open for reading bytes (a regular file only: a FIFO does not block, it is refused)."""
        return open_regular(self._p(name), self.url_of(name))

    def read_bytes(self, name: str | None = None, max_bytes: int | None = None) -> bytes:
        """The bytes of a regular file of at most ``max_bytes`` (see :meth:`Location.read_bytes`)."""
        shown = self.url_of(name)
        with open_regular(self._p(name), shown, max_bytes) as f:
            try:
                return f.read()
            except OSError as exc:
                raise DataError(f"{shown}: cannot read file ({exc.strerror or exc})") from None

    # -- listing --------------------------------------------------------------------------
    def kinds(self) -> FileKinds:
        """What each entry is, from one directory scan (links are ``link``, not followed)."""
        return scan_kinds(self._local)

    def walk(self, prune: Callable[[str], bool] | None = None) -> Iterator[tuple[str, FileKinds]]:
        """``(folder, kinds)`` for this folder and each folder below, depth first in name order (links not followed)."""
        return walk_kinds(lambda rel: scan_kinds(self._local / rel if rel else self._local), prune)

    def sizes(self) -> dict[str, int]:
        """``{name: bytes}`` of the regular files directly in this folder (not links; empty if it is not a folder)."""
        out: dict[str, int] = {}
        try:
            with os.scandir(self._local) as entries:
                for entry in entries:
                    if not entry.is_symlink() and entry.is_file(follow_symlinks=False):
                        out[entry.name] = entry.stat(follow_symlinks=False).st_size
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            raise DataError(f"{self}: cannot read the folder ({exc.strerror or exc}); check its permissions") from None
        return out

    def list_dirs(self) -> list[str]:
        """Names of the folders directly in this one (links to folders included), sorted."""
        try:
            with os.scandir(self._local) as entries:
                return sorted(e.name for e in entries if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise DataError(f"{self}: cannot read the folder ({exc.strerror}); check its permissions") from None

    def glob(self, pattern: str) -> list[Location]:
        """The entries directly in this folder whose name matches ``pattern`` (links included, sorted)."""
        return [LocalLocation(p) for p in sorted(self._local.glob(pattern))]

    def file_inside(self, name: str, where: str, kinds: FileKinds | None = None) -> str | None:
        """See :meth:`Location.file_inside`; this folder must be resolved (:meth:`resolve`)."""
        return resolve_inside(self._local, name, where, kinds)

    # -- writing --------------------------------------------------------------------------
    def upload(self, local: str | os.PathLike[str], name: str) -> None:
        """Copy a local file to ``name`` in this folder."""
        self._p(name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, self._p(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small file whole."""
        self._p(name).parent.mkdir(parents=True, exist_ok=True)
        self._p(name).write_bytes(data)

    def remove(self, name: str) -> None:
        """Delete ``name`` if it is there."""
        self._p(name).unlink(missing_ok=True)

    def invalidate(self) -> None:
        """Nothing to forget: the operating system keeps no listing stoker could read stale."""

    # -- plumbing -------------------------------------------------------------------------
    def __fspath__(self) -> str:
        return str(self._local)
