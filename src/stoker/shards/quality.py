"""How well a shard set's labels are mixed, in the orders its readers meet them."""

from __future__ import annotations

import os

import numpy as np

from stoker.mixing import ShuffleQuality, shuffle_quality
from stoker.shards.manifest import Manifest
from stoker.shards.reader import ShardSet
from stoker.shards.stream import stream_order

__all__ = ["stream_quality"]


def stream_quality(
    root: str | os.PathLike[str], split: str, batch_size: int = 256, shuffle_buffer: int = 10_000, seed: int = 0
) -> dict[str, ShuffleQuality]:
    """Shuffle quality of one split as stored on disk and as the streaming reader yields it.

    A map-style :class:`~stoker.shards.ShardDataset` shuffles globally through the
    sampler and is always well mixed; what packing decides is the order on disk, which a
    :class:`~stoker.shards.ShardStream` only partly undoes (shard order + a buffer).

    Returns:
        ``{"stored order": ..., "stream (buffer N)": ...}``.
    """
    manifest = Manifest.load(root)
    shards = ShardSet(root, split)
    try:
        labels = np.asarray(shards.all_labels())
    finally:
        shards.close()
    sizes = [info.samples for info in manifest.splits[split]]
    order = stream_order(sizes, seed=seed, epoch=0, shuffle=True, shuffle_buffer=shuffle_buffer,
                         rank=0, world_size=1, worker=0, num_workers=1)
    num_classes = len(manifest.classes)
    return {
        "stored order": shuffle_quality(labels, batch_size, num_classes, seed),
        f"stream (buffer {shuffle_buffer})": shuffle_quality(labels[order], batch_size, num_classes, seed),
    }
