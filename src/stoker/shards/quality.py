"""How well a shard set's labels are mixed, in the orders its readers meet them.

What training gets from a :class:`~stoker.shards.ShardStream` is not one reader's
order: under a DataLoader with ``N`` workers each worker reads its own part of the
epoch (:func:`~stoker.shards.stream.stream_order` for that rank and worker), makes
whole batches of it, and torch hands the batches to the training loop round-robin
(worker 0's first batch, worker 1's first batch, ..., then every worker's second...;
a worker that has run out is skipped). Each rank of a distributed run does the same
over its own part. :func:`loader_label_streams` builds exactly that stream from the
public ``stream_order``, so it follows whatever order the stream reads in, and
:func:`stream_quality` scores it next to the order on disk.

Example:
    >>> q = stream_quality("packed/", "train", batch_size=256, workers=2)  # doctest: +SKIP
    >>> q["stream (buffer 10000, 2 workers x 1 rank)"].verdict  # doctest: +SKIP
    'good'
"""

from __future__ import annotations

import os

import numpy as np

from stoker.errors import ConfigError
from stoker.mixing import ShuffleQuality, shuffle_quality
from stoker.shards.manifest import Manifest
from stoker.shards.reader import ShardSet
from stoker.shards.stream import stream_order

__all__ = ["loader_label_streams", "loader_stream_quality", "stream_name", "stream_quality"]


def loader_label_streams(
    labels: np.ndarray,
    shard_sizes: list[int] | np.ndarray,
    *,
    batch_size: int,
    workers: int = 0,
    ranks: int = 1,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 10_000,
) -> list[np.ndarray]:
    """The labels each rank's training loop receives from a ShardStream under a DataLoader.

    Args:
        labels: the split's labels in stored order (as :class:`~stoker.shards.ShardDataset` numbers rows).
        shard_sizes: samples per shard, in manifest order.
        batch_size: samples per batch (each worker batches its own rows; the last batch may be short).
        workers: DataLoader workers per rank (0: the main process reads, like one worker).
        ranks: distributed ranks (world size).
        seed, epoch, shuffle, shuffle_buffer: as :class:`~stoker.shards.ShardStream` takes them.

    Returns:
        One label array per rank, in the order its loader yields them.

    Raises:
        ConfigError: a batch size, worker count or rank count out of range.

    Example:
        >>> streams = loader_label_streams(np.repeat([0, 1], 4), [4, 4], batch_size=2, workers=2, ranks=2)
        >>> [len(s) for s in streams]  # each rank gets half the epoch, its two workers' batches in turn
        [4, 4]
    """
    if batch_size < 1 or workers < 0 or ranks < 1:
        raise ConfigError(f"batch_size and ranks must be >= 1 and workers >= 0, got {batch_size}, {ranks} and {workers}")
    labels = np.asarray(labels)
    readers = max(workers, 1)
    streams = []
    for rank in range(ranks):
        batches: list[list[np.ndarray]] = []
        for worker in range(readers):
            rows = stream_order(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                                rank=rank, world_size=ranks, worker=worker, num_workers=readers)
            mine = labels[rows]
            batches.append([mine[i : i + batch_size] for i in range(0, len(mine), batch_size)])
        # torch's DataLoader: batch i of every worker still running, in worker order
        rounds = max((len(b) for b in batches), default=0)
        ordered = [b[i] for i in range(rounds) for b in batches if i < len(b)]
        streams.append(np.concatenate(ordered) if ordered else labels[:0])
    return streams


def loader_stream_quality(
    labels: np.ndarray,
    shard_sizes: list[int] | np.ndarray,
    num_classes: int,
    *,
    batch_size: int,
    workers: int = 0,
    ranks: int = 1,
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer: int = 10_000,
) -> ShuffleQuality:
    """The shuffle quality of :func:`loader_label_streams`: the worst rank's (ranks read alike)."""
    streams = loader_label_streams(labels, shard_sizes, batch_size=batch_size, workers=workers, ranks=ranks, seed=seed,
                                   shuffle=shuffle, shuffle_buffer=shuffle_buffer)
    scored = [shuffle_quality(s, batch_size, num_classes, seed) for s in streams if len(s)]
    if not scored:
        return shuffle_quality(np.asarray(labels)[:0], batch_size, num_classes, seed)
    return min(scored, key=lambda q: q.score)


def stream_name(shuffle_buffer: int, workers: int = 0, ranks: int = 1) -> str:
    """The key :func:`stream_quality` gives the stream: ``"stream (buffer N)"`` for one reader,
    ``"stream (buffer N, W workers x R ranks)"`` otherwise."""
    if max(workers, 1) == 1 and ranks == 1:
        return f"stream (buffer {shuffle_buffer})"
    return (f"stream (buffer {shuffle_buffer}, {workers} worker{'s' if workers != 1 else ''} x "
            f"{ranks} rank{'s' if ranks != 1 else ''})")


def stream_quality(
    root: str | os.PathLike[str],
    split: str,
    batch_size: int = 256,
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    *,
    workers: int = 0,
    ranks: int = 1,
) -> dict[str, ShuffleQuality]:
    """Shuffle quality of one split as stored on disk and as a ShardStream delivers it to training.

    A map-style :class:`~stoker.shards.ShardDataset` shuffles globally through the
    sampler and is always well mixed; what packing decides is the order on disk, which a
    :class:`~stoker.shards.ShardStream` only partly undoes (its reading order + a buffer).
    The stream is scored as ``workers`` DataLoader workers on each of ``ranks`` ranks
    deliver it (see the module docs): the worst rank's batches.

    Returns:
        ``{"stored order": ..., stream_name(shuffle_buffer, workers, ranks): ...}``.
    """
    manifest = Manifest.load(root)
    shards = ShardSet(root, split)
    try:
        labels = np.asarray(shards.all_labels())
    finally:
        shards.close()
    sizes = [info.samples for info in manifest.splits[split]]
    num_classes = len(manifest.classes)
    return {
        "stored order": shuffle_quality(labels, batch_size, num_classes, seed),
        stream_name(shuffle_buffer, workers, ranks): loader_stream_quality(
            labels, sizes, num_classes, batch_size=batch_size, workers=workers, ranks=ranks, seed=seed,
            shuffle_buffer=shuffle_buffer,
        ),
    }
