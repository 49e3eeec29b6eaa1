"""``ShardStream``: an iterable torch Dataset over a shard set — shard order shuffled, then a buffer.

Each epoch, the shards of the split are put in a seeded random order
(:func:`stoker.order.permutation` of the shards) and their rows laid end to end. That
sequence is split by the rule of :mod:`stoker.order`: rank ``r`` of ``R`` takes every
``R``-th row (so the ranks' shares differ by at most one sample), and deals its rows to
its workers in blocks of ``block_rows``: worker ``w`` of ``N`` reads blocks ``w, w + N,
w + 2N, ...``. Every (rank, worker) therefore reads across the whole epoch — all of its
shards, in step with the others — rather than one contiguous piece of it, so how well
the batches are mixed does not depend on the number of workers or ranks (with
contiguous pieces, two workers over a class-sorted pack each read half of the classes:
every batch held half of them). Every sample is read exactly once per epoch; nothing is
trimmed. Each reader then shuffles its rows through a buffer of ``shuffle_buffer`` rows
(:func:`stoker.order.buffer_shuffle`, drawn from ``(BUFFER, rank, worker)`` of the
epoch); its reads stay within a window of the files (good for a page cache, or a disk
larger than memory).

``len(stream)`` is what this rank reads per epoch, all its workers together, as for
every stoker reader.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from stoker.errors import ConfigError
from stoker.loading.collate import collate
from stoker.loading.contract import StreamReader
from stoker.loading.placement import distributed_placement
from stoker.loading.skips import OnError, Skipped
from stoker.order import BUFFER, buffer_shuffle, check_placement, epoch_rng, permutation, share, share_size
from stoker.shards.cache import read_ahead
from stoker.shards.dataset import ShardDataset

__all__ = ["BLOCK_ROWS", "ShardStream", "stream_order"]

BLOCK_ROWS = 64  # rows a worker takes at a time: small enough to interleave, large enough to read in runs

log = logging.getLogger("stoker")


def stream_order(
    shard_sizes: list[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    shuffle_buffer: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    block_rows: int = BLOCK_ROWS,
) -> np.ndarray:
    """The sample indices one (rank, worker) reads in one epoch, in the order it reads them.

    Args:
        shard_sizes: samples in each shard of the split, in manifest order.
        seed, epoch: fix the shard order and the buffer's draws.
        shuffle: shuffle the shard order and run the buffer; False reads in order.
        shuffle_buffer: rows in the shuffle buffer.
        rank, world_size, worker, num_workers: which part of the epoch to read.
        block_rows: rows of a rank's sequence dealt to one worker at a time (fewer
            when the smallest shard would not give every worker a block).

    Returns:
        ``int64`` sample indices (into the split, as :class:`ShardDataset` numbers them).

    Example:
        >>> order = [stream_order([3, 3], seed=0, epoch=0, shuffle=True, shuffle_buffer=4,
        ...                       rank=0, world_size=1, worker=w, num_workers=2) for w in (0, 1)]
        >>> sorted(np.concatenate(order).tolist())
        [0, 1, 2, 3, 4, 5]
    """
    check_placement(rank, world_size, worker, num_workers, where="stream_order")
    if block_rows < 1:
        raise ConfigError(f"block_rows must be >= 1, got {block_rows}")
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    shard_order = permutation(len(sizes), seed, epoch) if shuffle else np.arange(len(sizes))
    sequence = np.concatenate(
        [np.arange(starts[k], starts[k + 1], dtype=np.int64) for k in shard_order] or [np.zeros(0, dtype=np.int64)]
    )
    # Each shard must give every worker a block, or a worker would miss that shard.
    smallest = int(sizes[sizes > 0].min()) if (sizes > 0).any() else 1
    block_rows = max(1, min(block_rows, smallest // (world_size * num_workers)))
    mine = share(sequence, rank, world_size, worker, num_workers, block=block_rows)
    if not shuffle:
        return mine
    rng = epoch_rng(seed, epoch, BUFFER, rank, worker)
    return np.fromiter(buffer_shuffle(mine.tolist(), shuffle_buffer, rng), dtype=np.int64, count=len(mine))


class ShardStream(IterableDataset, StreamReader):
    """An iterable torch Dataset over one split of a shard set: every sample once per epoch.

    Use it where an iterable data set is wanted (streaming-style training, several
    ranks); for an exact global shuffle use the map-style :class:`ShardDataset`. Under
    DataLoader workers and ``torch.distributed`` ranks each reader takes its own piece of
    the epoch (see the module docs). The epoch number (from :meth:`set_epoch`, which
    stoker's loader calls) lives in shared memory, so persistent workers follow it.

    Args:
        root: the folder ``stoker pack`` wrote.
        split: which split to read.
        transform: applied to each uint8 CHW image tensor.
        shuffle: shuffle shard order and rows each epoch (default True).
        shuffle_buffer: rows in each reader's shuffle buffer.
        seed: base seed of the shuffle.
        rank, world_size: this process's place among ranks; default: from
            ``torch.distributed`` when it is initialised, else one rank.
        on_error: ``"raise"`` or ``"skip"`` samples that fail to decode.
        read_rows: rows gathered per read (one call per this many samples).
        cache_dir, cache_limit, storage_options: for a shard set at a URL: the verified
            local cache, its size limit and the filesystem's options (see :class:`ShardDataset`).
        fetch_ahead: shards of a remote set downloaded ahead of the one being read.

    Example:
        >>> stream = ShardStream("packed", split="train", shuffle_buffer=10_000)  # doctest: +SKIP
        >>> loader = make_loader(stream, batch_size=256, num_workers=2)  # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str = "train",
        transform: Callable[[torch.Tensor], Any] | None = None,
        *,
        shuffle: bool = True,
        shuffle_buffer: int = 10_000,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: OnError = "raise",
        read_rows: int = 256,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        fetch_ahead: int = 2,
    ) -> None:
        if shuffle_buffer < 1 or read_rows < 1:
            raise ConfigError(f"shuffle_buffer and read_rows must be >= 1, got {shuffle_buffer} and {read_rows}")
        if (rank is None) != (world_size is None):
            raise ConfigError("give rank and world_size together, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank} is out of range for world_size={world_size}")
        self.dataset = ShardDataset(
            root, split, transform, on_error,
            cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
        )
        self.fetch_ahead = fetch_ahead
        if self.dataset.manifest.made_by.get("shuffle") is False:  # `stoker pack --no-shuffle`
            log.warning(
                "%s: packed with --no-shuffle (the source's order kept); a ShardStream reads it close to that "
                "order, so batches may hold few classes. Repack without --no-shuffle, or read it map-style "
                "(ShardDataset, shuffled by the sampler); `stoker inspect %s --workers N` scores the stream",
                root, root,
            )
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.read_rows = read_rows
        self._placement = (rank, world_size) if rank is not None and world_size is not None else None
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch the next iteration reads (its shard order and buffer draws)."""
        self._epoch.fill_(int(epoch))

    def placement(self) -> tuple[int, int, int, int]:
        """``(rank, world_size, worker, num_workers)`` of the current process."""
        rank, world_size = self._placement or distributed_placement() or (0, 1)
        info = get_worker_info()
        return (rank, world_size, 0, 1) if info is None else (rank, world_size, info.id, info.num_workers)

    def order(self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """The sample indices a (rank, worker) reads this epoch, in order (see :func:`stream_order`)."""
        return stream_order(
            [info.samples for info in self.dataset.shards.infos],
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            shuffle_buffer=self.shuffle_buffer,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
        )

    def __iter__(self) -> Iterator[tuple[Any, int] | Skipped]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[tuple[Any, int] | Skipped]:
        """This reader's items of the epoch from position ``start`` on (what stoker's loader resumes with).

        The rows before ``start`` are not read: the read that holds row ``start`` is
        made as in an uninterrupted pass and its first items are dropped, so the items
        that follow (and the bad-sample markers among them) are exactly the same.

        Args:
            start: how many of this reader's items to leave out.

        Returns:
            The iterator of the remaining samples and :class:`Skipped` markers.
        """
        rows = self.order(*self.placement())
        first = start // self.read_rows * self.read_rows
        return self._read(rows, first, start - first)

    def _read(self, rows: np.ndarray, first: int, drop: int) -> Iterator[tuple[Any, int] | Skipped]:
        for chunk in self._reads(rows[first:]):  # first is a multiple of read_rows: the same reads
            batch = self.dataset.__getitems__(chunk)
            items: list[Any] = [*batch.skipped, *batch]
            yield from items[drop:] if drop else items
            drop = 0

    def _reads(self, rows: np.ndarray) -> Iterator[np.ndarray]:
        """``rows`` cut into reads of ``read_rows``; a remote set's next shards are fetched ahead meanwhile."""
        return read_ahead(self.dataset.shards, rows, self.read_rows, self.fetch_ahead)

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all its workers together), as for every stoker reader."""
        rank, world_size, _, _ = self.placement()
        return share_size(len(self.dataset), rank, world_size)

    collate_fn = staticmethod(collate)

    def __repr__(self) -> str:
        return f"ShardStream({self.dataset.root!r}, split={self.dataset.split!r}: {len(self.dataset)} samples)"
