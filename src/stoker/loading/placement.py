"""Where this process sits among torch.distributed ranks: the one place every reader asks.

The Pipe's ``shard()`` and ``ShardStream`` both split an epoch by rank; both read the
placement here, so they cannot disagree about it.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["distributed_placement"]


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
