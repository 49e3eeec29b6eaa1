"""The one small interface every logger (and any callback given to ``fit``) implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.train.engine.history import EpochStats, History

__all__ = ["BatchProgress", "Logger", "RunInfo"]


@dataclass(frozen=True)
class RunInfo:
    """What a logger knows about the run when it starts.

    Attributes:
        name: the run's name.
        run_dir: the run folder (CSV, events, checkpoints, ``run.json`` go here).
        epochs: the total number of epochs.
        start_epoch: epochs already done (non-zero when resuming).
        device: the device, e.g. ``"cuda:0"``.
        tags: the run's tags.
        config: the run's configuration, for the record.
        resumed: whether the run continues from a checkpoint.
        loader_bound_share: the data-wait share above which an epoch is loader-bound.
        compute: how the CPU is shared, e.g. "torch threads 1 (of 2 cores, 1 left to the
            loader workers)"; empty on a GPU.
        adapting: adapt tries the train loader's settings (it acts on a loader-bound epoch itself).
        url: the run folder's URL when the log folder is one (``run_dir`` is then this
            machine's copy of it, which messages do not name), else ``None``.
    """

    name: str
    run_dir: Path
    epochs: int
    start_epoch: int = 0
    device: str = "cpu"
    tags: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    resumed: bool = False
    loader_bound_share: float = 0.3
    compute: str = ""
    adapting: bool = False
    url: str | None = None


@dataclass(frozen=True)
class BatchProgress:
    """Running figures of the current phase, after one batch.

    Attributes:
        phase: ``"train"`` or ``"valid"``.
        epoch: 1-based epoch number.
        batch: 1-based batch number within the phase.
        batches: batches in the phase (``None`` when the loader has no length).
        samples: samples seen so far in the phase.
        loss, acc: running mean loss and accuracy of the phase, up to this batch.
        elapsed_s, data_wait_s: running times of the phase when the batch was read
            back (the same for every batch of one read-back; see ``Scenario.sync_every``).
    """

    phase: str
    epoch: int
    batch: int
    batches: int | None
    samples: int
    loss: float
    acc: float
    elapsed_s: float
    data_wait_s: float

    @property
    def img_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Logger:
    """Receives the events of a run; every method is optional (the defaults do nothing).

    ``fit`` calls, in order: :meth:`start` once, then per epoch :meth:`epoch_start`,
    :meth:`batch_end` for every batch of both phases and :meth:`epoch_end`, and
    :meth:`end` once, also when the run stops early or fails. ``batch_end`` comes when
    the batch's loss is read back from the device, every ``Scenario.sync_every``
    batches (each batch in order, with its own figures): on CUDA 16 calls at a time
    by default, on the CPU one per batch.

    Example:
        >>> class Best(Logger):
        ...     def epoch_end(self, stats):
        ...         print(stats.epoch, stats.valid_acc)
        >>> from stoker.train import load_config, train_from_config
        >>> config = load_config(None, ["data.path=data/digiface", "data.image_size=16", "data.workers=0",
        ...                             "run.epochs=1", "run.progress=false", "run.adapt=false"])
        >>> _ = train_from_config(config, callbacks=[Best()], echo=None)
        run ...
        1/1 - tLoss ...
        1 0...
        best valid accuracy ...
    """

    def start(self, run: RunInfo, history: History) -> None:
        """The run starts; ``history`` holds the epochs a resumed run already did."""

    def epoch_start(self, epoch: int, batches: int | None) -> None:
        """Epoch ``epoch`` (1-based) starts; ``batches``: train + valid batches, if known."""

    def batch_end(self, progress: BatchProgress) -> None:
        """A batch is done."""

    def epoch_end(self, stats: EpochStats) -> None:
        """An epoch is done and its checkpoint written."""

    def end(self, history: History) -> None:
        """The run ended (``history.stopped`` says why); flush and close."""

    def note(self, line: str) -> None:
        """A line the run has to say while it trains, e.g. the loader setting adapt chose (:mod:`stoker.train.engine.adapt`)."""
