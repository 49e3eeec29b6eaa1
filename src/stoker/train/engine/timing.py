"""Where the time of an epoch goes: waiting for data versus computing.

The data wait of a phase is the time the device sat idle between two steps because the
next batch had not arrived; the rest of the phase's wall time is compute. How the idle
time is measured depends on who waits for whom:

* **Wall clock** (:class:`WallGaps`, the CPU and every device but CUDA): the time spent
  in ``next(loader)``. On the CPU the host *is* the device, so this is exact. Elsewhere
  it is exact only while the loop reads every step's loss back (``sync_every=1``, the
  default off CUDA): the read-back waits for the step, so time in ``next`` afterwards is
  time the device had nothing to do.
* **CUDA events** (:class:`EventGaps`, on CUDA): the loop reads back only every
  ``sync_every`` steps, so the host runs ahead and its time in ``next`` may overlap work
  the device is still doing. An event is recorded when the host has queued a step's work
  and asks for the next batch, another when the batch is there; the device reaches the
  first when it finishes that work and the second when it finishes that *and* the host
  has recorded it, so the time between them (``elapsed_time``) is how long the device
  idled waiting for the batch, whoever was slower. The times are read when they are
  complete, without waiting, at the loop's read-backs; all of them at the end of the phase.

Either way the clock is synchronised with the device when a phase starts and ends, so
wall times are whole. The loop's own non-blocking copy of a batch to the device is
queued after the second event and counts as compute; a copy the loader queues while it
hands the batch over (stoker's ``Loader`` with a CUDA ``device``) lies between the events
and counts as data wait.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Iterable
from typing import Protocol, TypeVar

import torch

__all__ = ["EventGaps", "Gaps", "Mark", "PhaseTimer", "WallGaps", "cuda_mark", "synchronize"]

T = TypeVar("T")

_SETTLE_AFTER = 64  # pending event pairs that make idle_ends look (without waiting) for finished ones


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Gaps(Protocol):
    """Measures the idle gaps between steps: :meth:`idle_starts` before ``next(loader)``, :meth:`idle_ends` after."""

    def idle_starts(self) -> None: ...

    def idle_ends(self) -> None: ...

    def settle(self, wait: bool = False) -> float:
        """Seconds of gaps measured so far (``wait``: wait for the device to reach the last one first)."""
        ...


class WallGaps:
    """Idle gaps by the host's wall clock: the time spent fetching each batch."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._since = 0.0

    def idle_starts(self) -> None:
        self._since = time.perf_counter()

    def idle_ends(self) -> None:
        self._seconds += time.perf_counter() - self._since

    def settle(self, wait: bool = False) -> float:
        return self._seconds


class Mark(Protocol):
    """A point recorded in the device's stream of work (what :class:`torch.cuda.Event` does)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Mark) -> float: ...  # milliseconds from this mark to ``end_event``


def cuda_mark(device: torch.device) -> Mark:
    """A timing :class:`torch.cuda.Event`, recorded on ``device``'s current stream (where the loop queues its work)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event  # type: ignore[return-value]


class EventGaps:
    """Idle gaps by the device's clock: pairs of marks whose elapsed time is read once both are reached.

    Args:
        mark: records a mark in the device's stream of work and returns it, e.g.
            ``functools.partial(cuda_mark, device)``.
    """

    def __init__(self, mark: Callable[[], Mark]) -> None:
        self._mark = mark
        self._open: Mark | None = None
        self._pending: list[tuple[Mark, Mark]] = []  # in the order recorded, so the device reaches them in order
        self._seconds = 0.0

    def idle_starts(self) -> None:
        self._open = self._mark()

    def idle_ends(self) -> None:
        if self._open is None:
            return
        self._pending.append((self._open, self._mark()))
        self._open = None
        if len(self._pending) >= _SETTLE_AFTER:  # keep the list short when nothing reads the figures
            self.settle()

    def settle(self, wait: bool = False) -> float:
        if wait and self._pending:
            self._pending[-1][1].synchronize()
        done = 0
        for start, end in self._pending:
            if not end.query():  # the device has not got there yet; nor to any pair after it
                break
            self._seconds += start.elapsed_time(end) / 1000.0
            done += 1
        del self._pending[:done]
        return self._seconds


class PhaseTimer:
    """Times one phase (train or validation) of an epoch.

    Wrap the loader with :meth:`iterate`; the device's idle time between batches is
    counted as data wait (see the module docstring for how), the rest of the phase as
    compute. On CUDA the data wait of the last few batches is known only once the device
    has got past them: read :attr:`data_wait_s` after a read-back, or :meth:`settle`.

    Args:
        device: synchronised with when the phase starts and ends.
        wall_s, data_wait_s: seconds carried over from the part of the phase that ran
            before a mid-epoch resume, so the epoch's figures cover all of it.
        gaps: how idle gaps are measured (default: :class:`EventGaps` on CUDA,
            :class:`WallGaps` elsewhere).

    Example:
        >>> timer = PhaseTimer(torch.device("cpu"))
        >>> for batch in timer.iterate(range(3)):
        ...     pass
        >>> timer.wall_s >= timer.data_wait_s >= 0
        True
    """

    def __init__(self, device: torch.device, wall_s: float = 0.0, data_wait_s: float = 0.0, gaps: Gaps | None = None) -> None:
        self.device = device
        self.wall_s = float(wall_s)
        if gaps is None:
            gaps = EventGaps(functools.partial(cuda_mark, device)) if device.type == "cuda" else WallGaps()
        self._gaps = gaps
        self._carried_wait_s = float(data_wait_s)
        self._start = 0.0
        self._carried_s = float(wall_s)

    @property
    def data_wait_s(self) -> float:
        """Seconds the device waited for data, as far as it has got (see :meth:`settle`)."""
        return self._carried_wait_s + self._gaps.settle()

    @property
    def compute_s(self) -> float:
        """Seconds of the phase not spent waiting for data."""
        return max(self.wall_s - self.data_wait_s, 0.0)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the phase started (while it runs; afterwards :attr:`wall_s`)."""
        return self._carried_s + time.perf_counter() - self._start if self._start else self.wall_s

    def settle(self) -> float:
        """Wait for the device to reach the last batch fetched, and return the whole :attr:`data_wait_s` so far."""
        return self._carried_wait_s + self._gaps.settle(wait=True)

    def iterate(self, loader: Iterable[T]) -> Generator[T, None, None]:
        """Yield the loader's batches, counting the device's wait for each one as data wait."""
        synchronize(self.device)
        self._start = time.perf_counter()
        batches = iter(loader)
        try:
            while True:
                self._gaps.idle_starts()  # the work queued so far ends here...
                try:
                    batch = next(batches)
                except StopIteration:
                    self._gaps.idle_ends()
                    break
                self._gaps.idle_ends()  # ...and the next batch's work starts here
                yield batch
        finally:
            synchronize(self.device)
            self._gaps.settle(wait=True)
            self.wall_s = self._carried_s + time.perf_counter() - self._start
            self._carried_s = self.wall_s
            self._start = 0.0
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"PhaseTimer(wall_s={self.wall_s:.3f}, data_wait_s={self.data_wait_s:.3f})"
