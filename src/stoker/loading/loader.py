"""``make_loader``: a torch DataLoader with sound defaults, skip accounting and device copies."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, cast

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from stoker.errors import ConfigError, StokerError
from stoker.loading.collate import Batch, collate, to_device
from stoker.loading.skips import Skipped

__all__ = ["BACKENDS", "Backend", "Loader", "make_loader", "resolve_device"]

log = logging.getLogger("stoker")

Backend = Literal["process", "thread"]
BACKENDS: tuple[Backend, ...] = ("process", "thread")  # the one list of loader backends


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/``None`` means CUDA when available, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device {device!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None


def _seed_worker(worker_id: int) -> None:
    """Seed Python's and numpy's RNGs from the seed torch gave this worker (distinct per worker)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class Loader:
    """Iterates batches of a data set, moved to the device; made by :func:`make_loader`.

    Each iteration is one epoch. The epoch number advances by itself after every full
    pass (or is set with :meth:`set_epoch`), and it fixes the shuffle order and the
    worker seeds: the same ``seed`` and epoch always give the same batches, which is
    what makes a resumed training run equal an uninterrupted one.

    Attributes:
        skipped: bad samples skipped in the last epoch (``on_error="skip"``).
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
    ) -> None:
        self.dataset = dataset
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
        # The shuffle order has its own generator: a DataLoader draws worker seeds from its
        # generator on a fresh iterator but not on a persistent one's reset, which would
        # make epoch N's order depend on whether the workers were started this epoch.
        self._sampler_generator = torch.Generator()
        self._iterable = isinstance(dataset, IterableDataset)
        self._distributed = isinstance(sampler, DistributedSampler)
        if self._iterable:
            self._sampler: Sampler[int] | None = None
        elif sampler is not None:
            self._sampler = sampler
        elif shuffle:
            self._sampler = RandomSampler(dataset, generator=self._sampler_generator)  # type: ignore[arg-type]
        else:
            self._sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        self._pin = device.type == "cuda"
        self._dataloader: DataLoader | None = None
        if backend == "process":
            self._dataloader = DataLoader(
                dataset,
                batch_size=batch_size,
                sampler=self._sampler,
                num_workers=num_workers,
                collate_fn=collate_fn,
                pin_memory=self._pin,
                drop_last=drop_last,
                prefetch_factor=prefetch_factor if num_workers > 0 else None,
                persistent_workers=persistent_workers and num_workers > 0,
                worker_init_fn=_seed_worker if num_workers > 0 else None,
                generator=self._generator,
            )
        else:
            if self._sampler is None:
                raise ConfigError("backend='thread' needs a map-style data set; use backend='process' for a Pipe")
            self._batches = BatchSampler(self._sampler, batch_size, drop_last)
            self._pool = ThreadPoolExecutor(max(num_workers, 1), thread_name_prefix="stoker-loader")
        self.drop_last = drop_last

    def __len__(self) -> int:
        """Number of batches per epoch (for map-style data sets)."""
        if self._dataloader is not None:
            return len(self._dataloader)
        return len(self._batches)

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch number the next iteration uses (shuffle order and worker seeds)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        self._generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        self._sampler_generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        if self._distributed:
            self._sampler.set_epoch(self.epoch)  # type: ignore[union-attr]
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        self.skipped = []
        batches = self._iter_process(self._dataloader) if self._dataloader is not None else self._iter_threads()
        for item in batches:
            if isinstance(item, Batch):
                self.skipped.extend(item.skipped)
                if item.size == 0:
                    continue
                item = item.data
            yield to_device(item, self.device, non_blocking=self._pin)
        if self.skipped:
            shown = "; ".join(f"{s.key}: {s.reason}" for s in self.skipped[:3])
            log.warning(
                "skipped %d bad sample(s) in epoch %d (on_error='skip'): %s%s",
                len(self.skipped), self.epoch, shown, " ..." if len(self.skipped) > 3 else "",
            )
        self.epoch += 1

    def _iter_process(self, dataloader: DataLoader) -> Iterator[Any]:
        try:
            yield from dataloader
        except StokerError as exc:
            raise _without_worker_traceback(exc) from None

    def _iter_threads(self) -> Iterator[Any]:
        """Fetch batches on a thread pool, in order, with a bounded number in flight."""
        fetch = getattr(self.dataset, "__getitems__", None)

        def load(indices: list[int]) -> Any:
            samples = fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
            return self._collate(samples)

        depth = max(self.num_workers, 1) * self.prefetch_factor
        pending: list[Future[Any]] = []
        batches = iter(self._batches)
        try:
            for indices in batches:
                pending.append(self._pool.submit(load, indices))
                if len(pending) >= depth:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Let the thread pool's threads go (the process backend's workers go with the loader)."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"workers={self.num_workers}, backend={self.backend!r}, device={self.device})"
        )


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
) -> Loader:
    """A loader with sound defaults for a map-style or iterable data set.

    Batches come out already on ``device`` (non-blocking copies from pinned memory when
    it is CUDA). Shuffling is seeded per epoch, every worker gets a distinct seed, and
    under ``torch.distributed`` each rank reads its own part of every epoch.

    Args:
        dataset: any torch Dataset: a stoker layout, a ``ShardDataset``, a ``Pipe``...
        batch_size: samples per batch.
        shuffle: reshuffle every epoch (map-style data sets; a Pipe shuffles itself).
        num_workers: worker processes (or threads); default: the data set's
            ``loader_defaults`` (a shard set knows what reads it fastest), else
            ``min(4, cpu count)``.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda:0"``, or ``None`` to leave batches on the CPU.
        drop_last: drop the last, short batch.
        prefetch_factor: batches each worker loads ahead.
        persistent_workers: keep worker processes between epochs.
        backend: ``"process"`` (torch DataLoader workers) or ``"thread"`` (a thread
            pool in this process; good when decoding releases the GIL or samples are
            cheap to read but costly to ship between processes); default: the data
            set's ``loader_defaults``, else ``"process"``.
        seed: base of the shuffle order and worker seeds.
        collate_fn: batch maker; default: the data set's ``collate_fn`` attribute if it
            has one, else torch's default collate with bad-sample accounting.
        distributed: split by rank with a ``DistributedSampler``; default: when
            ``torch.distributed`` is initialised.

    Returns:
        A :class:`Loader`; iterate it once per epoch.

    Example:
        >>> loader = make_loader(ClassFolderDataset("digiface"), batch_size=256, num_workers=2)  # doctest: +SKIP
        >>> for images, labels in loader:  # images: uint8 [256, 3, 112, 112] on the device  # doctest: +SKIP
        ...     pass
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    defaults = getattr(dataset, "loader_defaults", None) or {}
    if num_workers is None:
        num_workers = int(defaults.get("num_workers", min(4, os.cpu_count() or 1)))
    if backend is None:
        backend = defaults.get("backend", "process")
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_factor < 1:
        raise ConfigError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    iterable = isinstance(dataset, IterableDataset)
    if backend == "thread" and iterable:
        raise ConfigError("backend='thread' needs a map-style data set; use backend='process' for a Pipe")
    if distributed is None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    sampler: Sampler[int] | None = None
    if distributed and not iterable:
        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    resolved = resolve_device(device) if device is not None else torch.device("cpu")
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
        collate_fn=collate_fn or cast(Callable[[Any], Any], getattr(dataset, "collate_fn", collate)),
        sampler=sampler,
    )
