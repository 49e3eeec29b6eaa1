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


def test_tune_a_shard_set_as_it_is_on_its_own_storage(tiny_root: Path, tmp_path: Path) -> None:
    from stoker.bench.settings import check_tuned_for
    from stoker.packer import pack

    packed = tmp_path / "packed"
    pack([tiny_root], packed, store="pixels", size=(16, 16), seed=0, progress=False)
    path = tmp_path / "loader.toml"
    result = CliRunner().invoke(main, ["tune", str(packed), "--budget", "4s", "--max-workers", "0", "--batch-size", "8",
                                       "--device", "cpu", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert "is a shard set" not in result.output and "Pack the data first" not in result.output
    assert "tried" in result.output and "on 40 samples" in result.output and "chose:" in result.output
    settings = load_settings(path)
    assert (settings.method, settings.data, settings.workers) == ("shards-pixels", str(packed.resolve()), 0)
    assert check_tuned_for(settings, [str(packed)], str(path)) == []  # what it was tuned on is what a run reads
    wrong = CliRunner().invoke(main, ["tune", str(packed), "--storages", "files", "--budget", "4s", "--out", str(path)])
    assert wrong.exit_code == 1 and "only shards-pixels can be tuned on it" in wrong.output
    assert len(wrong.output.strip().splitlines()) == 1
