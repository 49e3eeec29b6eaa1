"""Open a data set from a path by looking at what is there.

=================================================  ======================================
what the folder holds                              opened as
=================================================  ======================================
``manifest.json``                                  a shard set (:class:`stoker.shards.ShardDataset`)
``ids.json`` or ``ids.csv``                        :class:`IdDataset` (every partition is a split)
``identity_CelebA.txt``, or a ``*.txt`` file       :class:`LabelFileDataset` (images in ``img/``
beside an ``img/`` folder                          when there is one, else beside the file)
anything else                                      :class:`ClassFolderDataset`
=================================================  ======================================

A path may also name the label file (``*.txt``) or the id file (``*.json``, ``*.csv``)
itself. Partition names ``validation``/``val`` become the split ``valid``.

Example:
    >>> ds = open_source("data/celeba")  # doctest: +SKIP
    >>> both = open_sources(["data/celeba", "data/digiface"])  # labels side by side  # doctest: +SKIP
    >>> splits = open_splits(["data/ids"])  # {"train": ..., "valid": ...}  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stoker.decode import Box
from stoker.errors import ConfigError, MissingFileError
from stoker.loading.skips import OnError
from stoker.sources.class_folders import ClassFolderDataset
from stoker.sources.dataset import FileDataset, Transform
from stoker.sources.ids import IdDataset
from stoker.sources.index import SampleIndex
from stoker.sources.label_file import LabelFileDataset

if TYPE_CHECKING:
    from stoker.shards.dataset import ShardDataset

__all__ = ["Layout", "canonical_split", "detect_layout", "open_source", "open_sources", "open_splits"]

Layout = Literal["shards", "ids", "label_file", "class_folders"]

_MANIFEST = "manifest.json"
_ID_FILES = ("ids.json", "ids.csv")
_CELEBA_LABELS = "identity_CelebA.txt"
_SPLIT_ALIASES = {"validation": "valid", "val": "valid"}


def canonical_split(partition: str) -> str:
    """The split name a partition gets: ``validation`` and ``val`` become ``valid``."""
    return _SPLIT_ALIASES.get(partition, partition)


def detect_layout(path: str | os.PathLike[str]) -> Layout:
    """Which layout ``path`` holds (see the module docs).

    Raises:
        MissingFileError: the path does not exist.
        ConfigError: a file that is neither a label file nor an id file.
    """
    p = Path(path)
    if p.is_file():
        suffix = p.suffix.lower()
        if suffix == ".txt":
            return "label_file"
        if suffix in (".json", ".csv"):
            return "ids"
        raise ConfigError(f"{p}: pass a folder, a '<file> <label>' .txt file, or an ids .json/.csv file")
    if not p.is_dir():
        raise MissingFileError(f"{p}: not found; pass a folder of images, a shard set or a label file")
    if (p / _MANIFEST).is_file():
        return "shards"
    if any((p / name).is_file() for name in _ID_FILES):
        return "ids"
    if (p / _CELEBA_LABELS).is_file() or ((p / "img").is_dir() and any(p.glob("*.txt"))):
        return "label_file"
    return "class_folders"


def _label_file_parts(p: Path, labels: str | os.PathLike[str] | None) -> tuple[Path, Path]:
    """(image folder, label file) of a label-file source."""
    if p.is_file():
        label_file, folder = p, p.parent
    else:
        folder = p
        if labels is not None:
            label_file = Path(labels)
        elif (p / _CELEBA_LABELS).is_file():
            label_file = p / _CELEBA_LABELS
        else:
            found = sorted(p.glob("*.txt"))
            if len(found) != 1:
                shown = ", ".join(f.name for f in found) or "none"
                raise ConfigError(f"{p}: cannot tell which .txt file holds the labels ({shown}); pass labels=FILE (--labels)")
            label_file = found[0]
    images = folder / "img" if (folder / "img").is_dir() else folder
    return images, label_file


def _id_file(p: Path) -> Path:
    if p.is_file():
        return p
    return next(p / name for name in _ID_FILES if (p / name).is_file())


def _partitions(id_file: Path) -> list[str]:
    """Partition names in an id file, in file order (the id readers report malformed files)."""
    try:
        if id_file.suffix.lower() == ".json":
            obj = json.loads(id_file.read_text())
            return [str(k) for k in obj["partition"]]
        with open(id_file, newline="") as f:
            return list(dict.fromkeys(row["split"] for row in csv.DictReader(f)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ["train"]  # let IdDataset raise its own, precise error


def _open_ids(id_file: Path, partition: str, **kwargs: Any) -> IdDataset:
    reader = IdDataset.from_json if id_file.suffix.lower() == ".json" else IdDataset.from_csv
    return reader(id_file, split=partition, **kwargs)


def _with_crop(dataset: FileDataset, crop: Box | None) -> FileDataset:
    if crop is None:
        return dataset
    if len(crop) != 4 or any(int(v) != v or v < 0 for v in crop) or crop[2] <= 0 or crop[3] <= 0:
        raise ConfigError(f"crop must be four integers (top, left, height, width), got {crop!r}")
    box = (int(crop[0]), int(crop[1]), int(crop[2]), int(crop[3]))
    sources = tuple(dataclasses.replace(s, crop=box) for s in dataset.index.sources)
    return FileDataset(dataclasses.replace(dataset.index, sources=sources), dataset.transform, dataset.on_error)


def _file_splits(
    path: str | os.PathLike[str], labels: str | os.PathLike[str] | None, crop: Box | None, name: str | None
) -> dict[str, FileDataset]:
    """Every split of one file source (layouts without partitions have only ``train``)."""
    p = Path(path)
    layout = detect_layout(p)
    source_name = name or (p.parent.name if p.is_file() else p.name) or "data"
    if layout == "shards":
        raise ConfigError(f"{p}: is a shard set; open it with ShardDataset, or pack it alone")
    if layout == "ids":
        id_file = _id_file(p)
        out: dict[str, FileDataset] = {}
        for partition in _partitions(id_file):
            out[canonical_split(partition)] = _open_ids(id_file, partition, name=source_name)
        found = list(out.values())
    elif layout == "label_file":
        images, label_file = _label_file_parts(p, labels)
        found = [LabelFileDataset(images, label_file, name=source_name)]
        out = {"train": found[0]}
    else:
        found = [ClassFolderDataset(p, name=source_name)]
        out = {"train": found[0]}
    return {split: _with_crop(ds, crop) for split, ds in out.items()}


def open_source(
    path: str | os.PathLike[str],
    split: str = "train",
    *,
    labels: str | os.PathLike[str] | None = None,
    crop: Box | None = None,
    name: str | None = None,
    transform: Transform | None = None,
    on_error: OnError = "raise",
) -> FileDataset | ShardDataset:
    """Open the data at ``path``, whatever its layout.

    Args:
        path: a folder (or a label or id file); see the module docs for what is detected.
        split: which split to open (layouts without partitions have only ``"train"``).
        labels: the label file of a label-file folder, when it holds several ``.txt`` files.
        crop: ``(top, left, height, width)`` for every image of the source.
        name: the source name kept in shards (default: the folder name).
        transform, on_error: as for :class:`FileDataset`.

    Returns:
        A :class:`FileDataset`, or a :class:`stoker.shards.ShardDataset` for a shard set.

    Raises:
        ConfigError: no such split, or the layout cannot be told.
        MissingFileError: the path does not exist.
    """
    if detect_layout(path) == "shards":
        from stoker.shards.dataset import ShardDataset

        if crop is not None or labels is not None:
            raise ConfigError(f"{path}: a shard set has its crop and labels already; leave crop and labels out")
        return ShardDataset(path, split, transform, on_error)
    splits = _file_splits(path, labels, crop, name)
    if split not in splits:
        hint = "" if len(splits) > 1 else "; make a validation split with .split(valid=0.1)"
        raise ConfigError(f"{path}: has no split {split!r} (it has: {', '.join(splits)}){hint}")
    chosen = splits[split]
    return FileDataset(chosen.index, transform, on_error)


def _distinct_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    names = [(Path(p).parent.name if Path(p).is_file() else Path(p).name) or "data" for p in paths]
    out = []
    for i, name in enumerate(names):
        out.append(name if names.count(name) == 1 else f"{name}-{i + 1}")
    return out


def open_splits(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    labels: str | os.PathLike[str] | None = None,
    crop: Box | None = None,
) -> dict[str, FileDataset]:
    """Every split of one or more file sources, label spaces laid side by side.

    Each source's labels are shifted past the previous sources' classes, the same way in
    every split, and every split shares one list of class names. Sources get distinct
    names (the folder name, numbered when two folders share one).

    Returns:
        ``{split: FileDataset}``, ``train`` first.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ConfigError("give at least one source")
    if labels is not None and len(paths) > 1:
        raise ConfigError("labels= names the label file of one source; pass a single source with it")
    per_source = [_file_splits(p, labels, crop, n) for p, n in zip(paths, _distinct_names(paths), strict=True)]
    classes: list[str] = []
    offsets: list[int] = []
    for splits in per_source:
        offsets.append(len(classes))
        widest = max((ds.classes for ds in splits.values()), key=len)
        classes.extend(widest)
    names = list(dict.fromkeys(["train", *[s for splits in per_source for s in splits]]))
    out: dict[str, FileDataset] = {}
    for split in names:
        members = [(splits[split], off) for splits, off in zip(per_source, offsets, strict=True) if split in splits]
        if not members:
            continue
        index = SampleIndex.concat([ds.index for ds, _ in members], [off for _, off in members])
        index = dataclasses.replace(index, classes=tuple(classes))
        out[split] = FileDataset(index)
    return out


def open_sources(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    split: str = "train",
    *,
    labels: str | os.PathLike[str] | None = None,
    crop: Box | None = None,
    transform: Transform | None = None,
    on_error: OnError = "raise",
) -> FileDataset | ShardDataset:
    """Open one or more sources as one data set (labels side by side, as :func:`concat`).

    A single shard set opens as a :class:`stoker.shards.ShardDataset`; shard sets cannot
    be combined with other sources.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if len(paths) == 1:
        return open_source(paths[0], split, labels=labels, crop=crop, transform=transform, on_error=on_error)
    if any(detect_layout(p) == "shards" for p in paths):
        raise ConfigError("a shard set cannot be combined with other sources; open it alone")
    splits = open_splits(paths, labels=labels, crop=crop)
    if split not in splits:
        raise ConfigError(f"no source has a split {split!r} (there are: {', '.join(splits)})")
    return FileDataset(splits[split].index, transform, on_error)

