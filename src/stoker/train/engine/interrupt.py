"""Stopping a run cleanly: Ctrl-C or SIGTERM asks ``fit`` to stop at the next step boundary.

A first Ctrl-C (SIGINT) or SIGTERM does not break off the step that is running: it
sets a flag that ``fit`` reads after every batch. At the next optimizer-step boundary
``fit`` writes ``last.pt`` with the loader's position and the partial epoch, says so,
and ends the run with ``KeyboardInterrupt``; ``--resume`` then continues with the very
next batch. A second signal raises ``KeyboardInterrupt`` at once (last.pt keeps the
last point saved). A ``KeyboardInterrupt`` raised by a logger's ``batch_end`` is taken
as the same request. A signal that comes after another rank was lost (``torchrun``
stopping what is left of the run) is taken as a request too, but not announced: the
run cannot save there, and says that a rank was lost instead.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopRequest"]

log = logging.getLogger("stoker")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A flag that a signal or a callback sets and the training loop reads at step boundaries.

    Use it as a context manager around the loop: in the main thread it installs
    handlers for SIGINT and SIGTERM and puts the previous ones back on exit (signals
    can only be handled in the main thread; elsewhere it only serves callbacks).

    Args:
        lost: says whether another rank of the run is gone (then a signal is not announced).

    Attributes:
        reason: what asked to stop (``"SIGINT"``, ``"SIGTERM"``, ``"KeyboardInterrupt"``), or ``None``.

    Example:
        >>> with StopRequest() as stop:
        ...     stop.requested
        False
    """

    def __init__(self, lost: Callable[[], bool] | None = None) -> None:
        self.reason: str | None = None
        self._lost = lost
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether something asked the run to stop."""
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Ask to stop at the next step boundary (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is not None:
            raise KeyboardInterrupt  # the second signal: stop at once
        self.request(signal.Signals(signum).name)
        if self._lost is not None and self._lost():
            return  # the launcher ends what is left of a run that lost a rank: the loss is what the run says
        log.warning(
            "%s: finishing this step, then saving last.pt to resume from; press Ctrl-C again to stop at once",
            self.reason,
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
