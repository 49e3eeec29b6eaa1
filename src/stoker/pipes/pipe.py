"""The streaming Pipe: a fluent, picklable recipe of generator stages.

A ``Pipe`` is a ``torch.utils.data.IterableDataset`` for people who used torchdata's
DataPipes. Each method returns a new pipe and leaves its own pipe untouched, so a pipe
is a recipe that can be iterated again (a new epoch) and handed to DataLoader workers::

    pipe = (
        Pipe.list_files("train/", masks="*.jpg", recursive=True)
        .shuffle(buffer_size=10_000, seed=0)   # same permutation in every worker and rank
        .shard()                               # each rank keeps a disjoint share; the loader's cut
        .load_image()                          # a registered stage: path -> (path, image)
    )

Shuffle before ``shard()`` and every sample is seen exactly once per epoch
(:mod:`stoker.pipes.context`). Under stoker's loader ``shard()`` is the *cut*: the stages
after it run on one batch's items at a time, so the batches are the same for any worker
count; stages that reorder or regroup (``shuffle``, ``batch``, ``concat``) belong before
it. The Pipe guide (``docs/guides/pipe.md``, "The cut") says more.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar

from torch.utils.data import IterableDataset

from stoker.errors import ConfigError
from stoker.loading.collate import collate
from stoker.loading.contract import StreamReader, SupportsBatchLists, SupportsBatchSplit
from stoker.loading.placement import distributed_placement
from stoker.pipes.compose import Step, compose, run_stages
from stoker.pipes.context import Context
from stoker.pipes.registry import is_one_to_one, registered_stage, reserve_names
from stoker.pipes.sharding import shard_items, shard_step
from stoker.pipes.shuffle import shuffle_step
from stoker.pipes.sources import iterable_step, list_files_step
from stoker.pipes.stages import batch_step, concat_step, filter_step, map_step

__all__ = ["Pipe"]

T = TypeVar("T")
U = TypeVar("U")


# Stages that reorder or regroup a stream: run on one batch at a time they would mean something else.
_BEFORE_THE_CUT = ("shuffle", "batch", "concat", "shard")


class Pipe(IterableDataset[T], StreamReader, SupportsBatchSplit, SupportsBatchLists):
    """A streaming dataset built from a source and a chain of stages.

    Build one with :meth:`from_iterable` or :meth:`list_files`, then chain stages. Stages
    registered with :func:`stoker.pipes.register_stage` are methods too.

    The recipe never changes; what does change is a little runtime state used to seed
    shuffles: the number given to :meth:`set_epoch`, and a count of how many times this
    pipe object was iterated in this process.

    Example:
        >>> pipe = Pipe.from_iterable(range(10)).filter(lambda x: x % 2 == 0).map(str)
        >>> list(pipe)
        ['0', '2', '4', '6', '8']
        >>> list(pipe.batch(2, drop_last=True))
        [['0', '2'], ['4', '6']]
    """

    def __init__(self, steps: tuple[Step, ...]) -> None:
        """Wrap a recipe; build pipes with :meth:`from_iterable` or :meth:`list_files`."""
        if not (isinstance(steps, tuple) and steps and all(isinstance(step, Step) for step in steps)):
            raise ConfigError("Pipe: build a pipe with Pipe.from_iterable(items) or Pipe.list_files(folder)")
        self._steps = steps
        self._epoch: int | None = None
        self._iterations = 0
        self._placement: tuple[int, int] | None = None  # torch.distributed (rank, world_size) seen by pickle
        self._block = 1  # items of the rank's share dealt to one worker at a time (split_by_batch)

    # -- sources ---------------------------------------------------------------------

    @classmethod
    def from_iterable(cls, iterable: Iterable[T]) -> Pipe[T]:
        """A pipe over the items of a re-iterable collection (list, range, ...).

        Example:
            >>> list(Pipe.from_iterable([3, 1, 2]))
            [3, 1, 2]
        """
        return cls((iterable_step(iterable),))

    @classmethod
    def list_files(
        cls: type[Pipe[str]], root: str | os.PathLike[str], masks: str | Sequence[str] = "*", recursive: bool = False
    ) -> Pipe[str]:
        """A pipe over the paths (str) of the files in ``root`` matching ``masks``.

        The order is fixed: a folder's files by name, then (``recursive``) each
        subfolder's, by name, depth first. Symbolic links to folders are not followed.

        Args:
            root: the folder to list.
            masks: a glob pattern for file names, or a list of them (``["*.jpg", "*.png"]``).
            recursive: look in subfolders too.

        Raises:
            MissingFileError: the folder does not exist or holds no matching file.

        Example:
            >>> paths = list(Pipe.list_files("data/digiface", masks=["*.jpg", "*.png"], recursive=True))
            >>> len(paths), paths[0]
            (40, 'data/digiface/0/0.png')
        """
        return cls((list_files_step(root, masks, recursive),))

    # -- stages ----------------------------------------------------------------------

    def compose(self, stage: Callable[..., Iterator[Any]], *args: Any, **kwargs: Any) -> Pipe[Any]:
        """A new pipe with ``stage(items, *args, **kwargs)`` (a generator function) added.

        Example:
            >>> def repeat(items, times):
            ...     for item in items:
            ...         yield from [item] * times
            >>> list(Pipe.from_iterable("ab").compose(repeat, 2))
            ['a', 'a', 'b', 'b']
        """
        return self._then(Step(getattr(stage, "__name__", "stage"), stage, args, kwargs))

    def map(self, fn: Callable[[T], U]) -> Pipe[U]:
        """A new pipe of ``fn(item)`` for each item.

        Example:
            >>> list(Pipe.from_iterable([1, 2]).map(lambda x: x * 10))
            [10, 20]
        """
        return self._then(map_step(fn))

    def filter(self, fn: Callable[[T], Any]) -> Pipe[T]:
        """A new pipe of the items for which ``fn(item)`` is true.

        Example:
            >>> list(Pipe.from_iterable(range(5)).filter(lambda x: x > 2))
            [3, 4]
        """
        return self._then(filter_step(fn))

    def concat(self, *others: Pipe[T]) -> Pipe[T]:
        """A new pipe of this pipe's items, then each other pipe's.

        The other pipes run in this pipe's epoch: their own ``set_epoch`` is not used.

        Example:
            >>> list(Pipe.from_iterable([1]).concat(Pipe.from_iterable([2]), Pipe.from_iterable([3])))
            [1, 2, 3]
        """
        for other in others:
            if not isinstance(other, Pipe):
                raise ConfigError(f"concat: expected Pipes, got {type(other).__name__}; wrap it with Pipe.from_iterable(...)")
        return self._then(concat_step(others))

    def shuffle(self, buffer_size: int, seed: int | None = None) -> Pipe[T]:
        """A new pipe that shuffles through a buffer of ``buffer_size`` items.

        Each epoch gets a new order, the same in every worker and rank (see
        :mod:`stoker.pipes.context`), so ``shuffle`` before ``shard`` is exactly-once.

        Args:
            buffer_size: how many items the buffer holds; at least the stream's length
                gives a full shuffle.
            seed: the shuffle's seed; ``None`` draws one from torch's global generator
                now. Under torch.distributed pass a seed, or seed torch alike on every rank.

        Example:
            >>> sorted(Pipe.from_iterable(range(4)).shuffle(buffer_size=4, seed=0))
            [0, 1, 2, 3]
        """
        return self._then(shuffle_step(buffer_size, seed))

    def shard(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
    ) -> Pipe[T]:
        """A new pipe that keeps this DataLoader worker's and torch.distributed rank's slice.

        Item ``i`` goes to rank ``i % world_size`` and, within that rank's share, to
        worker ``i // world_size % num_workers`` (the split rule of :mod:`stoker.order`,
        the same for every stoker reader); under stoker's loader, a whole batch of the
        rank's share at a time, so the batches do not depend on the worker count (the
        cut, see the module docs). Values left out are read when the pipe runs: the rank and
        world size from torch.distributed (0 and 1 when it is not initialised), the
        worker from ``torch.utils.data.get_worker_info()`` (0 of 1 in the main process).

        Args:
            rank, world_size: override the distributed placement (give both).
            worker, num_workers: override the worker placement (give both).

        Example:
            >>> list(Pipe.from_iterable(range(8)).shard(rank=1, world_size=2, worker=0, num_workers=2))
            [1, 5]
        """
        return self._then(shard_step(rank, world_size, worker, num_workers))

    def batch(
        self, batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[T]], Any] | None = None
    ) -> Pipe[Any]:
        """A new pipe of lists of ``batch_size`` items, or of ``collate_fn(list)``.

        Example:
            >>> list(Pipe.from_iterable(range(5)).batch(2))
            [[0, 1], [2, 3], [4]]
        """
        return self._then(batch_step(batch_size, drop_last, collate_fn))

    def __getattr__(self, name: str) -> Callable[..., Pipe[Any]]:
        """Registered stages: ``pipe.name(*args, **kwargs)`` adds the stage ``name``."""
        stage = None if name.startswith("_") else registered_stage(name)
        if stage is None:
            raise AttributeError(
                f"'Pipe' object has no attribute {name!r}; to add a stage of that name, "
                f"decorate a generator function with @register_stage({name!r})"
            )

        def add_stage(*args: Any, **kwargs: Any) -> Pipe[Any]:
            return self._then(Step(name, stage, args, kwargs, one_to_one=is_one_to_one(name)))

        return add_stage

    def _then(self, step: Step) -> Pipe[Any]:
        return Pipe((*self._steps, step))

    # -- running ---------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Seed this pipe's shuffles for ``epoch`` (as ``DistributedSampler.set_epoch``).

        Iterating after ``set_epoch(n)`` gives the same order every time it is called
        with ``n``, in any process and whatever DataLoader runs it: the order is a
        function of the shuffle seeds and ``n`` alone. Not needed for a new order each
        epoch; useful to repeat or resume one. Persistent workers of torch's own
        DataLoader keep the epoch they started with and count on; stoker's loader
        passes each epoch to its workers.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise ConfigError(f"set_epoch: expected an integer epoch, got {epoch!r}")
        self._epoch = epoch
        self._iterations = 0

    def __iter__(self) -> Iterator[T]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[T]:
        """Iterate this process's items from position ``start`` on, as ``iter(pipe)`` does.

        The first ``start`` items are passed over before the trailing one-to-one
        stages (``map``, ``load_image``, stages registered ``one_to_one``), so they are
        never decoded or mapped; the stages before those still run. stoker's loader
        uses this to resume an epoch in the middle.

        Args:
            start: how many items to leave out (0: all of them).

        Returns:
            The iterator of the remaining items.

        Example:
            >>> list(Pipe.from_iterable(range(5)).map(str).iter_from(3))
            ['3', '4']
        """
        context = Context.current(self._epoch, self._iterations, self._placement, self._block)
        self._iterations += 1
        return compose(self._steps, context, skip=start)

    @property
    def elastic(self) -> bool:
        """True when stoker's loader deals this pipe by batch (one ``shard()``, no worker override):
        its batches then follow no worker count, so defaults and the adaptation may change it."""
        return self._cut() is not None

    def split_by_batch(self, batch_size: int) -> bool:
        """Deal this rank's items at ``shard()`` to the workers a batch of ``batch_size`` at a time (stoker's loader calls it).

        Returns:
            True for a pipe with one ``shard()`` that leaves the worker split to the loader
            (no ``worker``/``num_workers`` override): its batches are then the same for any
            worker count (see the module docs); False otherwise, and nothing changes.

        Raises:
            ConfigError: ``shuffle``, ``batch``, ``concat`` or another ``shard`` after ``shard()``.
        """
        cut = self._cut()
        if cut is None:
            return False
        after = [step.name for step in self._steps[cut + 1 :] if step.name in _BEFORE_THE_CUT]
        if after:
            raise ConfigError(
                f"{self!r}: stoker's loader cuts batches at shard() and runs what follows on one batch at a time, "
                f"so {', '.join(after)} there would act within a batch; move it before shard()"
            )
        self._block = int(batch_size)
        return True

    def batch_lists_from(self, start: int, batch_size: int) -> Iterator[tuple[int, list[Any]]]:
        """This process's batches from item ``start`` of its share at ``shard()`` on, each as ``(items, samples)``.

        The items at ``shard()`` are cut into batches of ``batch_size``; the stages after it
        run on one batch's items at a time, so a dropped item shortens its own batch
        only. ``items`` is the batch's count at the cut (``batch_size`` but the last): the
        loader counts positions in it. Items before ``start`` never reach the stages after
        the cut.

        Example:
            >>> pipe = Pipe.from_iterable(range(6)).shard().filter(lambda x: x != 1)
            >>> pipe.split_by_batch(2), list(pipe.batch_lists_from(0, 2))
            (True, [(2, [0]), (2, [2, 3]), (2, [4, 5])])
        """
        cut = self._cut()
        if cut is None:
            raise ConfigError(f"{self!r}: batch_lists_from needs a shard() stage, the cut where batches are made")
        context = Context.current(self._epoch, self._iterations, self._placement, batch_size)
        self._iterations += 1
        items = compose(self._steps[: cut + 1], context)
        if start:
            items = islice(items, start, None)
        after = self._steps[cut + 1 :]
        while chunk := list(islice(items, batch_size)):
            yield len(chunk), list(run_stages(after, iter(chunk), context))

    def _cut(self) -> int | None:
        """Where the loader cuts batches: the index of the one ``shard`` step without a worker override, else None."""
        shards = [i for i, step in enumerate(self._steps) if step.name == "shard" and step.fn is shard_items]
        if len(shards) != 1 or self._steps[shards[0]].args[2] is not None:
            return None
        return shards[0]

    def iterate(self, context: Context) -> Iterator[T]:
        """Run the recipe in a given context (which epoch, rank and worker) without
        counting an iteration; ``iter(pipe)`` works the context out itself."""
        return compose(self._steps, context)

    # stoker's make_loader picks this up: it drops and counts load_image's Skipped markers.
    collate_fn = staticmethod(collate)

    def __len__(self) -> int:
        """The number of items this rank reads in one epoch (all its workers together), where known without iterating.

        The same meaning as ``len`` of every stoker reader (see :mod:`stoker.order`): a
        ``shard`` stage keeps this rank's share (the rank and world size as the pipe
        would run here, or its overrides; with a ``worker`` override, that one worker's
        share), so ``len(make_loader(pipe, ...))`` is this rank's number of batches.
        Known for a sized ``from_iterable`` source followed by ``map``, ``shuffle``,
        ``shard``, ``concat`` of sized pipes and ``batch`` before any ``shard``.
        Otherwise raises ``TypeError``, as ``len`` does for any object without a length.

        Example:
            >>> len(Pipe.from_iterable(range(10)).shuffle(4, seed=0).shard(rank=1, world_size=3))
            3
        """
        source, *stages = self._steps
        if source.length is None:
            raise TypeError(f"{self!r} has no length: its source {source.name} is not sized")
        n = source.length()
        sharded = False
        for stage in stages:
            if stage.length is None or (sharded and stage.name == "batch"):
                raise TypeError(f"{self!r} has no length: it is not known before the {stage.name} stage runs")
            if stage.name == "shard":
                n = stage.length(n, context=Context.current(self._epoch, self._iterations, self._placement))
                sharded = True
            else:
                n = stage.length(n)
        return n

    def __getstate__(self) -> dict[str, Any]:
        # Keep the torch.distributed placement for spawned workers, where it is not initialised.
        state = self.__dict__.copy()
        state["_placement"] = distributed_placement() or self._placement
        return state

    def __repr__(self) -> str:
        return "Pipe(" + " -> ".join(step.name for step in self._steps) + ")"


reserve_names(name for name in dir(Pipe) if not name.startswith("_"))  # no stage may shadow a method
