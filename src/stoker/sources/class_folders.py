"""Layout 3: one folder per class (numeric names as labels, or names mapped in sorted order)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from stoker.decode import SAMPLE_SUFFIXES
from stoker.errors import ConfigError, DataError, MissingFileError
from stoker.fs import Location, PathOrURL, join, where
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset, Transform
from stoker.sources.index import SampleIndex, Source

__all__ = ["ClassFolderDataset"]

LabelMode = Literal["auto", "numeric", "sorted"]


def _remote_listing(place: Location) -> tuple[list[str], dict[str, list[str]]]:
    """Class folders of a folder at a URL and the sample files under each (one recursive listing)."""
    files: dict[str, list[str]] = {f: [] for f in place.list_dirs() if not f.startswith(".")}
    for rel in place.walk_files():
        folder, _, rest = rel.partition("/")
        if rest and folder in files and os.path.splitext(rest)[1].lower() in SAMPLE_SUFFIXES:
            files[folder].append(rest)
    return sorted(files), files


def _list_files(folder: Path) -> list[str]:
    """Sample files under ``folder`` (recursively), as sorted paths relative to it."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        rel = os.path.relpath(dirpath, folder)
        for name in sorted(filenames):
            if os.path.splitext(name)[1].lower() in SAMPLE_SUFFIXES:
                found.append(name if rel == "." else os.path.join(rel, name))
    return found


class ClassFolderDataset(FileDataset):
    """Images in one folder per class: ``<root>/<class>/<file>``.

    Args:
        root: the folder holding the class folders.
        labels: ``"numeric"`` uses numeric folder names as labels (DigiFace-1M style),
            ``"sorted"`` numbers folder names in sorted order (torchvision ImageFolder
            style), ``"auto"`` picks numeric when every folder name is a number.
        label_offset: added to every label, so two sources can be combined without clashes.
        transform: applied to the uint8 image tensor.
        on_error: ``"raise"`` or ``"skip"`` bad samples (see :class:`FileDataset`).
        allow_empty: allow class folders with no image (their class is kept).
        name: the source name kept in shards and messages (default: the folder name).

    Raises:
        MissingFileError: ``root`` does not exist or has no class folders.
        DataError: a class folder has no images (unless ``allow_empty``).

    Example:
        >>> ds = ClassFolderDataset("digiface", labels="numeric")  # doctest: +SKIP
        >>> image, label = ds[0]  # image: uint8 tensor 3x112x112  # doctest: +SKIP
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
    ) -> None:
        if labels not in ("auto", "numeric", "sorted"):
            raise ConfigError(f"labels must be 'auto', 'numeric' or 'sorted', got {labels!r}")
        place = where(root)
        local = place if isinstance(place, Path) else Path()  # used only when local
        remote_files: dict[str, list[str]] | None = None
        if isinstance(place, Location):  # a bucket: list it once (stoker.fs)
            folders, remote_files = _remote_listing(place)
            if not folders and not place.exists():
                raise MissingFileError(f"{place.url}: folder not found; pass the folder that holds one folder per class")
        else:
            if not local.is_dir():
                raise MissingFileError(f"{local}: folder not found; pass the folder that holds one folder per class")
            folders = sorted(e.name for e in os.scandir(local) if e.is_dir() and not e.name.startswith("."))
        if not folders:
            raise MissingFileError(f"{root}: no class folders found; expected {root}/<class>/<image files>")
        numeric = all(f.isdigit() for f in folders)
        if labels == "numeric" and not numeric:
            bad = next(f for f in folders if not f.isdigit())
            raise ConfigError(f"{root}/{bad}: folder name is not a number; use labels='sorted' for named classes")
        if labels == "numeric" or (labels == "auto" and numeric):
            label_of = {f: int(f) for f in folders}
            classes = [str(i) for i in range(max(label_of.values()) + 1)]
            for f in folders:
                classes[label_of[f]] = f
        else:
            label_of = {f: i for i, f in enumerate(folders)}
            classes = list(folders)
        resolved = place.url if isinstance(place, Location) else str(local.resolve())
        keys, paths, sample_labels, empty = [], [], [], []
        for folder in folders:
            files = remote_files[folder] if remote_files is not None else _list_files(local / folder)
            if not files:
                empty.append(folder)
            for rel in files:
                keys.append(f"{folder}/{rel}")
                paths.append(join(resolved, folder, rel))
                sample_labels.append(label_of[folder])
        if empty and not allow_empty:
            shown = ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else "")
            raise DataError(f"{root}: {len(empty)} class folder(s) hold no images ({shown}); remove them or pass allow_empty=True")
        if not keys:
            raise MissingFileError(f"{root}: no image files found in the class folders")
        index = SampleIndex.build(keys, paths, sample_labels, Source(name or place.name, resolved), classes)
        super().__init__(index.with_label_offset(label_offset), transform, on_error)
