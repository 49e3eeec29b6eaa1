"""The small built-in stages: map, filter, batch and concat.

Each stage is a generator function ``stage(items, *args) -> Iterator`` and each has a
``*_step`` function that checks the arguments of its ``Pipe`` method before anything runs.
Exceptions raised by the user's functions pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from stoker.errors import ConfigError
from stoker.loading.skips import Skipped
from stoker.pipes.compose import Step, same_length

if TYPE_CHECKING:
    from stoker.pipes.context import Context
    from stoker.pipes.pipe import Pipe

__all__ = [
    "batch_items",
    "batch_length",
    "batch_step",
    "concat_items",
    "concat_step",
    "filter_items",
    "filter_step",
    "map_items",
    "map_step",
]

T = TypeVar("T")
U = TypeVar("U")


def map_items(items: Iterator[T], fn: Callable[[T], U]) -> Iterator[U | Skipped]:
    """Yield ``fn(item)`` for every item; a :class:`Skipped` marker passes through as it is."""
    for item in items:
        yield item if isinstance(item, Skipped) else fn(item)


def filter_items(items: Iterator[T], fn: Callable[[T], Any]) -> Iterator[T]:
    """Yield the items for which ``fn(item)`` is true; :class:`Skipped` markers pass (they are counted later)."""
    for item in items:
        if isinstance(item, Skipped) or fn(item):
            yield item


def batch_items(
    items: Iterator[T], batch_size: int, drop_last: bool, collate_fn: Callable[[list[T]], Any] | None
) -> Iterator[Any]:
    """Yield lists of ``batch_size`` items (the last may be short unless ``drop_last``),
    passed through ``collate_fn`` when one is given."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == batch_size:
            yield batch if collate_fn is None else collate_fn(batch)
            batch = []
    if batch and not drop_last:
        yield batch if collate_fn is None else collate_fn(batch)


def batch_length(batch_size: int, drop_last: bool, n: int) -> int:
    """How many batches ``n`` items make."""
    return n // batch_size if drop_last else -(-n // batch_size)


def concat_items(items: Iterator[T], pipes: Sequence[Pipe[T]], *, context: Context) -> Iterator[T]:
    """Yield the items, then those of each pipe in turn, all in this iteration's context."""
    yield from items
    for pipe in pipes:
        yield from pipe.iterate(context)


def concat_length(pipes: Sequence[Pipe[Any]], n: int) -> int:
    """The length of a concatenation: the sum of its parts' lengths."""
    return n + sum(len(pipe) for pipe in pipes)


def _check_callable(stage: str, fn: object) -> None:
    if not callable(fn):
        raise ConfigError(f"{stage}: expected a function, got {type(fn).__name__} {fn!r}")


def map_step(fn: Callable[[Any], Any]) -> Step:
    """Check the argument of ``Pipe.map`` and make its step."""
    _check_callable("map", fn)
    return Step("map", map_items, (fn,), length=same_length, one_to_one=True)


def filter_step(fn: Callable[[Any], Any]) -> Step:
    """Check the argument of ``Pipe.filter`` and make its step (its length is unknown)."""
    _check_callable("filter", fn)
    return Step("filter", filter_items, (fn,))


def batch_step(batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None) -> Step:
    """Check the arguments of ``Pipe.batch`` and make its step."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch: batch_size must be a positive integer, got {batch_size!r}")
    if collate_fn is not None:
        _check_callable("batch", collate_fn)
    length = partial(batch_length, batch_size, bool(drop_last))
    return Step("batch", batch_items, (batch_size, bool(drop_last), collate_fn), length=length)


def concat_step(pipes: Sequence[Pipe[Any]]) -> Step:
    """Make the step of ``Pipe.concat`` (which checks that ``pipes`` are pipes)."""
    parts = tuple(pipes)
    return Step("concat", concat_items, (parts,), needs_context=True, length=partial(concat_length, parts))
