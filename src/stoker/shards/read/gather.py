"""Copy pixel rows out of memory-mapped shards: one fancy index over many maps, or a threaded row copy.

:class:`RowSpan` lets one numpy fancy index read the rows of every record batch of every
shard (:meth:`stoker.shards.read.reader.ShardSet.gather_pixels`), and :meth:`RowSpan.take`
copy them into a given buffer (a reused one, a worker's shared memory:
:meth:`~stoker.shards.read.reader.ShardSet.read_pixels`), on several threads if asked
(:func:`split_copy`). :class:`BatchBuffers` hands a
batch's buffer out again once nothing holds the batch: a fresh buffer per batch costs a
page fault and a page the kernel zeroes per 4 KiB, which is a large part of a copy that
runs at memory speed.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stoker.cores import usable_cores
from stoker.loading.backends import one_intra_op_thread, own_intra_op_threads

__all__ = ["GATHER_SPLIT_BYTES", "BatchBuffers", "RowSpan", "copy_threads_for", "idle_copy_threads", "gather_pool", "split_copy", "take_rows"]

# A pixel gather is shared among threads in parts of this many bytes (a smaller part costs
# more to hand over than it saves; a larger one leaves a thread idle at the end).
GATHER_SPLIT_BYTES = 1 << 20
# How often idle_copy_threads looks at the machine's load again (seconds).
LOAD_CHECK_S = 1.0


@dataclass(frozen=True)
class _CpuSample:
    """One look at the cores: when, their busy seconds so far, and this process's copying helpers' CPU seconds."""

    pid: int
    wall: float
    busy: float | None  # None: this system does not say
    helpers: float
    threads: int


_seen: _CpuSample | None = None
_helper_cpu = [0.0]  # CPU seconds the split_copy helper threads of this process spent copying
_helper_lock = threading.Lock()


def copy_threads_for(cores: int, busy_cores: float) -> int:
    """The rule: 2 copying threads while the cores busy, the reader's own thread counted, leave half a core free.

    ``busy_cores`` is how many of the ``cores`` were busy over the last look, with the
    reader's own copying helpers taken out (they are what the rule decides). On 2 cores:
    2 threads while at most 1.5 were busy, so the reader's thread and half a core of other
    work; one other busy process takes it past that.
    """
    return 2 if cores >= 2 and busy_cores <= cores - 0.5 else 1


def _busy_seconds() -> float | None:
    """Busy CPU seconds since boot of the cores this process may use (``None`` where psutil cannot say)."""
    import psutil  # a dependency; imported here so that opening shards does not pay for it

    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error, NotImplementedError):
        return None
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if allowed and max(allowed) < len(per_cpu):  # a container's cores, not the whole host's
        per_cpu = [per_cpu[k] for k in allowed]
    # psutil's own rule (cpu_percent): all but idle and iowait; Linux counts guest time in user already
    not_busy = ("idle", "iowait", "guest", "guest_nice")
    return sum(sum(t) - sum(getattr(t, name, 0.0) for name in not_busy) for t in per_cpu)


def idle_copy_threads() -> int:
    """Copying threads for a gather by default: 2 where a core is idle besides the reader's own, else 1.

    Measured on 2 cores (``benchmarks/bench_peers.py --only pixels``, "2 gather threads"
    row): a second copying thread was 1.1-1.2x one on a quiet machine and 0.6-0.8x one
    with another process busy on a core, where the reader's own thread waits while its
    helper runs. So the cores' busy time is read at most once a second
    (:data:`LOAD_CHECK_S`), the CPU time of this process's own copying helpers is taken
    out of it, and :func:`copy_threads_for` decides. Before that, the one-minute load
    average decided: it lagged a minute and counted the reader's own second thread, so
    the reader talked itself out of it (README, "A second copying thread"). The first
    look, with nothing to compare, takes the load average. The count changes how fast
    rows are copied, never what is copied. A choice timed gather by gather (one thread
    or two, whichever cycled faster) was tried and dropped: switching between a fresh
    array and reused buffers made the cycles it timed unlike either steady state.
    """
    global _seen
    now = time.monotonic()
    last = _seen
    if last is not None and last.pid == os.getpid() and now - last.wall < LOAD_CHECK_S:
        return last.threads
    cores = usable_cores()
    busy = _busy_seconds()
    with _helper_lock:
        helpers = _helper_cpu[0]
    if last is not None and last.pid == os.getpid() and busy is not None and last.busy is not None:
        busy_cores = max(0.0, (busy - last.busy) - (helpers - last.helpers)) / (now - last.wall)
    else:
        try:
            busy_cores = os.getloadavg()[0]
        except OSError:  # no load average either: one thread, as before
            busy_cores = float(cores)
    threads = copy_threads_for(cores, busy_cores)
    _seen = _CpuSample(os.getpid(), now, busy, helpers, threads)
    return threads


_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own
_pool_lock = threading.Lock()


def gather_pool() -> ThreadPoolExecutor:
    """The process's pool of gather threads (made on first use, again after a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            # Each copies on one torch thread: split_copy decides how many threads copy, not the process's count.
            pool = ThreadPoolExecutor(max_workers=7, thread_name_prefix="stoker-gather",
                                      initializer=own_intra_op_threads, initargs=(1,))
            _pool = (os.getpid(), pool)
        return _pool[1]


def split_copy(n: int, threads: int, row_bytes: int, copy: Callable[[int, int], None]) -> None:
    """Run ``copy(lo, hi)`` over ``0..n`` in chunks of about :data:`GATHER_SPLIT_BYTES`, on up to ``threads`` threads.

    The calling thread works too, and the threads take chunks as they come free, so a
    helper that a busy machine does not schedule costs nothing: the caller does its share,
    and a helper that has not started by then is cancelled. ``threads`` is every thread
    that copies: a torch operator in ``copy`` runs on one thread on each of them
    (:func:`~stoker.loading.backends.one_intra_op_thread`), whatever the process's
    ``torch.set_num_threads`` says; the caller's own count is back after.
    """
    with one_intra_op_thread():
        _split_copy(n, threads, row_bytes, copy)


def _split_copy(n: int, threads: int, row_bytes: int, copy: Callable[[int, int], None]) -> None:
    rows = max(1, GATHER_SPLIT_BYTES // max(row_bytes, 1))
    chunks = -(-n // rows)
    helpers = min(threads, chunks) - 1
    if helpers <= 0:
        copy(0, n)
        return
    counter = itertools.count()  # next() on it is atomic under the GIL

    def work() -> None:
        while (k := next(counter)) < chunks:
            copy(k * rows, min(n, (k + 1) * rows))

    def helper() -> None:
        start = time.thread_time()
        try:
            work()
        finally:  # what idle_copy_threads takes out of the machine's busy time
            spent = time.thread_time() - start
            with _helper_lock:
                _helper_cpu[0] += spent

    pool = gather_pool()
    futures = [pool.submit(helper) for _ in range(helpers)]
    try:
        work()
    finally:
        for future in futures:
            if not future.cancel():
                future.result()


class RowSpan:
    """The pixel rows of many record batches, in many memory maps, reachable by one numpy fancy index.

    No array holds rows of different shards (each shard is its own memory map), so a
    batch from many shards was once copied row by row in Python, at 0.7x one fancy
    index over a single array. This object exposes the address range from the lowest
    record batch to the end of the highest as one byte array (``__array_interface__``)
    and keeps every record batch's view, and so every map, alive as long as that array
    lives. :attr:`rows` is a read-only strided view of it whose row ``k`` starts ``k * step``
    bytes in, ``step`` dividing the row size and every record batch's offset from the
    lowest; :meth:`gather` turns (record batch, row) into those row numbers and copies
    the whole batch with one fancy index, in C.

    Only rows inside record batches are ever read: the callers check sample indices
    (:meth:`ShardSet.locate`) before they come here, so the gaps between the maps, which
    may not be mapped at all, are never touched.
    """

    def __init__(self, views: list[np.ndarray], row_bytes: int) -> None:
        self._views = views  # kept alive: the array below points into them
        sized = [v for v in views if len(v)]
        addresses = np.asarray([v.ctypes.data if len(v) else 0 for v in views], dtype=np.int64)
        base = min(v.ctypes.data for v in sized)
        end = max(v.ctypes.data + v.nbytes for v in sized)
        offsets = np.where([len(v) > 0 for v in views], addresses - base, 0)
        step = int(np.gcd.reduce(np.append(offsets, row_bytes)))
        self.__array_interface__ = {"version": 3, "shape": (end - base,), "typestr": "|u1", "data": (base, True)}
        flat = np.asarray(self)  # its base is self, so the views outlive every array made from it
        self.rows = np.lib.stride_tricks.as_strided(
            flat, shape=((end - base - row_bytes) // step + 1, row_bytes), strides=(step, 1), writeable=False
        )
        self._first = offsets // step  # row number (in steps) of each record batch's first row
        self._per_row = row_bytes // step
        self._torch: torch.Tensor | None = None  # _tensor_rows, made on first use

    def gather(self, segment: np.ndarray, local: np.ndarray) -> np.ndarray:
        """A new ``[len, row_bytes]`` array: row ``local[j]`` of record batch ``segment[j]`` (checked by the caller)."""
        return self.rows[self._first[segment] + local * self._per_row]

    @property
    def contiguous(self) -> bool:
        """Whether every row starts a whole number of rows from the lowest (numpy's ``take`` can read it)."""
        return bool(self._per_row == 1)

    def take(self, segment: np.ndarray, local: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
        """``out[j] = row local[j] of record batch segment[j]`` (checked by the caller), on up to ``threads`` threads.

        A :attr:`contiguous` span: one ``np.take`` per part of about
        :data:`GATHER_SPLIT_BYTES`. A strided one (``np.take`` would first copy it whole,
        and numpy's fancy index has no ``out=``): one ``torch.index_select`` per part over
        a strided tensor of the span. Both copy in C with the GIL released, so parts copy
        side by side. On one thread the strided copy is slower than :meth:`gather`'s
        fresh fancy index (0.78x, ``benchmarks/bench_decode.py --only gather``); on two
        it is faster (1.1-1.2x the one-thread fancy index there), so callers take this for
        several threads or a buffer of their own.
        """
        where = self._first[segment] + local * self._per_row
        if self.contiguous:
            take_rows(self.rows, where, out, threads)
            return
        if not out.flags.c_contiguous:  # a buffer of the caller's that torch cannot fill in place
            out[...] = self.rows[where]
            return
        rows, index, into = self._tensor_rows(), torch.from_numpy(where), torch.from_numpy(out)

        def copy(lo: int, hi: int) -> None:
            torch.index_select(rows, 0, index[lo:hi], out=into[lo:hi])

        split_copy(len(where), threads, self.rows.shape[1], copy)

    def _tensor_rows(self) -> torch.Tensor:
        """:attr:`rows` as a torch tensor (made once): the source of the strided copy, never written."""
        if self._torch is None:
            # torch.from_numpy warns on a read-only array; this private alias is marked
            # writable only so that torch takes it without a warning. Nothing writes
            # through it (it is only index_select's source), and the maps are read-only
            # (PROT_READ): a write would fault, never change a shard.
            alias = np.asarray(_Alias(self.__array_interface__, self._views))
            flat = torch.from_numpy(alias)
            self._torch = torch.as_strided(flat, self.rows.shape, self.rows.strides)
        return self._torch


class _Alias:
    """The same bytes as a span, marked writable for :meth:`RowSpan._tensor_rows` (never written through)."""

    def __init__(self, interface: dict[str, Any], views: list[np.ndarray]) -> None:
        self._views = views  # the maps live as long as the tensor does (the span itself is not held: no cycle)
        self.__array_interface__ = {**interface, "data": (interface["data"][0], False)}


def take_rows(rows: np.ndarray, where: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
    """``out[j] = rows[where[j]]`` for a C-contiguous ``rows`` (indices checked by the caller), on up to ``threads`` threads."""

    def copy(lo: int, hi: int) -> None:
        np.take(rows, where[lo:hi], axis=0, out=out[lo:hi], mode="clip")  # mode="clip": no buffering of out=

    split_copy(len(where), threads, rows.shape[1] if rows.ndim > 1 else 1, copy)


class BatchBuffers:
    """Batch buffers handed out again once nothing outside holds them (a held batch is never overwritten).

    A buffer is reused only when its reference count shows that this object alone holds
    it: a batch the user keeps (as the array, a view of it, or a tensor made by
    ``torch.from_numpy``, which holds the array) is left alone, and a new buffer is made
    instead. Reused pages are already mapped, so filling them costs the copy alone.

    Args:
        keep: the most buffers kept (batches in flight plus the one the user holds fit
            in it; past it, buffers are made fresh and not kept).
    """

    def __init__(self, keep: int = 6) -> None:
        self.keep = keep
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised ``uint8`` array of ``shape``: a kept one nothing else holds, else a new one."""
        with self._lock:
            for k in range(len(self._buffers)):
                if self._buffers[k].shape == shape and _unheld(self._buffers, k):
                    return self._buffers[k]
            fresh = np.empty(shape, dtype=np.uint8)
            if len(self._buffers) < self.keep:
                self._buffers.append(fresh)
            else:  # full: replace a free buffer of another shape (a short last batch), if any
                free = [k for k in range(len(self._buffers)) if _unheld(self._buffers, k)]
                if free:
                    self._buffers[free[0]] = fresh
            return fresh

    def clear(self) -> None:
        """Drop every kept buffer (held batches keep theirs)."""
        with self._lock:
            self._buffers = []


def _unheld(buffers: list[np.ndarray], k: int) -> bool:
    """Whether only the list ``buffers`` refers to its item ``k`` (never, where reference counts cannot tell)."""
    return _COUNTS_TELL and sys.getrefcount(buffers[k]) <= _FREE_REFS


def _free_refs() -> int:
    """What :func:`sys.getrefcount` reports, inside :func:`_unheld`, for an item the list alone holds."""
    probe = [np.empty(0, dtype=np.uint8)]
    seen: list[int] = []

    def count(buffers: list[np.ndarray], k: int) -> bool:
        seen.append(sys.getrefcount(buffers[k]))
        return True

    count(probe, 0)
    return seen[0]


# CPython with the GIL: sys.getrefcount is exact. A free-threaded build defers and splits its
# counts, and PyPy has none: there every batch gets a fresh buffer.
_COUNTS_TELL = hasattr(sys, "getrefcount") and getattr(sys, "_is_gil_enabled", lambda: True)()
_FREE_REFS = _free_refs() if _COUNTS_TELL else 0
