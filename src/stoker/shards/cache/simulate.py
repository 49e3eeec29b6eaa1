"""Replay a machine's recorded plan of shard uses through a cache of a given size, under three eviction policies.

- ``"plan"``: what the cache does (:func:`~stoker.shards.cache.policy.eviction_order` with
  each shard's next use from the plan and where each reader is, :func:`~stoker.shards.cache.policy.next_use_of`);
- ``"optimal"``: Belady's offline policy, which knows the true order of every use
  (it evicts the shard used again furthest ahead in the replayed order; the fewest
  downloads there are when the shards are of one size);
- ``"lru"``: least recently used, what a cache without a plan does.

A use is one read of one shard by one reader; a hit is a use whose shard is in the cache.
The cache downloads on a miss and then evicts (never the shard being read) until it is
within the limit. ``benchmarks/bench_remote.py --plan`` reports the three hit rates, and
the tests hold the cache's policy within 5 % of the optimal one on plans of real streams.

Example:
    >>> uses = ({"a": [0, 32], "b": [16]},)
    >>> trace = trace_of(uses)
    >>> replay(trace, uses, {"a": 1, "b": 1}, 1, "plan").hits
    0
    >>> replay(trace, uses, {"a": 1, "b": 1}, 2, "optimal").hits
    1
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from stoker.errors import ConfigError
from stoker.shards.cache.policy import eviction_order, next_use_of

__all__ = ["Replay", "replay", "trace_of"]

Policy = Literal["plan", "optimal", "lru"]


@dataclass(frozen=True)
class Replay:
    """What a replay counted: uses, hits, downloads (misses)."""

    uses: int
    hits: int

    @property
    def downloads(self) -> int:
        """Uses that downloaded their shard."""
        return self.uses - self.hits

    @property
    def hit_rate(self) -> float:
        """Hits per use (1.0 with no uses)."""
        return self.hits / self.uses if self.uses else 1.0


def trace_of(uses: Sequence[Mapping[str, Sequence[int]]], lags: Sequence[int] | None = None) -> list[tuple[int, int, str]]:
    """Every use of the plan as ``(reader, time, shard)``, in the order the machine makes them.

    Readers make their reads in time order; ``lags`` (per reader, in the plan's time unit)
    puts a reader behind the others, as a slower rank or worker is.
    """
    events = []
    for reader, plan in enumerate(uses):
        lag = lags[reader] if lags is not None else 0
        for shard, times in plan.items():
            for t in times:
                events.append((t + lag, reader, t, shard))
    events.sort()
    return [(reader, t, shard) for _, reader, t, shard in events]


def replay(
    trace: Sequence[tuple[int, int, str]],
    uses: Sequence[Mapping[str, Sequence[int]]],
    sizes: Mapping[str, int],
    limit: int,
    policy: Policy,
    window: int | None = None,
) -> Replay:
    """Replay ``trace`` (from :func:`trace_of`) through a cache of ``limit`` bytes; shard ``s`` takes ``sizes[s]``.

    Args:
        trace: the uses in the order they happen: ``(reader, time, shard)``.
        uses: the plan (per reader, each shard's use times ascending), what ``"plan"`` knows.
        sizes: the bytes each shard takes in the cache.
        limit: the cache's bytes.
        policy: ``"plan"``, ``"optimal"`` or ``"lru"`` (see the module docs).
        window: the plan's admission window (:class:`~stoker.shards.cache.readers.MachinePlan`), for ``"plan"``.

    Raises:
        ConfigError: an unknown policy, or a shard larger than the limit.
    """
    if policy not in ("plan", "optimal", "lru"):
        raise ConfigError(f"policy must be 'plan', 'optimal' or 'lru', got {policy!r}")
    if sizes and max(sizes.values()) > limit:
        raise ConfigError(f"a shard of {max(sizes.values()):,} bytes does not fit in a limit of {limit:,}")
    at_index: dict[str, list[int]] = {}
    for i, (_, _, shard) in enumerate(trace):
        at_index.setdefault(shard, []).append(i)
    positions: list[int | None] = [0] * len(uses)
    cached: dict[str, int] = {}  # shard -> index of its last use
    used = hits = 0
    last_of_read = [i + 1 == len(trace) or trace[i + 1][:2] != trace[i][:2] for i in range(len(trace))]
    for i, (reader, t, shard) in enumerate(trace):
        positions[reader] = t
        hit = shard in cached
        cached[shard] = i
        if hit:
            hits += 1
        else:
            used += sizes[shard]
            _evict(cached, shard, used, limit, sizes, policy, uses, positions, at_index, i, window)
            used = sum(sizes[s] for s in cached)
        if last_of_read[i]:
            positions[reader] = t + 1  # done with that read, as a reader records once its read is taken
    return Replay(uses=len(trace), hits=hits)


def _evict(
    cached: dict[str, int], shard: str, used: int, limit: int, sizes: Mapping[str, int], policy: Policy,
    uses: Sequence[Mapping[str, Sequence[int]]], positions: Sequence[int | None], at_index: dict[str, list[int]], i: int,
    window: int | None,
) -> None:
    """Evict from ``cached`` by ``policy`` until within ``limit`` (never ``shard``, the one being read)."""
    if used <= limit:
        return
    if policy == "plan":
        next_use: dict[str, tuple[int, int]] | None = next_use_of(uses, positions, window=window)
    elif policy == "optimal":
        next_use = {}
        for s in cached:
            later = at_index[s]
            k = bisect.bisect_right(later, i)
            if k < len(later):
                next_use[s] = (0, later[k])
    else:
        next_use = None
    for victim in eviction_order(((s, float(last)) for s, last in cached.items() if s != shard), next_use):
        if used <= limit:
            break
        used -= sizes[victim]
        del cached[victim]
