"""Cores for the loader: how many compute threads torch may use while a run trains on the CPU.

A CPU run and its loader workers share the machine's cores. torch's intra-op thread pool
wants every core, and so do the workers: oversubscribed, both crawl, and the epoch line
says "wait 1%" because the time goes into slow compute, not into waiting
(``benchmarks/bench_threads.py``: 3.7x faster with the rule below beside 2 workers on
the project's 2-core machine). The rule:

* on the CPU, with ``W`` loader workers (processes or threads) on ``C`` usable cores,
  torch gets ``max(1, C - W)`` threads for the run, and its setting is restored after;
* on a GPU, or with no workers, nothing changes;
* ``Scenario(cpu_threads=N)`` (``run.cpu_threads``) sets it yourself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch

from stoker.errors import ConfigError

__all__ = ["ComputeThreads", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class ComputeThreads:
    """Sets torch's compute threads for a CPU run (see the module docs) and restores them.

    Attributes:
        threads: the number in force inside the ``with`` block.
        reason: one line saying why, for the console.

    Example:
        >>> with ComputeThreads(torch.device("cpu"), [], requested=1) as chosen:
        ...     chosen.threads
        1
    """

    def __init__(self, device: torch.device, loaders: Iterable[Any], requested: int | None = None) -> None:
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
            raise ConfigError(f"cpu_threads must be None or a whole number >= 1, got {requested!r}")
        self._before = torch.get_num_threads()
        workers = max((int(getattr(loader, "num_workers", 0) or 0) for loader in loaders if loader is not None), default=0)
        cores = usable_cores()
        if requested is not None:
            self.threads, self.reason = requested, f"torch threads {requested} (as set)"
        elif device.type == "cpu" and workers > 0:
            self.threads = max(1, min(self._before, cores - workers))
            self.reason = f"torch threads {self.threads} (of {cores} cores, {workers} left to the loader workers)"
        else:
            self.threads, self.reason = self._before, f"torch threads {self._before}"

    def __enter__(self) -> ComputeThreads:
        if self.threads != self._before:
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if torch.get_num_threads() != self._before:
            torch.set_num_threads(self._before)
