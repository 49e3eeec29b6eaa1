"""What a run measured: one :class:`EpochStats` per epoch, gathered in a :class:`History`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError

__all__ = ["EpochStats", "History", "METRIC_COLUMNS"]

# Column name (CSV, TensorBoard tag, ``stoker compare --metric``) -> EpochStats field.
METRIC_COLUMNS: dict[str, str] = {
    "epoch": "epoch",
    "acc/train": "train_acc",
    "acc/valid": "valid_acc",
    "loss/train": "train_loss",
    "loss/valid": "valid_loss",
    "time_s": "time_s",
    "img_per_s": "img_per_s",
    "data_wait_share": "data_wait_share",
    "lr": "lr",
}


@dataclass(frozen=True)
class EpochStats:
    """The measurements of one epoch (train and validation together).

    Losses are the mean over samples (each batch's mean loss weighted by its size) and
    accuracies the share of argmax hits; validation values are ``nan`` without a
    validation loader. Times are in seconds.

    Attributes:
        epoch: 1-based epoch number.
        train_loss, train_acc, valid_loss, valid_acc: the metrics.
        time_s: wall time of the epoch (train + validation).
        train_time_s: wall time of the training phase.
        data_wait_s: time spent waiting for the next batch (both phases).
        compute_s: the rest of ``time_s``.
        img_per_s: training samples per second of training phase.
        data_wait_share: ``data_wait_s / time_s``.
        lr: learning rate of the first parameter group at the end of the epoch.
        train_samples, valid_samples: samples seen.
        skipped: bad samples the loaders skipped (``on_error="skip"``).
    """

    epoch: int
    train_loss: float
    train_acc: float
    valid_loss: float
    valid_acc: float
    time_s: float
    train_time_s: float
    data_wait_s: float
    compute_s: float
    img_per_s: float
    data_wait_share: float
    lr: float
    train_samples: int
    valid_samples: int
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of numbers (what checkpoints store)."""
        return asdict(self)

    def as_row(self) -> dict[str, float]:
        """The epoch under its column names (``epoch``, ``acc/train``... as in ``metrics.csv``)."""
        return {column: getattr(self, attr) for column, attr in METRIC_COLUMNS.items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EpochStats:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class History:
    """Every epoch of a run, and how it ended.

    Attributes:
        epochs: one :class:`EpochStats` per finished epoch, in order (also the ones a
            resumed run inherited from its checkpoint).
        run_dir: the run folder.
        best_acc: best validation accuracy so far (``-inf`` before any).
        best_epoch: the epoch that reached it (0 before any).
        stopped: why the run ended: ``"finished"``, ``"patience"``, ``"non-finite loss"``,
            ``"interrupted"`` or ``"error"``.
    """

    epochs: list[EpochStats] = field(default_factory=list)
    run_dir: Path | None = None
    best_acc: float = -math.inf
    best_epoch: int = 0
    stopped: str = "running"

    def __len__(self) -> int:
        return len(self.epochs)

    def __getitem__(self, i: int) -> EpochStats:
        return self.epochs[i]

    def column(self, name: str) -> list[float]:
        """One metric across epochs, e.g. ``history.column("valid_acc")``."""
        return [getattr(e, name) for e in self.epochs]

    def rows(self) -> list[dict[str, float]]:
        """Every epoch under its column names, as :func:`~stoker.train.loggers.read_csv` returns them."""
        return [e.as_row() for e in self.epochs]

    @property
    def last(self) -> EpochStats | None:
        """The latest epoch, or ``None`` before the first."""
        return self.epochs[-1] if self.epochs else None

    def state_dict(self) -> dict[str, Any]:
        """The finished epochs and the best so far, as plain data (what ``last.pt`` holds).

        Returns:
            ``{"epochs": [EpochStats.to_dict(), ...], "best_acc": float, "best_epoch": int}``.

        Example:
            >>> History().state_dict()
            {'epochs': [], 'best_acc': -inf, 'best_epoch': 0}
        """
        return {"epochs": [e.to_dict() for e in self.epochs], "best_acc": self.best_acc, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (``run_dir`` and ``stopped`` stay as they are).

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ConfigError: the state lacks a key or holds an epoch that is not a dict of figures.
        """
        missing = [k for k in ("epochs", "best_acc", "best_epoch") if not isinstance(state, dict) or k not in state]
        if missing:
            raise ConfigError(f"not a History state (missing {missing}); pass what History.state_dict() returned")
        try:
            epochs = [EpochStats.from_dict(e) for e in state["epochs"]]
            best_acc, best_epoch = float(state["best_acc"]), int(state["best_epoch"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a History state: {exc}") from None
        self.epochs, self.best_acc, self.best_epoch = epochs, best_acc, best_epoch
