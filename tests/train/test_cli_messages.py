"""What `stoker train` prints reads as the command line: flags, not Python; epochs from 1; plurals."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import cli_spelling, main


@pytest.fixture
def with_bad_files(folders: Path, tmp_path: Path) -> Path:
    """The shared class folders, plus two files that are not images (one in each of two classes)."""
    root = tmp_path / "data"
    shutil.copytree(folders, root)
    for name in ("0/broken.png", "1/broken2.png"):
        (root / name).write_bytes(b"\x89PNG\r\n\x1a\n" + b"junk" * 10)
    return root


def _train(data: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:
    args = ["train", "--data", str(data), "--epochs", "1", "--batch-size", "40", "--workers", "0", "--image-size", "16",
            "--log-dir", str(tmp_path / "runs"), "--no-progress", "--no-adapt", "--device", "cpu", *extra]
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def test_a_bad_file_names_the_flag_that_skips_it(with_bad_files: Path, tmp_path: Path) -> None:
    code, output = _train(with_bad_files, tmp_path)
    assert code == 1, output
    assert "broken" in output and "--on-error skip" in output, output
    assert "on_error" not in output


def test_with_skip_on_the_summary_counts_epochs_from_1_and_gives_no_advice(
    with_bad_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stoker"):
        code, output = _train(with_bad_files, tmp_path, "--on-error", "skip")
    assert code == 0, output
    [summary] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert summary.startswith("skipped 2 bad sample(s) in epoch 1:"), summary
    assert "broken.png" in summary and "broken2.png" in summary
    assert "to skip bad samples" not in summary and "on_error" not in summary and "--on-error" not in summary  # not per file
    assert "1/1 - tLoss" in output and "1 epoch)" in output and "1 epochs" not in output, output


def test_cli_spelling_names_a_flag_only_where_the_command_has_it() -> None:
    message = "a.png: cannot decode image; delete or re-export the file, or load with on_error='skip' to skip bad samples"
    assert cli_spelling(message, "train").endswith("or pass --on-error skip to skip bad samples")
    assert cli_spelling(message, "pack") == "a.png: cannot decode image; delete or re-export the file"
    assert cli_spelling("nothing to change", "train") == "nothing to change"


def test_every_config_mistake_is_reported_at_once_with_the_table_it_belongs_in(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    config = tmp_path / "train.toml"
    config.write_text('[data]\npath = "data"\nbatchsize = 8\n\n[run]\nlr = 0.01\nepochs = 0\n\n[optimizer]\nname = "sgd"\n')
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0] == "error: 4 mistakes in the config:", result.output
    text = result.output
    assert "unknown key data.batchsize (did you mean batch_size?)" in text
    assert "unknown key run.lr: lr belongs in [optim] (optim.lr)" in text
    assert "run.epochs" in text and "unknown table [optimizer]" in text
    assert all(line.startswith(f"  {config}: ") for line in lines[1:]), text  # each says where


def test_one_mistake_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path / "data"), "--set", "run.lr=0.1"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "lr belongs in [optim]" in result.output and "--set run.lr=0.1" in result.output
