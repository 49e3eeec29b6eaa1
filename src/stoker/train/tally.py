"""The running figures of one phase of an epoch, and what a mid-epoch ``last.pt`` keeps of them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from stoker.train.interrupt import StopRequest
from stoker.train.loggers import BatchProgress, Logger
from stoker.train.timing import PhaseTimer

__all__ = ["Tally", "mid_epoch_entry", "notify_batch_end"]


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
        """``{"batches", "samples", "hits", "loss_sum"}`` so far."""
        return {"batches": self.batches, "samples": self.samples, "hits": self.hits, "loss_sum": self.loss_sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (a resumed epoch)."""
        self.batches, self.samples, self.hits = int(state["batches"]), int(state["samples"]), int(state["hits"])
        self.loss_sum = float(state["loss_sum"])

    @property
    def loss(self) -> float:
        """Mean loss over the samples so far (``nan`` before any)."""
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def acc(self) -> float:
        """Share of argmax hits so far (``nan`` before any)."""
        return self.hits / self.samples if self.samples else math.nan


def notify_batch_end(loggers: Iterable[Logger], progress: BatchProgress, stop: StopRequest) -> None:
    """Tell the loggers; a ``KeyboardInterrupt`` from one asks the run to stop at the next step boundary."""
    for logger in loggers:
        try:
            logger.batch_end(progress)
        except KeyboardInterrupt:
            stop.request("KeyboardInterrupt")


def mid_epoch_entry(epoch: int, phase: str, train: Tally, timer: PhaseTimer, lr: float, loader: Any) -> dict[str, Any]:
    """The ``partial`` entry of a mid-epoch ``last.pt`` (see :mod:`stoker.train.resume`)."""
    return {
        "epoch": epoch,
        "phase": phase,
        "loader": loader,
        "train": train.state_dict(),
        "train_timer": {"wall_s": timer.elapsed_s, "data_wait_s": timer.data_wait_s},
        "lr": lr,
    }
