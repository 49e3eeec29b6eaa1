"""TensorBoard logger: per-epoch scalars, train and valid curves on one chart.

Why custom scalars: TensorBoard draws one chart per tag, so ``loss/train`` and
``loss/valid`` would be two charts. ``add_scalars`` puts them on one chart by writing a
separate run (sub-folder) per curve, which doubles every run in the run list and breaks
the "one folder per run" rule. Instead each run writes plain scalars under one tag
each and a *custom scalars* layout that draws ``Loss`` (train and valid) and
``Accuracy`` (train and valid) as multi-line charts: open the "Custom Scalars" tab.
The plain charts stay in the "Scalars" tab, and ``stoker compare`` groups runs by tag.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.train.engine.history import EpochStats, History
from stoker.train.loggers.base import Logger, RunInfo

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["LAYOUT", "TensorBoardLogger", "write_test_scalars"]

# chart title -> tags drawn on it (regular expressions, anchored)
LAYOUT: dict[str, dict[str, list[object]]] = {
    "stoker": {
        "Loss": ["Multiline", [r"^loss/train$", r"^loss/valid$", r"^loss/test$"]],
        "Accuracy": ["Multiline", [r"^acc/train$", r"^acc/valid$", r"^acc/test$"]],
        "Throughput (img/s)": ["Multiline", [r"^perf/img_per_s$"]],
        "Data wait (share of epoch)": ["Multiline", [r"^perf/data_wait_share$"]],
    }
}


class TensorBoardLogger(Logger):
    """Writes TensorBoard event files into the run folder, flushed after every epoch.

    Scalars, at step = epoch (1-based): ``loss/train``, ``loss/valid``, ``acc/train``,
    ``acc/valid``, ``perf/img_per_s``, ``perf/data_wait_share``, ``perf/epoch_time_s``,
    ``perf/data_wait_s``, ``lr``. A resumed run purges any events past its checkpoint.

    After training, ``stoker train --test`` adds ``loss/test`` and ``acc/test`` at the
    epoch whose weights it evaluated (:func:`write_test_scalars`).

    Open with ``tensorboard --logdir <log_dir>``.
    """

    def __init__(self) -> None:
        self._writer: SummaryWriter | None = None

    def start(self, run: RunInfo, history: History) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = run.start_epoch + 1 if run.resumed else None
        self._writer = SummaryWriter(log_dir=str(run.run_dir), purge_step=purge)
        if not run.resumed:
            self._writer.add_custom_scalars(LAYOUT)
            record = {"name": run.name, "tags": dict(run.tags), "device": run.device, "config": dict(run.config)}
            self._writer.add_text("run", "```\n" + json.dumps(record, indent=2, default=str) + "\n```", 0)
        self._writer.flush()

    def epoch_end(self, stats: EpochStats) -> None:
        if self._writer is None:
            return
        scalars = {
            "loss/train": stats.train_loss,
            "loss/valid": stats.valid_loss,
            "acc/train": stats.train_acc,
            "acc/valid": stats.valid_acc,
            "perf/img_per_s": stats.img_per_s,
            "perf/data_wait_share": stats.data_wait_share,
            "perf/epoch_time_s": stats.time_s,
            "perf/data_wait_s": stats.data_wait_s,
            "lr": stats.lr,
        }
        for tag, value in scalars.items():
            if not math.isnan(value):
                self._writer.add_scalar(tag, value, stats.epoch)
        self._writer.flush()

    def end(self, history: History) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def write_test_scalars(run_dir: Path, loss: float, acc: float, epoch: int) -> bool:
    """Add the test split's ``loss/test`` and ``acc/test`` at step ``epoch`` to a run folder that has TensorBoard events.

    Returns:
        Whether they were written (a run that did not log to TensorBoard gets none).
    """
    if not any(run_dir.glob("events.out.tfevents.*")):
        return False
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(run_dir)) as writer:
        for tag, value in (("loss/test", loss), ("acc/test", acc)):
            if not math.isnan(value):
                writer.add_scalar(tag, value, epoch)
    return True
