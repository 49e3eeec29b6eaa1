"""Fetch ahead while a stream reads: the next shards of a remote set downloaded side by side, each let go when done.

:func:`read_ahead` cuts a reader's rows into reads and plans the shards of a remote
set around them (:class:`~stoker.shards.stream.ShardStream` reads through it): what to
fetch ahead, what to pin in the cache until it is read, and when to let go.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from stoker.shards.cache_entries import entry_cost

if TYPE_CHECKING:
    from stoker.shards.reader import ShardSet

__all__ = ["read_ahead"]

log = logging.getLogger("stoker")
FETCH_THREADS = 4  # downloads at once while a split the cache holds whole is read for the first time


def read_ahead(
    shards: ShardSet, rows: np.ndarray, read_rows: int, ahead: int, *, readers: int = 1, speaks: bool = True
) -> Iterator[np.ndarray]:
    """Cut ``rows`` into reads of ``read_rows``; for a remote set, fetch the next shards while one is read.

    The shards are fetched in the order the reads first need them, those of the current
    read and ``ahead`` beyond, side by side on ``ahead`` threads (so downloads overlap
    each other and the reading). A shard fetched ahead is held (pinned) until it is read,
    so no other reader evicts it first; without a cache limit it is opened (mapped and
    checked) by the thread that fetched it. A split the cache holds whole stays open after
    its reads (the next epoch reads it as a local set is read). A local set is simply
    cut into reads.

    A split larger than its cache (:attr:`ShardSet.tight`) holds nothing between reads:
    each read opens its shards one at a time and lets go of each after its part
    (:meth:`ShardSet.done_with`), and the shards fetched ahead are downloaded but not
    pinned. So no reader, even one blocked while its batches wait to be taken, holds
    room that another waits for; the least recently used shards are evicted first, so
    those about to be read stay.

    ``readers`` is how many readers of this set share the machine's cache (workers x
    ranks of the host) and ``speaks`` whether this one says what the plan cannot promise
    (one reader per machine does): see :func:`_say_readers_share`.
    """
    starts = range(0, len(rows), read_rows)
    if shards.remote is None or len(rows) == 0:
        for start in starts:
            yield rows[start : start + read_rows]
        return
    shard_of = shards.locate(rows)[0]
    read_of = np.arange(len(rows)) // read_rows
    first_read: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for s, r in zip(shard_of.tolist(), read_of.tolist(), strict=True):
        first_read.setdefault(s, r)
        last_read[s] = r
    tight = shards.tight
    if tight:  # fetch ahead only into the room this reader's own reads leave
        ahead = min(ahead, _room_ahead(shards, first_read, last_read, ahead))
        if readers > 1 and speaks:
            _say_readers_share(shards, readers)
    sequence = list(first_read)  # shards in the order they are first needed
    if not tight and all(shards.is_open(s) for s in sequence):  # a warm epoch: nothing to fetch or let go
        for start in starts:
            yield rows[start : start + read_rows]
        return
    ends: dict[int, list[int]] = {}
    for s, r in last_read.items():
        ends.setdefault(r, []).append(s)
    # Threads: the shards of a read are fetched side by side too (a group's first read needs all of them).
    threads = ahead if tight else max(ahead, min(FETCH_THREADS, len(sequence)))
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stoker-fetch") if ahead >= 1 else None
    pending: dict[int, Future[bool]] = {}
    submitted = 0
    pin: Callable[[int], bool] = lambda s: shards.fetch(s, wait=False, pin=not tight)  # noqa: E731
    if shards.cache is not None and shards.cache.limit is None:
        # No limit, so no room to wait for: a shard is opened (mapped and checked) on the thread that fetched it,
        # rather than by the read that first needs it, one shard after another while the fetches wait.
        pin = lambda s: shards.file(s) is not None  # noqa: E731
    try:
        for read, start in enumerate(starts):
            while pool is not None and submitted < len(sequence):
                s = sequence[submitted]
                waiting = sum(1 for t in pending if first_read[t] > read)
                if first_read[s] > read and waiting >= ahead:
                    break
                pending[s] = pool.submit(pin, s)
                submitted += 1
            here = np.unique(shard_of[start : start + read_rows]).tolist()
            for s in here:
                if s in pending:
                    pending.pop(s).result()  # pinned, or no room yet: then the read fetches it
            yield rows[start : start + read_rows]
            for s in ends.get(read, ()) if tight else ():  # a split the cache holds whole stays open
                shards.release(s, done=True)
    finally:
        for future in pending.values():
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
        for s in sequence if tight else ():  # idempotent: an unfinished pass lets go of what it opened or pinned
            shards.release(s)


def _room_ahead(shards: ShardSet, first_read: dict[int, int], last_read: dict[int, int], ahead: int) -> int:
    """Shards a reader of a split larger than its cache fetches ahead: what its limit holds beyond those it reads at once.

    Once per reader, a warning when its reads alone need more shards at once than the
    limit holds, with the smallest limit that fetches each shard once.
    """
    cache = shards.cache
    largest = max(entry_cost(info.bytes) for info in shards.infos)
    if cache is None or cache.shard_room is None or not first_read:
        return ahead
    starts = sorted(first_read.values())
    ends = sorted(last_read.values())
    peak = max(bisect.bisect_right(starts, r) - bisect.bisect_left(ends, r) for r in starts)  # in use at read r
    room = (cache.shard_room or 0) // largest
    if peak > room and not getattr(shards, "_warned_keep", False):
        shards._warned_keep = True  # type: ignore[attr-defined]
        log.warning(
            "%s: the cache limit of %s bytes holds %d shards, but this reader's order reads from %d at once (the "
            "shuffle buffer and the shards merged at once spread each shard's rows): shards evicted before their "
            "last read are fetched again; the smallest limit that fetches each shard once per reader is %s bytes "
            "(--cache-limit, STOKER_CACHE_LIMIT), or use a smaller shuffle_buffer",
            shards.root, f"{cache.limit:,}", room, peak, f"{peak * largest:,}",
        )
    return max(0, room - peak)


def _say_readers_share(shards: ShardSet, readers: int) -> None:
    """Once per process: several readers of a split larger than the cache may fetch a shard more than once an epoch.

    Every reader of a stream reads rows of every shard of a group (see
    :mod:`stoker.shards.stream`), and readers are not in step (ranks have no collective
    between their reads; DataLoader workers run ahead of each other by their prefetch).
    The cache holds its limit and never evicts a shard a reader holds, but a shard that
    one reader is done with can be evicted before a slower reader reaches it, and is then
    downloaded again. Only a limit that holds the whole split promises one download per
    shard and epoch, so that is what this says, rather than a fetch count it cannot keep.
    """
    cache = shards.cache
    if cache is None or cache.limit is None or cache.shard_room is None or getattr(shards, "_warned_share", False):
        return
    shards._warned_share = True  # type: ignore[attr-defined]
    whole = sum(entry_cost(info.bytes) for info in shards.infos) + (cache.limit - cache.shard_room)
    log.warning(
        "%s: %d readers on this machine (workers x ranks of the host) share a cache limit of %s bytes, smaller than "
        "this split; a reader that falls behind the others can find a shard evicted before it reads it, and that shard "
        "is downloaded again (the limit still holds); the limit that downloads each shard once per epoch is %s bytes "
        "(--cache-limit, STOKER_CACHE_LIMIT)",
        shards.root, readers, f"{cache.limit:,}", f"{whole:,}",
    )
