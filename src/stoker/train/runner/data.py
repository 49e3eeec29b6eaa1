"""From the ``[data]`` table to train and validation data sets and loaders.

The data is opened by :func:`stoker.data.open_data` (any layout: class folders, split
folders, a label file, ids with partitions, a packed shard set, several side by side).
Validation data is, in order of preference: ``valid_path``; the data's own validation
split (``val/`` folder, an ids partition named ``validation``/``val``, a shard set's
``valid`` split); a seeded, class-stratified share ``valid`` of the training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import Dataset

from stoker.data import open_data
from stoker.errors import ConfigError
from stoker.loading import Loader, make_loader
from stoker.loading.skips import check_on_error
from stoker.order import ShuffleScope
from stoker.train.runner.config import DataConfig

__all__ = ["TrainData", "build_data", "build_loaders"]


@dataclass
class TrainData:
    """The data sets of a run.

    Attributes:
        train, valid: the data sets (samples are uint8 CHW images and int labels); they
            keep their ``loader_defaults`` and ``collate_fn``, which the loaders use.
        num_classes: classes of the label space.
        description: one line saying what was opened, for the console and ``run.json``.
        test: the test split, when the data has one (``stoker train --test`` evaluates it).
    """

    train: Dataset
    valid: Dataset
    num_classes: int
    description: str
    test: Dataset | None = None


def build_data(cfg: DataConfig, seed: int = 0) -> TrainData:
    """Open the data of ``cfg`` and find or split off validation data.

    Raises:
        ConfigError: no path, a shard set mixed with other sources, validation data with
            other classes, or a ``valid`` share that leaves a side empty.
        DataError: the data itself is missing or malformed (the message names the file).
    """
    if not cfg.path:
        raise ConfigError("data.path is not set; give the data folder, e.g. --data data/digiface")
    data = open_data(
        cfg.path,
        valid=cfg.valid,
        valid_paths=cfg.valid_path or None,
        image_size=cfg.image_size,
        crop=cfg.crop,
        labels=cfg.labels,
        on_error=check_on_error(cfg.on_error),
        seed=seed,
        label_order="sorted" if cfg.label_order == "sorted" else "auto",
    )
    test = data["test"] if "test" in data else None
    train, valid = data["train"], data["valid"]
    if cfg.decoder != "auto":  # what a `stoker tune` file recorded (decoder = "nvjpeg"), or asked for
        from stoker.shards.read.dataset import ShardDataset

        if not isinstance(train, ShardDataset) or train.store != "encoded":
            raise ConfigError(f"data.decoder = {cfg.decoder!r} decodes shard sets of encoded images, and the train data "
                              f"({data.describe()}) is not one; leave data.decoder out (or pack the data with "
                              "`stoker pack DATA OUT --store encoded`)")
        decoder: Any = cfg.decoder  # one of DECODERS (the config's choice)
        train = train.with_decoder(decoder)
        valid = valid.with_decoder(decoder) if isinstance(valid, ShardDataset) else valid
        test = test.with_decoder(decoder) if isinstance(test, ShardDataset) else test
    return TrainData(train, valid, data.num_classes, data.describe(), test)


def build_loaders(data: TrainData, cfg: DataConfig, device: torch.device, seed: int = 0) -> tuple[Loader, Loader]:
    """The train (shuffled, order fixed per epoch by ``seed``) and validation (in order) loaders.

    Workers and backend left out (``workers`` unset, ``backend = "auto"``) are
    :func:`~stoker.make_loader`'s defaults: what the data set measured fastest with, else
    this rank's share of the machine (:mod:`stoker.loading.workers`).

    Under torch.distributed, a map-style train set is split evenly over the ranks (each
    rank the same number of samples; the last ``len % world_size`` of each shuffled
    epoch are left out), and a map-style validation set exactly (every sample once).
    """
    common = _loader_settings(cfg, device, seed)
    train = make_loader(data.train, shuffle=True, shuffle_scope=cast(ShuffleScope, cfg.shuffle_scope), **common)
    valid = make_loader(data.valid, shuffle=False, even=False, **common)
    return train, valid


def build_test_loader(data: TrainData, cfg: DataConfig, device: torch.device) -> Loader:
    """The test split's loader: in order, each sample once over the ranks (as validation's).

    Raises:
        ConfigError: the data has no test split.
    """
    if data.test is None:
        raise ConfigError(f"run.test: the data has no test split ({data.description}); leave out --test, or give "
                          "data with a test/ folder or partition")
    return make_loader(data.test, shuffle=False, even=False, **_loader_settings(cfg, device, seed=0))


def _loader_settings(cfg: DataConfig, device: torch.device, seed: int) -> dict[str, Any]:
    """What every loader of a run shares: batch size, prefetch, device, seed, workers, backend, reader placement."""
    return {
        "batch_size": cfg.batch_size,
        "prefetch_factor": cfg.prefetch_factor,
        "device": device,
        "seed": seed,
        "num_workers": cfg.workers,  # None: make_loader's one rule (stoker.loading.workers)
        "backend": None if cfg.backend == "auto" else cfg.backend,  # None: what the data set says, else process
        "place_readers": cfg.place_readers,  # stoker.loading.reader_cpu
    }
