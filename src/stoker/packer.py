"""``pack``: open the data at any path (or take a data set) and write it as shuffled shards.

The opening is :func:`stoker.data.open_data`'s (every layout, several sources side by
side, a shard set to re-pack); the writing is :func:`stoker.shards.write_shards`'s
(checksummed, atomic, resumable, the same bytes for the same arguments).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.data import LabelOrder, open_data
from stoker.decode.image import Box
from stoker.errors import ConfigError
from stoker.fs import is_url
from stoker.shards.format.manifest import Manifest
from stoker.shards.pack.packing import write_shards
from stoker.shards.read.dataset import ShardDataset
from stoker.sources.dataset import FileDataset
from stoker.types import PathLike

__all__ = ["pack"]


def pack(
    source: PathLike | Sequence[PathLike] | FileDataset | ShardDataset | Mapping[str, Any],
    out: PathLike,
    *,
    labels: PathLike | None = None,
    crop: Box | None = None,
    label_order: LabelOrder = "auto",
    **options: Any,
) -> Manifest:
    """Pack a data set into shuffled, checksummed Arrow shards plus ``manifest.json``.

    Args:
        source: a folder in any layout (class folders, split folders, a label file,
            ids), several of them (labels side by side), an existing shard set (re-pack),
            a stoker data set, a ``{split: data set}`` mapping (:func:`stoker.open_data`'s),
            or ``{split: path(s)}`` to give each split its own source (one label mapping).
        out: the output folder (new, empty, or this same pack half done).
        labels: the label file of a label-file folder that holds several ``.txt`` files.
        crop: ``(top, left, height, width)`` for every image of file sources.
        label_order: ``"auto"`` or ``"sorted"``, as for :func:`stoker.open_data`.
        options: as for :func:`stoker.shards.write_shards`: ``store``, ``size``,
            ``shard_samples``, ``shard_bytes``, ``valid``, ``seed``, ``shuffle``,
            ``workers``, ``overwrite``, ``progress``.

    Returns:
        The :class:`~stoker.shards.Manifest` written.

    Raises:
        ConfigError, DataError, ShardError: as :func:`stoker.shards.write_shards` raises them.

    Example:
        >>> manifest = pack("data/digiface", "packed-here", store="pixels", size=(32, 32), valid=0.1, progress=False)
        >>> manifest.split_samples("train"), manifest.split_samples("valid")
        (36, 4)
    """
    if isinstance(source, Mapping) and all(isinstance(v, (str, os.PathLike, list, tuple)) for v in source.values()):
        opened = open_data(source, crop=crop, labels=labels, label_order=label_order)  # {split: paths}: one label mapping
        return write_shards(dict(opened), out, origin=[path for path, _ in opened.opened], **options)
    if isinstance(source, (FileDataset, ShardDataset, Mapping)):
        if labels is not None or crop is not None:
            raise ConfigError("pack: labels and crop apply to paths; a data set has its labels and crop already")
        return write_shards(source, out, **options)
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not paths:
        raise ConfigError("pack: give at least one source")
    opened = open_data(paths, crop=crop, labels=labels, label_order=label_order)
    if opened.is_shards and (labels is not None or crop is not None):
        raise ConfigError("pack: a shard set has its labels and crop already; leave --labels and --crop out")
    origin = [os.fspath(p) if is_url(p) else str(Path(p).resolve()) for p in paths]  # a URL stays a URL
    return write_shards(dict(opened), out, origin=origin, **options)
