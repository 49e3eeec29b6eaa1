"""Cores for the loader: how many compute threads torch may use while a run trains on the CPU.

A CPU run and its loader workers share the machine's cores, and so do the other ranks
of the same host. torch's intra-op thread pool wants every core, and so do the
workers: oversubscribed, both crawl, and the epoch line says "wait 1%" because the time
goes into slow compute, not into waiting (``benchmarks/bench_threads.py``: 3.7x faster
with the rule below beside 2 workers on the project's 2-core machine; two ranks on one
host, each with torch's default threads, ran at 45-63 img/s against ~1,000 with one
thread each). The rule:

* the cores of this rank are the process's usable cores (its CPU affinity) divided by
  the ranks of this host (``LOCAL_WORLD_SIZE``, which ``torchrun`` sets; 1 alone);
* on the CPU, with ``W`` workers of the **train** loader (worker processes, or the
  threads of the thread backend: at least one) beside the step, torch gets
  ``max(1, C - W)`` of those ``C`` cores (never more than it had), and its setting is
  restored after. The validation loader's workers do not count: they wait while the
  model trains;
* on a GPU, or on the CPU alone without workers, nothing changes;
* ``Scenario(cpu_threads=N)`` (``run.cpu_threads``) sets it yourself.

The rule is a function of the machine and the settings, never of a measurement: on the
CPU the number of threads changes how torch splits its float sums, so the weights of
two runs differ, to the last bit, between thread counts (:mod:`stoker.train.engine.adapt` says
so too, and leaves the CPU's threads as this rule sets them).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch

from stoker.cores import usable_cores
from stoker.errors import ConfigError
from stoker.loading.placement import local_ranks

__all__ = ["ComputeThreads", "loader_workers", "usable_cores"]


def loader_workers(loader: Any) -> tuple[int, str]:
    """``(workers, what they are)`` that read for ``loader`` beside the step: processes, or its pool's threads."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if getattr(loader, "backend", "process") == "thread":
        return max(workers, 1), "thread"
    return workers, "process"


class ComputeThreads:
    """Sets torch's compute threads for a CPU run (see the module docs) and restores them.

    Args:
        device: where the model trains.
        loaders: the train loader first (its workers run beside the step); the others
            (validation) are not counted.
        requested: ``run.cpu_threads``; ``None``: the rule.

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
        train = next((loader for loader in loaders if loader is not None), None)
        workers, kind = loader_workers(train) if train is not None else (0, "process")
        ranks = local_ranks()
        total = usable_cores()
        cores = max(1, total // ranks)
        of = f"{cores} of {total} cores, its share with {ranks} ranks on this host" if ranks > 1 else f"{cores} cores"
        if requested is not None:
            self.threads, self.reason = requested, f"torch threads {requested} (as set)"
        elif device.type == "cpu" and (workers > 0 or ranks > 1):
            self.threads = max(1, min(self._before, cores - workers))
            left = f", {workers} left to the train loader's {kind} workers" if workers else ""
            self.reason = f"torch threads {self.threads} (of {of}{left})"
        else:
            self.threads, self.reason = self._before, f"torch threads {self._before}"

    def __enter__(self) -> ComputeThreads:
        if self.threads != self._before:
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if torch.get_num_threads() != self._before:
            torch.set_num_threads(self._before)
