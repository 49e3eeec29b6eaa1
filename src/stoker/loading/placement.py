"""Where this process sits among torch.distributed ranks: the one place every reader asks.

The Pipe's ``shard()`` and ``ShardStream`` both split an epoch by rank; both read the
placement here, so they cannot disagree about it. How many ranks share this host
(:func:`local_ranks`) is read here too: the CPU thread rule and the stream's cache
planning both count the readers of one machine.
"""

from __future__ import annotations

import os

import torch.distributed as dist

__all__ = ["distributed_placement", "local_rank", "local_ranks"]


def distributed_placement() -> tuple[int, int] | None:
    """``(rank, world_size)`` from torch.distributed, or ``None`` when it is not initialised.

    Returns:
        The placement, or ``None`` outside a distributed run (and in a spawned worker,
        where the process group is not initialised).

    Example:
        >>> distributed_placement() is None  # not under torchrun
        True
    """
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
