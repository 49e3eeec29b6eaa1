"""Watch the memory and CPU time of this process and all its children (loader workers).

A background thread polls psutil. Resident memory (RSS) is cheap to read and is polled
often; proportional memory (PSS: shared pages split between the processes sharing them,
so forked workers and memory-mapped shards are not counted twice) costs a few
milliseconds a process on Linux and is polled about once a second. CPU time is summed
per process id, keeping the last figure of workers that have exited.

Example:
    >>> with ProcessMonitor() as monitor:  # doctest: +SKIP
    ...     run_an_epoch()
    >>> monitor.peak_rss_bytes, monitor.cpu_seconds  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psutil

__all__ = ["ProcessMonitor"]


class ProcessMonitor:
    """Peak memory and total CPU time of this process tree while the ``with`` block runs.

    Args:
        interval_s: seconds between RSS polls.
        pss_interval_s: seconds between PSS polls (0 turns them off).

    Attributes:
        peak_rss_bytes: the largest sum of RSS over all processes seen at one time.
        peak_pss_bytes: the largest sum of PSS seen (0 where the OS does not report it).
        baseline_rss_bytes: RSS of this process when the block began.
        cpu_seconds: user + system CPU time all processes spent in the block.
        wall_seconds: how long the block ran.
        max_processes: the most processes seen at once (this one and its workers).
    """

    def __init__(self, interval_s: float = 0.05, pss_interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.pss_interval_s = pss_interval_s
        self.peak_rss_bytes = 0
        self.peak_pss_bytes = 0
        self.baseline_rss_bytes = 0
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self.max_processes = 1
        self._root = psutil.Process()
        self._start_cpu: dict[int, float] = {}
        self._last_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_wall = 0.0

    @property
    def cpu_cores_used(self) -> float:
        """Mean number of cores kept busy: CPU seconds over wall seconds."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def _processes(self) -> list[psutil.Process]:
        try:
            return [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return [self._root]

    def _poll(self, with_pss: bool) -> None:
        rss = pss = 0
        processes = self._processes()
        self.max_processes = max(self.max_processes, len(processes))
        for process in processes:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    rss += process.memory_info().rss
                    if with_pss:
                        pss += getattr(process.memory_full_info(), "pss", 0)
            except (psutil.Error, OSError):
                continue  # a worker exited between listing and reading
            cpu = times.user + times.system
            self._start_cpu.setdefault(process.pid, cpu if process.pid == self._root.pid else 0.0)
            self._last_cpu[process.pid] = cpu
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if with_pss:
            self.peak_pss_bytes = max(self.peak_pss_bytes, pss)

    def _run(self) -> None:
        next_pss = time.monotonic()
        while not self._stop.wait(self.interval_s):
            with_pss = self.pss_interval_s > 0 and time.monotonic() >= next_pss
            if with_pss:
                next_pss = time.monotonic() + self.pss_interval_s
            self._poll(with_pss)

    def __enter__(self) -> ProcessMonitor:
        self.baseline_rss_bytes = self._root.memory_info().rss
        self._start_wall = time.perf_counter()
        self._poll(with_pss=self.pss_interval_s > 0)
        self._thread = threading.Thread(target=self._run, name="stoker-bench-monitor", daemon=True)
        self._thread.start()
        return self

    def sample_now(self) -> None:
        """Take one more reading (with PSS) now; call it just before workers shut down."""
        self._poll(with_pss=self.pss_interval_s > 0)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll(with_pss=False)
        self.wall_seconds = time.perf_counter() - self._start_wall
        self.cpu_seconds = sum(self._last_cpu[pid] - self._start_cpu.get(pid, 0.0) for pid in self._last_cpu)
