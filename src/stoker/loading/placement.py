"""Where this process sits among torch.distributed ranks: the one place every reader asks.

The Pipe's ``shard()`` and ``ShardStream`` both split an epoch by rank; both read the
placement here, so they cannot disagree about it. How many ranks share this host
(:func:`local_ranks`) is read here too: the CPU thread rule and the stream's cache
planning both count the readers of one machine. Which loader worker this process (or
thread) is reads here too (:func:`worker_placement`): a DataLoader worker process, or a
thread of the loader's thread backend (:func:`as_worker`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["as_worker", "distributed_placement", "local_rank", "local_ranks", "worker_placement"]

_thread = threading.local()  # the worker a thread of the loader's thread backend runs as


def distributed_placement() -> tuple[int, int] | None:
    """``(rank, world_size)`` from torch.distributed, or ``None`` when it is not initialised.

    Returns:
        The placement, or ``None`` outside a distributed run (and in a spawned worker,
        where the process group is not initialised).

    Example:
        >>> distributed_placement() is None  # not under torchrun
        True
    """
    import torch.distributed as dist  # here: the CLI asks local_ranks() before torch is needed

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def local_ranks(unknown: int = 1) -> int:
    """The ranks sharing this host: ``LOCAL_WORLD_SIZE`` (set by ``torchrun``), else ``unknown``.

    ``unknown`` is what a caller assumes without it: 1 for the CPU thread rule (a
    process alone), the world size where assuming fewer would hide a problem (every
    rank may be on this host).
    """
    text = (os.environ.get("LOCAL_WORLD_SIZE") or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else unknown


def local_rank(unknown: int = 0) -> int:
    """This process's rank among those of its host: ``LOCAL_RANK`` (set by ``torchrun``), else ``unknown``."""
    text = (os.environ.get("LOCAL_RANK") or "").strip()
    return int(text) if text.isdigit() else unknown


def worker_placement() -> tuple[int, int]:
    """``(worker, num_workers)`` of the loader worker running here: a DataLoader worker process, a
    thread inside :func:`as_worker`, else ``(0, 1)`` (the loader's own process reads).

    Example:
        >>> worker_placement()
        (0, 1)
        >>> with as_worker(2, 3):
        ...     worker_placement()
        (2, 3)
    """
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None:
        return info.id, info.num_workers
    return getattr(_thread, "placement", (0, 1))


@contextmanager
def as_worker(worker: int, num_workers: int) -> Iterator[None]:
    """Run the block in this thread as loader worker ``worker`` of ``num_workers`` (the thread backend's readers)."""
    before = getattr(_thread, "placement", None)
    _thread.placement = (worker, num_workers)
    try:
        yield
    finally:
        if before is None:
            del _thread.placement
        else:
            _thread.placement = before
