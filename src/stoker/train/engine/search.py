"""Which reader count to time next: a search toward less waiting, fed with what each count measured.

A pure policy (no loader, no clock): :class:`ReaderSearch` is given, for each reader count
timed, the seconds of a step (arrival to arrival) and the share of them spent waiting for
data, and says which count to time next. :mod:`stoker.train.engine.adapt` runs the trials;
``tests/train/test_adapt_search.py`` drives it with simulated curves.

The rule, from the count it stands on (the start, then each count that was faster by more
than :data:`GAIN`):

1. **more readers while the step waits for data**: twice the most timed (0 -> 1), up to
   ``most``, while that most was not clearly slower;
2. **fewer when it hardly waits** (readers then only take the training process's CPU),
   or when more readers were slower, or at ``most``: half as many, and half again while
   the fewest timed did not wait and were not clearly slower;
3. **then between**: the middle of the gap to a timed neighbour, where the lower end of
   the gap still waited for data (past a count that does not wait, more readers cannot
   help), the wider gap first;
4. nothing left: the search is over; :meth:`ReaderSearch.best` is the fastest count timed.

Each step at most doubles or halves, so ``most`` is reached from 1 in ``log2(most)``
trials, and the refinement halves a gap per trial.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GAIN", "ReaderSearch", "Reading", "WAIT_FLOOR"]

WAIT_FLOOR = 0.05  # a step that waits less than this share for data gains nothing from more readers
GAIN = 0.05  # the search moves to a count only when it was this much faster than the one it stands on (noise)


@dataclass
class Reading:
    """What one reader count measured: seconds a step, the share of them waiting for data, trials averaged."""

    s_per_step: float
    wait_share: float
    trials: int = 1


class ReaderSearch:
    """The search over reader counts ``0..most`` that starts at ``start`` (see the module docs).

    Args:
        start: the reader count in force (the first one to time).
        most: the most readers to try (this rank's cores).
        wait_floor: the data-wait share under which more readers cannot help.

    Example:
        >>> search = ReaderSearch(start=2, most=16)
        >>> search.next()
        2
        >>> search.add(2, s_per_step=0.05, wait_share=0.8); search.next()  # waits: more readers
        4
    """

    def __init__(self, start: int, most: int, *, wait_floor: float = WAIT_FLOOR) -> None:
        self.start = min(max(start, 0), max(most, 0))
        self.most = max(most, 0)
        self.wait_floor = wait_floor
        self.readings: dict[int, Reading] = {}
        self.order: list[int] = []  # counts in the order they were first timed
        self.anchor = self.start

    def add(self, readers: int, s_per_step: float, wait_share: float) -> None:
        """What ``readers`` measured (a repeated count is averaged with its earlier trials)."""
        seen = self.readings.get(readers)
        if seen is None:
            self.readings[readers] = Reading(s_per_step, wait_share)
            self.order.append(readers)
        else:
            n = seen.trials
            seen.s_per_step = (seen.s_per_step * n + s_per_step) / (n + 1)
            seen.wait_share = (seen.wait_share * n + wait_share) / (n + 1)
            seen.trials = n + 1
        anchor = self.readings.get(self.anchor)
        if readers != self.anchor and anchor is not None and s_per_step < (1 - GAIN) * anchor.s_per_step:
            self.anchor = readers

    def next(self) -> int | None:
        """The reader count to time next, or ``None`` when the search is over."""
        if self.start not in self.readings:
            return self.start
        a = self.anchor
        here = self.readings[a]
        waits = here.wait_share >= self.wait_floor
        above = [r for r in self.readings if r > a]
        below = [r for r in self.readings if r < a]
        # The frontiers: the most and fewest readers timed, while not clearly slower than the anchor (within noise,
        # a step from 0 to 1 reader may gain little); the search goes on from them.
        top, bottom = max(self.readings), min(self.readings)
        near = (1 + GAIN) * here.s_per_step
        top_waits = self.readings[top].wait_share >= self.wait_floor
        # 1. the step waits: more readers (one reader beside the step may be no faster than reading in it: go on)
        if top < self.most and top_waits and (self.readings[top].s_per_step <= near or top <= 1):
            return min(self.most, max(1, 2 * top))
        if bottom == a and a > 0 and (not waits or above or a == self.most):  # 2. fewer
            return a // 2
        if bottom < a and bottom > 0 and self.readings[bottom].wait_share < self.wait_floor \
                and self.readings[bottom].s_per_step <= near:  # 2. fewer still: they did not wait either
            return bottom // 2
        gaps: list[tuple[int, int, int]] = []  # (width, prefer the upper gap while waiting, middle)
        if above and waits:  # 3. between: past a count that does not wait, more readers cannot help
            hi = min(above)
            if hi - a > 1:
                gaps.append((hi - a, 1, (a + hi) // 2))
        if below:
            lo = max(below)
            if a - lo > 1 and self.readings[lo].wait_share >= self.wait_floor:
                gaps.append((a - lo, 0, (lo + a + 1) // 2))
        return max(gaps)[2] if gaps else None

    def best(self) -> int:
        """The fastest count timed (the fewer readers of two equal ones); the start before any was timed."""
        if not self.readings:
            return self.start
        return min(self.readings, key=lambda r: (self.readings[r].s_per_step, r))

    def done(self) -> bool:
        return self.next() is None

    def tried(self) -> str:
        """The counts timed, in order, for a person: e.g. ``2, 4, 8, 16, 12``."""
        return ", ".join(str(r) for r in self.order)
