"""``fit``: the training loop, top to bottom.

One function, numbered steps. What it guarantees:

* the epoch loss is the sum of each batch's mean loss times its size, over the number
  of samples (exact when the last batch is short); accuracy is the share of argmax hits;
* the time of every epoch is split into waiting for data and computing (see
  :mod:`stoker.train.timing`);
* ``last.pt`` after every epoch and ``best.pt`` whenever validation accuracy improves,
  both written atomically; resuming from ``last.pt`` continues exactly (weights,
  optimizer, scaler, scheduler, epoch, RNG states, best so far, history);
* a non-finite loss stops the run at once, naming the epoch and batch, and leaves the
  last good checkpoint as it was.

Resume is bit-exact when the data order is a function of the epoch, as with stoker's
:class:`~stoker.Loader` (``fit`` calls ``loader.set_epoch``). Random augmentations in
persistent worker processes draw from per-worker generators that a checkpoint does not
hold: with them a resumed run is statistically, not bitwise, the same.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from stoker.errors import CheckpointError, ConfigError, TrainingError
from stoker.loading import resolve_device
from stoker.train.checkpoint import get_rng_state, load_checkpoint, save_checkpoint, set_rng_state
from stoker.train.history import EpochStats, History
from stoker.train.loggers import BatchProgress, ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger
from stoker.train.plots import plot_curves
from stoker.train.record import BEST_FILE, LAST_FILE, device_name, prepare_run_dir, versions, write_run_json
from stoker.train.scenario import Scenario
from stoker.train.timing import PhaseTimer

__all__ = ["CHECKPOINT_FORMAT", "fit"]

CHECKPOINT_FORMAT = "stoker-checkpoint/1"
_AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def fit(scenario: Scenario, callbacks: Sequence[Logger] = ()) -> History:
    """Train ``scenario.model`` for ``scenario.epochs`` epochs, validating after each.

    The run folder ``log_dir/name`` receives ``metrics.csv``, ``run.json``, TensorBoard
    events, ``last.pt``, ``best.pt`` and, at the end, ``curves.png``.

    Args:
        scenario: what to train and how.
        callbacks: more loggers, called after the scenario's own (any object with the
            :class:`~stoker.train.loggers.Logger` methods).

    Returns:
        The :class:`History` of every epoch (with the ones before a resume).

    Raises:
        TrainingError: the loss became NaN or infinite (the message names epoch and batch).
        ConfigError: the run folder already holds a run and ``resume`` is off, or there
            is nothing to resume.
        CheckpointError: ``last.pt`` cannot be written or read.

    Example:
        >>> history = fit(Scenario(model, optimizer, nn.CrossEntropyLoss(), train, valid, epochs=3))  # doctest: +SKIP
        >>> history.best_acc, history.best_epoch  # doctest: +SKIP
        (0.91, 3)
    """
    s = scenario

    # 1. Device, run folder, the model on the device, AMP.
    device = resolve_device(s.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed image sizes: let cuDNN pick the fastest kernels
    name, run_dir = prepare_run_dir(s.log_dir, s.name, s.resume)
    model = s.model.to(device)
    preprocess = s.preprocess.to(device) if isinstance(s.preprocess, nn.Module) else s.preprocess
    forward = torch.compile(model) if s.compile else model  # state is saved from `model`, not the wrapper
    amp_dtype = _AMP_DTYPES[s.amp]
    scaler = torch.amp.GradScaler(device.type, enabled=s.amp == "fp16")
    config = json.loads(json.dumps(dict(s.config), default=str))  # plain types, for weights_only checkpoints

    # 2. Resume: everything that shapes the next epoch comes back from last.pt.
    history = History(run_dir=run_dir)
    if s.resume:
        state = load_checkpoint(run_dir / LAST_FILE, map_location="cpu")
        _check_checkpoint(state, run_dir / LAST_FILE)
        model.load_state_dict(state["model"])
        s.optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        if s.scheduler is not None and state["scheduler"] is not None:
            s.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        history.epochs = [EpochStats.from_dict(e) for e in state["history"]]
        history.best_acc, history.best_epoch = float(state["best_acc"]), int(state["best_epoch"])
    start_epoch = len(history.epochs)

    # 3. Loggers and the run's record.
    loggers = _make_loggers(s.loggers, s.progress) + list(callbacks)
    info = RunInfo(name, run_dir, s.epochs, start_epoch, str(device), dict(s.tags), config, s.resume, s.loader_bound_share)
    record = {
        "name": name,
        "tags": dict(s.tags),
        "config": config,
        "device": str(device),
        "device_name": device_name(device),
        "versions": versions(),
        "model": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "amp": s.amp,
        "compile": s.compile,
        "epochs": s.epochs,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_run_json(run_dir, record, history)
    for logger in loggers:
        logger.start(info, history)

    try:
        for epoch in range(start_epoch + 1, s.epochs + 1):  # 1-based
            batches = _batches(s.train_loader, s.valid_loader)
            for logger in loggers:
                logger.epoch_start(epoch, batches)

            # 4. Train: per batch copy, zero, forward under autocast, loss, backward, step.
            model.train()
            _set_epoch(s.train_loader, epoch - 1)  # the shuffle order is a function of the epoch
            train, train_timer = _Tally("train", epoch, _len(s.train_loader)), PhaseTimer(device)
            lr = s.optimizer.param_groups[0]["lr"]
            for batch, (images, labels) in enumerate(train_timer.iterate(s.train_loader), start=1):
                images = images.to(device, non_blocking=True)  # uint8 [B, C, H, W]; no-op if the loader moved it
                labels = labels.to(device, non_blocking=True)  # int64 [B]
                if (batch - 1) % s.grad_accum == 0:
                    s.optimizer.zero_grad(set_to_none=True)
                x = preprocess(images) if preprocess is not None else images  # float [B, C, H, W], on the device
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    logits = forward(x)  # [B, classes]
                    loss = s.loss_fn(logits, labels)  # mean over the batch
                scaler.scale(loss / s.grad_accum).backward()
                if batch % s.grad_accum == 0:
                    _step(s, scaler)
                # Reading the loss back waits for the step: one sync per batch, which keeps
                # the data-wait/compute split honest and names the batch of a bad loss.
                loss_value, hits = torch.stack([loss.detach().float(), (logits.argmax(1) == labels).sum().float()]).tolist()
                if not math.isfinite(loss_value):
                    raise TrainingError(
                        f"non-finite loss ({loss_value}) at epoch {epoch}, batch {batch}; the run stopped and "
                        f"{run_dir / LAST_FILE} still holds the last good epoch ({epoch - 1}). Lower the learning "
                        "rate, check the data for bad values, or use amp='bf16' instead of 'fp16'"
                    )
                train.add(loss_value, int(hits), labels.shape[0], train_timer, loggers)
            if train.batches % s.grad_accum:
                _step(s, scaler)  # the last, partial accumulation window
            if train.samples == 0:
                raise TrainingError(f"epoch {epoch}: the train loader gave no batches; check the data and drop_last")

            # 5. Validate in eval mode without gradients.
            valid, valid_timer = _Tally("valid", epoch, _len(s.valid_loader)), PhaseTimer(device)
            if s.valid_loader is not None:
                model.eval()
                _set_epoch(s.valid_loader, epoch - 1)
                with torch.no_grad():
                    for images, labels in valid_timer.iterate(s.valid_loader):
                        images = images.to(device, non_blocking=True)
                        labels = labels.to(device, non_blocking=True)
                        x = preprocess(images) if preprocess is not None else images
                        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                            logits = forward(x)
                            loss = s.loss_fn(logits, labels)
                        loss_value, hits = torch.stack([loss.float(), (logits.argmax(1) == labels).sum().float()]).tolist()
                        valid.add(loss_value, int(hits), labels.shape[0], valid_timer, loggers)

            # 6. Epoch figures; the scheduler steps after them so `lr` is the one this epoch used.
            time_s = train_timer.wall_s + valid_timer.wall_s
            wait_s = train_timer.data_wait_s + valid_timer.data_wait_s
            stats = EpochStats(
                epoch=epoch,
                train_loss=train.loss,
                train_acc=train.acc,
                valid_loss=valid.loss,
                valid_acc=valid.acc,
                time_s=time_s,
                train_time_s=train_timer.wall_s,
                data_wait_s=wait_s,
                compute_s=time_s - wait_s,
                img_per_s=train.samples / train_timer.wall_s if train_timer.wall_s > 0 else 0.0,
                data_wait_share=wait_s / time_s if time_s > 0 else 0.0,
                lr=lr,
                train_samples=train.samples,
                valid_samples=valid.samples,
                skipped=len(getattr(s.train_loader, "skipped", ())) + len(getattr(s.valid_loader, "skipped", ())),
            )
            history.epochs.append(stats)
            if s.scheduler is not None and s.scheduler_interval == "epoch":
                if isinstance(s.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    s.scheduler.step(stats.valid_loss if s.valid_loader is not None else stats.train_loss)
                else:
                    s.scheduler.step()

            # 7. Checkpoints: best.pt first, then last.pt, so a crash between the two
            #    redoes this epoch (deterministically) rather than lose a best model.
            improved = s.valid_loader is not None and stats.valid_acc > history.best_acc
            if improved:
                history.best_acc, history.best_epoch = stats.valid_acc, epoch
                save_checkpoint(
                    {"format": CHECKPOINT_FORMAT, "model": model.state_dict(), "epoch": epoch,
                     "valid_acc": stats.valid_acc, "name": name, "tags": dict(s.tags), "config": config},
                    run_dir / BEST_FILE,
                )
            save_checkpoint(
                {
                    "format": CHECKPOINT_FORMAT,
                    "model": model.state_dict(),
                    "optimizer": s.optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
                    "epoch": epoch,
                    "best_acc": history.best_acc,
                    "best_epoch": history.best_epoch,
                    "history": [e.to_dict() for e in history.epochs],
                    "rng": get_rng_state(),
                    "name": name,
                    "tags": dict(s.tags),
                    "config": config,
                },
                run_dir / LAST_FILE,
            )
            for logger in loggers:
                logger.epoch_end(stats)

            # 8. Stop early when validation accuracy has not improved for `patience` epochs.
            if s.patience is not None and epoch - history.best_epoch >= s.patience:
                history.stopped = "patience"
                break
        else:
            history.stopped = "finished"
    except TrainingError:
        history.stopped = "non-finite loss"
        raise
    except KeyboardInterrupt:
        history.stopped = "interrupted"
        raise
    except BaseException:
        history.stopped = "error"
        raise
    finally:
        # 9. Close the loggers, record how the run ended, draw curves.png.
        for logger in loggers:
            logger.end(history)
        write_run_json(run_dir, record, history)
        if s.plot and history.epochs:
            plot_curves(history.rows(), run_dir / "curves.png", title=name)
    return history


class _Tally:
    """Running sums of one phase: samples, loss x batch size, argmax hits."""

    def __init__(self, phase: str, epoch: int, batches: int | None) -> None:
        self.phase, self.epoch, self.total_batches = phase, epoch, batches
        self.batches = self.samples = self.hits = 0
        self.loss_sum = 0.0

    def add(self, loss: float, hits: int, size: int, timer: PhaseTimer, loggers: Iterable[Logger]) -> None:
        self.batches += 1
        self.samples += size
        self.hits += hits
        self.loss_sum += loss * size  # the batch's mean loss, weighted by its size
        progress = BatchProgress(
            self.phase, self.epoch, self.batches, self.total_batches, self.samples,
            self.loss, self.acc, timer.elapsed_s, timer.data_wait_s,
        )
        for logger in loggers:
            logger.batch_end(progress)

    @property
    def loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else math.nan

    @property
    def acc(self) -> float:
        return self.hits / self.samples if self.samples else math.nan


def _step(s: Scenario, scaler: torch.amp.GradScaler) -> None:
    """One optimizer step through the scaler (a plain step when fp16 is off)."""
    scaler.step(s.optimizer)
    scaler.update()
    if s.scheduler is not None and s.scheduler_interval == "step":
        s.scheduler.step()


def _len(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _batches(train: Any, valid: Any) -> int | None:
    n_train, n_valid = _len(train), (_len(valid) if valid is not None else 0)
    return None if n_train is None or n_valid is None else n_train + n_valid


def _set_epoch(loader: Any, epoch: int) -> None:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)


def _make_loggers(names_or_loggers: Iterable[Any], progress: bool) -> list[Logger]:
    """Built-in loggers by name (``"console"``, ``"csv"``, ``"tensorboard"``), others as given."""
    loggers: list[Logger] = []
    for item in names_or_loggers:
        if item == "console":
            loggers.append(ConsoleLogger(progress=progress))
        elif item == "csv":
            loggers.append(CsvLogger())
        elif item == "tensorboard":
            loggers.append(TensorBoardLogger())
        elif isinstance(item, str):
            raise ConfigError(f"Scenario.loggers: unknown logger {item!r}; built in: console, csv, tensorboard")
        else:
            loggers.append(item)
    return loggers


def _check_checkpoint(state: dict[str, Any], path: Any) -> None:
    missing = [k for k in ("model", "optimizer", "scaler", "scheduler", "epoch", "best_acc", "best_epoch", "history", "rng")
               if k not in state]
    if state.get("format") != CHECKPOINT_FORMAT or missing:
        raise CheckpointError(
            f"{path}: not a stoker last.pt (format {state.get('format')!r}, missing {missing}); "
            "resume needs the last.pt a stoker run wrote"
        )
