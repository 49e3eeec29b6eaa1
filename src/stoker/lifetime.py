"""Worker processes die with the process that started them.

A ``kill -9`` of ``stoker pack`` gives its workers no chance to be told: on Linux each
worker asks the kernel for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
elsewhere, and as a second line, a daemon thread watches the parent's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["die_with_parent", "pid_alive"]

_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0


def die_with_parent(parent_pid: int | None = None) -> None:
    """Make this process exit when its parent does (call it first thing in a worker).

    Args:
        parent_pid: the pid of the process that must stay alive (default: the current parent).
    """
    parent = os.getppid() if parent_pid is None else parent_pid
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the watchdog below still works
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)

    def watch() -> None:
        while True:
            threading.Event().wait(_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="stoker-parent-watch", daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one we may not signal counts as running).

    A zombie (killed, not yet reaped by its parent: a ``kill -9`` under a parent that
    never waits, such as a container's first process) does not run. No pid below 1 runs
    (``kill(0, ...)`` would ask about this process's group).
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``/proc`` (Linux) says ``pid`` has exited and waits to be reaped; ``False`` where it cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]  # the state follows the command name in brackets
