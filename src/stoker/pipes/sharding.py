"""Split a stream between DataLoader workers and torch.distributed ranks.

The split is the rule of :mod:`stoker.order`, the same for every stoker reader: with
``R`` ranks of ``N`` workers each, item ``i`` of the stream (counted from 0 where the
``shard`` stage stands) is read by rank ``i % R``, and within that rank's share (item
``j = i // R`` of it) by worker ``j % N``. So the worker ``w`` of rank ``r`` keeps the
items with ``i % (R * N) == r + R * w``. The shares are disjoint and together hold every
item, so an epoch over all of them sees each item exactly once; each rank reads the
same items as a map-style sampler's rank share of the same order would, and nothing
is trimmed here (the stream's length need not be known).

Under stoker's loader a rank deals its share to its workers a whole batch at a time
(``block`` of the iteration's :class:`~stoker.pipes.context.Context`, the loader's batch
size; see :meth:`Pipe.split_by_batch`): worker ``w`` keeps batches ``w, w + N, ...`` of
the rank's share, so a batch holds the same items whatever the worker count.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from stoker.errors import ConfigError
from stoker.order import check_placement, iter_share, share_size
from stoker.pipes.compose import Step

if TYPE_CHECKING:
    from stoker.pipes.context import Context

__all__ = ["shard_items", "shard_length", "shard_step"]

T = TypeVar("T")


def _placement(
    rank: int | None, world_size: int | None, worker: int | None, num_workers: int | None, context: Context
) -> tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)``: the overrides, else where the iteration runs."""
    return (
        context.rank if rank is None else rank,
        context.world_size if world_size is None else world_size,
        context.worker if worker is None else worker,
        context.num_workers if num_workers is None else num_workers,
    )


def shard_items(
    items: Iterator[T],
    rank: int | None,
    world_size: int | None,
    worker: int | None,
    num_workers: int | None,
    *,
    context: Context,
) -> Iterator[T]:
    """The ``shard`` stage: keep this (rank, worker)'s share; ``None`` means "as running"."""
    rank_, world_size_, worker_, num_workers_ = _placement(rank, world_size, worker, num_workers, context)
    check_placement(rank_, world_size_, worker_, num_workers_, where="shard")
    block = context.block if worker is None else 1  # a worker override deals item by item, as it always did
    yield from iter_share(items, rank_, world_size_, worker_, num_workers_, block=block)


def shard_length(
    rank: int | None, world_size: int | None, worker: int | None, num_workers: int | None, n: int, *, context: Context
) -> int:
    """Items the ``shard`` stage keeps of ``n``, for this rank: all its workers together, or the
    one worker given as an override (see :meth:`Pipe.__len__`).

    Example:
        >>> from stoker.pipes.context import Context
        >>> shard_length(None, None, None, None, 10, context=Context(rank=1, world_size=3))
        3
    """
    rank_, world_size_, worker_, num_workers_ = _placement(rank, world_size, worker, num_workers, context)
    check_placement(rank_, world_size_, worker_, num_workers_, where="shard")
    return share_size(n, rank_, world_size_, worker, num_workers_)


def shard_step(
    rank: int | None = None,
    world_size: int | None = None,
    worker: int | None = None,
    num_workers: int | None = None,
) -> Step:
    """Check the overrides of ``Pipe.shard`` and make its step.

    Raises:
        ConfigError: only one of a pair (rank and world_size, worker and num_workers)
            was given, or a value is out of range.
    """
    for index_name, index, count_name, count in (
        ("rank", rank, "world_size", world_size),
        ("worker", worker, "num_workers", num_workers),
    ):
        if (index is None) != (count is None):
            raise ConfigError(f"shard: give {index_name} and {count_name} together, or neither")
    check_placement(
        0 if rank is None else rank, 1 if world_size is None else world_size,
        0 if worker is None else worker, 1 if num_workers is None else num_workers, where="shard",
    )
    args = (rank, world_size, worker, num_workers)
    return Step("shard", shard_items, args, needs_context=True, length=partial(shard_length, *args))
