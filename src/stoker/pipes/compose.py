"""A pipe's recipe is a tuple of steps; ``compose`` turns it into a chain of generators.

The first step is the source (called with its own arguments only); each later step is a
stage, a generator function called with the items of the step before it first:
``stage(items, *args, **kwargs)``. Steps hold only functions and their arguments, so a
recipe pickles as long as its functions do (module-level functions always do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker.pipes.context import Context

__all__ = ["Step", "compose", "run_stages", "same_length"]


def same_length(n: int) -> int:
    """The length rule of a stage that keeps every item (map, shuffle)."""
    return n


@dataclass(frozen=True, eq=False)
class Step:
    """One link of a pipe's recipe: a generator function and the arguments it gets.

    Attributes:
        name: how the step shows in the pipe's ``repr``.
        fn: the source or stage function.
        args: positional arguments after the upstream items.
        kwargs: keyword arguments.
        needs_context: pass the iteration's :class:`Context` as ``context=``.
        length: the pipe's length after this step from its length before (a source:
            from nothing), or ``None`` where it is not known without iterating.
        one_to_one: the stage yields exactly one item for each item it reads, in order
            (map, load_image): a resumed iteration can pass items over before it, so
            they are never computed (see :func:`compose`).
    """

    name: str
    fn: Callable[..., Iterator[Any]]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    needs_context: bool = False
    length: Callable[..., int] | None = None
    one_to_one: bool = False

    def start(self, *upstream: Iterator[Any], context: Context) -> Iterator[Any]:
        """Call the function on the upstream items (none for a source)."""
        extra = {"context": context} if self.needs_context else {}
        return self.fn(*upstream, *self.args, **self.kwargs, **extra)


def compose(steps: Sequence[Step], context: Context, skip: int = 0) -> Iterator[Any]:
    """Chain a source and its stages into one iterator; nothing runs until it is read.

    With ``skip``, the first ``skip`` items of the result are left out, as cheaply as
    the recipe allows: they are dropped before the trailing run of one-to-one stages
    (``map``, ``load_image``), so a resumed epoch does not decode the images it passes
    over. The stages before them (source, shuffle, shard, filter) still run.

    Args:
        steps: the source, then the stages.
        context: the iteration's epoch and placement.
        skip: how many items of the result to leave out.

    Returns:
        The iterator of items.

    Example:
        >>> from stoker.pipes.context import Context
        >>> def numbers(n): yield from range(n)
        >>> def doubled(items): return (2 * x for x in items)
        >>> list(compose([Step("numbers", numbers, (3,)), Step("doubled", doubled)], Context()))
        [0, 2, 4]
    """
    source, *stages = steps
    cut = len(stages)
    while skip and cut > 0 and stages[cut - 1].one_to_one:
        cut -= 1
    items = source.start(context=context)
    for stage in stages[:cut]:
        items = stage.start(items, context=context)
    if skip:
        items = islice(items, skip, None)
    for stage in stages[cut:]:
        items = stage.start(items, context=context)
    return items


def run_stages(stages: Sequence[Step], items: Iterator[Any], context: Context) -> Iterator[Any]:
    """Chain ``stages`` (no source) onto ``items``: what follows the cut, run on one batch's items at a time.

    Example:
        >>> from stoker.pipes.context import Context
        >>> def doubled(items): return (2 * x for x in items)
        >>> list(run_stages([Step("doubled", doubled)], iter([1, 2]), Context()))
        [2, 4]
    """
    for stage in stages:
        items = stage.start(items, context=context)
    return items
