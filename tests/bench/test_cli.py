"""`stoker bench` and `stoker tune` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.bench import load_settings
from stoker.cli.main import main


def test_bench_prints_the_table_and_writes_the_report(tiny_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["bench", str(tiny_root), "--methods", "files,pipe", "--workers", "0",
                                       "--batch-size", "8", "--device", "cpu", "--limit-seconds", "0.05", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| workers | files | pipe |" in result.output
    assert result.output.count("Recommendation:") == 1  # in the markdown, not again after it
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert [(r["method"], r["status"], r["samples"]) for r in runs] == [("files", "ok", 40), ("pipe", "ok", 40)]
    assert (out / "bench.png").is_file() and (out / "bench.md").is_file()


def test_tune_writes_settings_the_loader_takes(tiny_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "loader.toml"
    result = CliRunner().invoke(main, ["tune", str(tiny_root), "--budget", "3s", "--storages", "files",
                                       "--max-workers", "0", "--batch-size", "8", "--device", "cpu", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert "chose:" in result.output and f"wrote {path}" in result.output
    settings = load_settings(path)
    assert settings.workers == 0
    # the file records what it was tuned for: storage, data and layout
    assert (settings.method, settings.data, settings.layout) == ("files", str(tiny_root.resolve()), "class_folders")
    assert "[tuned_for]" in path.read_text() and 'storage = "files"' in path.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "{data}", "--workers", "two"], "--workers"),
        (["bench", "{data}", "--methods", "fast"], "unknown method 'fast'"),
        (["bench", "{data}", "--size", "big"], "--size"),
        (["tune", "{data}", "--budget", "soon"], "--budget"),
    ],
)
def test_bad_options_are_one_line_errors(tiny_root: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, [a.format(data=tiny_root) for a in args])
    assert result.exit_code == 1 and message in result.output
