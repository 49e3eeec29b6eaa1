"""``stoker train``: train a model from a TOML config, flags overriding its keys."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stoker.errors import ConfigError, MissingFileError
from stoker.fs.location import is_url
from stoker.fs.near import did_you_mean
from stoker.train.runner.config import TrainConfig, describe_keys, key_flags, load_config

_EPILOG = """\b
Examples:
  stoker train train.toml
  stoker train train.toml --epochs 3 --set optim.lr=0.01 --tag category=shards
  stoker train --data data/digiface --model small_cnn --epochs 5 --image-size 64
  stoker train --name my-run --resume                 # continue runs/my-run from last.pt, its own config
  stoker train --keys                                 # every key, its default and values

\b
The run folder (run.log_dir/run.name) gets metrics.csv, run.json, TensorBoard events,
last.pt (every epoch; --checkpoint-every-steps N also mid-epoch), best.pt (best
valid accuracy) and curves.png. Ctrl-C finishes the step, saves last.pt there and
stops; --resume continues with the next batch (a second Ctrl-C stops at once).
--log-dir may be a URL (s3://bucket/runs): the run is written in a local copy and
uploaded after every epoch, and --resume reads it back on any machine. Under torchrun
on several machines with a local --log-dir each, --resume continues from the newest
last.pt on any of them (README: "Several machines, no shared folder").
"""


def _config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per config key, made from the key's field (its flag, help, kind and check)."""
    for flag in reversed(key_flags()):
        kind, metavar = flag.check.kind, flag.check.metavar
        if kind == "switch":
            name = flag.flag.removeprefix("--")
            option = click.option(f"--{name}/--no-{name}", flag.param, default=None, help=flag.help())
        elif kind in ("many", "pairs"):
            option = click.option(flag.flag, flag.param, multiple=True, metavar=metavar, help=flag.help())
        else:
            option = click.option(flag.flag, flag.param, metavar=metavar, help=flag.help())
        command = option(command)
    return command


def _flag_values(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The config keys the flags set, as raw values (each read as its key's check says), and the flag of each.

    Raises:
        ConfigError: a ``--tag`` that is not KEY=VALUE.
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for flag in key_flags():
        given_value = given.get(flag.param)
        if given_value is None or given_value == ():
            continue  # not on the command line: the config file's value or the default
        kind = flag.check.kind
        if kind == "many":
            value: Any = list(given_value)
        elif kind == "pairs":
            value = {}
            for pair in given_value:
                name, sep, text = pair.partition("=")
                if not sep or not name:
                    raise ConfigError(f"{flag.flag} {pair!r}: expected KEY=VALUE, e.g. category=shards")
                value[name] = text
        elif kind == "switch":
            value = bool(given_value)
        else:
            value = flag.check.parse(given_value)
        values[flag.key], origins[flag.key] = value, flag.flag
    return values, origins


@click.command("train", epilog=_EPILOG)
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_config_options
@click.option("--loader-config", "--loader", "loader_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Loader settings from `stoker tune --out FILE` (its [data] table); flags still win.")
@click.option("--set", "assignments", multiple=True, metavar="TABLE.KEY=VALUE",
              help="Set any config key, e.g. --set optim.scheduler=cosine (value read as TOML, else text).")
@click.option("--keys", is_flag=True, help="Print every config key with its default, help and flag, and exit.")
def train(config: Path | None, loader_file: Path | None, assignments: tuple[str, ...], keys: bool, **given: Any) -> None:
    """Train a model on image data, as CONFIG (a TOML file) says; flags override its keys.

    CONFIG has four tables, [data], [model], [optim] and [run] (see --keys). Without
    CONFIG, the defaults apply and --data is needed. Every key has a flag (below, each
    naming its key); a flag's value passes the key's own check, and an unknown key or a
    bad value is an error naming the flag or file, the key and what it accepts.
    """
    if keys:
        click.echo(describe_keys(), nl=False)
        return
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if loader_file is not None:
        values = _loader_settings(loader_file)
        origins = dict.fromkeys(values, str(loader_file))
    flag_values, flag_origins = _flag_values(given)
    values.update(flag_values)  # the flags win over the settings file
    origins.update(flag_origins)
    # --tag adds to the config's tags; --resume takes the run's own config from its run.json (at a URL log dir,
    # or over several machines the one beside the newest last.pt)
    cfg = load_config(config, assignments, values, origins, records=_run_record_text)
    _check_paths(cfg, origins)
    # torch and the rest are imported only now, once the arguments and paths have passed their checks
    from stoker.train.runner.from_config import rank_zero, train_from_config

    if loader_file is not None:
        _check_tuned_for(loader_file, cfg.data.path, cfg.data.batch_size)
    try:
        result = train_from_config(cfg, echo=click.echo)
    except KeyboardInterrupt as exc:
        if rank_zero():  # one line for the run, not one per rank
            click.echo(f"\ninterrupted; {str(exc) or 'stopped before the run began; start it again'}", err=True)
        sys.exit(130)
    if rank_zero():
        click.echo(result.where())


def _run_record_text(config: TrainConfig) -> str | None:
    """The run.json a --resume takes its config from (imports the runner: only a resume pays for it)."""
    from stoker.train.runner.from_config import run_record_text

    return run_record_text(config)


def _is_share(text: str) -> bool:
    try:
        return 0.0 < float(text) < 1.0
    except ValueError:
        return False


def _check_paths(cfg: TrainConfig, origins: dict[str, str]) -> None:
    """A local --data or --valid path that does not exist is an error before anything heavy is imported.

    The message names the flag (or the config key), the nearest names beside the path, and
    ``--valid-share`` where ``--valid`` was given a share.

    Raises:
        MissingFileError: the first missing path.
    """
    for key, flag, paths in (("data.path", "--data", cfg.data.path), ("data.valid_path", "--valid", cfg.data.valid_path)):
        for path in paths:
            if is_url(path) or os.path.lexists(os.path.expanduser(path)):
                continue
            given = flag if origins.get(key) == flag else f"[data] {key.split('.')[1]}"
            if flag == "--valid" and _is_share(path):
                hint = f"; to hold out a share of --data for validation, pass --valid-share {path}"
            else:
                hint = f"; pass a folder of images, a shard set or a label file{did_you_mean(path)}"
            raise MissingFileError(f"{given} {path}: not found{hint}")


def _loader_settings(path: Path) -> dict[str, Any]:
    """The [data] table of a `stoker tune` settings file, as ``{"data.key": value}``."""
    from stoker.bench.settings import load_data_table

    return {f"data.{key}": value for key, value in load_data_table(path).items()}


def _check_tuned_for(path: Path, data: list[str], batch_size: int) -> None:
    """Stop when the settings file was tuned for another storage than ``data``; warn for other data or batch size."""
    from stoker.bench.settings import check_tuned_for, load_settings

    for warning in check_tuned_for(load_settings(path), data, str(path), batch_size):
        click.echo(f"warning: {warning}", err=True)
