"""How many loader workers a data set gets when none are asked for: the one rule, stated once.

The rule, in order:

1. the data set's measured ``loader_defaults["num_workers"]`` where it has one;
2. a reader whose batches depend on the worker count (an iterable data set that splits
   its stream by worker and does not say ``elastic = True``): :data:`FALLBACK_WORKERS`,
   a constant, so the same run gives the same batches, and resumes, on any machine;
3. otherwise the machine's share (:func:`machine_workers`): this rank's cores (the usable
   cores, :func:`stoker.cores.usable_cores`, over ``LOCAL_WORLD_SIZE``) less what the
   training process keeps (:data:`TRAINING_CORES`, one more from :data:`BUSY_HOST_CORES`
   up, on an accelerator; half of them on the CPU), and no more worker processes than fit
   in :data:`MEMORY_SHARE` of the available memory. One core alone gives 0 workers.

The worker count is a speed setting only: for every elastic reader the batches a rank
sees are the same for any count and either backend (the "Batches" rule of
:mod:`stoker.order`). ``make_loader``, ``stoker train`` (``data.workers`` left out) and
``stoker inspect`` take this rule; ``docs/guides/loading.md`` ("Which settings") explains it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psutil

from stoker.cores import usable_cores
from stoker.errors import ConfigError
from stoker.loading.placement import local_ranks

__all__ = [
    "BUSY_HOST_CORES",
    "FALLBACK_WORKERS",
    "MEMORY_SHARE",
    "TRAINING_CORES",
    "batches_follow_workers",
    "default_workers",
    "machine_workers",
]

FALLBACK_WORKERS = 2
"""Loader workers of a reader whose batches depend on the worker count (it cannot follow the machine)."""

TRAINING_CORES = 1
"""Cores an accelerator run's training process keeps for itself (launching kernels, collate, pinning)..."""

BUSY_HOST_CORES = 8
"""...and one more from this many cores of a rank up."""

MEMORY_SHARE = 0.5
"""Worker processes, each counted at the training process's resident memory, stay within this share of available RAM."""


def batches_follow_workers(dataset: Any) -> bool:
    """Whether the worker count decides which samples a batch of ``dataset`` holds.

    An iterable data set splits its stream by worker, unless it says otherwise with a
    true ``elastic`` attribute (its batches are a function of seed, epoch, ranks and batch
    size alone); a map-style data set's order is the sampler's. ``dataset`` may be a class.
    """
    from torch.utils.data import IterableDataset  # here: the CLI reads this module's rule before torch is needed

    iterable = issubclass(dataset, IterableDataset) if isinstance(dataset, type) else isinstance(dataset, IterableDataset)
    return iterable and not bool(getattr(dataset, "elastic", False))


def machine_workers(*, accelerator: bool, backend: str = "process", cores: int | None = None,
                    ranks: int | None = None, resident_bytes: int | None = None,
                    available_bytes: int | None = None) -> int:
    """The readers this rank's share of the machine affords (see the module docs).

    Args:
        accelerator: the model trains on an accelerator (``False``: on the CPU, beside the readers).
        backend: ``"process"`` workers are bounded by memory too; ``"thread"`` ones share the process's.
        cores: usable cores of the host (``None``: :func:`~stoker.cores.usable_cores`).
        ranks: training processes on this host (``None``: ``LOCAL_WORLD_SIZE``, else 1).
        resident_bytes: what one worker process may hold (``None``: this process's resident memory).
        available_bytes: memory available (``None``: psutil's ``available``).

    Example:
        >>> memory = {"resident_bytes": 2**30, "available_bytes": 64 * 2**30}  # 1 GiB a worker, 64 GiB free
        >>> machine_workers(accelerator=True, cores=16, ranks=1, **memory), machine_workers(
        ...     accelerator=True, cores=16, ranks=2, **memory)
        (14, 6)
    """
    share = max(1, (usable_cores() if cores is None else cores) // (local_ranks() if ranks is None else max(ranks, 1)))
    if accelerator:
        workers = share - TRAINING_CORES - (1 if share >= BUSY_HOST_CORES else 0)
    else:
        workers = share // 2
    workers = max(0, workers)
    if backend == "process" and workers > 0:
        resident = psutil.Process().memory_info().rss if resident_bytes is None else resident_bytes
        available = psutil.virtual_memory().available if available_bytes is None else available_bytes
        workers = min(workers, int(MEMORY_SHARE * available) // max(resident, 1))
    return workers


def default_workers(loader_defaults: Mapping[str, Any] | None, *, follows_workers: bool = False,
                    accelerator: bool = True, backend: str = "process", cores: int | None = None,
                    ranks: int | None = None) -> int:
    """The worker count of a data set whose ``loader_defaults`` are these (``None`` or ``{}``: it has none).

    Args:
        loader_defaults: what the data set measured fastest with.
        follows_workers: the worker count decides its batches (:func:`batches_follow_workers`).
        accelerator, backend, cores, ranks: as :func:`machine_workers`.

    Raises:
        ConfigError: ``loader_defaults["num_workers"]`` is not a whole number >= 0.

    Example:
        >>> default_workers({"num_workers": 0}), default_workers({}, follows_workers=True)
        (0, 2)
        >>> default_workers(None, backend="thread", cores=16, ranks=1)
        14
    """
    workers = (loader_defaults or {}).get("num_workers")
    if workers is None:
        if follows_workers:
            return FALLBACK_WORKERS
        return machine_workers(accelerator=accelerator, backend=backend, cores=cores, ranks=ranks)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(
            f"the data set's loader_defaults give num_workers={workers!r}, not a whole number >= 0; "
            "fix its loader_defaults or pass num_workers"
        )
    return workers
