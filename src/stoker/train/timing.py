"""Where the time of an epoch goes: waiting for data versus computing.

The split is honest because the loop reads the loss of every step back to the host
(``loss.item()``) after the optimizer step: that waits for the device to finish the
step, so the time spent in ``next(loader)`` afterwards is time the device sat idle
waiting for data, not time it was still busy. The clock is also synchronised with the
device when a phase starts and stops. The host-to-device copy of a batch is queued
without blocking and counts as compute.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable
from typing import TypeVar

import torch

__all__ = ["PhaseTimer", "synchronize"]

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Times one phase (train or validation) of an epoch.

    Wrap the loader with :meth:`iterate`; every ``next`` is counted as data wait, the
    rest of the phase as compute.

    Args:
        device: synchronised with when the phase starts and ends.
        wall_s, data_wait_s: seconds carried over from the part of the phase that ran
            before a mid-epoch resume, so the epoch's figures cover all of it.

    Example:
        >>> timer = PhaseTimer(torch.device("cpu"))
        >>> for batch in timer.iterate(range(3)):
        ...     pass
        >>> timer.wall_s >= timer.data_wait_s >= 0
        True
    """

    def __init__(self, device: torch.device, wall_s: float = 0.0, data_wait_s: float = 0.0) -> None:
        self.device = device
        self.data_wait_s = float(data_wait_s)
        self.wall_s = float(wall_s)
        self._start = 0.0
        self._carried_s = float(wall_s)

    @property
    def compute_s(self) -> float:
        """Seconds of the phase not spent waiting for data."""
        return max(self.wall_s - self.data_wait_s, 0.0)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the phase started (while it runs; afterwards :attr:`wall_s`)."""
        return self._carried_s + time.perf_counter() - self._start if self._start else self.wall_s

    def iterate(self, loader: Iterable[T]) -> Generator[T, None, None]:
        """Yield the loader's batches, adding the time each one took to arrive to the data wait."""
        synchronize(self.device)
        self._start = time.perf_counter()
        batches = iter(loader)
        try:
            while True:
                before = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    self.data_wait_s += time.perf_counter() - before
                    break
                self.data_wait_s += time.perf_counter() - before
                yield batch
        finally:
            synchronize(self.device)
            self.wall_s = self._carried_s + time.perf_counter() - self._start
            self._carried_s = self.wall_s
            self._start = 0.0
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"PhaseTimer(wall_s={self.wall_s:.3f}, data_wait_s={self.data_wait_s:.3f})"


