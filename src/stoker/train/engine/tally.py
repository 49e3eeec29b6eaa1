"""The running figures of one phase of an epoch, and what a mid-epoch ``last.pt`` keeps of them.

A batch's loss and hits are tensors on the device; turning them into numbers makes the
host wait for the device to finish the batch, so that it cannot queue the next one
meanwhile. :class:`PendingBatches` keeps them on the device and reads a whole window of
batches back in one copy; :class:`Tally` sums what was read back.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import torch

from stoker.errors import ConfigError
from stoker.train.engine.interrupt import StopRequest
from stoker.train.engine.timing import PhaseTimer
from stoker.train.loggers import BatchProgress, Logger

__all__ = ["PendingBatches", "TALLY_STATE_FORMAT", "Tally", "mid_epoch_entry", "notify_batch_end"]

TALLY_STATE_FORMAT = "stoker-tally/1"
_COUNTS = ("batches", "samples", "hits")


class Tally:
    """Running sums of one phase: samples, loss x batch size, argmax hits (``state_dict`` for a mid-epoch save)."""

    def __init__(self, phase: str, epoch: int, batches: int | None) -> None:
        self.phase, self.epoch, self.total_batches = phase, epoch, batches
        self.batches = self.samples = self.hits = 0
        self.loss_sum = 0.0

    def add(self, loss: float, hits: int, size: int) -> None:
        """Count one batch: its mean ``loss``, argmax ``hits`` and ``size`` (samples)."""
        self.batches += 1
        self.samples += size
        self.hits += hits
        self.loss_sum += loss * size  # the batch's mean loss, weighted by its size

    def progress(self, timer: PhaseTimer) -> BatchProgress:
        """The running figures the loggers get after a batch."""
        return BatchProgress(
            self.phase, self.epoch, self.batches, self.total_batches, self.samples,
            self.loss, self.acc, timer.elapsed_s, timer.data_wait_s,
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"format", "batches", "samples", "hits", "loss_sum"}`` so far (``format``: :data:`TALLY_STATE_FORMAT`)."""
        return {"format": TALLY_STATE_FORMAT, "batches": self.batches, "samples": self.samples, "hits": self.hits,
                "loss_sum": self.loss_sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (a resumed epoch).

        A state without ``format`` is the shape written before the format was named
        (a mid-epoch ``last.pt`` of an earlier stoker) and loads as it is.

        Raises:
            ConfigError: another format, a missing key, or a count that is not a whole
                number >= 0 (or more hits than samples), or a loss sum that is not a
                finite number; nothing is changed then.
        """
        what_to_do = ("pass what Tally.state_dict() returned; from a checkpoint, its mid-epoch entry is damaged or "
                      "from another stoker: delete the run folder's last.pt to start the epoch over")
        if not isinstance(state, dict):
            raise ConfigError(f"not a {TALLY_STATE_FORMAT} tally state (a {type(state).__name__}); {what_to_do}")
        form = state.get("format", TALLY_STATE_FORMAT)  # none: the unversioned shape before stoker-tally/1, the same keys
        if form != TALLY_STATE_FORMAT:
            raise ConfigError(f"a tally state of format {form!r}, but this stoker reads {TALLY_STATE_FORMAT}; {what_to_do}")
        missing = [k for k in (*_COUNTS, "loss_sum") if k not in state]
        if missing:
            raise ConfigError(f"not a {TALLY_STATE_FORMAT} tally state (missing {missing}); {what_to_do}")
        bad = [f"{k}={state[k]!r}" for k in _COUNTS
               if isinstance(state[k], bool) or not isinstance(state[k], numbers.Integral) or state[k] < 0]
        loss_sum = state["loss_sum"]
        if isinstance(loss_sum, bool) or not isinstance(loss_sum, numbers.Real) or not math.isfinite(loss_sum):
            bad.append(f"loss_sum={loss_sum!r}")
        if not bad and state["hits"] > state["samples"]:
            bad.append(f"hits={state['hits']!r} > samples={state['samples']!r}")
        if bad:
            raise ConfigError(
                f"a {TALLY_STATE_FORMAT} tally state holds {', '.join(bad)} (counts are whole numbers >= 0, "
                f"the loss sum a finite number); {what_to_do}"
            )
        self.batches, self.samples, self.hits = int(state["batches"]), int(state["samples"]), int(state["hits"])
        self.loss_sum = float(loss_sum)

    @property
    def loss(self) -> float:
        """Mean loss over the samples so far (``nan`` before any)."""
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def acc(self) -> float:
        """Share of argmax hits so far (``nan`` before any)."""
        return self.hits / self.samples if self.samples else math.nan


class PendingBatches:
    """The loss and argmax hits of the batches since the last read-back, still on the device.

    :meth:`flush` reads them all back in one copy (the one wait for the device per
    window) and counts them in ``tally`` in batch order, so the sums are the same, to
    the bit, whatever the window's size.

    Args:
        tally: where the batches are counted when they are read back.
        every: batches per window: :attr:`full` says when a read-back is due.

    Example:
        >>> tally = Tally("train", 1, None)
        >>> pending = PendingBatches(tally, every=2)
        >>> pending.add(torch.tensor(0.5), torch.tensor(3), 4)
        >>> pending.add(torch.tensor(float("nan")), torch.tensor(1), 4)
        >>> pending.full, pending.flush()
        (True, (2, nan))
        >>> tally.batches, tally.loss
        (1, 0.5)
    """

    def __init__(self, tally: Tally, every: int) -> None:
        self.tally, self.every = tally, every
        self._losses: list[torch.Tensor] = []  # 0-d: the batch's mean loss
        self._hits: list[torch.Tensor] = []  # 0-d: how many argmax predictions were right
        self._sizes: list[int] = []

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def full(self) -> bool:
        """Whether the window holds ``every`` batches."""
        return len(self._sizes) >= self.every

    def add(self, loss: torch.Tensor, hits: torch.Tensor, size: int) -> None:
        """Keep one batch's mean ``loss`` and ``hits`` (0-d tensors, not read) and its ``size``."""
        self._losses.append(loss.detach())
        self._hits.append(hits.detach())
        self._sizes.append(size)

    def flush(self, notify: Callable[[], None] | None = None, check_finite: bool = True) -> tuple[int, float] | None:
        """Read the window back and count its batches in the tally, in order, calling ``notify`` after each.

        Args:
            notify: called after each batch is counted (the loggers' ``batch_end``).
            check_finite: stop at the first non-finite loss: that batch and the ones after
                it are not counted (the run is stopping). Off, they are counted as they are.

        Returns:
            ``(batch, loss)`` of the first non-finite loss (the batch numbered from 1 in the
            phase, as the tally counts), or ``None``.
        """
        if not self._sizes:
            return None
        # float64 holds every float32 loss and every hit count exactly: one stack, one copy, one wait.
        rows = torch.stack([torch.stack(self._losses).double(), torch.stack(self._hits).double()], dim=1).tolist()
        sizes = self._sizes
        self._losses, self._hits, self._sizes = [], [], []
        for (loss, hits), size in zip(rows, sizes, strict=True):
            if check_finite and not math.isfinite(loss):
                return self.tally.batches + 1, loss
            self.tally.add(loss, int(hits), size)
            if notify is not None:
                notify()
        return None


def notify_batch_end(loggers: Iterable[Logger], progress: BatchProgress, stop: StopRequest) -> None:
    """Tell the loggers; a ``KeyboardInterrupt`` from one asks the run to stop at the next step boundary."""
    for logger in loggers:
        try:
            logger.batch_end(progress)
        except KeyboardInterrupt:
            stop.request("KeyboardInterrupt")


def mid_epoch_entry(epoch: int, phase: str, train: Tally, timer: PhaseTimer, lr: float, loader: Any) -> dict[str, Any]:
    """The ``partial`` entry of a mid-epoch ``last.pt`` (see :mod:`stoker.train.engine.resume`).

    ``train`` must have been flushed (its pending batches read back); the timer is
    settled here, so the saved data wait covers every batch trained.
    """
    data_wait_s = timer.settle()
    return {
        "epoch": epoch,
        "phase": phase,
        "loader": loader,
        "train": train.state_dict(),
        "train_timer": {"wall_s": timer.elapsed_s, "data_wait_s": data_wait_s},
        "lr": lr,
    }
