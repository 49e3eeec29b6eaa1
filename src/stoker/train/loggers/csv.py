"""CSV logger: ``metrics.csv``, one row per epoch, flushed every epoch."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import TextIO

from stoker.errors import DataError
from stoker.train.engine.history import METRIC_COLUMNS, EpochStats, History
from stoker.train.loggers.base import Logger, RunInfo

__all__ = ["CSV_COLUMNS", "CSV_FILE", "CsvLogger", "read_csv"]

CSV_FILE = "metrics.csv"

CSV_COLUMNS: tuple[str, ...] = tuple(METRIC_COLUMNS)


def _row(stats: EpochStats) -> list[str]:
    # repr of a float round-trips exactly; "nan" marks a missing value (no validation)
    return ["nan" if isinstance(v, float) and math.isnan(v) else repr(v) for v in stats.as_row().values()]


class CsvLogger(Logger):
    """Writes ``metrics.csv`` in the run folder: one row per epoch, flushed as it is written.

    Columns: ``epoch,acc/train,acc/valid,loss/train,loss/valid,time_s,img_per_s,data_wait_share,lr``.
    A resumed run rewrites the file from the checkpoint's history first, so the file
    never has a duplicate or a missing epoch, whatever moment the previous run stopped.

    Args:
        file_name: the file's name inside the run folder.
    """

    def __init__(self, file_name: str = CSV_FILE) -> None:
        self.file_name = file_name
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._writer: csv.writer | None = None  # type: ignore[valid-type]

    def start(self, run: RunInfo, history: History) -> None:
        self.path = run.run_dir / self.file_name
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows(_row(stats) for stats in history.epochs)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(buffer.getvalue(), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._file, lineterminator="\n")

    def epoch_end(self, stats: EpochStats) -> None:
        if self._file is None or self._writer is None:
            return
        self._writer.writerow(_row(stats))
        self._file.flush()

    def end(self, history: History) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Read a ``metrics.csv`` back: one dict of floats per epoch (``epoch`` as a float too).

    Raises:
        DataError: the file is missing or its header does not start with the stoker columns.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: metrics file not found; is this a stoker run folder?") from None
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    if header[: len(CSV_COLUMNS)] != CSV_COLUMNS:
        raise DataError(f"{path}:1: expected the columns {','.join(CSV_COLUMNS)}, found {','.join(header)}")
    rows = []
    for row in reader:
        try:
            rows.append({k: float(v) for k, v in row.items() if k is not None})
        except (TypeError, ValueError):
            raise DataError(f"{path}:{reader.line_num}: not a row of numbers: {row}") from None
    return rows
