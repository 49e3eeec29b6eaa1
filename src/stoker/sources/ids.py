"""Layout 1: ids + partition + labels, one file per id (``<root>/<id>.pt|.npy|.png|.jpg``)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from stoker.decode.image import SAMPLE_SUFFIXES
from stoker.errors import ConfigError, DataError, LabelError, MissingFileError
from stoker.fs import FileKinds, Location, PathOrURL
from stoker.fs import where as locate
from stoker.loading.skips import OnError
from stoker.sources.dataset import FileDataset
from stoker.sources.index import SampleIndex, Source
from stoker.sources.untrusted import check_name_utf8, parse_label, read_text_file
from stoker.types import Transform

__all__ = ["IdDataset"]


def _files_by_stem(root: Location, suffixes: Sequence[str]) -> tuple[dict[str, str], FileKinds]:
    """Map each file stem under ``root`` to its file name (one listing), and what each entry is."""
    if not root.is_dir():
        raise MissingFileError(f"{root}: data folder not found; pass the folder that holds the <id> files as root")
    kinds = root.kinds()
    names = sorted(n for n, kind in kinds.items() if kind != "dir")
    found: dict[str, str] = {}
    for name in names:
        stem, suffix = os.path.splitext(name)
        if suffix.lower() in suffixes:
            if stem in found:
                raise DataError(f"{root}: id {stem!r} has two files ({found[stem]}, {name}); keep one of them")
            found[stem] = name
    return found, kinds


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
        >>> ds = IdDataset.from_json("data/ids/ids.json", split="train")
        >>> image, label = ds[0]
        >>> image.dtype, image.shape[0]
        (torch.uint8, 3)
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
        place = locate(root).resolve()  # a folder (links resolved) or a URL
        if split not in partition:
            raise ConfigError(f"split {split!r} is not in the partition; it has: {', '.join(sorted(partition))}")
        _check_partition(partition, where)
        ids = [str(i) for i in partition[split]]
        int_labels = {str(k): parse_label(v, f"{where}: id {k!r}") for k, v in labels.items()}
        files, kinds = _files_by_stem(place, SAMPLE_SUFFIXES)
        resolved = str(place)
        paths, sample_labels = [], []
        for sample_id in ids:
            if sample_id not in int_labels:
                raise LabelError(f"{where}: id {sample_id!r} (split {split!r}) has no label; add it to the labels")
            if sample_id not in files:
                raise MissingFileError(
                    f"{resolved}: no file for id {sample_id!r} (looked for {sample_id}{{{','.join(SAMPLE_SUFFIXES)}}}); "
                    "add the file or remove the id from the partition"
                )
            check_name_utf8(files[sample_id], resolved)
            found = place.file_inside(files[sample_id], f"{where}: id {sample_id!r}", kinds)
            if found is None:  # a dangling symlink
                raise MissingFileError(f"{place.url_of(files[sample_id])}: the file of id {sample_id!r} does not exist")
            paths.append(found)
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
        text = read_text_file(path, "id file", '{"partition": {split: [ids]}, "labels": {id: label}}')
        try:
            obj = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicate_keys(pairs, path))
        except json.JSONDecodeError as exc:
            raise LabelError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise LabelError(f"{path}: JSON nested too deeply; expected {{\"partition\": ..., \"labels\": ...}}") from None
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
        text = read_text_file(path, "id file", "a CSV with header id,label,split")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
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
                labels[sample_id] = parse_label(label, f"{path}:{line}")
                partition.setdefault(part, []).append(sample_id)
        except csv.Error as exc:
            raise LabelError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
        return cls(_default_root(path, root), partition, labels, split, where=str(path), **kwargs)


def _as_path(path: PathOrURL) -> Location:
    """The id file's location (a URL stays a URL: pathlib would eat its ``//``)."""
    return locate(path)


def _default_root(path: Location, root: PathOrURL | None) -> Location:
    if root is not None:
        return locate(root)
    data = path.parent / "data"
    return data if data.is_dir() else path.parent


def _no_duplicate_keys(pairs: list[tuple[str, Any]], path: Location) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LabelError(f"{path}: key {key!r} appears twice; keep one entry per id")
        seen[key] = value
    return seen


def _check_partition(partition: Mapping[str, Sequence[str]], where: str) -> None:
    owner: dict[str, str] = {}
    for part, ids in partition.items():
        if not isinstance(ids, (list, tuple)):
            raise LabelError(f"{where}: split {part!r} must be a list of ids, got {type(ids).__name__} {_shown(ids)}")
        for sample_id in ids:
            if isinstance(sample_id, bool) or not isinstance(sample_id, (str, int)):
                raise LabelError(f"{where}: split {part!r} lists {_shown(sample_id)}; ids must be strings or integers")
            sample_id = str(sample_id)
            if not sample_id or "/" in sample_id or "\\" in sample_id or sample_id in (".", ".."):
                raise LabelError(f"{where}: id {sample_id!r} (split {part!r}) is not a plain file name; ids name files in the data folder")
            if sample_id in owner:
                place = "twice in" if owner[sample_id] == part else f"in both {owner[sample_id]!r} and"
                raise LabelError(f"{where}: id {sample_id!r} is listed {place} split {part!r}; list each id once")
            owner[sample_id] = part


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
