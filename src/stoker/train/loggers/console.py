"""Console logger: a progress bar per epoch and one summary line per epoch."""

from __future__ import annotations

import math
import sys
from typing import TextIO

from tqdm import tqdm

from stoker.terminal import bar_disable
from stoker.train.engine.history import EpochStats, History
from stoker.train.loggers.base import BatchProgress, Logger, RunInfo

__all__ = ["ConsoleLogger", "format_epoch"]


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def format_epoch(stats: EpochStats, epochs: int) -> str:
    """The summary line of one epoch.

    Several ranks add the slowest rank's wait where it stands out (``wait 4% (slowest
    rank 9%)``) and the samples trimmed to keep the ranks in step (``trimmed 3``).

    Example:
        ``3/10 - tLoss 0.412 - vLoss 0.455 - tAcc 0.871 - vAcc 0.853 - 1843 img/s - wait 4% - 12.1s``
    """
    slowest = stats.slowest_data_wait_share
    wait = f"wait {stats.data_wait_share:.0%}" + (f" (slowest rank {slowest:.0%})" if slowest - stats.data_wait_share >= 0.005 else "")
    return (
        f"{stats.epoch}/{epochs} - tLoss {_num(stats.train_loss)} - vLoss {_num(stats.valid_loss)}"
        f" - tAcc {_num(stats.train_acc)} - vAcc {_num(stats.valid_acc)}"
        f" - {stats.img_per_s:.0f} img/s - {wait}" + (f" - trimmed {stats.trimmed}" if stats.trimmed else "")
        + f" - {stats.time_s:.1f}s"
    )


class ConsoleLogger(Logger):
    """Prints a progress bar (stderr) and a line per epoch (stdout) as the run goes.

    An epoch that waited for data longer than the run's ``loader_bound_share`` of its
    time gets a second line saying so, unless adapt is on: it acts on that itself (it
    searches on, or says once that reading is the limit).

    Args:
        progress: show the progress bar when stderr is a terminal; ``False``: never.
        file: where summary lines go (default: ``sys.stdout`` at the time of writing).
    """

    def __init__(self, progress: bool = True, file: TextIO | None = None) -> None:
        self.progress = progress
        self.file = file
        self._bar: tqdm | None = None
        self._run: RunInfo | None = None

    def _write(self, line: str) -> None:
        tqdm.write(line, file=self.file or sys.stdout)

    def start(self, run: RunInfo, history: History) -> None:
        self._run = run
        resumed = f", resuming after epoch {run.start_epoch}" if run.resumed else ""
        compute = f", {run.compute}" if run.compute else ""
        self._write(f"run {run.name} in {run.url or run.run_dir} ({run.device}{compute}, {run.epochs} epoch{'' if run.epochs == 1 else 's'}{resumed})")

    def epoch_start(self, epoch: int, batches: int | None) -> None:
        epochs = self._run.epochs if self._run else "?"
        self._bar = tqdm(
            total=batches,
            desc=f"{epoch}/{epochs}",
            unit="batch",
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
            disable=bar_disable(self.progress),  # None: only on a terminal
        )

    def batch_end(self, progress: BatchProgress) -> None:
        if self._bar is None or self._bar.disable:
            return
        self._bar.set_postfix_str(
            f"{progress.phase} loss {progress.loss:.3f} acc {progress.acc:.3f} "
            f"{progress.img_per_s:.0f} img/s wait {progress.data_wait_share:.0%}",
            refresh=False,
        )
        self._bar.update(1)

    def epoch_end(self, stats: EpochStats) -> None:
        self._close_bar()
        run = self._run
        self._write(format_epoch(stats, run.epochs if run else stats.epoch))
        share = max(stats.data_wait_share, stats.slowest_data_wait_share)  # the slowest rank holds every rank back
        if run is not None and share > run.loader_bound_share and not run.adapting:  # adapt acts, and says so
            self._write(
                f"loader-bound: {share:.0%} of the epoch waiting for data; try `stoker tune`"
            )

    def note(self, line: str) -> None:
        self._write(line)

    def end(self, history: History) -> None:
        self._close_bar()
        if history.best_epoch:
            self._write(f"best valid accuracy {history.best_acc:.3f} at epoch {history.best_epoch} ({history.stopped})")
        else:
            self._write(f"run ended after {len(history)} epoch{'' if len(history) == 1 else 's'} ({history.stopped})")

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
