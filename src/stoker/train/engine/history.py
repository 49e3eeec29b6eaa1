"""What a run measured: one :class:`EpochStats` per epoch, gathered in a :class:`History`."""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError

__all__ = ["EpochStats", "HISTORY_STATE_FORMAT", "History", "METRIC_COLUMNS"]

HISTORY_STATE_FORMAT = "stoker-history/1"

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
        trimmed: training samples of the epoch left out so that every rank runs the
            same number of steps (several ranks only; over all ranks).
        slowest_data_wait_share: the largest ``data_wait_share`` of any rank (one slow
            loader holds every rank back); equal to ``data_wait_share`` on one process.
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
    trimmed: int = 0
    slowest_data_wait_share: float = 0.0

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
            ``"no readable batch"``, ``"no batches"``, ``"interrupted"`` or ``"error"``.
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
            ``{"format": HISTORY_STATE_FORMAT, "epochs": [EpochStats.to_dict(), ...],
            "best_acc": float, "best_epoch": int}``.

        Example:
            >>> History().state_dict()
            {'format': 'stoker-history/1', 'epochs': [], 'best_acc': -inf, 'best_epoch': 0}
        """
        return {
            "format": HISTORY_STATE_FORMAT,
            "epochs": [e.to_dict() for e in self.epochs],
            "best_acc": self.best_acc,
            "best_epoch": self.best_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (``run_dir`` and ``stopped`` stay as they are).

        A state without ``format`` is the shape written before the format was named (a
        ``last.pt`` of an earlier stoker) and loads as it is; so do epochs without the
        figures added since (``skipped``, ``trimmed``, ``slowest_data_wait_share``: 0).

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ConfigError: another format, a missing key, an epoch that lacks a figure or
                holds one of the wrong type, or a best epoch that is not a whole number
                >= 0; nothing is changed then.
        """
        what_to_do = ("pass what History.state_dict() returned; from a checkpoint, it is damaged or from another "
                      "stoker: restore last.pt from a copy, or start a new run under another name")
        if not isinstance(state, dict):
            raise ConfigError(f"not a {HISTORY_STATE_FORMAT} history state (a {type(state).__name__}); {what_to_do}")
        form = state.get("format", HISTORY_STATE_FORMAT)  # none: the unversioned shape before stoker-history/1
        if form != HISTORY_STATE_FORMAT:
            raise ConfigError(f"a history state of format {form!r}, but this stoker reads {HISTORY_STATE_FORMAT}; {what_to_do}")
        missing = [k for k in ("epochs", "best_acc", "best_epoch") if k not in state]
        if missing:
            raise ConfigError(f"not a {HISTORY_STATE_FORMAT} history state (missing {missing}); {what_to_do}")
        if not isinstance(state["epochs"], list):
            raise ConfigError(f"a history state's epochs must be a list, got {type(state['epochs']).__name__}; {what_to_do}")
        epochs = [_epoch_from_state(e, i, what_to_do) for i, e in enumerate(state["epochs"])]
        best_acc, best_epoch = state["best_acc"], state["best_epoch"]
        if isinstance(best_acc, bool) or not isinstance(best_acc, numbers.Real):
            raise ConfigError(f"a history state's best_acc must be a number, got {best_acc!r}; {what_to_do}")
        if isinstance(best_epoch, bool) or not isinstance(best_epoch, numbers.Integral) or best_epoch < 0:
            raise ConfigError(f"a history state's best_epoch must be a whole number >= 0, got {best_epoch!r}; {what_to_do}")
        self.epochs, self.best_acc, self.best_epoch = epochs, float(best_acc), int(best_epoch)


def _epoch_from_state(values: Any, index: int, what_to_do: str) -> EpochStats:
    """One epoch of a history state, every figure checked: whole numbers where counts are, numbers elsewhere."""
    if not isinstance(values, dict):
        raise ConfigError(f"a history state's epoch {index} must be a dict of figures, got {values!r}; {what_to_do}")
    known = {f.name: f for f in fields(EpochStats)}
    required = [f.name for f in known.values() if f.default is MISSING]
    missing = [k for k in required if k not in values]
    if missing:
        raise ConfigError(f"a history state's epoch {index} lacks {missing}; {what_to_do}")
    for name, f in known.items():
        if name not in values:
            continue
        value = values[name]
        whole = f.type in ("int", int)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
            kind = "a whole number" if whole else "a number"
            raise ConfigError(f"a history state's epoch {index} has {name}={value!r}, not {kind}; {what_to_do}")
    return EpochStats.from_dict(values)
