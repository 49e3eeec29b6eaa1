"""``make_loader``: a torch DataLoader with sound defaults, skip accounting and device copies."""

from __future__ import annotations

import logging
import random
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    SequentialSampler,
)

from stoker.errors import ConfigError, StokerError
from stoker.loading.backends import BACKENDS, Backend, init_loader_thread
from stoker.loading.collate import Batch, collate, to_device
from stoker.loading.contract import (
    SupportsBatchesFrom,
    SupportsBatchLists,
    SupportsBatchSplit,
    SupportsCollate,
    SupportsEpoch,
    SupportsGetItems,
    SupportsLoaderDefaults,
    SupportsOrderPlan,
    SupportsReadFor,
)
from stoker.loading.position import FromWorker, Positioned, ResumeSampler, TagWorker, as_is, in_worker_order, iter_from
from stoker.loading.reader_cpu import ReaderPlacement, plan_readers
from stoker.loading.samplers import EpochSampler, IndexBatches, RankSlice
from stoker.loading.skips import Skipped, without_skip_advice
from stoker.loading.steps import EqualSteps, ranks_in_step, steps_are_certain
from stoker.loading.stream_threads import thread_batches
from stoker.loading.workers import batches_follow_workers, default_workers
from stoker.order import SHUFFLE_SCOPES, WORKER_SEEDS, ShuffleScope, batches_before, epoch_seed

__all__ = ["BACKENDS", "LOADER_STATE_FORMAT", "Backend", "Loader", "RankSlice", "iter_from", "make_loader", "resolve_device"]

log = logging.getLogger("stoker")

# /2: epoch orders come from stoker.order (README "Changes"); a /1 position names a batch of another order.
LOADER_STATE_FORMAT = "stoker-loader/2"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/``None`` means CUDA when available, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device {device!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None


def _seed_worker(worker_id: int) -> None:
    """Seed Python's and numpy's RNGs from the seed torch gave this worker (distinct per worker).

    A worker also ignores Ctrl-C: the terminal sends it to the whole process group, and
    the training process, not its workers, decides how to stop (``fit`` finishes the
    step and saves where it is).
    """
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _WorkerInit:
    """A DataLoader worker's start: :func:`_seed_worker`, then the loader's :class:`ReaderPlacement`."""

    def __init__(self, placement: ReaderPlacement) -> None:
        self.placement = placement

    def __call__(self, worker_id: int) -> None:
        _seed_worker(worker_id)
        self.placement.apply()


class _ThreadInit:
    """A loader thread's start: its own intra-op threads, then the loader's :class:`ReaderPlacement`."""

    def __init__(self, placement: ReaderPlacement) -> None:
        self.placement = placement

    def __call__(self) -> None:
        init_loader_thread()
        self.placement.apply(thread=True)


class Loader:
    """Iterates batches of a data set, moved to the device; made by :func:`make_loader`.

    Each iteration is one epoch; the epoch number advances after every full pass (or is
    set with :meth:`set_epoch`) and, with ``seed``, fixes the batches. The batches do not
    depend on ``num_workers`` or ``backend`` (the "Batches" rule of :mod:`stoker.order`).
    Between two batches, :meth:`state_dict` says where the loader stands, and a new loader
    given it yields exactly the next batch, whatever it wraps, with any worker count or
    backend; passing over the batches already seen reads no data. Random draws inside
    worker processes (an augmentation) are not restored. Under ``torch.distributed`` with
    ``even=True`` every rank gets the same number of batches each epoch
    (:mod:`stoker.loading.steps`). The loading guide (``docs/guides/loading.md``, "What a
    Loader guarantees") says how, and what it leaves out.

    Attributes:
        placement: what each reader (worker process, loader thread) applies to itself as
            it starts (:mod:`stoker.loading.reader_cpu`).
        skipped: bad samples skipped in the last epoch (``on_error="skip"``).
        trimmed: samples of the last epoch left out so that every rank ran the same
            number of steps (this rank's batches past the step where the first rank ran
            out, plus, on rank 0, the ``len % world_size`` the even split leaves out);
            0 alone and for ``even=False``.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool,
        num_workers: int,
        device: torch.device,
        drop_last: bool,
        prefetch_factor: int,
        persistent_workers: bool,
        backend: Backend,
        seed: int,
        collate_fn: Callable[[Any], Any],
        sampler: Sampler[int] | None,
        even: bool = True,
        split_later: bool = False,
        placement: ReaderPlacement | None = None,
        shuffle_scope: ShuffleScope = "auto",
    ) -> None:
        self.dataset = dataset
        self.placement = placement if placement is not None else ReaderPlacement(reason="none given")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.device = device
        self.backend: Backend = backend
        self.prefetch_factor = prefetch_factor
        self.seed = seed
        self.epoch = 0
        self.skipped: list[Skipped] = []
        self._collate = collate_fn
        self._generator = torch.Generator()  # the DataLoader's: worker base seeds
        self._iterable = isinstance(dataset, IterableDataset)
        # Asked once: a runtime Protocol check scans the class's attributes, too slow to repeat per batch.
        self._reads_batches = isinstance(dataset, SupportsGetItems)
        self._distributed = isinstance(sampler, EpochSampler)  # a rank's share (stoker.loading.samplers)
        self._even = even
        self._shuffle = shuffle
        self._scope: ShuffleScope = shuffle_scope
        self._said_reach = False  # readers that reach past a block of a block shuffle: said once (_say_reach)
        # Made before the process group (Lightning starts it in trainer.fit): split by rank once there is one.
        self._split_later = split_later and not self._iterable and not self._distributed
        # Samples of an epoch no rank reads: the tail an even split drops (counted on rank 0 only).
        self._split_tail = sampler.trimmed if isinstance(sampler, EpochSampler) and sampler.rank == 0 else 0
        self.trimmed = self._split_tail  # known before the first pass; each pass adds what the ranks' agreement left out
        if self._iterable:
            self._sampler: Sampler[int] | None = None
        elif sampler is not None:
            self._sampler = sampler
        elif shuffle:
            # The order is a function of (seed, epoch) alone (stoker.order), whether or not
            # the workers were started this epoch.
            self._sampler = EpochSampler(dataset, shuffle=True, seed=seed, scope=shuffle_scope)
        else:
            self._sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        # Where this epoch stands (see state_dict): batches handed out, and for an
        # iterable data set, per worker, with the worker whose turn is next.
        self._slots = max(num_workers, 1)
        self._batches_done = 0
        self._worker_batches = [0] * self._slots
        self._next_worker = 0
        self._pending: dict[str, Any] | None = None  # a loaded state, for the epoch it names
        self._resume_sampler = ResumeSampler(self._sampler) if self._sampler is not None else None
        # An iterable that deals its rank's order to the workers a batch at a time: its batches, and
        # so its positions, are the same for every worker count and backend (stoker.order, "Batches").
        self._elastic = self._iterable and isinstance(dataset, SupportsBatchSplit) and dataset.split_by_batch(batch_size)
        # An iterable whose reads are the batches (a ShardStream read a batch's rows at a time)
        # hands them over whole with its own collate: no item-by-item batching, no second copy.
        self._whole_batches = bool(
            self._iterable and isinstance(dataset, SupportsBatchesFrom)
            and collate_fn is getattr(dataset, "collate_fn", None) and dataset.take_batch_size(batch_size)
        )
        # A Pipe cuts its batches at shard(): what a later stage drops shortens that batch only.
        self._batch_lists = self._elastic and not self._whole_batches and isinstance(dataset, SupportsBatchLists)
        self.drop_last = drop_last
        self._positioned: Positioned | None = None
        self._make_positioned()
        self._pin = device.type == "cuda"
        self.persistent_workers = persistent_workers
        self._dataloader: DataLoader | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._start_readers()

    def _make_positioned(self) -> None:
        """The iterable data set as the workers run it, for the current worker slots (see :class:`Positioned`)."""
        if not self._iterable:
            return
        whole = self._whole_batches or self._batch_lists
        self._positioned = Positioned(
            self.dataset, self._slots, (self.batch_size, self.drop_last) if whole else None,  # type: ignore[arg-type]
            batch_split=self.batch_size if self._elastic else None, collate=self._collate if self._batch_lists else None,
        )

    def _start_readers(self) -> None:
        """The DataLoader (process backend) or the thread pool (thread backend) for the current settings."""
        num_workers, prefetch_factor = self.num_workers, self.prefetch_factor
        whole = self._whole_batches or self._batch_lists
        if self._iterable and self.backend == "thread":
            if not self._elastic:
                raise ConfigError(f"backend='thread' reads a {type(self.dataset).__name__} only if it deals its order a "
                                  "batch at a time (a Pipe with one shard(), a ShardStream); "
                                  "use backend='process'")
            return  # read on threads of this process, one per worker slot (see __iter__)
        if whole and self.backend == "process" and num_workers == 0 and not self._pin:
            return  # read here, batch by batch, straight from the reader (see __iter__)
        if self.backend == "process" and num_workers == 0 and self._resume_sampler is not None and not self._pin:
            # Read here, batch by batch, with no DataLoader around it: its per-batch machinery
            # (profiler hooks, fetcher, checks) was part of the loader's gap to __getitems__
            # (benchmarks/bench_peers.py, "the last batch held" row: 0.81-0.83 before, 0.90-0.94
            # after). Pinned batches (CUDA) keep the DataLoader, which pins them.
            self._batches = IndexBatches(self._resume_sampler, self.batch_size, self.drop_last)
        elif self.backend == "process":
            self._dataloader = DataLoader(
                self._positioned if self._positioned is not None else self.dataset,
                batch_size=None if whole else self.batch_size,
                sampler=self._resume_sampler,
                num_workers=num_workers,
                collate_fn=as_is if whole else TagWorker(self._collate) if self._iterable else self._collate,
                pin_memory=self._pin,
                drop_last=self.drop_last and not whole,  # whole batches: Positioned drops the last
                prefetch_factor=prefetch_factor if num_workers > 0 else None,
                persistent_workers=self.persistent_workers and num_workers > 0,
                worker_init_fn=_WorkerInit(self.placement) if num_workers > 0 else None,
                generator=self._generator,
            )
        elif self._resume_sampler is not None:  # a map-style data set (an iterable on threads returned above)
            self._batches = IndexBatches(self._resume_sampler, self.batch_size, self.drop_last)
            self._pool = ThreadPoolExecutor(max(num_workers, 1), thread_name_prefix="stoker-loader",
                                            initializer=_ThreadInit(self.placement))  # its own torch threads

    def reconfigure(self, *, num_workers: int | None = None, backend: Backend | None = None,
                    prefetch_factor: int | None = None) -> None:
        """Read with other workers, backend or prefetch depth from the next iteration on; the batches stay the same.

        For a map-style data set the order of an epoch is the sampler's, a function of
        ``(seed, epoch)``; a ``Pipe`` or a ``ShardStream`` deals its rank's order to the
        workers a batch at a time. Either way which worker reads a batch does not change
        what it holds, so ``state_dict`` before and ``load_state_dict`` after a change
        continue the same epoch at the same batch (:mod:`stoker.train.engine.adapt` changes
        settings this way, between two batches). The old workers or threads are let go.
        (Random draws made inside a transform come from the reading worker's generator,
        so they change.)

        Raises:
            ConfigError: an iterable data set that does not deal its order a batch at a
                time (its worker count decides what a batch holds), or a value
                :func:`make_loader` refuses.
        """
        if self._iterable and not self._elastic:
            raise ConfigError(f"a Loader over a {type(self.dataset).__name__} (iterable) splits its stream by worker, "
                              "so its workers cannot change without changing its batches; make a new loader")
        workers = self.num_workers if num_workers is None else num_workers
        kind = self.backend if backend is None else backend
        depth = self.prefetch_factor if prefetch_factor is None else prefetch_factor
        if workers < 0 or depth < 1 or kind not in BACKENDS:
            raise ConfigError(f"reconfigure: num_workers must be >= 0, prefetch_factor >= 1 and backend one of "
                              f"{', '.join(BACKENDS)}; got {workers}, {depth}, {kind!r}")
        self.close()
        self._dataloader, self._pool = None, None
        self.num_workers, self.backend, self.prefetch_factor = workers, kind, depth
        self._slots = max(workers, 1)
        self._restart_epoch()
        self._make_positioned()
        self._start_readers()

    def __len__(self) -> int:
        """Number of batches per epoch.

        Raises:
            TypeError: an iterable data set read by several ranks in step (``even=True``
                under ``torch.distributed``): how many batches the ranks run together is
                known only as they read (they agree at every step), and a length that
                differed between ranks would let a loop that stops at ``len(loader)``
                (Lightning does) stop one rank before the others — a hang or a
                collective mismatch. Iterate it to the end instead: every rank stops at
                the same step.
        """
        if self._iterable and self._agrees():
            raise TypeError(
                f"len() of a Loader over a {type(self.dataset).__name__} read by several ranks in step is not known "
                "before the epoch is read (the ranks agree at every step); iterate it to the end"
            )
        if self._whole_batches or self._batch_lists:  # as a DataLoader counts an iterable's batches
            items = len(self.dataset)  # type: ignore[arg-type]
            return items // self.batch_size if self.drop_last else -(-items // self.batch_size)
        if self._dataloader is not None:
            return len(self._dataloader)
        return len(self._batches)

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch number the next iteration uses (shuffle order and worker seeds).

        A state loaded with :meth:`load_state_dict` for this same epoch is kept (the
        next iteration resumes it); for another epoch it is dropped.
        """
        if epoch != self.epoch:
            self._restart_epoch()
            if self._pending is not None and self._pending["epoch"] != epoch:
                self._pending = None
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, as a plain dict; :meth:`load_state_dict` continues from it.

        Taken between two batches, it names the batch that comes next: a new loader over
        the same data set, with the same settings, given this state yields exactly the
        rest of that epoch, then the following epochs as if nothing had happened.

        Returns:
            ``{"format", "epoch", "seed", "batch_size", "batches", "worker_batches",
            "next_worker", "skipped"}``: the epoch in progress (or next), the batches
            handed out in it (empty ones included), per worker for an iterable data
            set, whose turn is next, and the bad samples skipped so far as
            ``[key, reason]`` pairs; ``"split": "batch"`` for an iterable that deals its
            order a batch at a time, whose position is ``batches`` alone (any worker count
            resumes it).

        Example:
            >>> from stoker import ClassFolderDataset
            >>> data = ClassFolderDataset("data/digiface")
            >>> loader = make_loader(data, batch_size=8, num_workers=0, device=None, seed=0)
            >>> batches = iter(loader); _ = next(batches)
            >>> fresh = make_loader(data, batch_size=8, num_workers=0, device=None, seed=0)
            >>> fresh.load_state_dict(loader.state_dict())
            >>> bool((next(iter(fresh))[1] == next(batches)[1]).all())
            True
        """
        if self._pending is not None:
            return {**self._pending, "worker_batches": list(self._pending["worker_batches"]),
                    "skipped": [list(s) for s in self._pending["skipped"]]}
        return {
            "format": LOADER_STATE_FORMAT,
            "epoch": self.epoch,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "batches": self._batches_done,
            "worker_batches": list(self._worker_batches) if self._iterable else [],
            "next_worker": self._next_worker,
            "skipped": [[s.key, s.reason] for s in self.skipped] if self._batches_done else [],
            **self._order_plan(),
            **({"split": "batch"} if self._elastic else {}),
        }

    def _order_plan(self) -> dict[str, Any]:
        """``{"order_plan": ...}`` of a data set that has one (:class:`SupportsOrderPlan`) or a sampler shuffling
        in blocks (:func:`stoker.order.block_permutation`), else nothing."""
        plan = dict(self.dataset.order_plan()) if isinstance(self.dataset, SupportsOrderPlan) else {}
        blocks = self._sampler.blocks if isinstance(self._sampler, EpochSampler) else None
        if blocks is not None:
            plan.update(blocks.plan())
        return {"order_plan": plan} if plan or isinstance(self.dataset, SupportsOrderPlan) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration resumes its epoch at its next batch.

        No data is read for the batches passed over: a map-style data set's sampler
        leaves out their indices; an iterable data set's workers each start their
        stream after the items they had already batched (``iter_from``).

        Args:
            state: what :meth:`state_dict` returned (possibly through a checkpoint).

        Raises:
            ConfigError: the state is not a loader state, or was taken from a loader
                with another seed, batch size or (an iterable that does not deal its
                order a batch at a time) worker count, or mid-epoch under another order
                plan of the data set (:class:`~stoker.loading.contract.SupportsOrderPlan`),
                or mid-epoch over a ``Pipe`` or ``ShardStream`` by an earlier stoker,
                whose batches depended on the worker count.
        """
        keys = ("format", "epoch", "seed", "batch_size", "batches", "worker_batches", "next_worker", "skipped")
        if isinstance(state, dict) and state.get("format") == "stoker-loader/1":
            raise ConfigError(
                "the loader state was taken by an earlier stoker (stoker-loader/1), whose epoch orders differ from "
                "this version's: resuming it mid-epoch would see some samples twice and others not at all. Resume "
                "from a checkpoint taken at an epoch boundary, or finish the run with the version that started it"
            )
        if not isinstance(state, dict) or state.get("format") != LOADER_STATE_FORMAT or any(k not in state for k in keys):
            missing = [k for k in keys if k not in state] if isinstance(state, dict) else list(keys)
            raise ConfigError(f"not a {LOADER_STATE_FORMAT} loader state (missing {missing}); pass what Loader.state_dict() returned")
        for key, mine in (("seed", self.seed), ("batch_size", self.batch_size)):
            if state[key] != mine:
                raise ConfigError(
                    f"the loader state was taken with {key}={state[key]!r} but this loader has {key}={mine!r}; "
                    "resume with the same loader settings"
                )
        theirs = state.get("order_plan")
        mine_plan = self._order_plan().get("order_plan", {})
        # A stream's state always holds its plan; a map-style one holds a plan only when it shuffles in blocks.
        if isinstance(theirs, dict) or (mine_plan and not isinstance(self.dataset, SupportsOrderPlan)):
            theirs = theirs if isinstance(theirs, dict) else {}
            differ = [k for k in sorted(set(mine_plan) | set(theirs)) if theirs.get(k) != mine_plan.get(k)]
            if differ and int(state["batches"]) > 0:  # at an epoch's start, the new plan simply reads the next epoch
                said = ", ".join(f"{k}={theirs.get(k)!r} (now {mine_plan.get(k)!r})" for k in differ)
                raise ConfigError(
                    f"the loader state was taken mid-epoch when the data set's order was planned with {said}; "
                    "under another plan the rest of the epoch would read some samples twice and others not at all. "
                    "Resume with the same settings (a remote shard set's cache limit, --cache-limit, and the shuffle's scope, "
                    "--shuffle-scope, plan it too), or "
                    "from a checkpoint taken at an epoch's end"
                )
        workers = list(state["worker_batches"])
        batches = int(state["batches"])
        if self._elastic and batches > 0 and state.get("split") != "batch":
            raise ConfigError(
                f"the loader state was taken mid-epoch by an earlier stoker, which split a {type(self.dataset).__name__} "
                "between its workers item by item: this version reads other batches, and resuming would see some "
                "samples twice and others not at all. Resume from a checkpoint taken at an epoch's end, or finish "
                "the run with the version that started it"
            )
        if self._elastic:  # the position is the batches handed out: each worker's share of them, for this worker count
            if batches < 0:
                raise ConfigError(f"the loader state holds negative or out-of-range positions: {state!r}")
            workers = [batches_before(batches, w, self._slots) for w in range(self._slots)]
            state = {**state, "worker_batches": workers, "next_worker": batches % self._slots}
        if self._iterable and len(workers) != self._slots:
            raise ConfigError(
                f"the loader state was taken with {len(workers)} worker(s) but this loader has {self._slots}; an "
                "iterable data set splits its stream by worker, so resume with the same num_workers"
            )
        epoch, turn = int(state["epoch"]), int(state["next_worker"])
        if batches < 0 or epoch < 0 or not 0 <= turn < self._slots or any(int(b) < 0 for b in workers):
            raise ConfigError(f"the loader state holds negative or out-of-range positions: {state!r}")
        self.epoch = epoch
        self._restart_epoch()
        self._pending = {
            "format": LOADER_STATE_FORMAT, "epoch": epoch, "seed": self.seed, "batch_size": self.batch_size,
            "batches": batches, "worker_batches": [int(b) for b in workers] if self._iterable else [],
            "next_worker": turn, "skipped": [[str(k), str(r)] for k, r in state["skipped"]], **self._order_plan(),
            **({"split": "batch"} if self._elastic else {}),
        }

    def _restart_epoch(self) -> None:
        self._batches_done = 0
        self._worker_batches = [0] * self._slots
        self._next_worker = 0

    def __iter__(self) -> Iterator[Any]:
        resume, self._pending = (self._pending if self._pending is not None and self._pending["epoch"] == self.epoch else None), None
        if self._split_later and ranks_in_step():
            self._split_by_rank()
        self._generator.manual_seed(epoch_seed(self.seed, self.epoch, WORKER_SEEDS))
        if isinstance(self._sampler, EpochSampler):
            self._sampler.set_epoch(self.epoch)
            self._say_reach(self._sampler)
        if isinstance(self.dataset, SupportsEpoch):
            self.dataset.set_epoch(self.epoch)
        self._restart_epoch()
        self.skipped = []
        if resume is not None:
            self._batches_done = resume["batches"]
            self._worker_batches = list(resume["worker_batches"]) or [0] * self._slots
            self._next_worker = resume["next_worker"]
            self.skipped = [Skipped(key, reason) for key, reason in resume["skipped"]]
        if self._positioned is not None:
            self._positioned.control[0] = self.epoch
            self._positioned.control[1:] = torch.tensor(self._worker_batches, dtype=torch.int64) * self.batch_size
        elif self._resume_sampler is not None:
            self._resume_sampler.skip = self._batches_done * self.batch_size
        batches: Iterator[Any]
        if self._iterable and self.backend == "thread" and self._positioned is not None:
            batches = thread_batches(self._positioned, self._slots, self.batch_size, self.drop_last, self._collate,
                                     self.prefetch_factor, _ThreadInit(self.placement))
        elif self._dataloader is not None:
            batches = self._iter_process(self._dataloader)
        elif self._pool is not None:
            batches = self._iter_threads(self._pool)
        elif self._positioned is not None:  # whole batches, read in this thread
            batches = iter(self._positioned)
        else:
            batches = map(self._load, self._batches)
        if self._iterable and self._slots > 1:
            batches = in_worker_order(batches, self._slots, self._next_worker)
        # Every rank the same number of batches: known for an even map-style split that cannot
        # skip; agreed at every step for the rest (stoker.loading.steps).
        steps = EqualSteps(self._counted(batches)) if self._agrees() else None
        self.trimmed = self._split_tail
        for item in steps if steps is not None else self._counted(batches):
            if isinstance(item, Batch) and item.ready is not None:  # decoded on a side stream (stoker.decode.device)
                item.ready.wait()
            yield to_device(item.data if isinstance(item, Batch) else item, self.device, non_blocking=self._pin)
        if steps is not None:
            self.trimmed += steps.trimmed
        if self.skipped:
            # the advice to skip is for a run that stops; this one already skips: each file's reason alone
            shown = "; ".join(f"{s.key}: {without_skip_advice(s.reason)}" for s in self.skipped[:3])
            log.warning(
                "skipped %d bad sample(s) in epoch %d: %s%s",
                len(self.skipped), self.epoch + 1, shown, " ..." if len(self.skipped) > 3 else "",
            )  # epochs are counted from 1 wherever a user reads them (the loader's own count starts at 0)
        self.epoch += 1
        self._restart_epoch()

    def _say_reach(self, sampler: EpochSampler) -> None:
        """A block shuffle whose blocks are shorter than what this loader's readers read at once: said once.

        The readers of a rank read up to ``num_workers x prefetch_factor`` batches ahead of
        the one in use, and the ranks are a step apart at most: a stretch of the order that
        long meets the shards of more blocks than the cache holds, and a shard evicted
        before its last read is fetched again. The order does not change (it never depends
        on the workers): the warning says which limit or reading fetches each shard once.
        """
        blocks = sampler.blocks
        if blocks is None or self._said_reach:
            return
        ahead = self.num_workers * self.prefetch_factor if self.num_workers else 0
        window = (ahead + 2) * self.batch_size * sampler.world_size  # positions of the epoch's order read at once
        if window <= blocks.smallest_block():
            return
        self._said_reach = True
        log.warning(
            "the block shuffle's blocks (at most %s bytes of shards, %d samples at least) are shorter than the %d "
            "samples of the epoch's order that %d rank(s) x %d worker(s) (prefetch_factor %d, batch %d) read at once: "
            "shards may be fetched more than once per epoch; a cache limit of at least %s bytes (--cache-limit, "
            "STOKER_CACHE_LIMIT), or fewer workers or a lower prefetch_factor, fetches each once",
            f"{blocks.budget:,}", blocks.smallest_block(), window, sampler.world_size, self.num_workers,
            self.prefetch_factor, self.batch_size, f"{2 * blocks.budget_for(window):,}",
        )

    def _split_by_rank(self) -> None:
        """Read this rank's share from now on: the process group started after this loader was made.

        ``make_loader(distributed=None)`` means "split by rank under torch.distributed";
        a loader made before the group exists (as a Lightning module's loader made before
        ``trainer.fit`` starts the ranks) would otherwise read the whole data set on every
        rank, each sample once per rank per epoch, with nothing said.
        """
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        sampler = EpochSampler(self.dataset, rank, world_size, shuffle=self._shuffle, seed=self.seed, even=self._even,
                               scope=self._scope)
        self._split_later, self._distributed, self._sampler = False, True, sampler
        if self._resume_sampler is not None:
            self._resume_sampler.base = sampler  # what the DataLoader (or the thread pool's batches) draws from
        self._split_tail = sampler.trimmed if rank == 0 else 0
        self.trimmed = self._split_tail
        log.info("the process group started after this loader was made: rank %d now reads its share (1 of %d) of %s",
                 rank, world_size, type(self.dataset).__name__)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The epoch's batches as they arrive, its position and skips counted; a batch left empty is not yielded."""
        for item in batches:
            self._batches_done += 1
            if isinstance(item, FromWorker):
                self._worker_batches[item.worker] += 1
                self._next_worker = (item.worker + 1) % self._slots
                item = item.batch
            if isinstance(item, Batch):
                self.skipped.extend(item.skipped)
                if item.size == 0:
                    continue
            yield item

    @property
    def equal_steps(self) -> bool:
        """Whether every rank of the process group gets the same number of batches from this loader.

        True for a loader made with ``even=True`` (the default): under an initialised
        process group with several ranks, each epoch yields the same number of batches on
        every rank, in any loop (see :mod:`stoker.loading.steps`); ``False`` for
        ``even=False`` (validation), whose ranks' shares may differ by a batch.
        """
        return self._even

    def _agrees(self) -> bool:
        """Whether this epoch's ranks agree at every step: even, several ranks, and the counts not known equal."""
        return self._even and ranks_in_step() and not steps_are_certain(self.dataset, self._sampler)

    def _iter_process(self, dataloader: DataLoader) -> Iterator[Any]:
        """The DataLoader's batches; on an error its workers are stopped at once, then the error goes on.

        The error's traceback holds the DataLoader's iterator: left to the garbage collector, its
        clean-up ran when the queues it signals through were already collected, and waited 5 s
        for each worker. A loop that stops early keeps its persistent workers for the next epoch.
        """
        batches = iter(dataloader)
        try:
            yield from batches
        except GeneratorExit:
            raise
        except BaseException as exc:
            _stop_workers(dataloader, batches)
            if isinstance(exc, StokerError):
                raise _without_worker_traceback(exc) from None
            raise

    def _load(self, indices: list[int]) -> Any:
        """One batch read here (in this thread): the data set's batch read where it has one, then the collate."""
        if self._reads_batches:
            return self._collate(self.dataset.__getitems__(indices))  # type: ignore[attr-defined]
        return self._collate([self.dataset[i] for i in indices])

    def _iter_threads(self, pool: ThreadPoolExecutor) -> Iterator[Any]:
        """Fetch batches on a thread pool, in order, with a bounded number in flight."""
        depth = max(self.num_workers, 1) * self.prefetch_factor
        pending: list[Future[Any]] = []
        batches = iter(self._batches)
        try:
            for indices in batches:
                pending.append(pool.submit(self._load, indices))
                if len(pending) >= depth:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Let the thread pool's threads go, and stop the persistent worker processes now.

        A loader dropped in a reference cycle (say, with an error's traceback held) is
        otherwise cleaned up by the garbage collector, where torch waits 5 s for each worker.
        """
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        dataloader = getattr(self, "_dataloader", None)
        running = getattr(dataloader, "_iterator", None)  # persistent worker processes
        if running is not None:
            _stop_workers(dataloader, running)  # type: ignore[arg-type]

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"workers={self.num_workers}, backend={self.backend!r}, device={self.device})"
        )


def _stop_workers(dataloader: DataLoader, batches: Iterator[Any]) -> None:
    """Stop the worker processes behind ``batches`` now (torch's own clean-up); the next epoch starts new ones."""
    stop = getattr(batches, "_shutdown_workers", None)
    if stop is not None:
        stop()
    if getattr(dataloader, "_iterator", None) is batches:  # persistent workers: not these any more
        dataloader._iterator = None


def _without_worker_traceback(exc: StokerError) -> StokerError:
    """The same error without the worker's traceback torch pastes into the message.

    A DataLoader re-raises a worker's exception in the main process with the worker's
    whole traceback as its message; a stoker error already says what, where and what to
    do, so keep that and say it came from a worker.
    """
    text = str(exc)
    prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    at = text.rfind(prefix)
    if "Original Traceback" not in text or at < 0:
        return exc
    try:
        return type(exc)(f"{text[at + len(prefix):].strip()} (in a loader worker process)")
    except TypeError:  # an error class with a different constructor: keep it as it came
        return exc


def make_loader(
    dataset: Dataset,
    batch_size: int = 64,
    shuffle: bool = True,
    num_workers: int | None = None,
    device: str | torch.device | None = "auto",
    *,
    drop_last: bool = False,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    backend: Backend | None = None,
    seed: int = 0,
    collate_fn: Callable[[Any], Any] | None = None,
    distributed: bool | None = None,
    even: bool = True,
    place_readers: bool | ReaderPlacement | None = None,
    shuffle_scope: ShuffleScope = "auto",
) -> Loader:
    """A loader with sound defaults for a map-style or iterable data set.

    Batches come out on ``device``, in an order seeded per epoch, each rank reading its own part; what
    it asks of a data set is in :mod:`stoker.loading.contract`, and the loading guide says more.

    Args:
        dataset: any torch Dataset: a stoker layout, a ``ShardDataset``, a ``Pipe``...
        batch_size, shuffle: samples per batch; reshuffle every epoch (map-style sets; a Pipe shuffles itself).
        num_workers: worker processes (or threads); default: ``loader_defaults``, else :mod:`stoker.loading.workers`.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda:0"``, or ``None`` (stay on the CPU).
        drop_last, prefetch_factor, persistent_workers: as torch's DataLoader takes them.
        backend: ``"process"`` (DataLoader workers) or ``"thread"`` (a pool in this process).
        seed: base of the shuffle order and worker seeds.
        collate_fn: batch maker; default: the data set's ``collate_fn``, else torch's.
        distributed: split a map-style data set by rank; default: when ``torch.distributed`` is initialised.
        even: every rank yields the same number of batches; ``False``: each sample once (validation).
        place_readers: leave the training thread its CPU (:mod:`stoker.loading.reader_cpu`).
        shuffle_scope: ``"split"``, ``"blocks"`` (:func:`stoker.order.block_permutation`) or ``"auto"``.

    Example:
        >>> from stoker import ClassFolderDataset
        >>> loader = make_loader(ClassFolderDataset("data/digiface"), batch_size=16, num_workers=0, device=None)
        >>> images, labels = next(iter(loader))
        >>> images.dtype, images.shape[0], labels.shape
        (torch.uint8, 16, torch.Size([16]))
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    defaults = (dataset.loader_defaults or {}) if isinstance(dataset, SupportsLoaderDefaults) else {}
    if backend is None:
        backend = defaults.get("backend", "process")
    if num_workers is None:  # stoker.loading.workers: the one rule
        num_workers = default_workers(defaults, follows_workers=batches_follow_workers(dataset),
                                      accelerator=resolve_device(device).type != "cpu", backend=str(backend))
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_factor < 1:
        raise ConfigError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if shuffle_scope not in SHUFFLE_SCOPES:
        raise ConfigError(f"shuffle_scope must be one of {', '.join(SHUFFLE_SCOPES)}; got {shuffle_scope!r}")
    iterable = isinstance(dataset, IterableDataset)
    split_later = distributed is None  # no process group yet: the loader splits when one starts (Lightning)
    if distributed is None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    sampler: Sampler[int] | None = None
    if distributed and not iterable:
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        sampler = EpochSampler(dataset, rank, world_size, shuffle=shuffle, seed=seed, even=even, scope=shuffle_scope)
    resolved = resolve_device(device) if device is not None else torch.device("cpu")
    if isinstance(dataset, SupportsReadFor):  # a reader that may decode on a GPU decodes where the batches go
        dataset.read_for(resolved)
    return Loader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        device=resolved,
        drop_last=drop_last,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        backend=backend,
        seed=seed,
        collate_fn=collate_fn or (dataset.collate_fn if isinstance(dataset, SupportsCollate) else collate),
        sampler=sampler,
        even=even,
        split_later=split_later,
        placement=place_readers if isinstance(place_readers, ReaderPlacement) else plan_readers(
            place_readers, accelerator=resolve_device(device).type != "cpu"),
        shuffle_scope=shuffle_scope,
    )
