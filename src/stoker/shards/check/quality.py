"""How well a shard set's labels are mixed, in the orders its readers meet them.

What training gets from a :class:`~stoker.shards.ShardStream` is its rank's order (whole
batches dealt to the workers, handed back round robin: the rank's order again, whatever
the worker count). :func:`loader_label_streams` builds that stream from the public
:func:`~stoker.shards.read.stream.stream_order`, and :func:`stream_quality` scores it next
to the order on disk.

:func:`check_mixing` scores that stream and, when it is not well mixed, finds the
setting that fixes it, in this order: more shards read at once (``shards_at_once``,
free for a local set), a larger shuffle buffer (``shuffle_buffer``, memory), else
re-packing shuffled (or reading map-style). :func:`check_stream` does it for a live
``ShardStream`` and its loader's batch size and workers: ``stoker train`` (through
:class:`~stoker.train.Scenario`), ``stoker inspect`` and ``stoker bench`` say what it
finds before training or in their report.

A map-style set larger than its cache is shuffled in blocks of shards
(:func:`stoker.order.block_permutation`): :func:`block_shuffle_quality` scores the batches
each rank gets, and :func:`warn_if_blocks_poorly_mixed` says it before training.

Example:
    >>> q = stream_quality("packed", "train", batch_size=8, workers=2)
    >>> sorted(q)
    ['stored order', 'stream (buffer 10000, 2 workers x 1 rank)']
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from stoker.errors import ConfigError
from stoker.mixing import ShuffleQuality, shuffle_quality
from stoker.order import ShuffleBlocks, block_permutation, share
from stoker.shards.format.manifest import Manifest
from stoker.shards.read.dataset import ShardDataset
from stoker.shards.read.reader import ShardSet
from stoker.shards.read.stream import (
    REMOTE_SHARDS_AT_ONCE,
    SHARDS_AT_ONCE,
    ShardStream,
    shards_at_once_for,
    stream_order,
)

__all__ = [
    "MixingCheck",
    "block_shuffle_quality",
    "check_mixing",
    "check_stream",
    "loader_label_streams",
    "loader_stream_quality",
    "stream_name",
    "stream_quality",
    "warn_if_blocks_poorly_mixed",
    "warn_if_poorly_mixed",
]

log = logging.getLogger("stoker")

_BUFFER_STEPS = 4  # larger buffers tried, each 4x the last (up to the rank's share)


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
    shards_at_once: int = SHARDS_AT_ONCE,
) -> list[np.ndarray]:
    """The labels each rank's training loop receives from a ShardStream under a DataLoader.

    Args:
        labels: the split's labels in stored order (as :class:`~stoker.shards.ShardDataset` numbers rows).
        shard_sizes: samples per shard, in manifest order.
        batch_size: samples per batch (a worker reads whole batches of the rank's order; the last may be short).
        workers: DataLoader workers per rank (0: the main process reads, like one worker).
        ranks: distributed ranks (world size).
        seed, epoch, shuffle, shuffle_buffer, shards_at_once: as
            :class:`~stoker.shards.ShardStream` takes them.

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
                                rank=rank, world_size=ranks, worker=worker, num_workers=readers,
                                block_rows=batch_size, shards_at_once=shards_at_once)
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
    shards_at_once: int = SHARDS_AT_ONCE,
) -> ShuffleQuality:
    """The shuffle quality of :func:`loader_label_streams`: the worst rank's (ranks read alike)."""
    streams = loader_label_streams(labels, shard_sizes, batch_size=batch_size, workers=workers, ranks=ranks, seed=seed,
                                   shuffle=shuffle, shuffle_buffer=shuffle_buffer, shards_at_once=shards_at_once)
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
    shards_at_once: int | None = None,
) -> dict[str, ShuffleQuality]:
    """Shuffle quality of one split as stored on disk and as a ShardStream delivers it to training.

    A map-style :class:`~stoker.shards.ShardDataset` shuffles globally through the
    sampler and is always well mixed; what packing decides is the order on disk, which a
    :class:`~stoker.shards.ShardStream` only partly undoes (its reading order + a buffer).
    The stream is scored as ``workers`` DataLoader workers on each of ``ranks`` ranks
    deliver it (see the module docs): the worst rank's batches; ``shards_at_once`` as
    :func:`check_pack` takes it.

    Returns:
        ``{"stored order": ..., stream_name(shuffle_buffer, workers, ranks): ...}``.
    """
    stored, check = check_pack(root, split, batch_size, shuffle_buffer, seed, workers=workers, ranks=ranks,
                               shards_at_once=shards_at_once, find_fix=False)
    return {"stored order": stored, stream_name(shuffle_buffer, workers, ranks): check.quality}


@dataclass(frozen=True)
class MixingCheck:
    """How well a ShardStream's batches are mixed as a loader delivers them, and the setting that fixes it.

    Attributes:
        quality: the stream's quality (the worst rank's), as :func:`loader_stream_quality` scores it.
        batch_size, workers, ranks, shuffle_buffer, shards_at_once: the reading scored.
        fix: ``None`` when the stream is well mixed (or no fix was looked for);
            ``"shards_at_once"`` or ``"shuffle_buffer"`` when that setting at
            ``fix_value`` mixes well; ``"repack"`` when neither does within reach.
        fix_value: the value of ``fix`` that mixes well.
        fixed: the quality with that fix (``None`` for ``"repack"`` or no fix).
        limited_by_cache: more shards at once would fix it, but the remote cache's
            ``cache_limit`` does not hold them.
    """

    quality: ShuffleQuality
    batch_size: int
    workers: int
    ranks: int
    shuffle_buffer: int
    shards_at_once: int
    fix: str | None = None
    fix_value: int | None = None
    fixed: ShuffleQuality | None = None
    limited_by_cache: bool = False

    @property
    def ok(self) -> bool:
        """True when the stream is mixed well enough (verdict ``"good"``)."""
        return self.quality.ok

    def advice(self, flags: Mapping[str, str] | None = None) -> str:
        """What to change, in words; ``flags`` names each setting as the caller takes it
        (``{"shuffle_buffer": "--shuffle-buffer"}``; default ``shuffle_buffer=N``)."""
        names = dict(flags or {})

        def setting(name: str, value: int) -> str:
            flag = names.get(name)
            return f"{flag} {value}" if flag else f"{name}={value}"

        repack = ("repack it shuffled (`stoker pack` without --no-shuffle), or read it map-style "
                  "(ShardDataset, shuffled by the sampler)")
        if self.fix in ("shards_at_once", "shuffle_buffer") and self.fix_value is not None and self.fixed is not None:
            what = ("read more shards at once" if self.fix == "shards_at_once"
                    else f"give it a larger shuffle buffer (each rank shuffles its order through that many samples; now {self.shuffle_buffer})")
            return (f"{what}: {setting(self.fix, self.fix_value)} scores {self.fixed.score:.2f} "
                    f"({self.fixed.classes_per_batch:.1f} classes per batch); or {repack}")
        if self.limited_by_cache:
            return f"raise the cache's cache_limit so that more shards fit at once, or {repack}"
        return repack

    def warning(self, what: str, flags: Mapping[str, str] | None = None) -> str:
        """One warning line: which stream, how poorly mixed, and :meth:`advice`."""
        q = self.quality
        return (
            f"warning: {what}: a ShardStream read by {self.workers} worker(s) x {self.ranks} rank(s) "
            f"(buffer {self.shuffle_buffer}, {self.shards_at_once} shard(s) at once, batch {self.batch_size}) "
            f"is not well mixed (score {q.score:.2f}, {q.verdict}): its batches hold {q.classes_per_batch:.1f} "
            f"classes on average against {q.classes_per_batch_random:.1f} for a shuffle. To fix it, "
            + self.advice(flags)
        )


def check_mixing(
    labels: np.ndarray,
    shard_sizes: list[int] | np.ndarray,
    num_classes: int,
    *,
    batch_size: int,
    workers: int = 0,
    ranks: int = 1,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    shards_at_once: int = SHARDS_AT_ONCE,
    most_shards_at_once: int | None = None,
    find_fix: bool = True,
) -> MixingCheck:
    """Score a ShardStream as a loader delivers it and, when poorly mixed, find the setting that fixes it.

    The fixes are tried by simulation on the labels alone, cheapest first: twice, four
    times... as many shards at once (up to every shard, or ``most_shards_at_once``, what
    a remote set's cache holds), then buffers 4, 16, 64, 256 times larger (up to a
    rank's share); if none mixes well, the fix is to repack shuffled.

    Args:
        labels, shard_sizes, num_classes, batch_size, workers, ranks, seed,
            shuffle_buffer, shards_at_once: as :func:`loader_stream_quality` takes them.
        most_shards_at_once: the most shards that may be read at once (default: all).
        find_fix: look for a fix when the stream is not well mixed.

    Example:
        >>> labels, sizes = np.repeat(np.arange(8), 50), [50] * 8   # one class per shard
        >>> check = check_mixing(labels, sizes, 8, batch_size=32, shuffle_buffer=50, shards_at_once=1)
        >>> check.ok, check.fix, check.fix_value
        (False, 'shards_at_once', 8)
    """
    def score(buffer: int, at_once: int) -> ShuffleQuality:
        return loader_stream_quality(labels, shard_sizes, num_classes, batch_size=batch_size, workers=workers,
                                     ranks=ranks, seed=seed, shuffle_buffer=buffer, shards_at_once=at_once)

    quality = score(shuffle_buffer, shards_at_once)
    found = MixingCheck(quality, int(batch_size), int(workers), int(ranks), int(shuffle_buffer), int(shards_at_once))
    if quality.ok or not find_fix:
        return found
    shards = len(shard_sizes)
    most = shards if most_shards_at_once is None else max(1, min(int(most_shards_at_once), shards))
    k = shards_at_once
    while k < most:
        k = min(2 * k, most)
        tried = score(shuffle_buffer, k)
        if tried.ok:
            return replace(found, fix="shards_at_once", fix_value=k, fixed=tried)
    share = -(-len(labels) // ranks)
    buffer = shuffle_buffer
    for _ in range(_BUFFER_STEPS):
        if buffer >= share:
            break
        buffer = min(4 * buffer, share)
        tried = score(buffer, shards_at_once)
        if tried.ok:
            return replace(found, fix="shuffle_buffer", fix_value=buffer, fixed=tried)
    limited = most < shards and score(shuffle_buffer, shards).ok  # the cache keeps it from reading enough at once
    return replace(found, fix="repack", limited_by_cache=limited)


def check_pack(
    root: str | os.PathLike[str],
    split: str,
    batch_size: int = 256,
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    *,
    workers: int = 0,
    ranks: int = 1,
    shards_at_once: int | None = None,
    find_fix: bool = True,
) -> tuple[ShuffleQuality, MixingCheck]:
    """The quality of one split's stored order, and :func:`check_mixing` of a ShardStream over it.

    ``shards_at_once`` defaults to what a ShardStream over ``root`` reads at once
    (:data:`~stoker.shards.read.stream.SHARDS_AT_ONCE` for a local set,
    :data:`~stoker.shards.read.stream.REMOTE_SHARDS_AT_ONCE` for a URL), at most the shards
    there are. Reads every label of the split (for a URL: downloads the split).
    """
    manifest = Manifest.load(root)
    shards = ShardSet(root, split)
    try:
        labels = np.asarray(shards.all_labels())
        remote = shards.remote is not None
    finally:
        shards.close()
    infos = manifest.splits[split]
    sizes = [info.samples for info in infos]
    num_classes = len(manifest.classes)
    wanted = shards_at_once if shards_at_once is not None else REMOTE_SHARDS_AT_ONCE if remote else SHARDS_AT_ONCE
    k = shards_at_once_for([info.bytes for info in infos], wanted)
    check = check_mixing(labels, sizes, num_classes, batch_size=batch_size, workers=workers, ranks=ranks, seed=seed,
                         shuffle_buffer=shuffle_buffer, shards_at_once=k, find_fix=find_fix)
    return shuffle_quality(labels, batch_size, num_classes, seed), check


def check_stream(stream: ShardStream, batch_size: int, num_workers: int, world_size: int | None = None) -> MixingCheck | None:
    """:func:`check_mixing` of a live ``stream`` read in batches of ``batch_size`` by ``num_workers`` workers per rank.

    The ranks are ``world_size``, else the stream's own placement (its ``rank`` and
    ``world_size``, else ``torch.distributed``'s). Reads only the labels. Returns
    ``None`` for what is not measured: a stream that does not shuffle (it reads the
    stored order, as for validation), and a set at a URL whose shards are not all in
    the cache yet (measuring would download it).

    Example:
        >>> from stoker.shards.read.stream import ShardStream
        >>> check = check_stream(ShardStream("packed"), batch_size=8, num_workers=2)
        >>> check.ok                      # else check.warning("packed") says what to change
        True
    """
    shards = stream.dataset.shards
    if not stream.shuffle or (shards.remote is not None and shards.download_bytes() > 0):
        return None
    ranks = world_size if world_size is not None else stream.placement()[1]
    cache = shards.cache
    most = shards_at_once_for([info.bytes for info in shards.infos], len(shards.infos),
                              cache.shard_room if cache is not None else None, stream.fetch_ahead)
    try:
        labels = np.array(shards.all_labels())
    finally:
        shards.close()  # all_labels opens every shard; the stream reopens what it reads, when it reads it
    return check_mixing(
        labels, [info.samples for info in shards.infos], len(stream.dataset.manifest.classes),
        batch_size=batch_size, workers=num_workers, ranks=ranks, seed=stream.seed, shuffle_buffer=stream.shuffle_buffer,
        shards_at_once=stream.shards_at_once, most_shards_at_once=most,
    )


def warn_if_poorly_mixed(stream: ShardStream, batch_size: int, num_workers: int) -> MixingCheck | None:
    """Run :func:`check_stream` once and, when the stream is not well mixed, say so on the ``stoker`` logger.

    What training calls before its first epoch (:class:`~stoker.train.Scenario` does, for
    a loader over a ShardStream). Only rank 0 measures and speaks (every rank would find
    the same); a set at a URL not yet in the cache is not measured, and that is said too.

    Returns:
        The check (rank 0), or ``None`` where nothing was measured.
    """
    if stream.placement()[0] != 0:
        return None
    check = check_stream(stream, batch_size, num_workers)
    where = f"{stream.dataset.root} ({stream.dataset.split})"
    if check is None:
        if stream.shuffle:
            log.info("%s: the mixing of this ShardStream is not measured before its shards are in the cache; "
                     "`stoker inspect %s --workers %d` measures it", where, stream.dataset.root, num_workers)
        return None
    if not check.ok:
        log.warning("%s", check.warning(where))
    return check


def block_shuffle_quality(
    labels: np.ndarray, blocks: ShuffleBlocks, num_classes: int, *, batch_size: int, ranks: int = 1, seed: int = 0,
    epoch: int = 0,
) -> ShuffleQuality:
    """The shuffle quality of a map-style block shuffle as each rank's batches hold it: the worst rank's.

    Args:
        labels: the split's labels in stored order.
        blocks: the grouping (:meth:`ShardDataset.shuffle_blocks`).
        num_classes, batch_size, ranks, seed, epoch: the reading scored (workers do not change the batches).

    Example:
        >>> labels = np.repeat(np.arange(8), 50)             # one class per shard
        >>> two = ShuffleBlocks((50,) * 8, (1,) * 8, budget=2)
        >>> block_shuffle_quality(labels, two, 8, batch_size=32).verdict
        'poor'
        >>> whole = ShuffleBlocks((50,) * 8, (1,) * 8, budget=8)
        >>> block_shuffle_quality(labels, whole, 8, batch_size=32).verdict
        'good'
    """
    labels = np.asarray(labels)
    order = block_permutation(blocks, seed, epoch)
    scored = [shuffle_quality(labels[share(order, r, ranks, even=True)], batch_size, num_classes, seed) for r in range(ranks)]
    return min(scored, key=lambda q: q.score)


def warn_if_blocks_poorly_mixed(
    dataset: ShardDataset, blocks: ShuffleBlocks, batch_size: int, ranks: int, seed: int = 0
) -> ShuffleQuality | None:
    """Score a block shuffle before training and say it: a warning when not well mixed, else one info line.

    Only when every shard of the split is in the cache already (scoring reads every
    label; it must not download the split): otherwise that is said, and ``None`` returned.
    """
    where = f"{dataset.root} ({dataset.split})"
    if dataset.shards.download_bytes() > 0:
        log.info("%s: the mixing of its block shuffle is not measured before its shards are in the cache", where)
        return None
    try:
        labels = np.asarray(dataset.labels)
    finally:
        dataset.shards.close()  # reading the labels opened every shard; the loader reopens what it reads
    quality = block_shuffle_quality(labels, blocks, dataset.num_classes, batch_size=batch_size, ranks=ranks, seed=seed)
    said = (f"{where}: its block shuffle (blocks of at most {blocks.budget:,} bytes of shards, {ranks} rank(s), batch "
            f"{batch_size}) scores {quality.score:.2f} ({quality.verdict}): its batches hold "
            f"{quality.classes_per_batch:.1f} classes on average against {quality.classes_per_batch_random:.1f} for a "
            "shuffle of the whole split")
    if quality.ok:
        log.info("%s", said)
    else:
        log.warning("%s. To fix it, raise the cache limit (--cache-limit) for larger blocks, or repack it shuffled "
                    "(`stoker pack` without --no-shuffle)", said)
    return quality
