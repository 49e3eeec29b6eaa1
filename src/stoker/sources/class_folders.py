"""Layout 3: one folder per class (numeric names as labels, or names mapped in sorted order)."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Callable
from typing import Literal

from stoker.decode.image import SAMPLE_SUFFIXES
from stoker.errors import ConfigError, DataError, MissingFileError
from stoker.fs import FileKinds, Location, PathOrURL, join, where
from stoker.fs.local import is_within
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset
from stoker.sources.index import SampleIndex, Source, indexing_progress
from stoker.sources.untrusted import check_name_utf8, parse_label
from stoker.types import Transform

__all__ = ["ClassFolderDataset"]

log = logging.getLogger("stoker")

LabelMode = Literal["auto", "numeric", "sorted"]


def _list_files(
    root: Location,
    ignored: Counter[str] | None = None,
    follow_links: bool = False,
    found: Callable[[int], object] | None = None,
) -> tuple[list[str], dict[str, list[str]], tuple[str, ...]]:
    """The class folders of ``root``, the sample files under each (in walk order, relative to it), and followed links.

    One walk of ``root`` (one recursive listing at a URL), and one more per class folder
    that is a symbolic link. Only regular files are data: a FIFO or device named like an
    image is an error, and a symlinked file must resolve to a regular file inside its
    class folder's tree (``root`` is resolved). A class folder that is a link into
    ``root`` is a class folder; one that leads outside is refused, or followed with
    ``follow_links`` (its resolved target is returned, for the read-time check).
    ``found(n)`` is told each listed folder's count (progress).

    Raises:
        DataError: a class folder is a link to a folder outside ``root`` (without ``follow_links``).
    """
    folders: list[str] = []
    files: dict[str, list[str]] = {}
    linked: dict[str, str] = {}  # class folder -> the folder its link resolves to

    def add(folder: str, rel_dir: str, kinds: FileKinds, base: Location, strip: int) -> None:
        """The samples of one listed folder; names are relative to ``base``, less ``strip`` characters in the index."""
        if found is not None:
            found(len(kinds))
        for name in sorted(kinds):
            kind, rel = kinds[name], f"{rel_dir}/{name}" if rel_dir else name
            if kind == "dir":
                continue
            suffix = os.path.splitext(name)[1].lower()
            if suffix not in SAMPLE_SUFFIXES:
                if ignored is not None and not name.startswith("."):
                    ignored[suffix or "(no suffix)"] += 1
                continue
            check_name_utf8(name, base.url_of(rel_dir) if rel_dir else str(base))
            if kind != "file" and base.file_inside(rel, str(base), None) is None:
                continue  # a dangling symlink: not a sample
            files[folder].append(rel[strip:])

    for rel_dir, kinds in root.walk(prune=_hidden_top_folder):
        if not rel_dir:
            folders = sorted(n for n, kind in kinds.items() if kind == "dir" and not n.startswith("."))
            for name in sorted(n for n, kind in kinds.items() if kind == "link" and not n.startswith(".")):
                target = _linked_folder(root, name, follow_links)
                if target is not None:
                    linked[name] = target
            folders = sorted([*folders, *linked])
            files = {f: [] for f in folders}
            continue
        folder = rel_dir.partition("/")[0]
        if folder in files:
            add(folder, rel_dir, kinds, root, len(folder) + 1)
    for folder, target in linked.items():
        place = where(target)
        for rel_dir, kinds in place.walk():
            add(folder, rel_dir, kinds, place, 0)
    outside = tuple(t for t in linked.values() if not is_within(t, str(root)))
    return folders, files, outside


def _linked_folder(root: Location, name: str, follow_links: bool) -> str | None:
    """The resolved folder the link ``root/name`` leads to, if it is a class folder to read; None if it is not a folder.

    Raises:
        DataError: it leads outside ``root`` and ``follow_links`` is off.
    """
    if root.local_path is None:
        return None
    link = root.local_path / name
    target = os.path.realpath(link)
    if not os.path.isdir(target):
        return None  # a link to a file, or dangling: not a class folder (files at the top are not samples)
    if not follow_links and not is_within(target, str(root.local_path)):
        raise DataError(
            f"{link}: the class folder is a symbolic link to {target}, outside the data folder {root.local_path}; "
            "copy the folder in, or open it with stoker.ClassFolderDataset(root, follow_links=True) to read it"
        )
    return target


def _hidden_top_folder(rel_dir: str) -> bool:
    return "/" not in rel_dir and rel_dir.startswith(".")


_DIGITS = re.compile(r"[0-9]+")


class ClassFolderDataset(FileDataset):
    """Images in one folder per class: ``<root>/<class>/<file>``.

    Args:
        root: the folder holding the class folders.
        labels: ``"numeric"`` (folder names are the labels), ``"sorted"`` (names numbered in
            sorted order, as ImageFolder), ``"auto"`` (numeric when every name is a number).
        label_offset: added to every label, so two sources can be combined without clashes.
        transform: applied to the uint8 image tensor.
        on_error: ``"raise"`` or ``"skip"`` bad samples (see :class:`FileDataset`).
        allow_empty: allow class folders with no image (their class is kept).
        name: the source name kept in shards and messages (default: the folder name).
        follow_links: read class folders that link outside ``root`` (refused by default,
            with an error naming them); a file that leads outside is refused when opened.

    Raises:
        MissingFileError: ``root`` does not exist or has no class folders.
        DataError: a class folder is empty (without ``allow_empty``) or links outside (without ``follow_links``).

    Example:
        >>> ds = ClassFolderDataset("data/digiface", labels="numeric")
        >>> image, label = ds[0]
        >>> image.dtype, tuple(image.shape), label
        (torch.uint8, (3, 112, 112), 0)
    """

    def __init__(
        self,
        root: PathOrURL,
        labels: LabelMode = "auto",
        label_offset: int = 0,
        transform: Transform | None = None,
        on_error: OnError = "raise",
        allow_empty: bool = False,
        name: str | None = None,
        follow_links: bool = False,
    ) -> None:
        if labels not in ("auto", "numeric", "sorted"):
            raise ConfigError(f"labels must be 'auto', 'numeric' or 'sorted', got {labels!r}")
        place = where(root)
        if not place.is_dir():
            raise MissingFileError(f"{place}: folder not found; pass the folder that holds one folder per class")
        ignored: Counter[str] = Counter()
        with indexing_progress(str(root)) as bar:
            folders, listed, links = _list_files(place.resolve(), ignored, follow_links, bar.update)
        if not folders:
            raise MissingFileError(f"{root}: no class folders found; expected {root}/<class>/<image files>")
        for f in folders:
            check_name_utf8(f, str(root))
        numeric = all(_DIGITS.fullmatch(f) for f in folders)
        if labels == "numeric" and not numeric:
            bad = next(f for f in folders if not _DIGITS.fullmatch(f))
            raise ConfigError(f"{root}/{bad}: folder name is not a number; use labels='sorted' for named classes")
        if labels == "numeric" or (labels == "auto" and numeric):
            label_of = {f: parse_label(f, f"{root}/{f}") for f in folders}
            classes = [str(i) for i in range(max(label_of.values()) + 1)]
            for f in folders:
                classes[label_of[f]] = f
        else:
            label_of = {f: i for i, f in enumerate(folders)}
            classes = list(folders)
        resolved = str(place.resolve())
        keys, paths, sample_labels, empty = [], [], [], []
        for folder in folders:
            files = listed[folder]
            if not files:
                empty.append(folder)
            prefix = join(resolved, folder)  # once per folder: a join per file was most of the time of 70,000
            for rel in files:
                keys.append(f"{folder}/{rel}")
                paths.append(f"{prefix}/{rel}")
                sample_labels.append(label_of[folder])
        if ignored:  # never silent: say what was left out and why
            shown = ", ".join(f"{count} {suffix}" for suffix, count in ignored.most_common(5))
            log.warning(
                "%s: ignored %d file(s) that are not images stoker reads (%s); readable: %s",
                root, sum(ignored.values()), shown, " ".join(SAMPLE_SUFFIXES),
            )
        if empty and not allow_empty:
            shown = ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else "")
            raise DataError(f"{root}: {len(empty)} class folder(s) hold no images ({shown}); remove them or pass allow_empty=True")
        if not keys:
            raise MissingFileError(f"{root}: no image files found in the class folders")
        index = SampleIndex.build(keys, paths, sample_labels, Source(name or place.name, resolved, links=links), classes)
        super().__init__(index.with_label_offset(label_offset), transform, on_error)
