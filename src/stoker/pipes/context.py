"""Where and when one iteration of a pipe runs: its epoch, its rank and its worker.

A :class:`Context` is worked out once, when a pipe is iterated, and handed to the stages
that need it (``shuffle`` for its epoch seed, ``shard`` for its slice, ``concat`` to pass
it on), so that every stage of one iteration agrees on the epoch and the placement.

**The epoch seed rule.** A shuffle draws from :func:`stoker.order.epoch_rng` with its own
``seed`` and the epoch: the number given to :meth:`Pipe.set_epoch` plus how many times this
pipe object was iterated since. With no epoch set, the DataLoader's base seed of the epoch
is added as the stream (except under several ranks). Once an epoch is set the order is a
function of ``seed`` and the epoch alone, in every worker and rank, so a shuffle before
``shard()`` gives each the same permutation and each keeps a disjoint share: every sample
exactly once per epoch. The Pipe guide (``docs/guides/pipe.md``, "The epoch seed rule")
gives the rule in full and its limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import get_worker_info

from stoker.loading.placement import distributed_placement, worker_placement
from stoker.order import LOADER_SEED, epoch_seed

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    """Where and when one iteration of a pipe runs.

    Attributes:
        epoch: the number given to ``Pipe.set_epoch``, or ``None``.
        iteration: how many times the pipe was iterated in this process since then.
        loader_seed: the DataLoader's base seed of this epoch, or ``None``.
        rank: this process's torch.distributed rank (0 when not distributed).
        world_size: the number of ranks (1 when not distributed).
        worker: this DataLoader worker's id (0 in the main process).
        num_workers: the number of DataLoader workers (1 in the main process).
        block: items of the rank's share dealt to one worker at a time (``shard()``): the
            loader's batch size under stoker's loader (:meth:`Pipe.split_by_batch`), else 1.
    """

    epoch: int | None = None
    iteration: int = 0
    loader_seed: int | None = None
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    block: int = 1

    @classmethod
    def current(
        cls, epoch: int | None = None, iteration: int = 0, placement: tuple[int, int] | None = None, block: int = 1
    ) -> Context:
        """Read the worker and rank this process runs as.

        Args:
            epoch: the pipe's ``set_epoch`` number, if any.
            iteration: how many times the pipe was iterated since.
            placement: ``(rank, world_size)`` seen when the pipe was pickled, used when
                torch.distributed is not initialised here (a spawned worker).
            block: items dealt to one worker at a time.
        """
        rank, world_size = distributed_placement() or placement or (0, 1)
        info = get_worker_info()
        if info is None:  # the loader's process, or a thread of its thread backend
            return cls(epoch, iteration, None, rank, world_size, *worker_placement(), block)
        loader_seed = info.seed - info.id if world_size == 1 else None
        return cls(epoch, iteration, loader_seed, rank, world_size, info.id, info.num_workers, block)

    @property
    def order_epoch(self) -> int:
        """The epoch whose order this iteration reads: ``epoch + iteration`` (``iteration`` when no epoch is set)."""
        return (self.epoch or 0) + self.iteration

    def epoch_seed(self, seed: int) -> int:
        """The seed a shuffle with ``seed`` draws from in this iteration (see the module docs).

        ``numpy.random.default_rng`` of it is :func:`stoker.order.epoch_rng` of the rule's inputs.

        Example:
            >>> Context(epoch=2).epoch_seed(7) == Context(epoch=1, iteration=1).epoch_seed(7) == epoch_seed(7, 2)
            True
        """
        if self.epoch is None and self.loader_seed is not None:
            return epoch_seed(seed, self.order_epoch, LOADER_SEED, self.loader_seed)
        return epoch_seed(seed, self.order_epoch)
