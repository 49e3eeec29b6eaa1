"""stoker train (config + flags, resume, errors) and the demo's training run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

from stoker import ConfigError
from stoker.cli.train import train
from stoker.sources.synthetic import make_digiface
from stoker.train import read_csv
from stoker.train.runner.config import parse_config
from stoker.train.runner.data import build_data, build_loaders
from stoker.train.runner.from_config import demo_run, train_from_config


def _config(tmp_path: Path, folders: Path, extra: str = "") -> Path:
    path = tmp_path / "train.toml"
    path.write_text(f"""
[data]
path = "{folders}"
batch_size = 16
workers = 0
valid = 0.25

[model]
name = "small_cnn"

[optim]
lr = 0.003

[run]
log_dir = "{tmp_path / 'runs'}"
name = "cli"
device = "cpu"
tags = {{ category = "files" }}
{extra}
""")
    return path


def test_train_writes_the_run_folder_and_resumes(tmp_path: Path, folders: Path) -> None:
    config = _config(tmp_path, folders)
    result = CliRunner().invoke(train, [str(config), "--epochs", "2", "--tag", "machine=ci", "--sync-every", "3",
                                        "--no-progress"])
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "cli"
    for name in ("metrics.csv", "run.json", "best.pt", "last.pt", "curves.png"):
        assert (run_dir / name).is_file(), name
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert f"tensorboard --logdir {tmp_path / 'runs'}" in result.output
    assert "2/2 - tLoss" in result.output and "(class_folders): 120 train / 40 valid samples, 4 classes" in result.output
    record = json.loads((run_dir / "run.json").read_text())
    assert record["tags"] == {"category": "files", "machine": "ci"}
    assert record["config"]["optim"]["lr"] == 0.003 and record["status"] == "finished" and record["sync_every"] == 3
    assert {"torch", "torchvision", "python", "stoker"} <= set(record["versions"])

    again = CliRunner().invoke(train, [str(config), "--epochs", "2", "--no-progress"])
    assert isinstance(again.exception, ConfigError) and "already holds a run" in str(again.exception)

    resumed = CliRunner().invoke(train, [str(config), "--epochs", "3", "--resume", "--no-progress"])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming after epoch 2" in resumed.output  # without --sync-every 3: how it runs, not what it computes
    assert [r["epoch"] for r in read_csv(run_dir / "metrics.csv")] == [1, 2, 3]


def test_bad_config_key_is_an_error_naming_it(tmp_path: Path, folders: Path) -> None:
    config = _config(tmp_path, folders, extra="epoch = 3")
    result = CliRunner().invoke(train, [str(config)])
    assert isinstance(result.exception, ConfigError)
    assert "unknown key run.epoch (did you mean epochs?)" in str(result.exception)
    result = CliRunner().invoke(train, [str(_config(tmp_path, folders)), "--set", "run.epochs=3", "--amp", "fp32"])
    assert "run.amp must be one of auto, off, bf16, fp16" in str(result.exception)


def test_keys_lists_every_table() -> None:
    result = CliRunner().invoke(train, ["--keys"])
    assert result.exit_code == 0
    assert all(f"[{t}]" in result.output for t in ("data", "model", "optim", "run"))


def test_demo_run_beats_chance_quickly(tmp_path: Path) -> None:
    data = make_digiface(tmp_path / "digiface", n=400, classes=10, workers=1, progress=False)
    # Speed is the benchmarks' business, never a timed assertion here; this run takes seconds.
    result = demo_run(data, tmp_path / "runs", epochs=4, name="demo", progress=False, echo=None)
    assert result.best_acc > 0.5  # chance: 0.1
    assert set(result.files) == {"metrics", "record", "best", "last", "curves", "tensorboard"}
    assert "tensorboard --logdir" in result.where()
    assert json.loads((result.run_dir / "run.json").read_text())["tags"] == {"category": "demo"}


def test_image_size_resizes_uint8_on_the_loader_side(folders: Path) -> None:
    cfg = parse_config({"data": {"path": str(folders), "image_size": [24, 20], "workers": 0, "valid": 0.25}})
    data = build_data(cfg.data)
    train_loader, valid_loader = build_loaders(data, cfg.data, device=torch.device("cpu"))
    for loader in (train_loader, valid_loader):
        images, _ = next(iter(loader))
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 24, 20)


def test_train_on_a_packed_shard_set(tmp_path: Path, folders: Path) -> None:
    from stoker.packer import pack

    pack(folders, tmp_path / "packed", store="pixels", valid=0.25, workers=1, progress=False)
    pack(folders, tmp_path / "nosplit", store="encoded", workers=1, progress=False)
    for name, size in (("packed", None), ("nosplit", 16)):
        data: dict = {"path": str(tmp_path / name), "workers": 0, "valid": 0.25, "batch_size": 32}
        if size:
            data["image_size"] = size
        cfg = parse_config({"data": data, "run": {"epochs": 1, "log_dir": str(tmp_path / "runs"), "name": name,
                                                   "device": "cpu", "progress": False}})
        result = train_from_config(cfg, echo=None)
        assert "(shards): 120 train / 40 valid samples, 4 classes" in result.data
        assert len(result.history) == 1 and result.history[0].train_samples == 120


def test_loader_settings_from_tune_feed_the_data_table(tmp_path: Path, folders: Path) -> None:
    from stoker.cli.train import _loader_settings
    from stoker.train.runner.config import load_config

    settings = tmp_path / "loader.toml"
    settings.write_text('# measured: 900 img/s\n[data]\nworkers = 3\nbackend = "thread"\nprefetch_factor = 4\n')
    cfg = load_config(None, values=_loader_settings(settings))
    assert (cfg.data.workers, cfg.data.backend, cfg.data.prefetch_factor) == (3, "thread", 4)
    settings.write_text("[data]\nworkers = 'many'\n")
    result = CliRunner().invoke(train, [str(_config(tmp_path, folders)), "--loader-config", str(settings)])
    assert isinstance(result.exception, ConfigError) and "data.workers must be a whole number" in str(result.exception)


def test_stoker_train_and_compare_are_commands_and_errors_are_one_line(tmp_path: Path, folders: Path) -> None:
    from stoker.cli.main import main

    result = CliRunner().invoke(main, ["train", str(_config(tmp_path, folders, extra="epoch = 3"))])
    assert result.exit_code == 1
    assert "error: " in result.output and "unknown key run.epoch" in result.output
    assert CliRunner().invoke(main, ["compare", "--help"]).exit_code == 0
