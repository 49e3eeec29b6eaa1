"""Watch the memory and CPU time of this process and all its children (loader workers).

The watching runs in a small helper process (this file run as a script: Python and
psutil only, no torch), not in a thread of the measured process: a thread that wakes
twenty times a second slowed a loader running in the main process by up to three times,
by disturbing torch's thread pool on a busy machine.

Resident memory (RSS) is cheap to read and is polled often; proportional memory (PSS:
shared pages split between the processes sharing them, so forked workers and memory-
mapped shards are not counted twice) costs a few milliseconds a process on Linux and is
polled twice a second, and soon after new workers appear.

CPU time counts every process: this one (all its threads) and its workers. A worker's
time is read while it runs; once it has exited and been waited for, its whole time is in
this process's ``children_user``/``children_system`` counters, so a worker that lives
between two polls, or whose last moments fall after the last poll, is still counted.

Example:
    >>> with ProcessMonitor() as monitor:
    ...     total = sum(range(1_000_000))
    >>> monitor.peak_rss_bytes > 0, monitor.cpu_seconds >= 0
    (True, True)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import Any

import psutil

__all__ = ["ProcessMonitor"]

_ANSWER_TIMEOUT_S = 10.0  # the helper answers within a poll; past this it is stuck: kill it


class _Watch:
    """The helper's state: polls the process tree rooted at ``root_pid``, skipping itself."""

    def __init__(self, root_pid: int, pss: bool) -> None:
        self.root = psutil.Process(root_pid)
        self.me = os.getpid()
        self.pss = pss
        self.peak_rss = self.peak_pss = 0
        self.baseline_rss = self.root.memory_info().rss
        self.max_processes = 1
        self.start_own, self.start_reaped = self._root_times()
        self.cpu = 0.0

    def _root_times(self) -> tuple[float, float]:
        """(CPU seconds of the root itself, of its exited and waited-for children)."""
        times = self.root.cpu_times()
        return times.user + times.system, getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)

    def poll(self, with_pss: bool) -> None:
        try:
            processes = [self.root, *(p for p in self.root.children(recursive=True) if p.pid != self.me)]
        except psutil.Error:
            processes = [self.root]
        self.max_processes = max(self.max_processes, len(processes))
        rss = pss = 0
        running = 0.0  # CPU seconds of the workers still running (they began in the block)
        for process in processes:
            try:
                with process.oneshot():
                    if process.pid != self.root.pid:
                        if process.status() == psutil.STATUS_ZOMBIE:
                            continue  # exited: its time moves to the root's children counters
                        times = process.cpu_times()
                        running += times.user + times.system
                    rss += process.memory_info().rss
                    if with_pss and self.pss:
                        pss += getattr(process.memory_full_info(), "pss", 0)
            except (psutil.Error, OSError):
                continue  # a worker exited between listing and reading
        try:
            own, reaped = self._root_times()
        except psutil.Error:
            own, reaped = self.start_own, self.start_reaped
        # Each figure is a lower bound of the true total (a worker may have exited but not
        # yet been waited for): keep the largest.
        self.cpu = max(self.cpu, own - self.start_own + reaped - self.start_reaped + running)
        self.peak_rss = max(self.peak_rss, rss)
        if with_pss:
            self.peak_pss = max(self.peak_pss, pss)

    def result(self) -> dict[str, Any]:
        return {
            "peak_rss_bytes": self.peak_rss,
            "peak_pss_bytes": self.peak_pss,
            "baseline_rss_bytes": self.baseline_rss,
            "cpu_seconds": self.cpu,
            "max_processes": self.max_processes,
        }


def _serve(root_pid: int, interval_s: float, pss_interval_s: float) -> None:
    """The helper's main loop: poll until told to stop on stdin; answer on stdout."""
    watch = _Watch(root_pid, pss_interval_s > 0)
    watch.poll(with_pss=True)
    commands: list[str] = []
    wake = threading.Event()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.append(line.strip())
            wake.set()
        commands.append("stop")
        wake.set()

    threading.Thread(target=read_commands, daemon=True).start()
    print("ready", flush=True)
    next_pss = time.monotonic() + pss_interval_s
    while True:
        wake.wait(interval_s)
        wake.clear()
        with_pss = pss_interval_s > 0 and time.monotonic() >= next_pss
        if with_pss:
            next_pss = time.monotonic() + pss_interval_s
        seen = watch.max_processes
        while commands:
            command = commands.pop(0)
            if command == "sample":
                watch.poll(with_pss=True)
            elif command == "stop":
                watch.poll(with_pss=False)
                print(json.dumps(watch.result()), flush=True)
                return
        watch.poll(with_pss)
        if watch.max_processes > seen:  # workers started: measure what they share soon
            next_pss = min(next_pss, time.monotonic() + 0.2)


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

    def __init__(self, interval_s: float = 0.05, pss_interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.pss_interval_s = pss_interval_s
        self.peak_rss_bytes = 0
        self.peak_pss_bytes = 0
        self.baseline_rss_bytes = 0
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self.max_processes = 1
        self._helper: subprocess.Popen[str] | None = None
        self._start_wall = 0.0

    @property
    def cpu_cores_used(self) -> float:
        """Mean number of cores kept busy: CPU seconds over wall seconds."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def _send(self, command: str) -> None:
        helper = self._helper
        if helper is not None and helper.stdin is not None:
            helper.stdin.write(command + "\n")
            helper.stdin.flush()

    def __enter__(self) -> ProcessMonitor:
        # Run this file as a script (runpy leaves sys.path alone for a file), so the
        # helper imports psutil only, not stoker and torch.
        launch = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
        self._helper = subprocess.Popen(
            [sys.executable, "-c", launch, str(os.getpid()), str(self.interval_s), str(self.pss_interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._helper.stdout is not None:
            self._helper.stdout.readline()  # "ready": the baseline is taken
        self._start_wall = time.perf_counter()
        return self

    def sample_now(self) -> None:
        """Ask for one more reading (with PSS) soon, without waiting for it (workers are up now)."""
        self._send("sample")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall_seconds = time.perf_counter() - self._start_wall
        helper, self._helper = self._helper, None
        answer = ""
        if helper is not None:
            try:  # "stop" and end of input both stop the helper; it answers with one JSON line
                out, _ = helper.communicate("stop\n", timeout=_ANSWER_TIMEOUT_S)
                answer = out.strip().splitlines()[-1] if out.strip() else ""
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.communicate()
        if answer.startswith("{"):
            result = json.loads(answer)
            self.peak_rss_bytes = result["peak_rss_bytes"]
            self.peak_pss_bytes = result["peak_pss_bytes"]
            self.baseline_rss_bytes = result["baseline_rss_bytes"]
            self.cpu_seconds = result["cpu_seconds"]
            self.max_processes = result["max_processes"]


if __name__ == "__main__":  # the helper process
    _serve(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
