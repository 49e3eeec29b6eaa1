"""Split a stream between DataLoader workers and torch.distributed ranks.

With ``R`` ranks of ``N`` workers each there are ``R * N`` shards; the worker ``w`` of
rank ``r`` is shard ``r * N + w`` and keeps the items ``i`` with
``i % (R * N) == r * N + w``. The shards are disjoint and together hold every item, so
an epoch over all of them sees each item exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from stoker.errors import ConfigError
from stoker.pipes.compose import Step, same_length

if TYPE_CHECKING:
    from stoker.pipes.context import Context

__all__ = ["shard_items", "shard_position", "shard_step", "take_shard"]

T = TypeVar("T")


def shard_position(rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
    """Return ``(index, count)``: which of ``count`` shards this (rank, worker) reads.

    Raises:
        ConfigError: a count below 1, or a rank or worker outside its range.

    Example:
        >>> shard_position(rank=1, world_size=2, worker=0, num_workers=3)
        (3, 6)
    """
    _check_range("rank", rank, "world_size", world_size)
    _check_range("worker", worker, "num_workers", num_workers)
    return rank * num_workers + worker, world_size * num_workers


def _check_range(index_name: str, index: object, count_name: str, count: object) -> None:
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise ConfigError(
            f"shard: {index_name}={index!r} with {count_name}={count!r} is out of range; "
            f"expected integers with 0 <= {index_name} < {count_name}"
        )


def take_shard(items: Iterable[T], index: int, count: int) -> Iterator[T]:
    """Yield the items whose position ``i`` has ``i % count == index``.

    Example:
        >>> list(take_shard(range(10), index=1, count=3))
        [1, 4, 7]
    """
    yield from islice(items, index, None, count)


def shard_items(
    items: Iterator[T],
    rank: int | None,
    world_size: int | None,
    worker: int | None,
    num_workers: int | None,
    *,
    context: Context,
) -> Iterator[T]:
    """The ``shard`` stage: keep this (rank, worker)'s slice; ``None`` means "as running"."""
    index, count = shard_position(
        context.rank if rank is None else rank,
        context.world_size if world_size is None else world_size,
        context.worker if worker is None else worker,
        context.num_workers if num_workers is None else num_workers,
    )
    yield from take_shard(items, index, count)


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
        if index is not None:
            _check_range(index_name, index, count_name, count)
    return Step("shard", shard_items, (rank, world_size, worker, num_workers), needs_context=True, length=same_length)
