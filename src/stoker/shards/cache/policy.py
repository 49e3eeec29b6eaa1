"""Which cached shard goes first: the one the machine's plan needs furthest ahead (Belady), else the least recently used.

One function decides (:func:`eviction_order`): the cache calls it to make room
(:meth:`~stoker.shards.cache.store.ShardCache._make_room`) and the simulation replays
recorded plans through it (:mod:`stoker.shards.cache.simulate`), so the policy measured
there is the policy the cache runs.

- With a plan (a stream's readers on this machine have recorded theirs,
  :mod:`stoker.shards.cache.readers`): a shard no reader uses again goes first, then the
  one whose next use is furthest ahead; ties go least recently used first.
- Without one (map-style or random reads, whose order is not known ahead): least
  recently used first.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = ["NEVER", "eviction_order", "next_use_of"]

K = TypeVar("K", bound=Hashable)
NEVER = (2**62, 0)  # the next use of a shard no reader of the plan uses again: after every other


def eviction_order(entries: Iterable[tuple[K, float]], next_use: Mapping[K, tuple[int, int]] | None) -> list[K]:
    """The keys of ``entries`` (``(key, last used)``) in the order to evict them.

    Args:
        entries: each cached shard and when it was last used (any clock; larger is later).
        next_use: each shard's next use in the plan as ``(epoch, how far ahead)``; a shard missing
            from it is not used again. None: no plan is known, least recently used first.

    Example:
        >>> eviction_order([("a", 1.0), ("b", 2.0), ("c", 3.0)], {"a": (0, 5), "b": (0, 9)})
        ['c', 'b', 'a']
        >>> eviction_order([("a", 1.0), ("b", 2.0)], None)
        ['a', 'b']
    """
    found = list(entries)
    if next_use is None:
        return [key for key, _ in sorted(found, key=lambda e: e[1])]
    # furthest next use first (never = furthest of all), then least recently used
    ranked = sorted(found, key=lambda e: (next_use.get(e[0], NEVER), -e[1]), reverse=True)
    return [key for key, _ in ranked]


def next_use_of(
    uses: Sequence[Mapping[K, Sequence[int]]], positions: Sequence[int | None], epoch: int = 0, window: int | None = None
) -> dict[K, tuple[int, int]]:
    """Each shard's next use by any reader, from every reader's plan and where each reader is.

    A use is as far ahead as its reader has still to go to reach it (its time less the
    reader's position): a reader behind the others reaches the same time later. With a
    ``window`` (readers download a shard only once the slowest is within ``window`` of its
    first use, :mod:`stoker.shards.cache.readers`), a use is also no nearer than that
    admission: a reader waiting for it does not use it sooner.

    Args:
        uses: per reader, each shard's use times in ascending order (the times of its reads of it).
        positions: per reader, the time of the read it is at (its uses from then on count);
            None: a reader that has finished.
        epoch: the epoch of these uses (the first part of each key).
        window: the plan's admission window; None: no admission.

    Returns:
        ``{shard: (epoch, how far ahead)}`` for every shard some reader still uses.

    Example:
        >>> next_use_of([{"a": [0, 4]}, {"a": [2], "b": [6]}], [3, 0])
        {'a': (0, 1), 'b': (0, 6)}
    """
    found: dict[K, tuple[int, int]] = {}
    first: dict[K, int] = {}
    slowest = min((p for p in positions if p is not None), default=0)
    if window is not None:
        for plan in uses:
            for shard, times in plan.items():
                first[shard] = min(first.get(shard, times[0]), times[0])
    for plan, at in zip(uses, positions, strict=True):
        if at is None:
            continue
        for shard, times in plan.items():
            i = bisect.bisect_left(times, at)
            if i < len(times):
                ahead = int(times[i]) - at
                if window is not None:
                    ahead = max(ahead, first[shard] - window - slowest)
                key = (epoch, ahead)
                if key < found.get(shard, NEVER):
                    found[shard] = key
    return found
