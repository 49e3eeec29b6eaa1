"""Layout 1: ids + partition + labels, one file per id (``<root>/<id>.pt|.npy|.png|.jpg``)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.decode import SAMPLE_SUFFIXES
from stoker.errors import ConfigError, DataError, LabelError, MissingFileError
from stoker.fs import Location, PathOrURL, is_url, join, parent, read_text
from stoker.fs import where as locate
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset, Transform
from stoker.sources.index import SampleIndex, Source

__all__ = ["IdDataset"]


def _entry_names(root: Path | Location) -> list[str]:
    """The file names directly in ``root`` (one directory scan, or one listing of a bucket)."""
    if isinstance(root, Location):
        names = list(root.sizes())
        if not names and not root.exists():
            raise MissingFileError(f"{root.url}: data folder not found; pass the folder that holds the <id> files as root")
        return names
    if not root.is_dir():
        raise MissingFileError(f"{root}: data folder not found; pass the folder that holds the <id> files as root")
    with os.scandir(root) as entries:
        return [entry.name for entry in entries]


def _files_by_stem(root: Path | Location, suffixes: Sequence[str]) -> dict[str, str]:
    """Map each file stem under ``root`` to its file name (one directory scan)."""
    found: dict[str, str] = {}
    for entry in _entry_names(root):
        stem, suffix = os.path.splitext(entry)
        if suffix.lower() in suffixes:
            if stem in found:
                raise DataError(f"{root}: id {stem!r} has two files ({found[stem]}, {entry}); keep one of them")
            found[stem] = entry
    return found


class IdDataset(FileDataset):
    """Samples named by id: ``partition = {"train": [ids], "validation": [ids]}``, ``labels = {id: int}``.

    Each id is one file in ``root`` named ``<id>.pt`` (a tensor, loaded with
    ``weights_only=True``), ``<id>.npy``, ``<id>.png`` or ``<id>.jpg``.

    Args:
        root: the folder holding the files.
        partition: split name to list of ids.
        labels: id to integer label (``>= 0``).
        split: which split of ``partition`` to load.
        transform: applied to the uint8 image tensor.
        on_error: ``"raise"`` or ``"skip"`` bad samples (see :class:`FileDataset`).
        name: the source name kept in shards and messages.

    Raises:
        ConfigError: ``split`` is not in ``partition``.
        LabelError: an id has no label, a label is not a non-negative integer, or an id is listed twice.
        MissingFileError: an id has no file in ``root``.

    Example:
        >>> ds = IdDataset.from_json("ids/ids.json", split="train")  # doctest: +SKIP
        >>> image, label = ds[0]  # doctest: +SKIP
    """

    def __init__(
        self,
        root: PathOrURL,
        partition: Mapping[str, Sequence[str]],
        labels: Mapping[str, Any],
        split: str = "train",
        transform: Transform | None = None,
        on_error: OnError = "raise",
        name: str = "ids",
        where: str = "labels",
    ) -> None:
        place = locate(root)  # a folder or a URL
        if split not in partition:
            raise ConfigError(f"split {split!r} is not in the partition; it has: {', '.join(sorted(partition))}")
        ids = [str(i) for i in partition[split]]
        _check_partition(partition, where)
        int_labels = {str(k): _as_label(v, f"{where}: id {k!r}") for k, v in labels.items()}
        files = _files_by_stem(place, SAMPLE_SUFFIXES)
        resolved = place.url if isinstance(place, Location) else str(place.resolve())
        paths, sample_labels = [], []
        for sample_id in ids:
            if sample_id not in int_labels:
                raise LabelError(f"{where}: id {sample_id!r} (split {split!r}) has no label; add it to the labels")
            if sample_id not in files:
                raise MissingFileError(
                    f"{resolved}: no file for id {sample_id!r} (looked for {sample_id}{{{','.join(SAMPLE_SUFFIXES)}}}); "
                    "add the file or remove the id from the partition"
                )
            paths.append(join(resolved, files[sample_id]))
            sample_labels.append(int_labels[sample_id])
        num_classes = max(int_labels.values(), default=-1) + 1  # all splits agree on the class count
        index = SampleIndex.build(
            ids, paths, sample_labels, Source(name, resolved), classes=[str(i) for i in range(num_classes)]
        )
        super().__init__(index, transform, on_error)
        self.split_name = split

    @classmethod
    def from_json(
        cls, path: PathOrURL, root: PathOrURL | None = None, split: str = "train", **kwargs: Any
    ) -> IdDataset:
        """Load from a JSON file ``{"partition": {...}, "labels": {...}}``.

        ``root`` defaults to the ``data`` folder beside the JSON file, or the JSON file's
        own folder when there is no ``data`` folder.
        """
        path = _as_path(path)
        try:
            text = read_text(path)
        except FileNotFoundError:
            raise MissingFileError(f"{path}: id file not found") from None
        try:
            obj = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicate_keys(pairs, path))
        except json.JSONDecodeError as exc:
            raise LabelError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("partition"), dict) or not isinstance(obj.get("labels"), dict):
            raise LabelError(f'{path}: expected an object {{"partition": {{split: [ids]}}, "labels": {{id: label}}}}')
        return cls(_default_root(path, root), obj["partition"], obj["labels"], split, where=str(path), **kwargs)

    @classmethod
    def from_csv(
        cls, path: PathOrURL, root: PathOrURL | None = None, split: str = "train", **kwargs: Any
    ) -> IdDataset:
        """Load from a CSV file with header ``id,label,split`` (one row per id)."""
        path = _as_path(path)
        partition: dict[str, list[str]] = {}
        labels: dict[str, Any] = {}
        try:
            with io.StringIO(read_text(path), newline="") as f:
                reader = csv.DictReader(f)
                missing = {"id", "label", "split"} - set(reader.fieldnames or [])
                if missing:
                    raise LabelError(f"{path}:1: header must name the columns id,label,split (missing {sorted(missing)})")
                for row in reader:
                    line = reader.line_num
                    sample_id, label, part = row["id"], row["label"], row["split"]
                    if not sample_id or label is None or part is None or label == "":
                        raise LabelError(f"{path}:{line}: expected id,label,split, got {row}")
                    if sample_id in labels:
                        raise LabelError(f"{path}:{line}: id {sample_id!r} appears twice; keep one row per id")
                    labels[sample_id] = _as_label(label, f"{path}:{line}")
                    partition.setdefault(part, []).append(sample_id)
        except FileNotFoundError:
            raise MissingFileError(f"{path}: id file not found") from None
        return cls(_default_root(path, root), partition, labels, split, where=str(path), **kwargs)


def _as_path(path: PathOrURL) -> Path | str:
    """A local path as a Path; a URL stays a string (pathlib would eat its ``//``)."""
    place = locate(path)
    return place.url if isinstance(place, Location) else place


def _default_root(path: Path | str, root: PathOrURL | None) -> PathOrURL:
    if root is not None:
        return root if isinstance(root, Location) or (isinstance(root, str) and is_url(root)) else Path(root)
    if isinstance(path, str):  # a URL
        folder = parent(path)
        return join(folder, "data") if Location(join(folder, "data")).is_dir() else folder
    return path.parent / "data" if (path.parent / "data").is_dir() else path.parent


def _no_duplicate_keys(pairs: list[tuple[str, Any]], path: Path | str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LabelError(f"{path}: key {key!r} appears twice; keep one entry per id")
        seen[key] = value
    return seen


def _as_label(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise LabelError(f"{where}: label {value!r} is not an integer")
    try:
        label = int(value)
    except (TypeError, ValueError):
        raise LabelError(f"{where}: label {value!r} is not an integer; labels must be integers >= 0") from None
    if label != value and str(label) != str(value).strip():
        raise LabelError(f"{where}: label {value!r} is not an integer; labels must be integers >= 0")
    if label < 0:
        raise LabelError(f"{where}: label {label} is negative; labels must be integers >= 0")
    return label


def _check_partition(partition: Mapping[str, Sequence[str]], where: str) -> None:
    owner: dict[str, str] = {}
    for part, ids in partition.items():
        for sample_id in ids:
            sample_id = str(sample_id)
            if sample_id in owner:
                place = "twice in" if owner[sample_id] == part else f"in both {owner[sample_id]!r} and"
                raise LabelError(f"{where}: id {sample_id!r} is listed {place} split {part!r}; list each id once")
            owner[sample_id] = part
