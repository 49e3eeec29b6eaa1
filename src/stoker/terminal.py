"""Whether a progress bar is drawn: only on a terminal, and never under ``--quiet``.

A bar redrawn in a file or a job's log is hundreds of ``\\r`` frames; there the commands'
own lines say what happened. Every bar stoker draws takes its ``disable`` from
:func:`bar_disable`; the commands' ``--quiet`` sets :data:`QUIET_ENV`, which worker
processes inherit.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["QUIET_ENV", "LogCounter", "bar_disable", "bars_shown", "set_for_the_command", "set_quiet"]

QUIET_ENV = "STOKER_QUIET"


def bar_disable(progress: bool = True) -> bool | None:
    """tqdm's ``disable``: ``True`` when not ``progress`` or quiet, else ``None`` (tqdm draws only on a terminal)."""
    if not progress or os.environ.get(QUIET_ENV, "") not in ("", "0"):
        return True
    return None


def bars_shown(progress: bool = True) -> bool:
    """Whether a bar on stderr would be drawn now (``progress``, not quiet, stderr a terminal)."""
    return bar_disable(progress) is None and sys.stderr.isatty()


def set_quiet(quiet: bool) -> None:
    """Under ``--quiet``: no bar in this process or the workers it starts, until the command ends."""
    if quiet:
        set_for_the_command(QUIET_ENV, "1")


def set_for_the_command(name: str, value: str) -> None:
    """Set an environment variable until the running click command ends (for good outside one).

    The command's worker processes and subprocesses inherit it; it is undone when the
    command's context closes, so a command invoked in-process (``CliRunner``, a notebook)
    leaves nothing behind for what runs next.
    """
    before = os.environ.get(name)
    os.environ[name] = value
    import click  # light, and already imported wherever a command runs

    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(lambda: _restore(name, before))


def _restore(name: str, before: str | None) -> None:
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


class LogCounter:
    """A counter for a log, where a bar would be frames: plain lines, one when it ends and one a minute before.

    Nothing is written for a count that ends within ``delay`` seconds (as tqdm's
    ``delay``). Use it as tqdm: a context manager, ``update(n)``.

    Example:
        >>> with LogCounter("indexing data/train", " files", delay=0.0, file=sys.stdout) as counter:
        ...     counter.update(3)
        indexing data/train: 3 files
    """

    def __init__(self, desc: str, unit: str, delay: float = 0.0, file: TextIO | None = None,
                 interval_s: float = 60.0) -> None:
        self.desc, self.unit, self.delay, self.interval_s = desc, unit, delay, interval_s
        self.file = file
        self.n = 0
        self._start = self._said = time.monotonic()
        self._closed = False

    def _line(self) -> None:
        print(f"{self.desc}: {self.n:,}{self.unit}", file=self.file or sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._start >= self.delay and now - self._said >= self.interval_s:
            self._said = now
            self._line()

    def close(self) -> None:
        if not self._closed and time.monotonic() - self._start >= self.delay:
            self._line()
        self._closed = True

    def __enter__(self) -> LogCounter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
