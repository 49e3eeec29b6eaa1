"""``stoker train``: train a model from a TOML config, flags overriding its keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

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
"""


@click.command("train", epilog=_EPILOG)
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--data", "data", multiple=True, metavar="PATH", help="data.path: data folder(s) or a shard set (repeat for several).")
@click.option("--valid", "valid", multiple=True, metavar="PATH",
              help="data.valid_path: separate validation data, any layout (a shard set too), same classes.")
@click.option("--model", help="model.name: small_cnn or a torchvision classifier (resnet18, resnet50...).")
@click.option("--optimizer", help="optim.name: sgd, adam or adamw.")
@click.option("--lr", type=float, help="optim.lr: learning rate.")
@click.option("--epochs", type=int, help="run.epochs.")
@click.option("--batch-size", type=int, help="data.batch_size.")
@click.option("--workers", type=int, help="data.workers: loader worker processes.")
@click.option("--image-size", type=int, help="data.image_size: resize images to this square size.")
@click.option("--device", help="run.device: auto, cpu, cuda, cuda:N.")
@click.option("--amp", help="run.amp: off, bf16 or fp16.")
@click.option("--compile/--no-compile", "compile_", default=None, help="run.compile: torch.compile the model.")
@click.option("--log-dir", help="run.log_dir: folder of run folders.")
@click.option("--name", help="run.name: the run folder's name (default: the start time).")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Add to run.tags (repeatable), e.g. category=shards.")
@click.option("--seed", type=int, help="run.seed.")
@click.option("--patience", type=int, help="run.patience: epochs without a better valid accuracy before stopping.")
@click.option("--resume", is_flag=True, default=None,
              help="run.resume: continue the run --name from its last.pt, with the config in its run.json.")
@click.option("--checkpoint-every-steps", type=int, metavar="N",
              help="run.checkpoint_every_steps: also write last.pt every N optimizer steps.")
@click.option("--sync-every", type=int, metavar="N",
              help="run.sync_every: read the loss back from the device every N batches (default 16 on CUDA, 1 on the CPU).")
@click.option("--no-progress", is_flag=True, help="Hide progress bars (run.progress = false).")
@click.option("--loader-config", "--loader", "loader_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Loader settings from `stoker tune --out FILE` (its [data] table); flags still win.")
@click.option("--set", "assignments", multiple=True, metavar="TABLE.KEY=VALUE",
              help="Set any config key, e.g. --set optim.scheduler=cosine (value read as TOML, else text).")
@click.option("--keys", is_flag=True, help="Print every config key with its default and allowed values, and exit.")
def train(config: Path | None, data: tuple[str, ...], valid: tuple[str, ...], model: str | None, optimizer: str | None, lr: float | None,
          epochs: int | None, batch_size: int | None, workers: int | None, image_size: int | None,
          device: str | None, amp: str | None, compile_: bool | None, log_dir: str | None, name: str | None,
          tags: tuple[str, ...], seed: int | None, patience: int | None, resume: bool | None,
          checkpoint_every_steps: int | None, sync_every: int | None, no_progress: bool,
          loader_file: Path | None, assignments: tuple[str, ...], keys: bool) -> None:
    """Train a model on image data, as CONFIG (a TOML file) says; flags override its keys.

    CONFIG has four tables, [data], [model], [optim] and [run] (see --keys). Without
    CONFIG, the defaults apply and --data is needed. An unknown key or a bad value is
    an error naming the key and what it accepts.
    """
    from stoker.errors import ConfigError
    from stoker.train.config import describe_keys, load_config
    from stoker.train.runner import rank_zero, train_from_config

    if keys:
        click.echo(describe_keys(), nl=False)
        return
    flags: dict[str, Any] = {
        "data.path": list(data) or None,
        "data.valid_path": list(valid) or None,
        "model.name": model,
        "optim.name": optimizer,
        "optim.lr": lr,
        "run.epochs": epochs,
        "data.batch_size": batch_size,
        "data.workers": workers,
        "data.image_size": image_size,
        "run.device": device,
        "run.amp": amp,
        "run.compile": compile_,
        "run.log_dir": log_dir,
        "run.name": name,
        "run.seed": seed,
        "run.patience": patience,
        "run.resume": resume,
        "run.checkpoint_every_steps": checkpoint_every_steps,
        "run.sync_every": sync_every,
        "run.progress": False if no_progress else None,
    }
    values = _loader_settings(loader_file) if loader_file is not None else {}
    values.update((k, v) for k, v in flags.items() if v is not None)
    if tags:
        parsed = {}
        for tag in tags:
            key, sep, value = tag.partition("=")
            if not sep or not key:
                raise ConfigError(f"--tag {tag!r}: expected KEY=VALUE, e.g. category=shards")
            parsed[key] = value
        values["run.tags"] = parsed
    cfg = load_config(config, assignments, values)  # --tag adds to the config's tags
    if loader_file is not None:
        _check_tuned_for(loader_file, cfg.data.path)
    try:
        result = train_from_config(cfg, echo=click.echo)
    except KeyboardInterrupt as exc:
        if rank_zero():  # one line for the run, not one per rank
            click.echo(f"\ninterrupted; {str(exc) or 'stopped before the run began; start it again'}", err=True)
        sys.exit(130)
    if rank_zero():
        click.echo(result.where())


def _loader_settings(path: Path) -> dict[str, Any]:
    """The [data] table of a `stoker tune` settings file, as ``{"data.key": value}``."""
    from stoker.bench.settings import load_data_table

    return {f"data.{key}": value for key, value in load_data_table(path).items()}


def _check_tuned_for(path: Path, data: list[str]) -> None:
    """Stop when the settings file was tuned for another storage than ``data``; warn for other data."""
    from stoker.bench.settings import check_tuned_for, load_settings

    for warning in check_tuned_for(load_settings(path), data, str(path)):
        click.echo(f"warning: {warning}", err=True)
