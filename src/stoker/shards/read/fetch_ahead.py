"""Fetch ahead while a stream reads: the next shards of a remote set downloaded side by side, each let go when done.

:func:`read_ahead` cuts a reader's rows into reads and plans the shards of a remote
set around them (:class:`~stoker.shards.read.stream.ShardStream` reads through it): what to
fetch ahead, what to pin in the cache until it is read, and when to let go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from stoker.shards.cache.entries import entry_cost
from stoker.shards.cache.readers import PlanReader

if TYPE_CHECKING:
    from stoker.shards.read.reader import ShardSet

__all__ = ["disk_peak", "read_ahead", "shard_room"]

log = logging.getLogger("stoker")
FETCH_THREADS = 4  # downloads at once while a split the cache holds whole is read for the first time


def read_ahead(
    shards: ShardSet, rows: np.ndarray, read_rows: int, ahead: int, *,
    plan: PlanReader | None = None, times: Sequence[int] | np.ndarray | None = None,
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

    Several readers on one machine (workers, the ranks of a host) are not in step, so under
    such a limit they read by the machine's plan (``plan``, this reader's place in it, and
    ``times``, the time of each of its reads): each read records its time first, and a
    shard not in the cache is downloaded (by the read or ahead of it) only once the plan
    admits it (:meth:`~stoker.shards.cache.readers.PlanReader.wait_admitted`), and once the
    read is taken the reader records one row past it (its shards no longer count as needed by it): a reader
    ahead waits for the slower ones to move on, and each shard is downloaded once per
    epoch and machine when the limit holds the plan's smallest room.
    """
    starts = range(0, len(rows), read_rows)
    # A local set, or a warm epoch of a split the cache holds whole (every shard open): nothing to
    # fetch or let go, so the rows are not located either (that took 0.15 ms a pass: 3 % of a warm pass).
    warm = shards.remote is not None and not shards.tight and all(shards.is_open(s) for s in range(len(shards.infos)))
    if shards.remote is None or len(rows) == 0 or warm:
        for start in starts:
            yield rows[start : start + read_rows]
        return
    shard_of = shards.locate(rows)[0]
    first_read, last_read = _read_span(shard_of, read_rows)
    tight = shards.tight
    sequence = list(first_read)  # shards in the order they are first needed
    record = plan if tight and times is not None else None
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
    cache = shards.cache
    try:
        for read, start in enumerate(starts):
            here = np.unique(shard_of[start : start + read_rows]).tolist()
            if record is not None and cache is not None:  # where this reader is; then its turn for what it downloads
                record.at(int(times[read]))  # type: ignore[index]
                # every shard of the read, cached or not: one cached now may be evicted before the read opens it
                record.wait_admitted([shards.infos[s].sha256 for s in here])
            while pool is not None and submitted < len(sequence):
                s = sequence[submitted]
                waiting = sum(1 for t in pending if first_read[t] > read)
                if first_read[s] > read and (waiting >= ahead or (record is not None and not record.admitted(shards.infos[s].sha256))):
                    break
                pending[s] = pool.submit(pin, s)
                submitted += 1
            for s in here:
                if s in pending:
                    pending.pop(s).result()  # pinned, or no room yet: then the read fetches it
            yield rows[start : start + read_rows]
            for s in ends.get(read, ()) if tight else ():  # a split the cache holds whole stays open
                shards.release(s, done=True)
            if record is not None:  # the read is taken: its shards are no longer needed by it (next_uses)
                record.at(int(times[read]) + 1)  # type: ignore[index]
    finally:
        if record is not None:
            record.close()
        for future in pending.values():
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
        for s in sequence if tight else ():  # idempotent: an unfinished pass lets go of what it opened or pinned
            shards.release(s)


def _read_span(shard_of: np.ndarray, read_rows: int) -> tuple[dict[int, int], dict[int, int]]:
    """``({shard: its first read}, {shard: its last read})`` of rows in shards ``shard_of``, read ``read_rows`` at a time (in first-read order)."""
    shards, first = np.unique(shard_of, return_index=True)
    last = len(shard_of) - 1 - np.unique(shard_of[::-1], return_index=True)[1]
    by_first = np.argsort(first, kind="stable")
    shards, first, last = shards[by_first].tolist(), (first[by_first] // read_rows).tolist(), (last[by_first] // read_rows).tolist()
    return dict(zip(shards, first, strict=True)), dict(zip(shards, last, strict=True))


def disk_peak(shard_of: np.ndarray, read_rows: int) -> int:
    """The most shards a reader of a split larger than its cache needs on disk at once, for rows in shards ``shard_of``.

    A read takes its shards one at a time (:meth:`ShardSet.done_with`), so what must stay
    on disk through read ``r`` is the shards read both in it and in another read (carried
    into it or out of it), and the one being read: a shard read by ``r`` alone costs no
    more than that one.
    """
    return _peak_of_spans(*_read_span(shard_of, read_rows)) if len(shard_of) else 0


def _peak_of_spans(first_read: dict[int, int], last_read: dict[int, int]) -> int:
    """:func:`disk_peak` from each shard's first and last read."""
    reads = int(max(last_read.values())) + 1
    change = np.zeros(reads + 1, dtype=np.int64)  # spans over read r (first_read <= r <= last_read), not within it
    alone = np.zeros(reads, dtype=np.int64)  # 1 where a shard is read by read r alone
    for s, first in first_read.items():
        if last_read[s] > first:
            change[first] += 1
            change[last_read[s] + 1] -= 1
        else:
            alone[first] = 1
    return int((np.cumsum(change)[:reads] + alone).max())


def shard_room(shards: ShardSet) -> int:
    """How many of the set's largest shards its cache's limit holds (shards' own room, without the cached manifests)."""
    cache = shards.cache
    if cache is None or cache.shard_room is None or not shards.infos:
        return 0
    return cache.shard_room // max(entry_cost(info.bytes) for info in shards.infos)
