"""Where the readers run on the CPU: the training process keeps what it needs to launch its step.

On an accelerator the training process's Python thread launches the model's kernels;
readers running flat out on every core take the CPU it needs. Every reader applies a
:class:`ReaderPlacement` as it starts. The rule (:func:`plan_readers`), on Linux, when the
model trains on an accelerator (on the CPU nothing changes unless asked for):

1. **priority**: worker processes run at niceness :data:`READER_NICE` above their own, so
   the training thread gets a core first. Loader threads keep theirs: one descheduled
   while it holds the GIL would stall the training thread.
2. **cores**: from :data:`AFFINITY_MIN_CORES` usable cores up (``STOKER_CORES`` counted),
   worker processes run on the process's CPUs less the first ones, left to the training
   processes of this host (:data:`~stoker.loading.workers.TRAINING_CORES` per local rank,
   as the worker count rule counts them). Never on fewer cores, never where the affinity
   was already narrowed (``taskset``, a cpuset), never to an empty set.

Elsewhere than Linux nothing is changed. ``place_readers=False`` (``data.place_readers``,
``--no-place-readers``) turns it off; ``run.json`` records what was applied. The figures
are in ``docs/benchmarks.md``; the guide is ``docs/guides/loading.md``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from stoker.cores import usable_cores
from stoker.loading.placement import local_ranks
from stoker.loading.workers import BUSY_HOST_CORES, TRAINING_CORES

__all__ = ["AFFINITY_MIN_CORES", "READER_NICE", "ReaderPlacement", "plan_readers"]

log = logging.getLogger(__name__)

READER_NICE = 10
"""Niceness a reader process adds to its own (0 to 19; higher: runs after the training thread)."""

AFFINITY_MIN_CORES = 4
"""Usable cores from which worker processes are kept off the training processes' cores."""


def _linux() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "sched_setaffinity") and hasattr(os, "setpriority")


@dataclass(frozen=True)
class ReaderPlacement:
    """What each reader does to itself as it starts: niceness to add, cores to run on.

    Args:
        nice: niceness a worker process adds to its own (0: none).
        cpus: the cores a worker process runs on (``None``: left as it is).
        threads_nice: niceness a loader thread adds to its own (0: none).
        reason: why, in words (``run.json``).

    Example:
        >>> ReaderPlacement(nice=10, reason="asked").record()["nice"]
        10
    """

    nice: int = 0
    cpus: tuple[int, ...] | None = None
    threads_nice: int = 0
    reason: str = field(default="", compare=False)

    def apply(self, *, thread: bool = False) -> None:
        """Apply it to the calling worker process (``thread=False``) or loader thread (``thread=True``); Linux only.

        A step the system refuses is logged and left out: a reader that runs where it was
        is slower to nobody.
        """
        if not _linux():
            return
        nice = self.threads_nice if thread else self.nice
        # Linux sets niceness and affinity per thread: the calling one, and the threads it starts later.
        me = threading.get_native_id() if thread else 0
        try:
            if nice > 0:
                os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))
            if self.cpus and not thread:
                os.sched_setaffinity(0, self.cpus)
        except OSError as exc:
            log.debug("reader placement %s not applied: %s", self, exc)

    def record(self) -> dict[str, Any]:
        """What ``run.json`` says under ``"reader_placement"``."""
        return {"nice": self.nice, "cpus": list(self.cpus) if self.cpus is not None else None,
                "threads_nice": self.threads_nice, "reason": self.reason}


OFF = ReaderPlacement(reason="off (place_readers=False, data.place_readers = false, --no-place-readers)")
ON_THE_CPU = ReaderPlacement(reason="off: the model trains on the CPU, beside the readers (place_readers=True, "
                                    "--place-readers turns it on)")


def _kept_cores(cores: int, ranks: int) -> int:
    """Cores the training processes of this host keep: per rank, as the worker count rule counts them."""
    share = max(1, cores // max(ranks, 1))
    return max(ranks, 1) * (TRAINING_CORES + (1 if share >= BUSY_HOST_CORES else 0))


def plan_readers(enabled: bool | None = None, *, accelerator: bool = True, cores: int | None = None,
                 ranks: int | None = None, affinity: set[int] | None = None,
                 cpu_count: int | None = None) -> ReaderPlacement:
    """The placement every reader of this process applies (the module's rule).

    Args:
        enabled: ``False``: nothing (readers run as the process does); ``True``: the rule;
            ``None``: the rule when ``accelerator``, else nothing.
        accelerator: the model trains on an accelerator.
        cores: usable cores (``None``: :func:`~stoker.cores.usable_cores`, ``STOKER_CORES`` counted).
        ranks: training processes on this host (``None``: ``LOCAL_WORLD_SIZE``, else 1).
        affinity: the process's CPU affinity (``None``: ``os.sched_getaffinity(0)``).
        cpu_count: the machine's CPUs (``None``: ``os.cpu_count()``).

    Example:
        >>> plan_readers(cores=16, ranks=1, affinity=set(range(16)), cpu_count=16).cpus[:2]
        (2, 3)
    """
    if enabled is False:
        return OFF
    if enabled is None and not accelerator:
        return ON_THE_CPU
    if not _linux():
        return ReaderPlacement(reason="not Linux: readers run as the process does")
    count = usable_cores() if cores is None else cores
    ranks = local_ranks() if ranks is None else max(ranks, 1)
    mine = sorted(os.sched_getaffinity(0) if affinity is None else affinity)
    machine = (os.cpu_count() or len(mine)) if cpu_count is None else cpu_count
    said = f"readers at niceness +{READER_NICE}"
    if count < AFFINITY_MIN_CORES:
        return ReaderPlacement(READER_NICE, None, reason=f"{said}; {count} usable core(s): readers run on all of them "
                                                         f"(kept off the training cores from {AFFINITY_MIN_CORES} up)")
    if len(mine) < machine:
        return ReaderPlacement(READER_NICE, None, reason=f"{said}; the process's CPU affinity was set ({len(mine)} of "
                                                         f"{machine} CPUs): left as it is")
    kept = _kept_cores(count, ranks)
    readers = tuple(mine[kept:])
    if not readers:
        return ReaderPlacement(READER_NICE, None, reason=f"{said}; {len(mine)} CPU(s) in the affinity, {kept} kept for "
                                                         "training: readers run on all of them")
    return ReaderPlacement(READER_NICE, readers, reason=f"{said}; CPUs {mine[:kept]} kept for the training process"
                                                        f"{'es' if ranks > 1 else ''} of this host, readers on the other "
                                                        f"{len(readers)}")
