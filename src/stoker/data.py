"""One way in: ``open_data`` opens whatever a path holds, for every command and the library.

Every caller — ``stoker train``, ``pack``, ``bench``, ``tune``, ``inspect``, the demo and
user code — opens data here, so layout detection, split folders, validation splits and
(later) URLs are decided once. This module sits above :mod:`stoker.sources` and
:mod:`stoker.shards`; neither of those imports it.

The layout is detected from what the folder holds: ``manifest.json`` (a shard set),
``ids.json``/``ids.csv`` (ids + partitions), a label file beside ``img/``, split folders
(``train``, ``val``/``valid``/``validation``, ``test``), else class folders; the table is
in the guide, ``docs/guides/opening-data.md``.

A path may also name the label file (``*.txt``) or the id file (``*.json``, ``*.csv``)
itself. Split names ``validation`` and ``val`` become ``valid``. Several paths are laid
side by side: each source's labels are shifted past the previous sources' classes, the
same way in every split.

Example:
    >>> data = open_data("data/digiface", valid=0.1)
    >>> len(data["train"]), len(data["valid"]), data.num_classes
    (36, 4, 4)
    >>> train = open_data(["data/celeba", "data/digiface"], "train", image_size=112)
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker.decode.image import Box, resize
from stoker.errors import ConfigError, DataError, LabelError, MissingFileError, NetworkError
from stoker.fs import PATH_OR_URL_TYPES, Location, PathOrURL, where
from stoker.fs.near import did_you_mean
from stoker.loading.skips import OnError, check_on_error
from stoker.shards.cache.manifests import has_cached
from stoker.shards.format.manifest import Manifest
from stoker.shards.read.dataset import ShardDataset
from stoker.sources.class_folders import ClassFolderDataset
from stoker.sources.dataset import FileDataset
from stoker.sources.ids import IdDataset
from stoker.sources.index import SampleIndex
from stoker.sources.label_file import LabelFileDataset
from stoker.sources.splitting import stratified_split
from stoker.types import Transform

log = logging.getLogger("stoker")

__all__ = ["SPLIT_NAMES", "DataSplits", "LabelOrder", "Layout", "canonical_split", "detect_layout", "open_data"]

Where = Location  # a local path, or a folder or file at a URL (stoker.fs)
Paths = PathOrURL | Sequence[PathOrURL]
# {split: paths}: each split from its own sources, one label mapping for all (matched by class name).
SplitPaths = Mapping[str, Paths]
Layout = Literal["shards", "ids", "label_file", "split_folders", "class_folders"]

MANIFEST_FILE = "manifest.json"
_ID_FILES = ("ids.json", "ids.csv")
_CELEBA_LABELS = "identity_CelebA.txt"
# Folder or partition name -> split name. ImageFolder trees use train/val(/test).
SPLIT_NAMES: dict[str, str] = {"train": "train", "valid": "valid", "val": "valid", "validation": "valid", "test": "test"}


def canonical_split(name: str) -> str:
    """The split a partition or folder name means: ``validation`` and ``val`` become ``valid``."""
    return SPLIT_NAMES.get(name.lower(), name)


# -- what a path holds ------------------------------------------------------------------


def _subfolders(p: Where) -> list[str]:
    return [name for name in p.list_dirs() if not name.startswith(".")]


def _split_folders(p: Where) -> dict[str, Where] | None:
    """``{split: folder}`` when ``p`` is a tree of split folders, ``None`` when it is not one.

    Raises:
        ConfigError: the folder mixes split folders with other folders, or two folders
            mean the same split (``val`` and ``valid``).
    """
    folders = _subfolders(p)
    named = [f for f in folders if f.lower() in SPLIT_NAMES]
    # A split folder holds folders (classes) or a layout file; a class named "train"
    # holds images. Only the first kind makes a tree of splits.
    splits = [f for f in named if _subfolders(p / f) or any((p / f / n).is_file() for n in (*_ID_FILES, _CELEBA_LABELS))]
    if not splits:
        return None
    others = [f for f in folders if f not in splits]
    if others:
        raise ConfigError(
            f"{p}: ambiguous layout: split folders ({', '.join(splits)}) beside other folders "
            f"({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}). Pass the split folders themselves "
            f"(--data {p / splits[0]} and --valid {p / (splits[1] if len(splits) > 1 else splits[0])}), "
            "or move the other folders out"
        )
    found: dict[str, Where] = {}
    for f in splits:
        split = canonical_split(f)
        if split in found:
            raise ConfigError(f"{p}: both {found[split].name}/ and {f}/ mean the split {split!r}; keep one")
        found[split] = p / f
        _keep_inside(p, found[split])
    return found


def detect_layout(path: PathOrURL) -> Layout:
    """Which layout ``path`` holds (see the module docs).

    Raises:
        MissingFileError: the path does not exist.
        ConfigError: a file that is neither a label file nor an id file; a folder whose
            layout is ambiguous (the message says what was found and what to pass).
    """
    p = where(path)  # a local path or a URL: the same questions (stoker.fs)
    try:
        is_file = p.is_file()
    except NetworkError as exc:  # the store is unreachable: a shard set whose manifest is cached still opens, offline
        if exc.unreachable and has_cached(p.url):
            return "shards"
        raise
    if is_file:
        suffix = p.suffix.lower()
        if suffix == ".txt":
            return "label_file"
        if suffix in (".json", ".csv"):
            return "ids"
        raise ConfigError(f"{p}: pass a folder, a '<file> <label>' .txt file, or an ids .json/.csv file")
    if not p.is_dir():
        hint = did_you_mean(str(p)) if p.is_local else ""
        raise MissingFileError(f"{p}: not found; pass a folder of images, a shard set or a label file{hint}")
    if (p / MANIFEST_FILE).is_file():
        return "shards"
    if any((p / name).is_file() for name in _ID_FILES):
        return "ids"
    if (p / _CELEBA_LABELS).is_file() or ((p / "img").is_dir() and any(p.glob("*.txt"))):
        return "label_file"
    if _split_folders(p) is not None:
        return "split_folders"
    return "class_folders"


# -- opening one source -----------------------------------------------------------------


def _label_file_parts(p: Where, labels: PathOrURL | None) -> tuple[Where, Where]:
    """(image folder, label file) of a label-file source."""
    if p.is_file():
        label_file, folder = p, p.parent
    else:
        folder = p
        if labels is not None:
            label_file = where(labels)
        elif (p / _CELEBA_LABELS).is_file():
            label_file = p / _CELEBA_LABELS
        else:
            found: list[Any] = sorted(p.glob("*.txt"), key=str)
            if len(found) != 1:
                shown = ", ".join(f.name for f in found) or "none"
                raise ConfigError(f"{p}: cannot tell which .txt file holds the labels ({shown}); pass labels=FILE (--labels)")
            label_file = found[0]
    images = folder / "img" if (folder / "img").is_dir() else folder
    if labels is None:  # what the folder itself names must stay inside it (a stranger's data)
        _keep_inside(folder, images)
        _keep_inside(folder, label_file)
    return images, label_file


def _keep_inside(root: Where, path: Where) -> None:
    """A path stoker found under ``root`` (``img/``, a label or id file, a split folder) must resolve inside it.

    Raises:
        LabelError: a symbolic link leads outside the data folder.
    """
    if not root.contains(path):
        target = path.resolve()
        raise LabelError(
            f"{path}: leads outside the data folder {root} (to {target}); stoker reads only what is inside "
            "the folder it is given. Replace the link by the files, or pass the target folder itself"
        )


def _id_partitions(id_file: Where) -> list[str]:
    """Partition names in an id file, in file order (the id readers report malformed files)."""
    try:
        text = id_file.read_text(encoding="utf-8-sig")
        if id_file.suffix.lower() == ".json":
            obj = json.loads(text)
            return [str(k) for k in obj["partition"]]
        with io.StringIO(text, newline="") as f:
            return list(dict.fromkeys(row["split"] for row in csv.DictReader(f)))
    except (OSError, DataError, ValueError, KeyError, TypeError, AttributeError):
        return ["train"]  # let IdDataset raise its own, precise error


def _with_crop(dataset: FileDataset, crop: Box | None) -> FileDataset:
    if crop is None:
        return dataset
    if len(crop) != 4 or any(isinstance(v, bool) or int(v) != v or v < 0 for v in crop) or crop[2] <= 0 or crop[3] <= 0:
        raise ConfigError(
            f"crop must be four whole numbers (top, left, height, width) in pixels: top and left from 0, height and "
            f"width from 1; got {crop!r}"
        )
    box = (int(crop[0]), int(crop[1]), int(crop[2]), int(crop[3]))
    sources = tuple(dataclasses.replace(s, crop=box) for s in dataset.index.sources)
    return FileDataset(dataclasses.replace(dataset.index, sources=sources))


def _relabel(index: SampleIndex, classes: Sequence[str]) -> SampleIndex:
    """The index with labels renumbered to positions in ``classes`` (matched by name)."""
    position = {name: i for i, name in enumerate(classes)}
    mapping = [position.get(name, -1) for name in index.classes]  # -1: a class no sample has
    labels = np.asarray(mapping, dtype=np.int64)[index.labels] if len(index.labels) else index.labels
    return dataclasses.replace(index, labels=labels, classes=tuple(classes))


def _common_classes(indices: Sequence[SampleIndex]) -> list[str]:
    """One class list for split folders: numeric names keep their number, others sorted."""
    names = {name for index in indices for name in index.classes}
    if names and all(name.isdigit() for name in names):
        top = max(int(name) for name in names)
        return [str(i) for i in range(top + 1)]
    return sorted(names)


LabelOrder = Literal["auto", "sorted"]


def _file_splits(
    p: Where, layout: Layout, labels: PathOrURL | None, crop: Box | None, name: str, label_order: LabelOrder = "auto"
) -> dict[str, FileDataset]:
    """Every split of one file source (layouts without splits have only ``train``)."""
    if layout == "ids":
        id_file = p if p.is_file() else next(p / n for n in _ID_FILES if (p / n).is_file())
        if id_file is not p:
            _keep_inside(p, id_file)
        reader = IdDataset.from_json if id_file.suffix.lower() == ".json" else IdDataset.from_csv
        out: dict[str, FileDataset] = {}
        for partition in _id_partitions(id_file):
            split = canonical_split(partition)
            if split in out:
                raise ConfigError(f"{id_file}: partitions {partition!r} and another both mean the split {split!r}; rename one")
            out[split] = reader(id_file, split=partition, name=name)
    elif layout == "label_file":
        images, label_file = _label_file_parts(p, labels)
        out = {"train": LabelFileDataset(images, label_file, name=name)}
    elif layout == "split_folders":
        folders = _split_folders(p) or {}
        parts = {
            # Each split folder is its own source (root/train, root/val): packing several splits keeps them apart.
            split: _file_splits(folder, _inner_layout(folder), labels, None, f"{name}/{folder.name}", label_order)["train"]
            for split, folder in folders.items()
        }
        classes = _common_classes([ds.index for ds in parts.values()])
        out = {split: FileDataset(_relabel(ds.index, classes)) for split, ds in parts.items()}
    else:
        out = {"train": ClassFolderDataset(p, labels=label_order, name=name)}
    if label_order == "sorted" and layout in ("ids", "label_file"):
        out = _compact(out)
    return {split: _with_crop(ds, crop) for split, ds in out.items()}


def _compact(splits: Mapping[str, FileDataset]) -> dict[str, FileDataset]:
    """Number the labels that occur (in any split) 0..K-1 in sorted order: no empty classes."""
    first = next(iter(splits.values())).index
    used = sorted({int(label) for ds in splits.values() for label in np.unique(ds.index.labels)})
    keep = [first.classes[label] for label in used]
    return {split: FileDataset(_relabel(ds.index, keep)) for split, ds in splits.items()}


def _inner_layout(folder: Where) -> Layout:
    layout = detect_layout(folder)
    if layout in ("shards", "split_folders"):
        raise ConfigError(f"{folder}: a split folder must hold images (class folders, a label file or ids), not {layout}")
    return layout


def _source_names(paths: Sequence[Where]) -> list[str]:
    names = [(p.parent.name if p.is_file() else p.name) or "data" for p in paths]
    return [n if names.count(n) == 1 else f"{n}-{i + 1}" for i, n in enumerate(names)]


def _side_by_side(per_source: Sequence[Mapping[str, FileDataset]]) -> tuple[dict[str, FileDataset], tuple[str, ...]]:
    """Lay the sources' label spaces side by side, the same offsets in every split."""
    classes: list[str] = []
    offsets: list[int] = []
    for splits in per_source:
        offsets.append(len(classes))
        widest: tuple[str, ...] = max((ds.classes for ds in splits.values()), key=len)
        classes.extend(widest)
    names = list(dict.fromkeys(["train", "valid", *[s for splits in per_source for s in splits]]))
    out: dict[str, FileDataset] = {}
    for split in names:
        members = [(splits[split], off) for splits, off in zip(per_source, offsets, strict=True) if split in splits]
        if members:
            index = SampleIndex.concat([ds.index for ds, _ in members], [off for _, off in members])
            out[split] = FileDataset(dataclasses.replace(index, classes=tuple(classes)))
    return out, tuple(classes)


# -- the result -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class DataSplits(Mapping[str, Dataset]):
    """The splits of the data at some paths, with one label space; what :func:`open_data` returns.

    A read-only mapping ``{split: data set}`` (``train`` first, then ``valid``). Each data
    set is a stoker data set as the layout gives it — a :class:`FileDataset` or a
    :class:`ShardDataset` (or a view of one) — so its ``loader_defaults`` and
    ``collate_fn`` reach :func:`stoker.make_loader` intact.

    Attributes:
        datasets: the splits.
        classes: class names; ``classes[label]`` names a label, the same in every split.
        opened: ``(path, layout)`` of every source, in order.
        held_out: the validation split was cut from ``train`` (``valid=``), not found.
    """

    datasets: Mapping[str, Dataset]
    classes: tuple[str, ...]
    opened: tuple[tuple[str, str], ...]
    held_out: bool = False

    def __getitem__(self, split: str) -> Dataset:
        try:
            return self.datasets[split]
        except KeyError:
            hint = ("; hold out a share of train: `stoker train --valid-share 0.1`, `stoker pack ... --split valid=0.1`, "
                    "or open_data(..., valid=0.1)") if split == "valid" else ""
            raise ConfigError(f"{self.where()}: has no split {split!r} (it has: {', '.join(self.datasets)}){hint}") from None

    def __contains__(self, split: object) -> bool:
        return split in self.datasets  # not Mapping's: __getitem__ raises ConfigError for a missing split

    def __iter__(self) -> Iterator[str]:
        return iter(self.datasets)

    def __len__(self) -> int:
        return len(self.datasets)

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    @property
    def is_shards(self) -> bool:
        """The data is a packed shard set."""
        return any(layout == "shards" for _, layout in self.opened)

    @functools.cached_property
    def empty_classes(self) -> list[int]:
        """Labels that no sample of any split has (a model still gets an output for each)."""
        seen = np.zeros(self.num_classes, dtype=bool)
        for dataset in self.datasets.values():
            labels = getattr(dataset, "labels", None)
            if labels is None:
                return []
            seen[np.unique(np.asarray(labels))] = True
        return np.flatnonzero(~seen).tolist()

    def where(self) -> str:
        """The paths, for messages."""
        return ", ".join(path for path, _ in self.opened)

    def describe(self) -> str:
        """One line: what was opened and how many samples each split has."""
        kinds = ", ".join(f"{path} ({layout})" for path, layout in self.opened)
        counts = " / ".join(f"{len(ds)} {split}" for split, ds in self.datasets.items())  # type: ignore[arg-type]
        held = f" (valid: {len(self.datasets['valid'])} held out of train)" if self.held_out else ""  # type: ignore[arg-type]
        return f"{kinds}: {counts} samples, {self.num_classes} classes{held}"


# -- open_data --------------------------------------------------------------------------


def _transform(image_size: int | tuple[int, int] | None, transform: Transform | None) -> Transform | None:
    if image_size is None:
        return transform
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size):
        raise ConfigError(f"image_size must be a positive integer or (height, width), got {image_size!r}")
    sized = functools.partial(resize, size=size)
    return sized if transform is None else _Then(sized, transform)


@dataclasses.dataclass(frozen=True)
class _Then:
    """``second(first(x))``: a resize, then the user's transform (picklable for workers)."""

    first: Transform
    second: Transform

    def __call__(self, image: torch.Tensor) -> Any:
        return self.second(self.first(image))


def _open_shards(root: Where, image_size: Any, transform: Transform | None, on_error: OnError) -> dict[str, ShardDataset]:
    manifest = Manifest.load(root)
    size = (image_size, image_size) if isinstance(image_size, int) else (tuple(image_size) if image_size else None)
    # Resize only what the shard set does not already store at this size.
    chosen = transform if size is not None and manifest.image_size == size else _transform(image_size, transform)
    order = [s for s in ("train", "valid") if s in manifest.splits] + [s for s in manifest.splits if s not in ("train", "valid")]
    return {split: ShardDataset(root, split, chosen, on_error) for split in order}


def _apply(ds: FileDataset, transform: Transform | None, on_error: OnError) -> FileDataset:
    return FileDataset(ds.index, transform, on_error)


def _as_paths(paths: PathOrURL | Sequence[PathOrURL] | None, what: str) -> list[Where]:
    if paths is None:
        return []
    items = [paths] if isinstance(paths, PATH_OR_URL_TYPES) else list(paths)
    # A URL (s3://, gs://, memory://, ...) becomes a RemoteLocation, never a Path: pathlib would
    # turn "s3://b/x" into a local folder "s3:/b/x". file:// URLs are local paths.
    out = [where(item) for item in items]
    if not out and what == "paths":
        raise ConfigError("give at least one data path (a folder, a label file, an ids file or a shard set)")
    return out


def _open_sources(
    paths: Sequence[Where], labels: PathOrURL | None, crop: Box | None, label_order: LabelOrder = "auto"
) -> tuple[dict[str, Dataset], tuple[str, ...], list[tuple[str, str]], bool]:
    """Open the sources at ``paths`` (no transforms yet): splits, classes, what was opened, is a shard set."""
    layouts = [detect_layout(p) for p in paths]
    opened: list[tuple[str, str]] = [(str(p), layout) for p, layout in zip(paths, layouts, strict=True)]
    if "shards" in layouts:
        if len(paths) > 1:
            raise ConfigError("a shard set is opened alone; pack the sources together (stoker pack A B OUT) to combine them")
        if crop is not None or labels is not None:
            raise ConfigError(f"{paths[0]}: a shard set has its crop and labels already; leave crop and labels out")
        return {}, (), opened, True
    if labels is not None and len(paths) > 1:
        raise ConfigError("labels= names the label file of one source; pass a single source with it")
    names = _source_names(paths)
    per_source = [
        _file_splits(p, layout, labels, crop, n, label_order) for p, layout, n in zip(paths, layouts, names, strict=True)
    ]
    splits, classes = _side_by_side(per_source)
    return dict(splits), classes, opened, False


def _open_split_map(
    split_paths: SplitPaths, labels: PathOrURL | None, crop: Box | None, label_order: LabelOrder
) -> tuple[dict[str, Dataset], tuple[str, ...], list[tuple[str, str]]]:
    """Each split from its own file sources, relabelled into one class list (by name)."""
    if not split_paths:
        raise ConfigError("give at least one split, e.g. {'train': 'data/train', 'valid': 'data/val'}")
    parts: dict[str, FileDataset] = {}
    opened: list[tuple[str, str]] = []
    for name, value in split_paths.items():
        split = canonical_split(str(name))
        if split in parts:
            raise ConfigError(f"two sources are given for the split {split!r}; give each split once")
        found, classes, seen, shards = _open_sources(_as_paths(value, "paths"), labels, crop, label_order)
        if shards:
            raise ConfigError(f"{split}={value}: a shard set has its splits already; pack file sources per split")
        if len(set(classes)) != len(classes):
            raise ConfigError(f"{split}={value}: class names repeat across its sources; give one source per split")
        own = found.get("train") or next(iter(found.values()))
        parts[split] = own  # type: ignore[assignment]
        opened.extend((path, f"{layout}, {split}") for path, layout in seen)
    common = _common_classes([ds.index for ds in parts.values()])
    return {split: FileDataset(_relabel(ds.index, common)) for split, ds in parts.items()}, tuple(common), opened


@overload
def open_data(
    paths: Paths | SplitPaths, split: None = None, *, valid: float | None = ...,
    valid_paths: PathOrURL | Sequence[PathOrURL] | None = ..., image_size: int | tuple[int, int] | None = ...,
    crop: Box | None = ..., labels: PathOrURL | None = ..., transform: Transform | None = ...,
    on_error: OnError = ..., seed: int = ..., label_order: LabelOrder = ...,
) -> DataSplits: ...


@overload
def open_data(
    paths: Paths | SplitPaths, split: str, *, valid: float | None = ...,
    valid_paths: PathOrURL | Sequence[PathOrURL] | None = ..., image_size: int | tuple[int, int] | None = ...,
    crop: Box | None = ..., labels: PathOrURL | None = ..., transform: Transform | None = ...,
    on_error: OnError = ..., seed: int = ..., label_order: LabelOrder = ...,
) -> Dataset: ...


def open_data(
    paths: Paths | SplitPaths,
    split: str | None = None,
    *,
    valid: float | None = None,
    valid_paths: PathOrURL | Sequence[PathOrURL] | None = None,
    image_size: int | tuple[int, int] | None = None,
    crop: Box | None = None,
    labels: PathOrURL | None = None,
    transform: Transform | None = None,
    on_error: OnError = "raise",
    seed: int = 0,
    label_order: LabelOrder = "auto",
) -> DataSplits | Dataset:
    """Open the data at ``paths``, whatever its layout, with all its splits (the opening-data guide says more).

    Args:
        paths: a folder, label file, ids file or shard set; several file sources side by side
            (labels follow on); or ``{split: path(s)}``, each split from its own source.
        split: return only this split's data set (``"train"``, ``"valid"``, ...).
        valid, seed: without a validation split of its own, hold out this share of each class of ``train``.
        valid_paths: separate validation data, in any layout, with the training data's classes.
        image_size: resize every image (``int`` or ``(height, width)``); a shard set stored so is not resized.
        crop, labels: ``(top, left, height, width)`` for file sources; the label file among several ``.txt``.
        transform, on_error: applied to each uint8 CHW image; ``"raise"`` or ``"skip"`` bad samples.
        label_order: ``"auto"``: numeric class names are the labels; ``"sorted"``: classes numbered 0..K-1.

    Returns:
        A :class:`DataSplits` (``{split: data set}``; an empty class is logged and listed), or ``split``'s set.

    Raises:
        MissingFileError, ConfigError, DataError: a missing path; a bad split, layout or classes; malformed data.

    Example:
        >>> from stoker import make_loader
        >>> data = open_data("data/digiface", valid=0.1, image_size=64)
        >>> images, labels = next(iter(make_loader(data["train"], batch_size=8, num_workers=0)))
        >>> tuple(images.shape)
        (8, 3, 64, 64)
    """
    on_error = check_on_error(on_error)
    size_transform = _transform(image_size, transform)
    if isinstance(paths, Mapping):
        resolved = [p for value in paths.values() for p in _as_paths(value, "paths")]
        found, classes, opened = _open_split_map(paths, labels, crop, label_order)
        shards = False
    else:
        resolved = _as_paths(paths, "paths")
        found, classes, opened, shards = _open_sources(resolved, labels, crop, label_order)
    datasets: dict[str, Dataset]
    if shards:
        shard_splits = _open_shards(resolved[0], image_size, transform, on_error)
        datasets = dict(shard_splits)
        classes = next(iter(shard_splits.values())).classes
    else:
        datasets = {name: _apply(ds, size_transform, on_error) for name, ds in found.items()}  # type: ignore[arg-type]

    held_out = False
    extra = _as_paths(valid_paths, "valid_paths")
    if extra:
        given = open_data(extra, valid=None, image_size=image_size, crop=crop, labels=labels, transform=transform,
                          on_error=on_error, label_order=label_order)
        if tuple(given.classes) != tuple(classes):
            raise ConfigError(
                f"{given.where()}: its classes ({given.num_classes}) differ from {', '.join(map(str, resolved))}'s "
                f"({len(classes)}); give validation data with the same class folders or labels, in the same order"
            )
        # A validation source with one split is that split; else its "valid" split.
        datasets["valid"] = next(iter(given.values())) if len(given) == 1 else given["valid" if "valid" in given else "train"]
        opened.extend((path, f"{layout}, validation") for path, layout in given.opened)
    elif valid is not None and "valid" not in datasets:
        if "train" not in datasets:
            raise ConfigError(f"{', '.join(map(str, resolved))}: has no train split to hold validation data out of")
        train = datasets["train"]
        if not isinstance(train, (FileDataset, ShardDataset)):
            raise ConfigError(f"cannot hold out validation data of a {type(train).__name__}")
        train_rows, valid_rows = stratified_split(train.labels, valid, seed)  # one draw for files and shards
        datasets["train"], datasets["valid"] = train.subset(train_rows), train.subset(valid_rows)
        held_out = True
    order = [s for s in ("train", "valid") if s in datasets] + [s for s in datasets if s not in ("train", "valid")]
    result = DataSplits({s: datasets[s] for s in order}, tuple(classes), tuple(opened), held_out)
    if result.empty_classes:
        empty = result.empty_classes
        log.warning(
            "%s: %d of %d classes have no samples (%s%s)%s", result.where(), len(empty), result.num_classes,
            ", ".join(repr(result.classes[i]) for i in empty[:5]), " ..." if len(empty) > 5 else "",
            "; labels numbered from 1? label_order='sorted' (--label-order sorted) numbers the classes "
            "that occur without gaps" if any(name.isdigit() for name in result.classes) else "",
        )
    return result if split is None else result[split]
