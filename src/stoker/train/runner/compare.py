"""Compare runs: their curves on one plot, coloured by a group read from each run's record.

TensorBoard colours runs one by one; it cannot colour them by what the runs say about
themselves. Every stoker run writes ``run.json`` (name, tags, config, device) beside
``metrics.csv``, so ``stoker compare runs/* --group-by category`` draws one colour per
category and one line style per run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError, DataError
from stoker.train.engine.plots import plot_compare
from stoker.train.engine.record import RUN_FILE, read_run_json, run_status
from stoker.train.loggers.csv import CSV_COLUMNS, CSV_FILE, read_csv

__all__ = ["RunSummary", "compare_runs", "find_runs", "format_table", "load_run"]

NO_GROUP = "(none)"


@dataclass(frozen=True)
class RunSummary:
    """One run, read back from its folder.

    Attributes:
        name: the run's name.
        run_dir: its folder.
        group: the value of the ``--group-by`` key for this run.
        rows: ``metrics.csv``, one dict per epoch.
        best_acc, best_epoch: best validation accuracy and the epoch that reached it.
        time_s: wall time of all epochs.
        img_per_s: training images per second, averaged over epochs.
        data_wait_share: the share of all epochs' time spent waiting for data.
        status: how the run stands (:func:`~stoker.train.engine.record.run_status`): ``"finished"``,
            ``"running"``, ``"interrupted"`` (also a run killed while its ``run.json`` said running)...
    """

    name: str
    run_dir: Path
    group: str
    rows: list[dict[str, float]]
    best_acc: float
    best_epoch: int
    time_s: float
    img_per_s: float
    data_wait_share: float
    status: str = "unknown"


def _lookup(record: dict[str, Any], key: str) -> Any:
    """A tag by name, else a dotted path into ``run.json`` (``config.model.name``)."""
    tags = record.get("tags") or {}
    if key in tags:
        return tags[key]
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def load_run(run_dir: str | os.PathLike[str], group_by: str | None = None) -> RunSummary:
    """Read a run folder's ``run.json`` and ``metrics.csv``.

    Args:
        run_dir: the run folder.
        group_by: a tag name (``category``) or a dotted key of ``run.json``
            (``config.model.name``); runs without it fall in the group ``(none)``.
            ``None``: every run is its own group.

    Raises:
        DataError: the folder has no readable ``run.json`` or ``metrics.csv``.
    """
    run_dir = Path(run_dir)
    record = read_run_json(run_dir)
    rows = read_csv(run_dir / CSV_FILE)
    name = str(record.get("name") or run_dir.name)
    if group_by is None:
        group = name
    else:
        value = _lookup(record, group_by)
        group = NO_GROUP if value is None else str(value)
    valid = [(r["acc/valid"], int(r["epoch"])) for r in rows if not math.isnan(r["acc/valid"])]
    best_acc, best_epoch = max(valid, key=lambda v: (v[0], -v[1])) if valid else (math.nan, 0)
    time_s = sum(r["time_s"] for r in rows)
    img_per_s = sum(r["img_per_s"] for r in rows) / len(rows) if rows else math.nan
    wait_share = sum(r["data_wait_share"] * r["time_s"] for r in rows) / time_s if time_s > 0 else math.nan
    return RunSummary(name, run_dir, group, rows, best_acc, best_epoch, time_s, img_per_s, wait_share, run_status(record))


def find_runs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Run folders among ``paths``: a folder with ``run.json`` is a run; otherwise its
    sub-folders that hold one are (so ``stoker compare runs`` takes every run in ``runs``).

    Raises:
        DataError: a path is neither a run folder nor holds any.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / RUN_FILE).is_file():
            found.append(path)
            continue
        inner = sorted(p.parent for p in path.glob(f"*/{RUN_FILE}"))
        if not inner:
            raise DataError(f"{path}: no {RUN_FILE} here or in its sub-folders; pass stoker run folders")
        found.extend(inner)
    return found


def compare_runs(
    run_dirs: Sequence[str | os.PathLike[str]],
    group_by: str | None = None,
    metric: str = "acc/valid",
    out: str | os.PathLike[str] | None = None,
) -> tuple[list[RunSummary], Any]:
    """Read runs and draw ``metric`` of all of them on one plot (one colour per group).

    Args:
        run_dirs: the run folders.
        group_by: see :func:`load_run`.
        metric: a ``metrics.csv`` column (``acc/valid``, ``loss/train``, ``img_per_s``, ``data_wait_share``...).
        out: the image to write (``compare.png``), or ``None``.

    Returns:
        ``(runs, figure)``: the runs sorted by group (then as given) and the matplotlib Figure.

    Raises:
        ConfigError, DataError: no runs, or an unknown metric; a folder is not a readable run.

    Example:
        >>> from stoker.train import demo_run
        >>> for name, category in (("a", "files"), ("b", "shards")):
        ...     _ = demo_run("data/digiface", "runs", epochs=1, image_size=16, workers=0, name=name,
        ...                  tags={"category": category}, progress=False, echo=None)
        run a in runs/a ...
        ...
        best valid accuracy ... at epoch 1 (finished)
        >>> runs, _ = compare_runs(["runs/a", "runs/b"], group_by="category", out="compare.png")
        >>> [run.group for run in runs], Path("compare.png").is_file()
        (['files', 'shards'], True)
    """
    if not run_dirs:
        raise ConfigError("compare needs at least one run folder")
    if metric not in CSV_COLUMNS or metric == "epoch":
        raise ConfigError(f"metric must be one of {', '.join(CSV_COLUMNS[1:])}; got {metric!r}")
    loaded = [load_run(d, group_by) for d in run_dirs]
    groups = list(dict.fromkeys(r.group for r in loaded))
    runs = sorted(loaded, key=lambda r: groups.index(r.group))
    figure = plot_compare([(r.name, r.group, r.rows) for r in runs], metric=metric, out=out)
    return runs, figure


def format_table(runs: Sequence[RunSummary]) -> str:
    """A plain-text table: group, run, best valid accuracy and its epoch, time, img/s, data wait, status."""
    header = ("group", "run", "best vAcc", "epoch", "time", "img/s", "wait", "status")
    body = [
        (
            r.group,
            r.name,
            "-" if math.isnan(r.best_acc) else f"{r.best_acc:.3f}",
            str(r.best_epoch) if r.best_epoch else "-",
            f"{r.time_s:.1f}s",
            "-" if math.isnan(r.img_per_s) else f"{r.img_per_s:.0f}",
            "-" if math.isnan(r.data_wait_share) else f"{r.data_wait_share:.0%}",
            r.status,
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = []
    for row in (header, *body):
        cells = [cell.ljust(w) if i < 2 or i == len(row) - 1 else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
