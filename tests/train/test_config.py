"""The TOML config: every key checked, errors name the key and what it accepts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from stoker import ConfigError, MissingFileError
from stoker.train.config import describe_keys, load_config, parse_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(text)
    return path


def test_a_full_config_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, """
[data]
path = ["a", "b"]
image_size = [48, 64]
batch_size = 32
[model]
name = "resnet18"
[optim]
name = "sgd"
lr = 0.1
scheduler = "cosine"
[run]
epochs = 3
amp = "bf16"
tags = { category = "shards", gpu = 1 }
""")
    cfg = load_config(path)
    assert cfg.data.path == ["a", "b"] and cfg.data.image_size == (48, 64) and cfg.data.batch_size == 32
    assert cfg.model.name == "resnet18" and cfg.optim.name == "sgd" and cfg.optim.lr == 0.1
    assert cfg.run.epochs == 3 and cfg.run.amp == "bf16" and cfg.run.tags == {"category": "shards", "gpu": "1"}
    assert cfg.to_dict()["optim"]["scheduler"] == "cosine"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[optim]\nlrr = 0.1", r"unknown key optim\.lrr \(did you mean lr\?\); \[optim\] takes: name, lr,"),
        ("[optim]\nname = 'rmsprop'", r"optim\.name must be one of sgd, adam, adamw; got 'rmsprop'"),
        ("[run]\namp = 'fp8'", r"run\.amp must be one of off, bf16, fp16"),
        ("[run]\nepochs = 0", r"run\.epochs must be a whole number >= 1, got 0"),
        ("[run]\nepochs = 2.5", r"run\.epochs must be a whole number"),
        ("[optim]\nlr = 'fast'", r"optim\.lr must be a number"),
        ("[data]\nvalid = 1.5", r"data\.valid must be a number in \(0\.0, 1\.0\)"),
        ("[data]\nimage_size = [64]", r"data\.image_size must be a size"),
        ("[model]\nname = 'resnet19'", r"model\.name 'resnet19' is not a known model \(did you mean resnet18"),
        ("[trainer]\nepochs = 1", r"unknown table \[trainer\]; the tables are \[data\], \[model\], \[optim\], \[run\]"),
        ("[run]\nresume = true", r"run\.resume needs run\.name"),
        ("[run]\ndevice = 'gpu0'", r"run\.device must be auto, cpu, cuda or cuda:N"),
        ("[run]\nsync_every = 0", r"run\.sync_every must be a whole number >= 1, got 0"),
    ],
)
def test_bad_keys_and_values_name_the_key_and_the_allowed_values(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_overrides_and_flags(tmp_path: Path) -> None:
    path = _write(tmp_path, "[optim]\nlr = 0.1\n[run]\ntags = { category = 'files' }\n")
    cfg = load_config(
        path,
        ["optim.lr=0.01", "data.path=/data/x", "run.compile=true", "data.image_size=[32, 32]"],
        {"run.epochs": 2, "run.tags": {"gpu": "h200"}},
    )
    assert cfg.optim.lr == 0.01 and cfg.data.path == ["/data/x"] and cfg.run.compile is True
    assert cfg.data.image_size == (32, 32) and cfg.run.epochs == 2
    assert cfg.run.tags == {"category": "files", "gpu": "h200"}  # flag tags add to the file's
    with pytest.raises(ConfigError, match=r"--set 'lr=0\.1': expected table\.key=value"):
        load_config(None, ["lr=0.1"])
    with pytest.raises(ConfigError, match=r"--set optim\.lr=abc: optim\.lr must be a number"):
        load_config(None, ["optim.lr=abc"])


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[run\nepochs = 1"))


def test_described_keys_are_a_valid_config_of_the_defaults() -> None:
    text = describe_keys()
    assert "sgd | adam | adamw" in text and "off | bf16 | fp16" in text
    assert parse_config(tomllib.loads(text)) == parse_config({})
