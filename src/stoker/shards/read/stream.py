"""``ShardStream``: an iterable torch Dataset over a shard set — several shards read at once, then a buffer.

Each epoch, the shards of the split are put in a seeded random order and cut into groups
of at most ``shards_at_once`` consecutive shards (:data:`SHARDS_AT_ONCE` for a local set,
:data:`REMOTE_SHARDS_AT_ONCE` for a set at a URL, fewer when the cache holds fewer). The
rows of a group are merged at random, each shard's rows in their stored order, so a file
is read in runs and a batch mixes the classes of a whole group of shards, however the
pack was cut. That sequence is split by the rule of :mod:`stoker.order`: rank ``r`` of
``R`` takes every ``R``-th row, shuffles its share through a buffer of ``shuffle_buffer``
rows, and deals it to its workers a batch at a time (:meth:`ShardStream.split_by_batch`),
so a rank's batches do not depend on the worker count or the backend. Every sample is
read exactly once per epoch; nothing is trimmed (:func:`stream_order` is the rule).

For a set at a URL, each shard is a file in the local cache, fetched ahead while the one
before is read (:mod:`stoker.shards.read.fetch_ahead`). When the split is larger than
``cache_limit``, ``shards_at_once`` and ``fetch_ahead`` are lowered to fit (:func:`cache_plan`)
and the machine's readers read by one plan (:meth:`ShardStream.machine_plan`,
:mod:`stoker.shards.cache.readers`). ``len(stream)`` is what this rank reads per epoch,
all its workers together. The guides say more: ``docs/guides/loading.md`` ("The order of
an epoch, exactly") and ``docs/guides/remote.md`` ("One reading plan per machine").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from stoker.errors import ConfigError
from stoker.loading.collate import Batch, collate
from stoker.loading.contract import (
    StreamReader,
    SupportsBatchesFrom,
    SupportsBatchSplit,
    SupportsLoaderDefaults,
    SupportsOrderPlan,
)
from stoker.loading.placement import distributed_placement, local_rank, local_ranks, worker_placement
from stoker.loading.skips import OnError, Skipped
from stoker.order import (
    BUFFER,
    INTERLEAVE,
    buffer_shuffle_array,
    check_placement,
    epoch_rng,
    permutation,
    share,
    share_size,
)
from stoker.shards.cache.entries import entry_cost
from stoker.shards.cache.readers import MachinePlan, PlanReader, pass_tag
from stoker.shards.read.dataset import ShardDataset, collate_shard_batch
from stoker.shards.read.fetch_ahead import disk_peak, read_ahead, shard_room

__all__ = [
    "READ_ROWS",
    "REMOTE_SHARDS_AT_ONCE",
    "SHARDS_AT_ONCE",
    "ShardStream",
    "cache_plan",
    "shard_groups",
    "shards_at_once_for",
    "stream_order",
]

log = logging.getLogger("stoker")
READ_ROWS = 256  # rows a read gathers (and a worker takes at a time) when neither the caller nor a loader said
# Shards whose rows are merged into one stretch of the epoch: a batch mixes about this many
# shards' classes. A local file open at once costs an address range and shorter runs per read
# (read_rows / shards_at_once rows of each file); a remote one costs a cached file on disk and
# its download before the first batch, hence fewer.
SHARDS_AT_ONCE = 32
REMOTE_SHARDS_AT_ONCE = 8



def _local_rank_list(rank: int, world_size: int) -> list[int]:
    """The ranks on this machine: torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` place them; without them, every rank."""
    count = min(local_ranks(unknown=world_size), world_size)
    here = local_rank(unknown=-1)
    first = rank - here if 0 <= here <= rank else rank - rank % count
    first = max(0, min(first, world_size - count))
    return list(range(first, first + count)) if first <= rank < first + count else [rank]


def shard_groups(shard_order: np.ndarray, shards_at_once: int) -> list[np.ndarray]:
    """``shard_order`` cut into the fewest groups of at most ``shards_at_once`` consecutive shards, as equal as can be.

    Example:
        >>> [g.tolist() for g in shard_groups(np.arange(10), 4)]
        [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    """
    if shards_at_once < 1:
        raise ConfigError(f"shards_at_once must be >= 1, got {shards_at_once}")
    count = -(-len(shard_order) // shards_at_once)
    return [g for g in np.array_split(np.asarray(shard_order, dtype=np.int64), max(count, 1)) if len(g)]


def _merged(groups: list[np.ndarray], sizes: np.ndarray, starts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The rows of each group of shards merged at random (each shard's rows in order), the groups end to end.

    The merge is uniform over the ways to interleave the group's shards: which shard
    each place of the stretch reads is a random permutation of the group's rows' shards.
    """
    parts = []
    for group in groups:
        members = np.sort(group)  # shard numbers ascending: their rows are ascending too
        rows = np.concatenate([np.arange(starts[k], starts[k + 1], dtype=np.int64) for k in members])
        if len(members) == 1:
            parts.append(rows)
            continue
        shard_of = np.repeat(members, sizes[members])[rng.permutation(len(rows))]  # the shard each place reads
        merged = np.empty_like(rows)
        merged[np.argsort(shard_of, kind="stable")] = rows  # each shard's places, in order, take its rows in order
        parts.append(merged)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


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
    block_rows: int = READ_ROWS,
    shards_at_once: int = SHARDS_AT_ONCE,
) -> np.ndarray:
    """The sample indices one (rank, worker) reads in one epoch, in the order it reads them.

    The indices are ``int64``, into the split as :class:`ShardDataset` numbers them. The
    rank's order (its share of the epoch, through its buffer) does not depend on the
    workers; worker ``w`` of ``N`` reads its blocks ``w, w + N, ...`` of ``block_rows`` rows.

    Args:
        shard_sizes: samples in each shard of the split, in manifest order.
        seed, epoch: fix the shard order, the merge of each group and the buffer's draws.
        shuffle: shuffle shards, merge groups and run the buffer; False: stored order.
        shuffle_buffer: rows in the rank's shuffle buffer.
        rank, world_size, worker, num_workers: which part of the epoch to read.
        block_rows: rows dealt to one worker at a time (the loader's batch size).
        shards_at_once: shards merged into one stretch of the epoch (1: one after the other).

    Example:
        >>> order = [stream_order([3, 3], seed=0, epoch=0, shuffle=True, shuffle_buffer=4, rank=0,
        ...                       world_size=1, worker=w, num_workers=2, block_rows=2) for w in (0, 1)]
        >>> sorted(np.concatenate(order).tolist())
        [0, 1, 2, 3, 4, 5]
        >>> one = stream_order([3, 3], seed=0, epoch=0, shuffle=True, shuffle_buffer=4, rank=0,
        ...                    world_size=1, worker=0, num_workers=1)
        >>> np.concatenate([one[0:2], one[4:6]]).tolist() == order[0].tolist()  # worker 0 reads blocks 0 and 2
        True
    """
    check_placement(rank, world_size, worker, num_workers, where="stream_order")
    if block_rows < 1:
        raise ConfigError(f"block_rows must be >= 1, got {block_rows}")
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if shuffle:
        groups = shard_groups(permutation(len(sizes), seed, epoch), shards_at_once)
        sequence = _merged(groups, sizes, starts, epoch_rng(seed, epoch, INTERLEAVE))
    else:
        sequence = np.arange(int(starts[-1]), dtype=np.int64)
    mine = share(sequence, rank, world_size)
    if shuffle:  # the rank's buffer: drawn as the one worker of a rank always drew it
        mine = buffer_shuffle_array(mine, shuffle_buffer, epoch_rng(seed, epoch, BUFFER, rank, 0))
    return share(mine, 0, 1, worker, num_workers, block=block_rows)


def cache_plan(shard_bytes: list[int], cache_limit: int, fetch_ahead: int, overhead: int = 0) -> tuple[int, int]:
    """``(most shards at once, shards fetched ahead)`` that a stream's readers on one machine keep within ``cache_limit``.

    The readers of a machine (workers, ranks) read the same group of shards at the
    same time, and at a group's end some have moved on to the next group while others
    finish this one: together they hold up to two groups, plus the shards fetched
    ahead. So a limit that holds ``n`` of the largest shards (each with its stamp,
    :func:`~stoker.shards.cache.entries.entry_cost`) gives ``fetch_ahead`` (at most
    ``n - 2``) and groups of ``(n - fetch_ahead) // 2`` shards. ``cache_limit`` is the room
    for shards (:attr:`~stoker.shards.cache.store.ShardCache.shard_room`); ``overhead``, what
    the cache's own files take besides, goes into the message.

    Raises:
        ConfigError: the limit holds fewer than two shards; the message gives the smallest limit that works.

    Example:
        >>> cache_plan([2**20] * 20, 10 * 2**20, 2)
        (3, 2)
    """
    largest = entry_cost(max(shard_bytes))
    room = int(cache_limit) // largest
    if room < 2:
        raise ConfigError(
            f"cache_limit {int(cache_limit) + overhead:,} bytes"
            f"{f' ({overhead:,} of them for the cached manifests)' if overhead else ''} holds {room} of the largest "
            f"shard ({max(shard_bytes):,} bytes, {largest:,} in the cache), and a stream reads 2 at once at a group's "
            f"edge; the smallest limit that works is {2 * largest + overhead:,} bytes (--cache-limit, STOKER_CACHE_LIMIT)"
        )
    ahead = max(0, min(fetch_ahead, room - 2))
    return max(1, (room - ahead) // 2), ahead


def shards_at_once_for(
    shard_bytes: list[int], wanted: int = SHARDS_AT_ONCE, cache_limit: int | None = None, fetch_ahead: int = 0
) -> int:
    """Shards a stream merges at once: ``wanted``, at most the shards there are, and what a cache limit holds.

    A remote set keeps every shard being read in its local cache, and ``fetch_ahead``
    more on the way; with ``cache_limit`` bytes, see :func:`cache_plan` (a split that
    fits in the limit whole is not limited by it).

    Example:
        >>> shards_at_once_for([100] * 20), shards_at_once_for([100] * 3), shards_at_once_for([2**20] * 20, 8, 10 * 2**20, 2)
        (20, 3, 3)
    """
    if isinstance(wanted, bool) or not isinstance(wanted, (int, np.integer)) or wanted < 1:
        raise ConfigError(f"shards_at_once must be a positive integer, got {wanted!r}")
    fits = int(wanted)
    if cache_limit is not None and shard_bytes and sum(entry_cost(b) for b in shard_bytes) > cache_limit:
        fits = min(fits, cache_plan(shard_bytes, cache_limit, fetch_ahead)[0])
    return max(1, min(fits, len(shard_bytes)))


class ShardStream(
    IterableDataset, StreamReader, SupportsBatchesFrom, SupportsBatchSplit, SupportsLoaderDefaults, SupportsOrderPlan
):
    """An iterable torch Dataset over one split of a shard set: every sample once per epoch.

    For an exact global shuffle use the map-style :class:`ShardDataset`. Each rank deals its
    share of the epoch to its workers a batch at a time (see the module docs); under torch's
    own DataLoader, give ``read_rows`` its ``batch_size``. The epoch (:meth:`set_epoch`, which
    stoker's loader calls) lives in shared memory, so persistent workers follow it.

    Args:
        root, split: the folder ``stoker pack`` wrote, and which split to read.
        transform, on_error: applied to each uint8 CHW image; ``"raise"`` or ``"skip"`` what fails to decode.
        shuffle, shuffle_buffer, seed: shuffle shards and rows each epoch (default True),
            through a buffer of this many rows per reader, from this base seed.
        rank, world_size: this process's place among ranks; default from ``torch.distributed``.
        read_rows: rows per read; default the first stoker loader's batch size (:meth:`take_batch_size`).
        cache_dir, cache_limit, storage_options, fetch_ahead: for a set at a URL (see
            :class:`ShardDataset`), and the shards downloaded ahead of the one being read.
        shards_at_once: shards merged into one stretch of the epoch (the attribute: the number
            used); the order depends on it, so give a local copy and its URL the same value.

    Example:
        >>> from stoker import make_loader
        >>> stream = ShardStream("packed", split="train", shuffle_buffer=16)
        >>> sum(len(labels) for _, labels in make_loader(stream, batch_size=8, num_workers=0)) == len(stream)
        True
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
        read_rows: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        fetch_ahead: int = 2,
        shards_at_once: int | None = None,
    ) -> None:
        if shuffle_buffer < 1 or (read_rows is not None and read_rows < 1):
            raise ConfigError(f"shuffle_buffer and read_rows must be >= 1, got {shuffle_buffer} and {read_rows}")
        if (rank is None) != (world_size is None):
            raise ConfigError("give rank and world_size together, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank} is out of range for world_size={world_size}")
        self.dataset = ShardDataset(
            root, split, transform, on_error,
            cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
        )
        shards = self.dataset.shards
        shards.streaming = True  # this stream lets go of each shard after its last read (read_ahead)
        infos = shards.infos
        cache = shards.cache
        limit = cache.shard_room if cache is not None and shards.tight else None  # a split that fits whole is not limited
        if limit is not None and cache is not None and cache.limit is not None and infos:
            fetch_ahead = cache_plan([info.bytes for info in infos], limit, fetch_ahead, cache.limit - limit)[1]
        self.fetch_ahead = fetch_ahead
        wanted = shards_at_once if shards_at_once is not None else SHARDS_AT_ONCE if cache is None else REMOTE_SHARDS_AT_ONCE
        self.shards_at_once = shards_at_once_for([info.bytes for info in infos], wanted, limit, fetch_ahead)
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self._read_rows = read_rows  # None: the first loader's batch size (take_batch_size)
        self._block: int | None = None  # rows dealt to a worker at a time: the loader's batch size (split_by_batch)
        self._plans: dict[tuple[int, ...], tuple[MachinePlan, int, list[np.ndarray]]] = {}  # machine_plan's, by epoch and placement
        self._placement = (rank, world_size) if rank is not None and world_size is not None else None
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._said_buffer = False
        self._main_says = False  # the rank's own process said the buffer (set_epoch there): its worker processes do not
        self._said_room = False

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch the next iteration reads (its shard order and buffer draws).

        Called in the rank's own process (stoker's loader does, before its workers start), it is that process that
        says a buffer lowered for a tight cache (:meth:`order`), once per run; its worker processes never do.
        """
        self._epoch.fill_(int(epoch))
        if torch.utils.data.get_worker_info() is None and worker_placement() == (0, 1):
            self._main_says = True
            if self.shuffle and self.dataset.shards.tight and not self._said_buffer:
                self._reader_order(*self.placement()[:2])  # says it when this epoch's order lowers the buffer

    def placement(self) -> tuple[int, int, int, int]:
        """``(rank, world_size, worker, num_workers)`` of the current process (or loader thread)."""
        rank, world_size = self._placement or distributed_placement() or (0, 1)
        return (rank, world_size, *worker_placement())

    @property
    def block_rows(self) -> int:
        """Rows of the rank's order dealt to one worker at a time: the loader's batch size, else :attr:`read_rows`."""
        return self._block if self._block is not None else self.read_rows

    @property
    def elastic(self) -> bool:
        """True: its batches follow no worker count (:meth:`split_by_batch`), so defaults and the adaptation may change it."""
        return True

    def split_by_batch(self, batch_size: int) -> bool:
        """Deal the rank's order to the workers a batch of ``batch_size`` rows at a time (stoker's loader calls it).

        Returns:
            True: its batches are then the same for any worker count.
        """
        self._block = int(batch_size)
        return True

    def order(self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """The sample indices a (rank, worker) reads this epoch, in order (see :func:`stream_order`).

        A split larger than its cache is read with a smaller buffer where the rank's order
        would otherwise need more shards on disk at once than the limit holds
        (:func:`~stoker.shards.read.fetch_ahead.disk_peak`): halved until it fits, and said
        once per run by the rank's own process (by worker 0 of each epoch where no
        :meth:`set_epoch` ran there). The rank's order decides it, so every worker count reads the same.
        """
        return share(self._reader_order(rank, world_size), 0, 1, worker, num_workers, block=self.block_rows)

    def _reader_order(self, rank: int, world_size: int) -> np.ndarray:
        """The order of the rank (worker 0 of 1), its buffer lowered to fit a tight cache."""
        shards = self.dataset.shards
        buffer = self.shuffle_buffer
        while True:
            rows = stream_order(
                [info.samples for info in shards.infos],
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                shuffle_buffer=buffer,
                rank=rank,
                world_size=world_size,
                worker=0,
                num_workers=1,
                block_rows=self.block_rows,
                shards_at_once=self.shards_at_once,
            )
            if not (self.shuffle and shards.tight) or buffer == 1:
                break
            peak, room = disk_peak(shards.locate(rows)[0], self.read_rows), shard_room(shards)
            if peak <= room:
                break
            if not self._said_buffer and self._says_buffer_here():
                self._said_buffer = True
                log.warning(
                    "%s: the shuffle buffer of %d rows is lowered for rank %d until its reads need at most the %d "
                    "shards the cache limit holds at once (with %d rows they need %d); a larger --cache-limit keeps "
                    "the buffer", shards.root, self.shuffle_buffer, rank, room, buffer, peak,
                )
            buffer //= 2
        return rows

    def _says_buffer_here(self) -> bool:
        """Whether this process says the lowered buffer: the rank's own process (and its loader threads); a worker
        process only where the rank's process never set the epoch (a plain DataLoader), and then worker 0 alone."""
        info = torch.utils.data.get_worker_info()
        return info is None or (not self._main_says and info.id == 0)

    @property
    def loader_defaults(self) -> dict[str, Any]:
        """The loader settings a stream over pixel shards reads fastest with: in the training process (``num_workers=0``).

        As for the map-style :class:`ShardDataset`, a pixel read is a copy out of the
        memory-mapped files, and shipping it from a worker process costs several times
        more (``benchmarks/bench_peers.py``, the ShardStream rows). Encoded shards say
        nothing, so the loader's default rule (:mod:`stoker.loading.workers`) applies; the
        worker count is a speed setting only, since a stream's batches do not depend on it.
        """
        return {"backend": "process", "num_workers": 0} if self.dataset.store == "pixels" else {}

    def order_plan(self) -> dict[str, Any]:
        """What fixes the order besides seed, epoch and placement; the loader refuses a mid-epoch resume under another.

        ``cache_room`` (the shards a limit smaller than the split holds, else None) plans
        each reader's buffer (:meth:`order`), as ``shards_at_once`` may be lowered by it.
        """
        shards = self.dataset.shards
        return {
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "shards_at_once": self.shards_at_once,
            "read_rows": self.read_rows,
            "cache_room": shard_room(shards) if self.shuffle and shards.tight else None,
        }

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
        size = self._read_size()
        first = start // size * size
        return self._read(rows, first, start - first)

    def _read(self, rows: np.ndarray, first: int, drop: int) -> Iterator[tuple[Any, int] | Skipped]:
        for chunk in self._reads(rows, first):  # first is a multiple of the read size: the same reads
            batch = self.dataset.__getitems__(chunk)
            items: list[Any] = [*batch.skipped, *batch]
            yield from items[drop:] if drop else items
            drop = 0

    @property
    def read_rows(self) -> int:
        """Rows gathered per read: as given, else the first loader's batch size, else :data:`READ_ROWS`."""
        return self._read_rows if self._read_rows is not None else READ_ROWS

    def take_batch_size(self, batch_size: int) -> bool:
        """Told by a loader made over it: True when its reads are that loader's batches (it takes :meth:`batches_from`).

        A stream made without ``read_rows`` reads in batches of the first loader's
        ``batch_size`` from then on. Item by item, a batch is the items of one read (its
        bad samples' markers first), so a read's rows collated at once are exactly that
        batch; with reads of another size a batch would straddle two, and that loader
        reads item by item.
        """
        if self._read_rows is None:
            self._read_rows = int(batch_size)
        return batch_size == self._read_rows

    def batches_from(self, start: int, batch_size: int) -> Iterator[tuple[int, Batch]]:
        """This reader's batches of the epoch from item ``start`` on, each read collated whole (``(items, batch)``).

        The batches :func:`~stoker.make_loader` gives item by item, without handing each
        image through Python and copying it into a batch again (``benchmarks/bench_peers.py``,
        the ShardStream rows).

        Raises:
            ConfigError: ``batch_size`` is not ``read_rows``, or ``start`` not a multiple of it.
        """
        if batch_size != self.read_rows or start % batch_size:
            raise ConfigError(f"batches_from: reads of {self.read_rows} rows cannot give batches of {batch_size} "
                              f"from item {start}; read item by item (iter_from)")
        rows = self.order(*self.placement())
        for chunk in self._reads(rows, start):
            yield len(chunk), collate_shard_batch(self.dataset.__getitems__(chunk))

    def _read_size(self) -> int:
        """Rows per read: :attr:`read_rows`, or a worker's block where that would cut reads across its blocks.

        Item by item, a read's bad-sample markers come first; a read inside one block
        (one batch) keeps every sample in its batch whatever the worker count.
        """
        if self.block_rows % self.read_rows == 0:
            return self.read_rows
        return self.block_rows

    def _reads(self, rows: np.ndarray, first: int) -> Iterator[np.ndarray]:
        """``rows[first:]`` cut into reads (:meth:`_read_size`); a remote set's next shards are fetched ahead meanwhile.

        A split larger than its cache reads by the machine's plan (:meth:`machine_plan`).
        """
        shards = self.dataset.shards
        size = self._read_size()
        if shards.remote is None or shards.cache is None or not shards.tight or not len(rows):
            return read_ahead(shards, rows[first:], size, self.fetch_ahead)
        rank, world_size, worker, num_workers = self.placement()
        plan, me, times = self.machine_plan(rank, world_size, worker, num_workers)
        tag = pass_tag(  # what fixes the stream's orders: every reader of it on this machine names it alike
            shards.root, shards.split, [info.sha256 for info in shards.infos], self.seed, world_size,
            num_workers, self.block_rows, size, sorted(self.order_plan().items()),
        )
        record = PlanReader(shards.cache.root, tag, self.epoch, me, plan)
        # Said by the machine's first reader, once per run: a DataLoader worker is new each epoch, its rank's process is not.
        run = os.getppid() if torch.utils.data.get_worker_info() is not None else os.getpid()
        if me == 0 and not self._said_room and record.first_time(f"room-{run}"):
            self._say_room()
        return read_ahead(shards, rows[first:], size, self.fetch_ahead, plan=record, times=times[me][first // size :])

    def machine_plan(
        self, rank: int, world_size: int, worker: int, num_workers: int
    ) -> tuple[MachinePlan, int, list[np.ndarray]]:
        """The plan of this epoch's readers on this machine: ``(plan, this reader's number, each reader's read times)``.

        The machine's readers are its ranks (``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` under
        torchrun; without them every rank counts as local) times ``num_workers``; reader
        ``n`` is local rank ``n // num_workers``, worker ``n % num_workers``. A read's time
        is the place of its first row in its rank's order (the ranks read the same stretch
        of the epoch at once). The window is the widest whose shards fit in the limit
        (:meth:`MachinePlan.window_for`).
        """
        size = self._read_size()
        key = (self.epoch, rank, world_size, num_workers, size, self.block_rows)
        if key not in self._plans:
            shards = self.dataset.shards
            ranks = _local_rank_list(rank, world_size)
            uses: list[dict[str, list[int]]] = []
            times: list[np.ndarray] = []
            shas = [info.sha256 for info in shards.infos]
            for r in ranks:
                order = self._reader_order(r, world_size)
                shard_of = shards.locate(order)[0] if len(order) else np.zeros(0, dtype=np.int64)
                places = np.arange(len(order), dtype=np.int64)
                for w in range(num_workers):
                    mine = share(places, 0, 1, w, num_workers, block=self.block_rows)
                    read = np.arange(len(mine), dtype=np.int64) // size
                    at = mine[::size]
                    pairs = np.unique(read * len(shas) + shard_of[mine])  # (read, shard), by read then shard
                    plan: dict[str, list[int]] = {}
                    for r_, s_ in zip((pairs // len(shas)).tolist(), (pairs % len(shas)).tolist(), strict=True):
                        plan.setdefault(shas[s_], []).append(int(at[r_]))
                    uses.append(plan)
                    times.append(at)
            room = shard_room(shards)
            machine, need = MachinePlan.window_for(tuple(uses), room)
            self._plans = {key: (machine, need, times)}  # one epoch's at a time
        machine, need, times = self._plans[key]
        me = _local_rank_list(rank, world_size).index(rank) * num_workers + worker
        return machine, me, times

    def _say_room(self) -> None:
        """Once, when the limit holds fewer shards than the machine's plan needs at once: the smallest limit that does."""
        shards = self.dataset.shards
        cache = shards.cache
        need = self._plans[next(iter(self._plans))][1]
        room = shard_room(shards)
        self._said_room = True
        if cache is None or cache.limit is None or cache.shard_room is None or need <= room:
            return
        largest = max(entry_cost(info.bytes) for info in shards.infos)
        log.warning(
            "%s: the cache limit of %s bytes holds %d shards, but the readers of this machine need %d at once: some "
            "shards are downloaded more than once per epoch; the smallest limit that downloads each once per epoch "
            "per machine is %s bytes (--cache-limit, STOKER_CACHE_LIMIT), or use a smaller shuffle_buffer",
            shards.root, f"{cache.limit:,}", room, need, f"{need * largest + cache.limit - cache.shard_room:,}",
        )

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all its workers together), as for every stoker reader."""
        rank, world_size, _, _ = self.placement()
        return share_size(len(self.dataset), rank, world_size)

    collate_fn = staticmethod(collate)

    def __repr__(self) -> str:
        return f"ShardStream({self.dataset.root!r}, split={self.dataset.split!r}: {len(self.dataset)} samples)"
