"""CSV and TensorBoard loggers: exact columns, one row per epoch, written while the run goes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from torch import nn

from stoker.train import Logger, Scenario, fit, read_csv
from stoker.train.loggers import CSV_COLUMNS


def _run(tmp_path: Path, epochs: int, callbacks=()) -> tuple[Path, list]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g)
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 20, 8)]
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(), batches, batches[:1],
        epochs=epochs, log_dir=tmp_path, name="run", preprocess=None, device="cpu", progress=False,
        loggers=("csv", "tensorboard"), plot=False,
    )
    history = fit(scenario, callbacks=callbacks)
    return tmp_path / "run", history.epochs


def test_csv_columns_rows_and_flush_while_running(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class PeekCsv(Logger):  # callbacks run after the built-in loggers
        def epoch_end(self, stats):
            seen.append((tmp_path / "run" / "metrics.csv").read_text().splitlines())

    run_dir, epochs = _run(tmp_path, 3, [PeekCsv()])
    assert [len(lines) for lines in seen] == [2, 3, 4]  # header + one row per finished epoch
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("epoch,acc/train,acc/valid,loss/train,loss/valid,")
    assert lines[0] == ",".join(CSV_COLUMNS) == "epoch,acc/train,acc/valid,loss/train,loss/valid,time_s,img_per_s,data_wait_share,lr"
    rows = read_csv(run_dir / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for row, stats in zip(rows, epochs, strict=True):
        assert row["loss/train"] == stats.train_loss and row["acc/valid"] == stats.valid_acc
        assert row["data_wait_share"] == stats.data_wait_share and row["lr"] == 0.5


def test_tensorboard_events_hold_the_scalars_and_the_two_curve_charts(tmp_path: Path) -> None:
    run_dir, epochs = _run(tmp_path, 2)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/valid", "acc/train", "acc/valid", "perf/img_per_s", "perf/data_wait_share", "lr"} <= scalars
    for tag, attr in (("loss/train", "train_loss"), ("acc/valid", "valid_acc"), ("perf/data_wait_share", "data_wait_share")):
        values = events.Scalars(tag)
        assert [v.step for v in values] == [1, 2]
        assert [v.value for v in values] == pytest.approx([getattr(e, attr) for e in epochs], rel=1e-6)
    layout = layout_pb2.Layout.FromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    assert charts["Loss"] == [r"^loss/train$", r"^loss/valid$", r"^loss/test$"]
    assert charts["Accuracy"] == [r"^acc/train$", r"^acc/valid$", r"^acc/test$"]


def test_the_tensorboard_docs_name_every_tag_written(tmp_path: Path) -> None:
    """The logger's docstring (what the docs render) lists exactly the scalar tags a run writes, test ones included."""
    import re

    from stoker.train.loggers.tensorboard import TensorBoardLogger, write_test_scalars

    run_dir, _ = _run(tmp_path, 1)
    assert write_test_scalars(run_dir, 0.5, 0.75, 1)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    written = set(events.Tags()["scalars"])
    named = set(re.findall(r"``([a-z_]+(?:/[a-z_]+)?)``", TensorBoardLogger.__doc__ or "")) - {"tensorboard"}
    assert written == named, (written ^ named)
