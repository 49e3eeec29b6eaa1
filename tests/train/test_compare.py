"""stoker compare: runs on one plot, one colour per group, one line style per run, a table."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import DataError
from stoker.cli.compare import compare
from stoker.train import EpochStats, History
from stoker.train.engine.record import write_run_json
from stoker.train.loggers import CsvLogger, RunInfo
from stoker.train.runner.compare import compare_runs, format_table


def _fake_run(log_dir: Path, name: str, category: str, accs: list[float]) -> Path:
    """A run folder as fit writes it, without training: run.json and metrics.csv."""
    run_dir = log_dir / name
    run_dir.mkdir(parents=True)
    history = History(run_dir=run_dir, stopped="finished")
    csv = CsvLogger()
    csv.start(RunInfo(name, run_dir, len(accs)), history)
    for epoch, acc in enumerate(accs, start=1):
        stats = EpochStats(epoch, 1.0 / epoch, acc, 1.1 / epoch, acc - 0.05, 2.0, 1.8, 0.5, 1.5, 100.0 * epoch,
                           0.25, 0.1, 180, 20)
        history.epochs.append(stats)
        csv.epoch_end(stats)
    csv.end(history)
    write_run_json(run_dir, {"name": name, "tags": {"category": category}, "config": {"model": {"name": "small_cnn"}}}, history)
    return run_dir


@pytest.fixture()
def runs(tmp_path: Path) -> list[Path]:
    return [
        _fake_run(tmp_path / "runs", "files-a", "files", [0.5, 0.7, 0.8]),
        _fake_run(tmp_path / "runs", "shards-a", "shards", [0.6, 0.9, 0.85]),
        _fake_run(tmp_path / "runs", "files-b", "files", [0.55, 0.75]),
    ]


def test_three_runs_in_two_groups_draw_two_colours(runs: list[Path], tmp_path: Path) -> None:
    summaries, figure = compare_runs(runs, group_by="category", out=tmp_path / "compare.png")
    assert (tmp_path / "compare.png").stat().st_size > 0
    lines = figure.axes[0].get_lines()
    assert len(lines) == 3
    assert len({line.get_color() for line in lines}) == 2
    styles = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in lines}
    assert styles["files / files-a"][0] == styles["files / files-b"][0] != styles["shards / shards-a"][0]
    assert styles["files / files-a"][1] != styles["files / files-b"][1]  # one line style per run in a group
    assert [s.group for s in summaries] == ["files", "files", "shards"]
    shards = next(s for s in summaries if s.group == "shards")
    assert shards.best_acc == pytest.approx(0.85) and shards.best_epoch == 2  # acc/valid = acc - 0.05
    table = format_table(summaries)
    assert table.splitlines()[0].split() == ["group", "run", "best", "vAcc", "epoch", "time", "img/s", "wait", "status"]
    assert "shards-a" in table and "25%" in table
    assert [line.split()[-1] for line in table.splitlines()[1:]] == ["finished"] * 3


def test_group_by_a_key_of_the_record_and_other_metrics(runs: list[Path]) -> None:
    summaries, figure = compare_runs(runs, group_by="config.model.name", metric="loss/train")
    assert {s.group for s in summaries} == {"small_cnn"}
    assert figure.axes[0].get_ylabel() == "loss/train"
    summaries, _ = compare_runs(runs, group_by="missing")
    assert {s.group for s in summaries} == {"(none)"}


def test_cli_compare_takes_a_folder_of_runs(runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "c.png"
    result = CliRunner().invoke(compare, [str(tmp_path / "runs"), "--group-by", "category", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "3 runs, 2 group(s)" in result.output and out.is_file()


def test_not_a_run_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(compare, [str(tmp_path)])
    assert isinstance(result.exception, DataError) and "no run.json" in str(result.exception)


def test_compare_chart_colours_legend_and_empty_runs() -> None:
    from stoker.train.engine.plots import plot_compare

    rows = [{"epoch": 1.0, "acc/valid": 0.5}, {"epoch": 2.0, "acc/valid": 0.7}]
    one = plot_compare([("a", "shards", rows), ("b", "files", rows), ("empty", "pipe", [])])
    two = plot_compare([("c", "pipe", rows), ("d", "shards", rows)])

    def colours(fig: object) -> dict[str, tuple]:
        ax = fig.axes[0]  # type: ignore[attr-defined]
        return {line.get_label().split(" / ")[0]: tuple(line.get_color()) for line in ax.get_lines()}

    assert colours(one)["shards"] == colours(two)["shards"]  # a group keeps its colour across charts
    ax = one.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["shards / a", "files / b"] and "1 run(s) with no epochs left out: empty" in ax.get_title()
    one.canvas.draw()
    legend_box, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend_box.x0 >= axes_box.x1  # beside the data, not over it


def test_runs_without_groups_are_named_once_in_distinct_hues(tmp_path: Path) -> None:
    """No ``name / name`` legend when every run is its own group; groups of a chart never share a hue while one is free."""
    from stoker.train.engine.plots import group_colours

    runs = [_fake_run(tmp_path / "runs", name, "files", [0.5, 0.7]) for name in ("alpha", "beta", "gamma")]
    _, figure = compare_runs(runs, out=tmp_path / "c.png")
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert sorted(labels) == ["alpha", "beta", "gamma"]
    for names in (["alpha", "beta", "gamma"], [f"run-{i}" for i in range(10)], ["20261204-150915", "20261204-150952"]):
        hues = [index // 2 for index in group_colours(names, 20).values()]
        assert len(set(hues)) == len(hues), names  # tab20 pairs a dark and a light shade of each hue
    many = group_colours([f"g{i}" for i in range(14)], 20)
    assert len(set(many.values())) == 14  # past ten groups, light shades come in, still one colour each
