"""The loader backends: the one list every part of stoker reads (torch-free, for the CLI).

``"process"`` loads in torch DataLoader worker processes; ``"thread"`` in a thread pool
of the main process (where decoding releases the GIL). :func:`stoker.make_loader`,
``stoker bench``, ``stoker tune`` and the training configuration all take these names.

A loader thread runs torch's operators (the batched resize of :mod:`stoker.decode.jpeg`) with
an intra-op thread count of its own (:func:`init_loader_thread`): torch's default, the
cores this process may use, whatever the training process set with
``torch.set_num_threads``. ``fit`` lowers the process's count to max(1, cores - workers)
for the model's sake; loader threads that read it resized on one thread each, so the
loader read slower inside ``fit`` than outside it (``benchmarks/bench_peers.py``, its
"JPEG, process threads 1 vs 2" row): a resize spread over the cores fills the time
another loader thread leaves a core idle (holding the GIL, waiting for the consumer).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator
from typing import Literal

from stoker.cores import usable_cores

__all__ = [
    "BACKENDS",
    "LOADER_INTRA_OP_THREADS",
    "Backend",
    "init_loader_thread",
    "loader_intra_op_threads",
    "one_intra_op_thread",
    "own_intra_op_threads",
]

log = logging.getLogger(__name__)

Backend = Literal["process", "thread"]
BACKENDS: tuple[Backend, ...] = ("process", "thread")

# torch intra-op threads of each thread-backend loader thread; None: loader_intra_op_threads().
LOADER_INTRA_OP_THREADS: int | None = None

_gomp: ctypes.CDLL | None | bool = False  # False: not looked up yet; None: not there


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch itself loaded (its wheel's ``lib/libgomp.so.1``), or ``None``."""
    global _gomp
    if _gomp is False:
        import torch

        _gomp = None
        if "OpenMP" in torch.__config__.parallel_info():
            path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
            if os.path.exists(path):  # only torch's own: another OpenMP runtime would be a second one in the process
                try:
                    _gomp = ctypes.CDLL(path)
                except OSError:
                    _gomp = None
    return _gomp if isinstance(_gomp, ctypes.CDLL) else None


def own_intra_op_threads(threads: int) -> bool:
    """Give the calling thread ``threads`` torch intra-op threads of its own, leaving every other thread's count alone.

    torch's OpenMP backend reads the count per thread (OpenMP's ``nthreads-var``), but
    ``torch.set_num_threads`` also changes the process-wide value new threads start
    from (and MKL's); this sets the calling thread's alone, after torch has initialised
    it. Returns whether it could (torch built with OpenMP, the runtime found);
    otherwise the thread keeps the process's count.
    """
    import torch

    torch.get_num_threads()  # torch sets a new thread's count on first use: let it, then set ours
    gomp = _torch_openmp()
    if gomp is None:
        return False
    gomp.omp_set_num_threads(ctypes.c_int(max(1, int(threads))))
    return bool(torch.get_num_threads() == max(1, int(threads)))


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[bool]:
    """Inside, torch's operators called from this thread run on one thread; its own count comes back after.

    For copies whose threads stoker counts itself (the pixel gather's): a torch operator
    spreads over the calling thread's intra-op count, which is the training process's
    (torch's default, the cores; ``fit``'s; a peer library's), so copying threads that
    each spread it ran several times more threads than cores (medians 0.56 and 0.60 of one
    torch thread on 2 cores, ``benchmarks/bench_peers.py --only pixels``, "torch threads" rows). Only the calling thread's
    OpenMP count changes: another thread (a model's) keeps its own. Yields whether it
    could; without torch's OpenMP runtime the operators keep the process's count.
    """
    import torch

    before = torch.get_num_threads()  # also lets torch set a new thread's count first
    gomp = _torch_openmp() if before > 1 else None
    if gomp is None:
        yield before == 1
        return
    gomp.omp_set_num_threads(ctypes.c_int(1))
    try:
        yield True
    finally:
        gomp.omp_set_num_threads(ctypes.c_int(before))


def loader_intra_op_threads() -> int:
    """The intra-op threads a loader thread gets: :data:`LOADER_INTRA_OP_THREADS`, else torch's default count.

    torch's default is ``OMP_NUM_THREADS`` where set, else the cores this process may
    run on: what a process that never called ``torch.set_num_threads`` uses.
    """
    if LOADER_INTRA_OP_THREADS is not None:
        return max(1, int(LOADER_INTRA_OP_THREADS))
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()


def init_loader_thread() -> None:
    """Run once in each thread-backend loader thread: its own :func:`loader_intra_op_threads` intra-op threads."""
    if not own_intra_op_threads(loader_intra_op_threads()):
        log.debug("loader thread: torch has no per-thread OpenMP count here; it uses the process's")
