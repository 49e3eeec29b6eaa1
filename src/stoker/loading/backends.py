"""The loader backends: the one list every part of stoker reads (torch-free, for the CLI).

``"process"`` loads in torch DataLoader worker processes; ``"thread"`` in a thread pool
of the main process (where decoding releases the GIL). :func:`stoker.make_loader`,
``stoker bench``, ``stoker tune`` and the training configuration all take these names.

A loader thread runs torch's operators (the batched resize of :mod:`stoker.jpeg`) with
one intra-op thread of its own (:func:`init_loader_thread`), whatever the training
process set with ``torch.set_num_threads``: each loader thread is one core's worth of
work already, and ``fit`` sets the process's count by what the model needs (max(1,
cores - workers)), which would otherwise also decide how the loader's resizes spread.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Literal

__all__ = ["BACKENDS", "LOADER_INTRA_OP_THREADS", "Backend", "init_loader_thread", "own_intra_op_threads"]

log = logging.getLogger(__name__)

Backend = Literal["process", "thread"]
BACKENDS: tuple[Backend, ...] = ("process", "thread")

# torch intra-op threads of each thread-backend loader thread.
LOADER_INTRA_OP_THREADS = 1

_gomp: ctypes.CDLL | None | bool = False  # False: not looked up yet; None: not there


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch itself loaded (its wheel's ``lib/libgomp.so.1``), or ``None``."""
    global _gomp
    if _gomp is False:
        import torch

        _gomp = None
        if "OpenMP" in torch.__config__.parallel_info():
            path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
            try:
                _gomp = ctypes.CDLL(path if os.path.exists(path) else "libgomp.so.1")
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


def init_loader_thread() -> None:
    """Run once in each thread-backend loader thread: its own :data:`LOADER_INTRA_OP_THREADS` intra-op threads."""
    if not own_intra_op_threads(LOADER_INTRA_OP_THREADS):
        log.debug("loader thread: torch has no per-thread OpenMP count here; it uses the process's")
