"""Whether a progress bar is drawn: only on a terminal, and never under ``--quiet``.

A bar redrawn in a file or a job's log is hundreds of ``\\r`` frames; there the commands'
own lines say what happened. Every bar stoker draws takes its ``disable`` from
:func:`bar_disable`; the commands' ``--quiet`` sets :data:`QUIET_ENV`, which worker
processes inherit.
"""

from __future__ import annotations

import os
import sys

__all__ = ["QUIET_ENV", "bar_disable", "bars_shown", "set_quiet"]

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
    """Under ``--quiet``: no bar in this process or the workers it starts."""
    if quiet:
        os.environ[QUIET_ENV] = "1"
