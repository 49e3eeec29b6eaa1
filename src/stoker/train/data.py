"""From the ``[data]`` table to train and validation data sets and loaders.

The layout of every path is detected by :mod:`stoker.sources.detect` (class folders, a
label file, ids with partitions, or a packed shard set). Validation data is, in order of
preference: ``valid_path``; the data's own validation split (an ids partition named
``validation``/``val``, a shard set's ``valid`` split); a seeded, class-stratified share
``valid`` of the training data.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from stoker.decode import resize
from stoker.errors import ConfigError
from stoker.loading import Loader, make_loader
from stoker.sources import FileDataset
from stoker.sources.detect import detect_layout, open_splits
from stoker.train.config import DataConfig

__all__ = ["TrainData", "build_data", "build_loaders"]


@dataclass
class TrainData:
    """The data sets of a run.

    Attributes:
        train, valid: the data sets (samples are uint8 CHW images and int labels).
        num_classes: classes of the label space.
        description: one line saying what was opened, for the console and ``run.json``.
        collate_fn: the batch maker the loaders should use (``None``: the default).
        default_backend: the loader backend that suits this data best.
    """

    train: Dataset
    valid: Dataset
    num_classes: int
    description: str
    collate_fn: Any = None
    default_backend: str = "process"


def build_data(cfg: DataConfig, seed: int = 0) -> TrainData:
    """Open the data of ``cfg`` and find or split off validation data.

    Raises:
        ConfigError: no path, a shard set mixed with other sources, validation data with
            other classes, or a ``valid`` share that leaves a side empty.
        DataError: the data itself is missing or malformed (the message names the file).
    """
    if not cfg.path:
        raise ConfigError("data.path is not set; give the data folder, e.g. --data data/digiface")
    transform = functools.partial(resize, size=cfg.image_size) if cfg.image_size is not None else None
    layouts = [detect_layout(p) for p in cfg.path]
    if "shards" in layouts:
        data = _open_shards(cfg, transform, seed)
    else:
        data = _open_files(cfg, transform, seed)
    kinds = ", ".join(f"{p} ({layout})" for p, layout in zip(cfg.path, layouts, strict=True))
    data.description = f"{kinds}: {len(data.train)} train / {len(data.valid)} valid samples, {data.num_classes} classes"  # type: ignore[arg-type]
    return data


def build_loaders(data: TrainData, cfg: DataConfig, device: torch.device, seed: int = 0) -> tuple[Loader, Loader]:
    """The train (shuffled, order fixed per epoch by ``seed``) and validation (in order) loaders."""
    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "num_workers": cfg.workers,
        "prefetch_factor": cfg.prefetch_factor,
        "device": device,
        "backend": data.default_backend if cfg.backend == "auto" else cfg.backend,
        "seed": seed,
        "collate_fn": data.collate_fn,
    }
    return make_loader(data.train, shuffle=True, **common), make_loader(data.valid, shuffle=False, **common)


def _open_files(cfg: DataConfig, transform: Any, seed: int) -> TrainData:
    """Class folders, label files and ids: label spaces side by side when there are several."""
    splits = open_splits(cfg.path, labels=cfg.labels, crop=cfg.crop)
    train = FileDataset(splits["train"].index, transform, cfg.on_error)  # type: ignore[arg-type]
    if cfg.valid_path:
        given = open_splits(cfg.valid_path, labels=cfg.labels, crop=cfg.crop)["train"]
        if given.classes != train.classes:
            raise ConfigError(
                f"data.valid_path: its classes ({given.num_classes}) differ from data.path's ({train.num_classes}); "
                "give validation data with the same class folders or labels, in the same order"
            )
        valid = FileDataset(given.index, transform, cfg.on_error)  # type: ignore[arg-type]
    elif "valid" in splits:
        valid = FileDataset(splits["valid"].index, transform, cfg.on_error)  # type: ignore[arg-type]
    else:
        train, valid = train.split(valid=cfg.valid, seed=seed)
    return TrainData(train, valid, train.num_classes, "")


def _open_shards(cfg: DataConfig, transform: Any, seed: int) -> TrainData:
    """One packed shard set: its ``valid`` split, or a stratified share of ``train``."""
    from stoker.shards.dataset import ShardDataset, collate_shard_batch

    if len(cfg.path) != 1 or cfg.valid_path:
        raise ConfigError("data.path: a shard set trains alone (no other paths, no valid_path); pack the sources together")
    root = cfg.path[0]
    train = ShardDataset(root, "train", on_error=cfg.on_error)  # type: ignore[arg-type]
    if transform is not None and train.image_size != cfg.image_size:
        train.transform = transform  # resize only what the shard set does not already store at this size
    backend = getattr(train, "loader_defaults", {}).get("backend", "process")  # what measured fastest
    base = TrainData(train, train, train.num_classes, "", collate_shard_batch, backend)
    if "valid" in train.manifest.splits:
        base.valid = ShardDataset(root, "valid", transform=train.transform, on_error=cfg.on_error)  # type: ignore[arg-type]
    else:
        base.train, base.valid = _split_by_label(train, cfg.valid, seed)
    return base


def _split_by_label(ds: Any, valid: float, seed: int) -> tuple[Dataset, Dataset]:
    """A seeded, class-stratified split of any data set with ``.labels`` (as ``FileDataset.split``)."""
    labels = np.asarray(ds.labels)
    rng = np.random.default_rng(seed)
    valid_rows = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        valid_rows.append(rows[rng.permutation(len(rows))][: int(round(len(rows) * valid))])
    is_valid = np.zeros(len(labels), dtype=bool)
    is_valid[np.concatenate(valid_rows)] = True
    if is_valid.all() or not is_valid.any():
        raise ConfigError(f"data.valid = {valid} leaves one side of the split empty for {len(labels)} samples")
    return Subset(ds, np.flatnonzero(~is_valid).tolist()), Subset(ds, np.flatnonzero(is_valid).tolist())
