"""stoker.train.runner.data: the [data] table opened through open_data, with the data's own loader defaults."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from stoker.loading.workers import machine_workers
from stoker.packer import pack
from stoker.shards import ShardDataset
from stoker.train.runner.config import parse_config
from stoker.train.runner.data import build_data, build_loaders


def _loaders(data_table: dict) -> tuple:
    cfg = parse_config({"data": data_table})
    data = build_data(cfg.data)
    return data, build_loaders(data, cfg.data, device=torch.device("cpu"))


def test_shard_sets_keep_their_measured_loader_defaults(tmp_path: Path, folders: Path) -> None:
    """A pixel shard set without a valid split used to become a torch Subset read by 2 workers."""
    pack(folders, tmp_path / "pixels", store="pixels", workers=0, progress=False)
    data, (train, valid) = _loaders({"path": str(tmp_path / "pixels"), "valid": 0.25})
    assert isinstance(data.train, ShardDataset) and isinstance(data.valid, ShardDataset)
    assert (train.num_workers, valid.num_workers) == (0, 0)  # what measured fastest for pixel shards
    assert len(data.train) == 120 and len(data.valid) == 40
    _, (train, _) = _loaders({"path": str(tmp_path / "pixels"), "valid": 0.25, "workers": 1})
    assert train.num_workers == 1  # the user's setting wins
    _, (train, _) = _loaders({"path": str(folders), "valid": 0.25})
    assert train.num_workers == machine_workers(accelerator=False, backend="process")  # file data: the machine's share


def test_split_folders_train_on_train_and_validate_on_val(tmp_path: Path, folders: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(folders, root / "train")
    shutil.copytree(folders / "1", root / "val" / "1")
    data, _ = _loaders({"path": str(root), "workers": 0})
    assert data.num_classes == 4 and len(data.train) == 160 and len(data.valid) == 40
    assert set(data.valid.labels.tolist()) == {1}
    assert "split_folders" in data.description


def test_train_cli_validates_a_shard_set_against_a_folder(tmp_path: Path, folders: Path) -> None:
    from click.testing import CliRunner

    from stoker.cli.train import train

    pack(folders, tmp_path / "pixels", store="pixels", workers=0, progress=False)
    shutil.copytree(folders / "1", tmp_path / "other" / "cat")
    args = ["--data", str(tmp_path / "pixels"), "--valid", str(tmp_path / "other"), "--epochs", "1", "--device", "cpu",
            "--log-dir", str(tmp_path / "runs"), "--name", "v", "--no-progress"]
    result = CliRunner().invoke(train, args)
    assert result.exit_code != 0 and "classes" in str(result.exception)
    args[3] = str(folders)
    result = CliRunner().invoke(train, args)
    assert result.exit_code == 0, result.output
    assert "160 train / 160 valid samples" in result.output


def test_train_test_evaluates_the_test_split_once_with_the_best_model(tmp_path: Path, folders: Path) -> None:
    """`stoker train --test` on train/ + val/ + test/: the test split once, with best.pt, in run.json and test.csv."""
    import csv
    import json

    from click.testing import CliRunner

    from stoker.cli.train import train

    root = tmp_path / "tree"
    shutil.copytree(folders, root / "train")
    shutil.copytree(folders / "1", root / "val" / "1")
    shutil.copytree(folders / "2", root / "test" / "2")
    args = ["--data", str(root), "--epochs", "2", "--device", "cpu", "--workers", "0", "--model", "small_cnn",
            "--log-dir", str(tmp_path / "runs"), "--no-progress"]
    result = CliRunner().invoke(train, [*args, "--name", "untested"])
    assert result.exit_code == 0, result.output
    first = next(line for line in result.output.splitlines() if line.startswith("data:"))
    assert "its test split (40 samples) is not evaluated: add --test" in first  # said on the first line
    assert not (tmp_path / "runs" / "untested" / "test.csv").exists()

    result = CliRunner().invoke(train, [*args, "--name", "tested", "--test"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "tested"
    record = json.loads((run / "run.json").read_text())
    best_epoch = record["summary"]["best_epoch"]
    assert record["test"]["samples"] == 40 and record["test"]["weights"] == f"best.pt (epoch {best_epoch})"
    assert 0.0 <= record["test"]["acc"] <= 1.0 and record["status"] == "finished"
    with open(run / "test.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["split"] == "test" and int(rows[0]["samples"]) == 40
    assert "test: 40 samples" in result.output and "test.csv" in result.output
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    [acc] = events.Scalars("acc/test")  # in TensorBoard too, at the epoch whose weights were evaluated
    assert acc.step == best_epoch and abs(acc.value - record["test"]["acc"]) < 1e-6
    assert [s.step for s in events.Scalars("loss/test")] == [best_epoch]

    result = CliRunner().invoke(train, ["--data", str(folders), "--epochs", "1", "--device", "cpu", "--test",
                                        "--log-dir", str(tmp_path / "runs"), "--name", "none", "--no-progress"])
    assert result.exit_code != 0 and "no test split" in str(result.exception)
