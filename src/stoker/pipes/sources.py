"""Where a pipe's items come from: an iterable, or the files of a folder.

A source is a generator function of its own arguments. Sources are read again on each
iteration of the pipe, so they must be re-iterable: a list, a range, a folder.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator, Sequence, Sized
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from stoker.errors import ConfigError, MissingFileError
from stoker.fs import where
from stoker.pipes.compose import Step

__all__ = ["iterable_step", "iterate", "list_files", "list_files_step", "matching_files"]

T = TypeVar("T")


def iterate(iterable: Iterable[T]) -> Iterator[T]:
    """The ``from_iterable`` source: yield the items of ``iterable``."""
    yield from iterable


def iterable_step(iterable: Iterable[Any]) -> Step:
    """Check the argument of ``Pipe.from_iterable`` and make its step.

    Raises:
        ConfigError: ``iterable`` is not iterable, or is a one-shot iterator (a generator,
            a file object), which a second epoch would find empty.
    """
    if not isinstance(iterable, Iterable):
        raise ConfigError(f"from_iterable: expected an iterable, got {type(iterable).__name__}")
    if isinstance(iterable, Iterator):
        raise ConfigError(
            f"from_iterable: got a one-shot iterator ({type(iterable).__name__}) that a second epoch would "
            "find empty; pass a collection (list(...), a range) or an object whose __iter__ starts afresh"
        )
    length = partial(len, cast(Sized, iterable)) if hasattr(iterable, "__len__") else None
    return Step("from_iterable", iterate, (iterable,), length=length)


def matching_files(folder: str, masks: Sequence[str], recursive: bool) -> Iterator[str]:
    """Yield the files of ``folder`` whose name matches one of ``masks``, in name order,
    then (``recursive``) those of each subfolder in name order, depth first.

    The order is fixed by the names alone, and only one folder is held in memory at a
    time. Symbolic links to folders are not followed (they could loop). A URL
    (``s3://bucket/images``) is listed through fsspec, in the same order.
    """
    place = where(folder)
    listing = place.walk() if recursive else iter([("", place.kinds())])
    for rel_dir, kinds in listing:
        here = place.child(rel_dir) if rel_dir else place
        for name in sorted(kinds):
            kind = kinds[name]  # a link counts when it leads to a file (links to folders are not walked)
            if (kind == "file" or (kind == "link" and here.is_file(name))) and any(fnmatch.fnmatch(name, m) for m in masks):
                yield here.url_of(name)


def _is_folder(root: str) -> bool:
    return where(root).is_dir()


def _no_files_error(root: str | Path, masks: Sequence[str], recursive: bool) -> MissingFileError:
    where = "in or below" if recursive else "in"
    also = "" if recursive else ", or pass recursive=True to look in subfolders"
    return MissingFileError(
        f"{root}: no files matching {list(masks)} {where} this folder; check the folder and the masks{also}"
    )


def list_files(root: str, masks: tuple[str, ...], recursive: bool) -> Iterator[str]:
    """The ``list_files`` source: yield the matching file paths in a fixed order
    (see :func:`matching_files`).

    Raises:
        MissingFileError: the folder is gone or holds no matching file.
    """
    if not _is_folder(root):
        raise MissingFileError(f"{root}: folder not found; check the path (it is read on every epoch)")
    found = False
    for path in matching_files(root, masks, recursive):
        found = True
        yield path
    if not found:
        raise _no_files_error(root, masks, recursive)


def list_files_step(root: str | os.PathLike[str], masks: str | Sequence[str] = "*", recursive: bool = False) -> Step:
    """Check the arguments of ``Pipe.list_files`` and make its step.

    The folder must exist and hold a matching file now; the listing itself is done
    each time the pipe is iterated, in the same order each time.

    Raises:
        ConfigError: ``masks`` is empty or not made of strings.
        MissingFileError: the folder does not exist or holds no matching file.
    """
    mask_tuple = (masks,) if isinstance(masks, str) else tuple(masks)
    if not mask_tuple or not all(isinstance(mask, str) for mask in mask_tuple):
        raise ConfigError(f"list_files: masks must be a glob pattern or a list of them, like '*.jpg'; got {masks!r}")
    place = where(root)
    folder = str(place)
    if not _is_folder(folder):
        what = "is a file, not a folder" if place.exists() else "folder not found"
        raise MissingFileError(f"{folder}: {what}; pass the folder that holds the files")
    if next(matching_files(folder, mask_tuple, recursive), None) is None:
        raise _no_files_error(folder, mask_tuple, recursive)
    return Step("list_files", list_files, (folder, mask_tuple, bool(recursive)))
