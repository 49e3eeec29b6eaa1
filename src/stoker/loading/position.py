"""Where a pass stands, across the loader's workers: a pass resumed from a position.

A map-style data set resumes through its sampler (:class:`ResumeSampler` leaves out the
batches already handed out); an iterable one through :func:`iter_from` in each worker
(:class:`Positioned` carries the epoch and each worker's first item into persistent
worker processes), and its batches come back in the order an uninterrupted pass gives
them (:func:`in_worker_order`, over batches tagged by :class:`TagWorker`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import IterableDataset, Sampler

from stoker.loading.collate import Batch
from stoker.loading.contract import SupportsEpoch, SupportsIterFrom
from stoker.loading.placement import worker_placement

__all__ = ["FromWorker", "Positioned", "ResumeSampler", "TagWorker", "as_is", "in_worker_order", "iter_from"]

log = logging.getLogger("stoker")


def iter_from(dataset: Iterable[Any], start: int) -> Iterator[Any]:
    """Iterate ``dataset`` from its item ``start`` on, as cheaply as it allows.

    A data set with an ``iter_from(start)`` method
    (:class:`~stoker.loading.contract.SupportsIterFrom`: ``Pipe``, ``ShardStream``) passes
    over the first items without reading or decoding them; any other iterable is read
    from the beginning and the first ``start`` items are thrown away (logged, since it
    costs as much as reading them).

    Args:
        dataset: an iterable data set.
        start: how many items to leave out.

    Returns:
        The iterator of the remaining items.

    Example:
        >>> list(iter_from(range(5), 3))
        [3, 4]
    """
    if start <= 0:
        return iter(dataset)
    if isinstance(dataset, SupportsIterFrom):
        return dataset.iter_from(start)
    log.info("resuming %s: it has no iter_from(start), so its first %d items are read and discarded",
             type(dataset).__name__, start)
    return islice(iter(dataset), start, None)


class ResumeSampler(Sampler[int]):
    """The loader's sampler; its next pass leaves out the first ``skip`` indices (read no data for them)."""

    def __init__(self, base: Sampler[int]) -> None:
        self.base = base
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        return islice(iter(self.base), skip, None)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]


class Positioned(IterableDataset):
    """An iterable data set as the loader's workers run it: in the loader's epoch, from the loader's position.

    The epoch and each worker's first item sit in a shared-memory tensor, so persistent
    worker processes, which never see an attribute set in the main process after they
    started, read the values of the epoch that is starting.

    Args:
        dataset: the iterable data set.
        workers: the loader's worker slots (1 for reading in the calling process).
        whole_batches: ``(batch_size, drop_last)`` for a reader that hands its batches over
            whole (:class:`~stoker.loading.contract.SupportsBatchesFrom`, or
            :class:`~stoker.loading.contract.SupportsBatchLists` with ``collate``): each
            item is then a :class:`FromWorker` batch, and a worker's last batch of fewer
            than ``batch_size`` items is dropped under ``drop_last``, as a DataLoader drops
            it. None: the items themselves, for the DataLoader to batch.
        batch_split: the loader's batch size, for a reader that deals its rank's order to
            the workers a batch at a time (:class:`~stoker.loading.contract.SupportsBatchSplit`):
            told again in each worker before each epoch.
        collate: the loader's collate function, for a reader's batch lists.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        workers: int,
        whole_batches: tuple[int, bool] | None = None,
        *,
        batch_split: int | None = None,
        collate: Callable[[Any], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.control = torch.zeros(1 + workers, dtype=torch.int64).share_memory_()  # [epoch, start of worker 0, ...]
        self.whole_batches = whole_batches
        self.batch_split = batch_split
        self.collate = collate

    def __iter__(self) -> Iterator[Any]:
        worker, _ = worker_placement()
        epoch, start = int(self.control[0]), int(self.control[1 + worker])
        if isinstance(self.dataset, SupportsEpoch):
            self.dataset.set_epoch(epoch)
        if self.batch_split is not None:  # set only for a SupportsBatchSplit reader that said yes
            self.dataset.split_by_batch(self.batch_split)  # type: ignore[attr-defined]
        if self.whole_batches is not None:  # set only for a reader of whole batches (the loader asked)
            return self._batches(worker, start, *self.whole_batches)
        return iter_from(self.dataset, start)

    def _batches(self, worker: int, start: int, batch_size: int, drop_last: bool) -> Iterator[FromWorker]:
        if self.collate is None:
            batches = self.dataset.batches_from(start, batch_size)  # type: ignore[attr-defined]
        else:
            batches = self._collated(self.dataset.batch_lists_from(start, batch_size), self.collate)  # type: ignore[attr-defined]
        for items, batch in batches:
            if drop_last and items < batch_size:
                return
            yield FromWorker(worker, batch)

    @staticmethod
    def _collated(lists: Iterator[tuple[int, list[Any]]], collate: Callable[[Any], Any]) -> Iterator[tuple[int, Any]]:
        """Each batch list collated; one its later stages left empty is an empty :class:`Batch` (not yielded)."""
        for items, samples in lists:
            yield items, (collate(samples) if samples else Batch(None, 0))

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


def as_is(item: Any) -> Any:
    """The DataLoader's collate for items that are batches already (picklable, for worker processes)."""
    return item


class FromWorker:
    """A batch and the id of the worker that made it (an iterable data set's batches come from one worker each)."""

    __slots__ = ("batch", "worker")

    def __init__(self, worker: int, batch: Any) -> None:
        self.worker, self.batch = worker, batch

    def pin_memory(self) -> FromWorker:
        """Called by the DataLoader's pin-memory thread when the device is CUDA."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return FromWorker(self.worker, pin_memory(self.batch))


class TagWorker:
    """A collate function that also says which worker made the batch."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> FromWorker:
        return FromWorker(worker_placement()[0], self.collate_fn(samples))


def in_worker_order(batches: Iterator[FromWorker], workers: int, first: int) -> Iterator[FromWorker]:
    """Batches of an iterable data set in the order an uninterrupted epoch gives them.

    A DataLoader takes the workers' batches round robin, starting at worker 0, and
    leaves a worker out once its stream ends. A resumed epoch must continue the
    round at ``first``, the worker after the one that gave the last batch: the batches
    are held (at most one per worker) until it is their turn. A worker is known to be
    done when the DataLoader passes it over, or when the DataLoader ends.
    """
    queues: list[deque[FromWorker]] = [deque() for _ in range(workers)]
    done = [False] * workers
    expect, turn = first, 0  # our next worker; the DataLoader's next worker

    def ready(final: bool) -> Iterator[FromWorker]:
        nonlocal expect
        while True:
            if queues[expect]:
                yield queues[expect].popleft()
                expect = (expect + 1) % workers
            elif done[expect] or final:
                if all(not q for q in queues):
                    return
                expect = (expect + 1) % workers
            else:
                return

    for batch in batches:
        while turn != batch.worker:  # the DataLoader passed these workers over: their streams ended
            done[turn] = True
            turn = (turn + 1) % workers
        turn = (batch.worker + 1) % workers
        queues[batch.worker].append(batch)
        yield from ready(final=False)
    yield from ready(final=True)
