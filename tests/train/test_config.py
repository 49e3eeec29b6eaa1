"""The TOML config: every key checked, errors name the key and what it accepts."""

from __future__ import annotations

import re
import tempfile
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stoker import ConfigError, MissingFileError
from stoker.train.engine.scenario import SCENARIO_KEYS
from stoker.train.runner.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    describe_keys,
    key_flags,
    load_config,
    parse_config,
)


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
        ("[run]\namp = 'fp8'", r"run\.amp must be one of auto, off, bf16, fp16"),
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


# --- one config path: the fields say each key once; flags, files, --set and Scenario agree ---

_README_FLAGS = (
    "--data", "--valid", "--model", "--optimizer", "--lr", "--epochs", "--batch-size", "--workers", "--image-size",
    "--device", "--amp", "--compile", "--no-compile", "--log-dir", "--name", "--tag", "--seed", "--patience", "--resume",
    "--checkpoint-every-steps", "--sync-every", "--no-progress", "--loader-config", "--loader", "--set", "--keys",
)


def _run_train(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """Invoke ``stoker train`` up to the config it would train with (no training)."""
    import stoker.train.runner.from_config as runner
    from stoker.cli.train import train

    seen: list[TrainConfig] = []

    def fake(cfg: TrainConfig, echo: Any = None) -> Any:
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(runner, "train_from_config", fake)
    with tempfile.TemporaryDirectory() as folder:  # the data paths the tests name exist: train checks them first
        for name in ("a", "b", "v"):
            (Path(folder) / name).mkdir()
        with monkeypatch.context() as m:
            m.chdir(folder)
            result = CliRunner().invoke(train, args)
    return (seen[0] if seen else None), result


def test_every_key_has_one_flag_and_help_explains_it() -> None:
    from stoker.cli.train import train

    flags = key_flags()
    every_key = {f"{table}.{f.name}" for table, cls in (("data", DataConfig), ("model", ModelConfig), ("optim", OptimConfig),
                                                         ("run", RunConfig)) for f in fields(cls)}
    assert len(flags) == len(every_key) and {k.key for k in flags} == every_key  # one option per key
    assert len({k.flag for k in flags}) == len(flags)
    shown = " ".join(CliRunner().invoke(train, ["--help"], terminal_width=200).output.split())
    for flag in flags:
        assert f"{flag.flag} " in shown and f"{flag.key}: " in shown, flag  # the key named in its option's help
    for name in _README_FLAGS:  # the flags the README and users rely on are all still there
        assert f"{name} " in shown or f"{name}," in shown, name


def test_flags_set_their_keys_through_the_same_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, result = _run_train([
        "--data", "a", "--data", "b", "--valid", "v", "--epochs", "3", "--image-size", "48", "--no-progress",
        "--lr", "0.01", "--grad-accum", "2", "--compile", "--valid-share", "0.2", "--crop", "[0, 0, 10, 12]",
        "--tag", "gpu=h200", "--tag", "n=1", "--name", "2024", "--log-dir", str(tmp_path), "--optimizer", "sgd",
        "--backend", "thread", "--workers", "0", "--cpu-threads", "1",
    ], monkeypatch)
    assert cfg is not None, result.output
    assert cfg.data.path == ["a", "b"] and cfg.data.valid_path == ["v"] and cfg.data.valid == 0.2
    assert cfg.data.image_size == (48, 48) and cfg.data.crop == (0, 0, 10, 12) and cfg.data.backend == "thread"
    assert (cfg.run.epochs, cfg.run.grad_accum, cfg.run.compile, cfg.run.progress) == (3, 2, True, False)
    assert cfg.run.name == "2024" and cfg.run.tags == {"gpu": "h200", "n": "1"}  # text keys stay text
    assert (cfg.optim.lr, cfg.optim.name, cfg.data.workers, cfg.run.cpu_threads) == (0.01, "sgd", 0, 1)
    config = tmp_path / "train.toml"
    config.write_text("[run]\nepochs = 5\nprogress = false\ntags = { category = 'files' }\n")
    cfg, result = _run_train([str(config), "--progress", "--tag", "gpu=h200", "--data", "a"], monkeypatch)
    assert cfg is not None, result.output
    assert cfg.run.epochs == 5 and cfg.run.progress is True and cfg.run.tags == {"category": "files", "gpu": "h200"}


@pytest.mark.parametrize("name", ["epochs", "grad_accum", "seed", "patience", "sync_every", "checkpoint_every_steps",
                                  "cpu_threads"])
def test_a_boolean_or_negative_whole_number_is_refused_everywhere(name: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """TOML, --set, the flag and Scenario refuse the same values with the same message, each naming where."""
    import torch
    from torch import nn

    from stoker.train.engine.scenario import Scenario

    flag = "--" + name.replace("_", "-")
    minimum = 0 if name == "seed" else 1
    for bad, shown in ((True, "True"), (-1, "-1")):
        message = rf"run\.{name} must be a whole number >= {minimum}, got {shown}"
        path = _write(tmp_path, f"[run]\n{name} = {str(bad).lower()}\n")
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {message}"):
            load_config(path)
        with pytest.raises(ConfigError, match=rf"^--set run\.{name}={str(bad).lower()}: {message}"):
            load_config(None, [f"run.{name}={str(bad).lower()}"])
        _, result = _run_train([str(_write(tmp_path, "[run]\nepochs = 2\n")), flag, str(bad).lower()], monkeypatch)
        assert isinstance(result.exception, ConfigError), result.output
        assert re.match(rf"^{flag}: run\.{name} must be a whole number >= {minimum}, got '?{shown.lower()}'?$",
                        str(result.exception)), str(result.exception)  # the flag is named, not the file
        if name not in SCENARIO_KEYS:
            continue  # run.seed seeds the config's run; a Scenario is given seeded parts
        model = nn.Linear(2, 2)
        with pytest.raises(ConfigError, match=rf"^Scenario: {name} must be a whole number >= {minimum}, got {shown}$"):
            Scenario(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), [], [],
                     **{"epochs": 1, name: bad})  # type: ignore[arg-type]


def test_scenario_takes_what_a_config_takes() -> None:
    import torch
    from torch import nn

    from stoker.train.engine.scenario import Scenario

    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scenario = Scenario(model, optimizer, nn.CrossEntropyLoss(), [], [], epochs=1, device=torch.device("cpu"),
                        log_dir=Path("runs"), tags={"gpu": 1}, loader_bound_share=1)
    assert scenario.tags == {"gpu": "1"} and scenario.loader_bound_share == 1.0  # cleaned as in a config
    assert scenario.device == torch.device("cpu") and scenario.log_dir == Path("runs")  # richer Python types kept
    assert set(SCENARIO_KEYS) <= {f.name for f in fields(RunConfig)} & {f.name for f in fields(Scenario)}  # same names
    for bad, message in (({"amp": "fp8"}, "amp must be one of auto, off, bf16, fp16"), ({"device": "gpu0"}, "device must be auto"),
                         ({"loader_bound_share": 1.5}, r"loader_bound_share must be a number in \[0\.0, 1\.0\]"),
                         ({"compile": 1}, "compile must be true or false"), ({"name": ""}, "name must be non-empty text")):
        with pytest.raises(ConfigError, match=rf"^Scenario: {message}"):
            Scenario(model, optimizer, nn.CrossEntropyLoss(), [], [], epochs=1, **bad)  # type: ignore[arg-type]


def test_a_bad_flag_value_with_a_config_file_names_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "[run]\nepochs = 2\n")
    for args, message in (
        (["--amp", "fp32"], "--amp: run.amp must be one of auto, off, bf16, fp16; got 'fp32'"),
        (["--lr", "fast"], "--lr: optim.lr must be a number in (0.0, inf], got text 'fast'"),
        (["--image-size", "4"], "--image-size: data.image_size must be a size in pixels"),
        (["--tag", "nokey"], "--tag 'nokey': expected KEY=VALUE"),
    ):
        _, result = _run_train([str(path), *args], monkeypatch)
        assert isinstance(result.exception, ConfigError) and str(result.exception).startswith(message), str(result.exception)
    settings = _write(tmp_path, "[data]\nworkers = -2\n")
    settings = settings.rename(tmp_path / "loader.toml")
    _, result = _run_train([str(path), "--loader-config", str(settings)], monkeypatch)
    assert str(result.exception).startswith(f"{settings}: data.workers must be a whole number >= 0"), str(result.exception)


def test_resuming_a_run_that_does_not_exist_names_the_run_and_the_runs_there(tmp_path: Path) -> None:
    """`stoker train --name my-run --resume` with no such run: not "data.path is not set"."""
    from stoker.cli.train import train

    (tmp_path / "runs" / "yesterday").mkdir(parents=True)
    (tmp_path / "runs" / "yesterday" / "run.json").write_text("{}")
    result = CliRunner().invoke(train, ["--log-dir", str(tmp_path / "runs"), "--name", "my-run", "--resume"])
    assert result.exit_code != 0
    message = str(result.exception) + result.output
    assert "no run called 'my-run'" in message and "does not exist" in message and "yesterday" in message
    assert "data.path" not in message
