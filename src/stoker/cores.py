"""How many cores this process may use: the one rule every default that counts cores reads."""

from __future__ import annotations

import os

from stoker.errors import ConfigError

__all__ = ["CORES_ENV", "usable_cores"]

CORES_ENV = "STOKER_CORES"
"""Set it to the cores stoker may count (a container whose CPU quota is below its affinity, or a test)."""


def usable_cores() -> int:
    """The cores this process may run on: ``STOKER_CORES`` where set, else its CPU affinity, else the CPU count.

    Raises:
        ConfigError: ``STOKER_CORES`` is set to something other than a whole number >= 1.
    """
    text = os.environ.get(CORES_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"{CORES_ENV}={text!r}: not a whole number >= 1; set it to the cores stoker may use, "
                              "or unset it to count this process's CPU affinity")
        return int(text)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
