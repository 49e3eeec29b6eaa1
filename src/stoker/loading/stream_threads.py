"""The thread backend for an iterable data set: one thread per worker slot, batches taken round robin.

Each thread runs a copy of the loader's :class:`~stoker.loading.position.Positioned` data
set as worker ``w`` of ``N`` (:func:`~stoker.loading.placement.as_worker`), exactly as a
DataLoader worker process would, and makes its batches; the batches are handed over as a
DataLoader hands over its workers' (worker 0's first, worker 1's first, ..., a worker
that has run out passed over). A reader that deals its rank's order a batch at a time
(:class:`~stoker.loading.contract.SupportsBatchSplit`) therefore gives the same batches
on threads as in worker processes.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from stoker.loading.backends import init_loader_thread
from stoker.loading.placement import as_worker
from stoker.loading.position import FromWorker, Positioned

__all__ = ["thread_batches"]

_END = object()  # a thread's stream has ended
_POLL_S = 0.1  # how often a thread blocked on a full queue looks whether the epoch was abandoned


def thread_batches(
    positioned: Positioned, workers: int, batch_size: int, drop_last: bool, collate: Callable[[Any], Any], depth: int,
    init: Callable[[], None] = init_loader_thread,
) -> Iterator[FromWorker]:
    """One epoch of ``positioned`` read by ``workers`` threads, each holding at most ``depth`` batches ahead.

    Items that are not batches yet (``positioned.whole_batches`` is None) are cut into
    batches of ``batch_size`` by each thread and collated, as a DataLoader worker does.
    An error in a thread is raised here, in its turn. Each thread runs ``init`` first.
    """
    stop = threading.Event()
    queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=max(depth, 1)) for _ in range(workers)]

    def put(worker: int, item: Any) -> bool:
        while not stop.is_set():
            try:
                queues[worker].put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run(worker: int) -> None:
        init()
        mine = copy.copy(positioned)  # a data set of its own, as a worker process has (iteration counts, batch split)
        mine.dataset = copy.copy(positioned.dataset)
        try:
            with as_worker(worker, workers):
                for batch in _batches(mine, worker, batch_size, drop_last, collate):
                    if not put(worker, batch):
                        return
        except BaseException as exc:  # raised in the consumer, in this worker's turn
            put(worker, exc)
            return
        put(worker, _END)

    threads = [threading.Thread(target=run, args=(w,), name=f"stoker-stream-{w}", daemon=True) for w in range(workers)]
    for thread in threads:
        thread.start()
    try:
        turns = deque(range(workers))
        while turns:
            item = queues[turns[0]].get()
            if item is _END:
                turns.popleft()
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            turns.rotate(-1)
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _batches(
    positioned: Positioned, worker: int, batch_size: int, drop_last: bool, collate: Callable[[Any], Any]
) -> Iterator[FromWorker]:
    """This worker's batches: as the reader hands them over, else its items cut and collated here."""
    items = iter(positioned)
    if positioned.whole_batches is not None:
        yield from items
        return
    while chunk := list(islice(items, batch_size)):
        if drop_last and len(chunk) < batch_size:
            return
        yield FromWorker(worker, collate(chunk))
