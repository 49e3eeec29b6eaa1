"""Config-driven runs: ``train_from_config`` (behind ``stoker train``) and ``demo_run``."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from stoker.errors import ConfigError, DataError
from stoker.loading import Loader, resolve_device
from stoker.train.engine import staging
from stoker.train.engine.distributed import Ranks, join_launch, launched
from stoker.train.engine.evaluate import TEST_FILE, TestFigures, evaluate_test
from stoker.train.engine.handover import newest_record
from stoker.train.engine.history import History
from stoker.train.engine.layout import choose_layout
from stoker.train.engine.loop import fit
from stoker.train.engine.record import (
    BEST_FILE,
    LAST_FILE,
    RUN_FILE,
    describe_status,
    read_run_json,
    resume_command,
    run_dir_of,
)
from stoker.train.engine.run import AMP_DTYPES, resolve_amp
from stoker.train.engine.scenario import SCENARIO_KEYS, Scenario
from stoker.train.loggers import Logger, RunInfo
from stoker.train.loggers.tensorboard import write_test_scalars
from stoker.train.runner.config import OptimConfig, TrainConfig, parse_config
from stoker.train.runner.data import build_data, build_loaders, build_test_loader
from stoker.train.runner.models import build_model

__all__ = ["RunInterrupted", "TrainingResult", "build_optimizer", "demo_run", "rank_zero", "run_record_text", "train_from_config"]

Echo = Callable[[str], None]


@dataclass(frozen=True)
class TrainingResult:
    """What a config-driven run produced.

    Attributes:
        run_dir: the run folder.
        history: every epoch's figures and how the run ended.
        data: one line describing the data that was opened.
        test: the test split's figures (``run.test``), else ``None``.
        url: the run folder's URL when ``run.log_dir`` is one (``run_dir`` is then this
            machine's copy of it), else ``None``.
    """

    run_dir: Path
    history: History
    data: str
    test: TestFigures | None = None
    url: str | None = None

    @property
    def best_acc(self) -> float:
        """Best validation accuracy (``nan`` if there was no validation)."""
        return self.history.best_acc if self.history.best_epoch else math.nan

    @property
    def files(self) -> dict[str, Path]:
        """The run's files that exist: metrics, record, checkpoints, curves, TensorBoard events."""
        candidates = {
            "metrics": self.run_dir / "metrics.csv",
            "record": self.run_dir / RUN_FILE,
            "best": self.run_dir / BEST_FILE,
            "last": self.run_dir / LAST_FILE,
            "curves": self.run_dir / "curves.png",
            "test": self.run_dir / TEST_FILE,
        }
        found = {k: p for k, p in candidates.items() if p.exists()}
        events = sorted(self.run_dir.glob("events.out.tfevents.*"))
        if events:
            found["tensorboard"] = events[-1]
        return found

    def where(self) -> str:
        """Lines saying where everything is and how to open it."""
        files = self.files
        lines = [f"run folder: {self.url} (this machine's copy: {self.run_dir})" if self.url else f"run folder: {self.run_dir}"]
        labels = {
            "metrics": "metrics (one row per epoch)",
            "record": "run record (config, tags, versions, device)",
            "best": "best model (by valid accuracy)",
            "last": "last checkpoint (resume from it)",
            "curves": "loss and accuracy curves",
            "test": "test split figures (best model)",
        }
        for key, label in labels.items():
            if key in files:
                lines.append(f"  {files[key].name:<13} {label}")
        if "tensorboard" in files:
            lines.append("  events.out.*  TensorBoard events")
            logdir = self.url.rsplit("/", 1)[0] if self.url else self.run_dir.parent
            lines.append(f"open TensorBoard: tensorboard --logdir {logdir}  (Scalars tab: loss/train, acc/valid ...; Custom Scalars tab: "
                         "Loss and Accuracy, train, valid and test on one chart)")
        return "\n".join(lines)


class RunInterrupted(KeyboardInterrupt):
    """A config-driven run stopped by Ctrl-C or SIGTERM; ``str()`` says what was saved and how to continue.

    Attributes:
        run_dir: the run folder (``None`` on ranks other than 0, or before it was made).
        command: the command that continues the run (``""`` when there is nothing to resume).
    """

    def __init__(self, run_dir: Path | None, url: str | None = None) -> None:
        self.run_dir = run_dir
        self.command = ""
        shown = url or run_dir
        if run_dir is None:
            text = "stopped before the run folder was made; start the run again"
        elif not (run_dir / LAST_FILE).is_file():
            text = f"{shown}: stopped before its first {LAST_FILE}, nothing to resume; start the run again"
        else:
            log_dir, name = url.rsplit("/", 1) if url else (str(run_dir.parent), run_dir.name)
            self.command = resume_command(log_dir, name)
            text = f"{shown}/{LAST_FILE} holds the last point saved: continue with {self.command}"
        super().__init__(text)


class _RunFolder(Logger):
    """Hears which folder the run writes to (rank 0 only: fit gives the other ranks no loggers)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def start(self, run: RunInfo, history: History) -> None:
        self.run_dir = run.run_dir


def rank_zero() -> bool:
    """Whether this process is rank 0 of its run (or runs alone): the one process that prints.

    Inside a process group, its rank; otherwise the ``RANK`` a launcher such as
    ``torchrun`` set (which outlives the group, for what is printed after the run ended).
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return (os.environ.get("RANK") or "0").strip() == "0"


def build_optimizer(cfg: OptimConfig, params: Any) -> torch.optim.Optimizer:
    """The optimizer of ``[optim]`` over ``params``."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ConfigError(f"optim.name must be one of sgd, adam, adamw; got {cfg.name!r}")


def _build_scheduler(cfg: OptimConfig, optimizer: torch.optim.Optimizer, epochs: int, steps_per_epoch: int) -> tuple[Any, str]:
    """``(scheduler or None, "epoch" | "step")`` for ``optim.scheduler``."""
    if cfg.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs), "epoch"
    if cfg.scheduler == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.step_epochs, gamma=cfg.gamma), "epoch"
    if cfg.scheduler == "onecycle":
        total = epochs * max(steps_per_epoch, 1)
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total), "step"
    return None, "epoch"


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_from_config(
    config: TrainConfig,
    callbacks: Sequence[Logger] = (),
    echo: Echo | None = print,
) -> TrainingResult:
    """Open the data, build model, optimizer and schedule, and :func:`fit` as ``config`` says.

    Args:
        config: a checked configuration (:func:`~stoker.train.runner.config.load_config`).
        callbacks: extra loggers.
        echo: prints what was opened before training (``None``: quiet).

    Returns:
        A :class:`TrainingResult`; ``result.where()`` says where everything is.

    Raises:
        ConfigError, DataError, TrainingError: a bad combination of keys; bad data; a non-finite loss.
        RunInterrupted: Ctrl-C or SIGTERM (a ``KeyboardInterrupt`` that says how to continue).

    Example:
        >>> from stoker.train import load_config
        >>> config = load_config(None, ["data.path=data/digiface", "data.image_size=16", "data.workers=0",
        ...                             "run.epochs=1", "run.progress=false", "run.adapt=false", "run.name=first"])
        >>> print(train_from_config(config, echo=None).where())
        run first in runs/first ...
        ...
        run folder: runs/first
        ...
    """
    # 1. Seeds, ranks (under torchrun: join the process group first, so the loaders split by
    #    rank), device, data and loaders.
    _seed_everything(config.run.seed)
    ranks = join_launch(config.run.device)
    try:
        device = ranks.device if ranks.active else resolve_device(config.run.device)
        return _train(config, callbacks, echo if ranks.main else None, device, ranks)
    finally:
        ranks.close()


def _steps_per_epoch(loader: Loader, grad_accum: int, ranks: Ranks) -> int:
    """Optimizer steps in an epoch, the same number on every rank (a schedule's length: the ranks' LRs must not differ).

    A stream read by several ranks has no length before it is read (``len`` raises):
    then at most its share's batches plus one short batch per worker, the most over ranks.
    """
    try:
        batches = len(loader)
    except TypeError:
        share = len(cast(Any, loader.dataset))  # this rank's samples (stoker.order: len is the rank's share)
        batches = math.ceil(share / loader.batch_size) + max(loader.num_workers, 1)
    return int(ranks.max([math.ceil(batches / grad_accum)])[0])


def _train(config: TrainConfig, callbacks: Sequence[Logger], echo: Echo | None, device: torch.device,
           ranks: Ranks) -> TrainingResult:
    """:func:`train_from_config` once the ranks are joined: on ``device``, echoing on rank 0 only."""
    data = build_data(config.data, seed=config.run.seed)
    num_classes = config.model.num_classes or data.num_classes
    if num_classes < data.num_classes:
        raise ConfigError(f"model.num_classes = {num_classes} but the data has {data.num_classes} classes; raise it or leave it out")
    train_loader, valid_loader = build_loaders(data, config.data, device, seed=config.run.seed)
    test_loader = build_test_loader(data, config.data, device) if config.run.test else None  # refused before training

    # 2. Model, loss, optimizer, schedule.
    model = build_model(config.model.name, num_classes)
    optimizer = build_optimizer(config.optim, model.parameters())
    steps = _steps_per_epoch(train_loader, config.run.grad_accum, ranks)
    scheduler, interval = _build_scheduler(config.optim, optimizer, config.run.epochs, steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=config.optim.label_smoothing)
    if echo is not None:
        untested = f"; its test split ({len(cast(Any, data.test)):,} samples) is not evaluated: add --test" if (
            data.test is not None and not config.run.test) else ""
        echo(f"data: {data.description}{untested}")
        echo(f"model: {config.model.name} ({num_classes} classes, {sum(p.numel() for p in model.parameters()):,} parameters), "
             f"{config.optim.name} lr {config.optim.lr:g}, batch {config.data.batch_size}, "
             f"{train_loader.num_workers} {train_loader.backend} worker{'' if train_loader.num_workers == 1 else 's'}")
        if config.run.resume and config.run.name:
            _echo_resumed(config.run.log_dir, config.run.name, echo)

    record = config.to_dict()
    record["data"]["opened"] = data.description
    run = {name: getattr(config.run, name) for name in SCENARIO_KEYS}  # the [run] keys a Scenario takes, as they are
    run["device"] = device  # resolved (under torchrun: this rank's)
    scenario = Scenario(
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        train_loader=train_loader,
        valid_loader=valid_loader,
        scheduler=scheduler,
        scheduler_interval=interval,  # type: ignore[arg-type]
        config=record,
        **run,
    )

    # 3. Train (fit leaves the loader workers their cores on the CPU).
    folder = _RunFolder()
    try:
        history = fit(scenario, [*callbacks, folder])
    except KeyboardInterrupt:
        url = staging.run_url(config.run.log_dir, folder.run_dir.name) if folder.run_dir is not None else None
        raise RunInterrupted(folder.run_dir, url) from None
    run_dir = Path(history.run_dir or config.run.log_dir)
    url = staging.run_url(config.run.log_dir, run_dir.name)
    test = None
    if test_loader is not None:  # 4. The test split, once, with the best model.
        amp = resolve_amp(config.run.amp, device)
        preprocess = scenario.preprocess.to(device) if isinstance(scenario.preprocess, nn.Module) else scenario.preprocess
        test = evaluate_test(model, test_loader, run_dir, ranks, device=device, preprocess=preprocess,
                             amp_dtype=AMP_DTYPES[amp], loss_fn=loss_fn,
                             memory_format=choose_layout(config.run.channels_last, device, amp, model).memory_format)
        if ranks.main:  # beside the curves: at the epoch whose weights were evaluated
            write_test_scalars(run_dir, test.loss, test.acc, history.best_epoch or len(history.epochs))
        if echo is not None:
            echo(f"test: {test.samples:,} samples, loss {test.loss:.4f}, accuracy {test.acc:.4f} ({test.weights})")
        if url is not None and ranks.main:
            staging.push(run_dir, url)  # test.csv and the run.json that names it
    return TrainingResult(run_dir, history, data.description, test, url)


def _echo_resumed(log_dir: str, name: str, echo: Echo) -> None:
    """Say how the run being resumed ended (a killed one says interrupted, not running)."""
    url = staging.run_url(log_dir, name)
    try:
        text = staging.read_text(url, RUN_FILE) if url is not None else None
        record = json.loads(text) if text is not None else read_run_json(Path(log_dir) / name)
    except (DataError, ValueError):
        return  # no record to tell from (on this machine): fit says whether there is anything to resume
    if isinstance(record, dict):
        echo(f"resuming {url or Path(log_dir) / name}: it was {describe_status(record)}")


def run_record_text(config: TrainConfig) -> str | None:
    """The text of the ``run.json`` that ``config`` (a run to resume) takes its config from; ``None``: there is none.

    At a URL ``run.log_dir``, the one there. Under a launch over several ranks (torchrun
    on several machines, each with its own run folder), the one beside the newest
    ``last.pt`` over all ranks (:func:`stoker.train.engine.handover.newest_record`): this joins
    the ranks now, so every rank must call it (``stoker train --resume`` does). Else the
    local file. What :func:`~stoker.train.runner.config.load_config` takes as ``records``.

    Raises:
        NetworkError: the URL cannot be reached.
        ConfigError: the ranks cannot be joined.
    """
    log_dir, name = config.run.log_dir, str(config.run.name)
    url = staging.run_url(log_dir, name)
    if url is not None:
        return staging.read_text(url, RUN_FILE)
    if launched():
        return newest_record(join_launch(config.run.device), run_dir_of(log_dir, name))
    try:
        return (Path(log_dir) / name / RUN_FILE).read_text(encoding="utf-8")
    except OSError:
        return None


def demo_run(
    data_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] = "runs",
    *,
    epochs: int = 4,
    image_size: int | None = 64,
    batch_size: int = 32,
    workers: int = 2,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    seed: int = 0,
    progress: bool = True,
    echo: Echo | None = print,
) -> TrainingResult:
    """Train the small CNN for a few epochs on ``data_dir``: what ``stoker demo`` runs.

    With the default 10-class synthetic DigiFace-like data (a few hundred 112x112
    images, resized to 64x64), this reaches a validation accuracy far above chance in
    seconds on two CPU cores.

    Args:
        data_dir: the data folder, in any layout (detected).
        out_dir: the log folder; the run folder is ``out_dir/name``.
        epochs, image_size, batch_size, workers, seed: as the config keys of the same names.
        name: the run's name (default: the start time).
        tags: labels for ``run.json`` (default ``{"category": "demo"}``).
        progress: show progress bars.
        echo: prints what was opened (``None``: quiet).

    Returns:
        The :class:`TrainingResult`; ``print(result.where())`` tells the user where things are.

    Example:
        >>> result = demo_run("data/digiface", "runs", epochs=1, image_size=16, workers=0, progress=False, echo=None)
        run ... in runs/...
        ...
        best valid accuracy ... at epoch 1 (finished)
        >>> 0.0 <= result.best_acc <= 1.0
        True
    """
    data: dict[str, Any] = {"path": str(data_dir), "batch_size": batch_size, "workers": workers}
    if image_size is not None:
        data["image_size"] = image_size
    run: dict[str, Any] = {
        "epochs": epochs,
        "log_dir": str(out_dir),
        "seed": seed,
        "progress": progress,
        "tags": dict(tags) if tags is not None else {"category": "demo"},
    }
    if name is not None:
        run["name"] = name
    raw = {"data": data, "model": {"name": "small_cnn"}, "optim": {"name": "adamw", "lr": 3e-3}, "run": run}
    return train_from_config(parse_config(raw, source="demo"), echo=echo)
