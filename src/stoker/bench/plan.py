"""``BenchPlan``: what one benchmark runs, on what data, checked before anything runs.

A plan is the arguments of :func:`~stoker.bench.bench` as one dataclass: ``stoker
bench`` builds one from its flags, :func:`~stoker.bench.quick_bench` from its few
arguments, and :func:`~stoker.bench.run_bench` runs it.

Example:
    >>> plan = BenchPlan("digiface/", methods=["files", "shards-pixels"], workers=(0, 2), max_seconds=10)
    >>> [m.name for m in plan.resolved_methods()]
    ['files', 'shards-pixels']
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stoker.bench.methods import Method, resolve_methods
from stoker.errors import ConfigError
from stoker.loading.backends import BACKENDS
from stoker.train.runner.config import AMP_MODES, OPTIMIZERS, OptimConfig

if TYPE_CHECKING:
    from stoker.sources.dataset import FileDataset

__all__ = ["DEFAULT_WORKERS", "MODES", "TRAIN_OPTIMIZER", "BenchPlan"]

DEFAULT_WORKERS: tuple[int, ...] = (0, 1, 2, 4)
MODES: tuple[str, ...] = ("load", "train")
TRAIN_OPTIMIZER: str = OptimConfig().name  # stoker train's default optimizer


@dataclass(frozen=True)
class BenchPlan:
    """Every method x workers x backend to time on one data set, and how.

    Raises:
        ConfigError: a bad value (unknown method, negative workers...), on construction.
    """

    data: str | os.PathLike[str] | FileDataset
    """A folder in any layout stoker reads, or a stoker data set."""
    methods: Sequence[str | Method] | None = None
    """Registered method names (:data:`~stoker.bench.methods.METHODS`: ``files``, ``pipe``, ``shards-encoded``,
    ``shards-pixels``...) or :class:`~stoker.bench.methods.Method` objects; ``None``: every registered method."""
    workers: Sequence[int] = DEFAULT_WORKERS
    """Numbers of loader workers to try."""
    backends: Sequence[str] = BACKENDS[:1]  # the process backend
    """Loader backends to try (:data:`~stoker.loading.backends.BACKENDS`)."""
    mode: str = "load"
    """``"load"`` only loads batches; ``"train"`` also runs a training step of ``model`` on each, and reports the
    share of time spent waiting for data."""
    model: str = "resnet18"
    """The model of train mode (``small_cnn`` or a torchvision classifier)."""
    amp: str | None = None
    """Train mode's precision, ``"off"``, ``"bf16"`` or ``"fp16"``; ``None``: bf16 on CUDA, float32 elsewhere
    (:mod:`stoker.bench.step`)."""
    channels_last: bool | None = None
    """Train mode's memory format, as ``stoker train`` takes it (``None``: its default, on for a convolutional model
    on CUDA under AMP)."""
    optimizer: str = TRAIN_OPTIMIZER
    """Train mode's optimizer, as ``stoker train --optimizer`` (default: its default)."""
    batch_size: int = 256
    """Samples per batch."""
    epochs: int = 1
    """Epochs per run (each checked)."""
    max_seconds: float | None = None
    """Stop each run after this long (the result is then ``partial``)."""
    size: tuple[int, int] | None = None
    """``(height, width)`` to resize every image to; needed when sizes differ."""
    packed: str | os.PathLike[str] | None = None
    """A folder holding ``encoded/`` and/or ``pixels/`` shard sets of this data to reuse (packing is then not timed);
    by default they are packed into a temporary folder that is removed afterwards."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead."""
    shuffle_buffer: int = 10_000
    """The Pipe's shuffle buffer."""
    device: str | None = "auto"
    """Where batches go (``"auto"``: CUDA when present)."""
    cold: bool = False
    """Drop the data's files from the page cache before each run."""
    limits_time_s: float = 1.0
    """Seconds for each limit measurement."""
    seed: int = 0
    """Seed of every shuffle and of the packing."""
    progress: bool = True
    """Show a progress bar per run on stderr."""

    def __post_init__(self) -> None:
        self.resolved_methods()
        workers = self.workers
        if not workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in workers):
            raise ConfigError(f"workers must be whole numbers >= 0, got {list(workers)!r}")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ConfigError(f"backends must be among {', '.join(BACKENDS)}, got {list(self.backends)!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be {' or '.join(repr(m) for m in MODES)}, got {self.mode!r}")
        if self.amp is not None and self.amp not in AMP_MODES:
            raise ConfigError(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.batch_size < 1 or self.epochs < 1:
            raise ConfigError(f"batch_size and epochs must be >= 1, got {self.batch_size} and {self.epochs}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"max_seconds must be positive, got {self.max_seconds}")
        if self.prefetch_factor < 1 or self.shuffle_buffer < 1:
            raise ConfigError(
                f"prefetch_factor and shuffle_buffer must be >= 1, got {self.prefetch_factor} and {self.shuffle_buffer}"
            )

    def resolved_methods(self) -> list[Method]:
        """The plan's methods as :class:`Method` objects (registered names looked up)."""
        return resolve_methods(self.methods)

    def runs(self) -> list[tuple[Method, str, int]]:
        """``(method, backend, workers)`` of every run, in the order they run."""
        return [(m, b, w) for m in self.resolved_methods() for b in self.backends for w in self.workers]
