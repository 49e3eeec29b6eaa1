"""``fit``: the training loop, top to bottom.

One function, numbered steps. What it guarantees:

* the epoch loss is the sum of each batch's mean loss times its size, over the number
  of samples (exact when the last batch is short); accuracy is the share of argmax hits;
* the time of every epoch is split into waiting for data and computing (see
  :mod:`stoker.train.timing`);
* ``last.pt`` after every epoch (and every ``checkpoint_every_steps`` optimizer steps)
  and ``best.pt`` whenever validation accuracy improves, both written atomically;
  resuming from ``last.pt`` continues exactly (weights, optimizer, scaler, scheduler,
  epoch, RNG states, best so far, history, and mid-epoch the loader's position and the
  partial epoch's tallies and seconds);
* Ctrl-C or SIGTERM stops at the next optimizer-step boundary and saves ``last.pt``
  there (see :mod:`stoker.train.interrupt`); during validation it saves the epoch as
  trained and the resumed run redoes the validation, which changes no weights;
* a non-finite loss stops the run at once, naming the epoch and batch, and leaves the
  last good checkpoint as it was.

Resume is bit-exact when the data order is a function of the epoch, as with stoker's
:class:`~stoker.Loader` (``fit`` calls ``loader.set_epoch``, and mid-epoch its
``state_dict``). Random augmentations in worker processes draw from per-worker
generators that a checkpoint does not hold: with them a resumed run is statistically,
not bitwise, the same.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from stoker.errors import ConfigError, TrainingError
from stoker.loading import resolve_device
from stoker.train.checkpoint import get_rng_state, load_checkpoint, save_checkpoint
from stoker.train.history import EpochStats, History
from stoker.train.interrupt import StopRequest
from stoker.train.loggers import ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger
from stoker.train.plots import plot_curves
from stoker.train.record import BEST_FILE, LAST_FILE, device_name, prepare_run_dir, versions, write_run_json
from stoker.train.resume import CHECKPOINT_FORMAT, check_last, restore_last, restore_loader
from stoker.train.scenario import Scenario
from stoker.train.tally import Tally, mid_epoch_entry, notify_batch_end
from stoker.train.threads import ComputeThreads
from stoker.train.timing import PhaseTimer

__all__ = ["CHECKPOINT_FORMAT", "fit"]

log = logging.getLogger("stoker")
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
        CheckpointError: ``last.pt`` cannot be written or read, or does not fit this run.
        KeyboardInterrupt: Ctrl-C or SIGTERM (after ``last.pt`` was saved at a step boundary).

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
    resumable = hasattr(s.train_loader, "state_dict") and hasattr(s.train_loader, "load_state_dict")
    if s.checkpoint_every_steps is not None and not resumable:
        raise ConfigError(
            "Scenario.checkpoint_every_steps needs a train loader with state_dict/load_state_dict "
            f"(stoker's make_loader); got a {type(s.train_loader).__name__}"
        )
    name, run_dir = prepare_run_dir(s.log_dir, s.name, s.resume)
    last_path = run_dir / LAST_FILE
    model = s.model.to(device)
    preprocess = s.preprocess.to(device) if isinstance(s.preprocess, nn.Module) else s.preprocess
    forward = torch.compile(model) if s.compile else model  # state is saved from `model`, not the wrapper
    amp_dtype = _AMP_DTYPES[s.amp]
    scaler = torch.amp.GradScaler(device.type, enabled=s.amp == "fp16")
    config = json.loads(json.dumps(dict(s.config), default=str))  # plain types, for weights_only checkpoints

    # 2. Resume: everything that shapes the next batch comes back from last.pt.
    history = History(run_dir=run_dir)
    partial: dict[str, Any] | None = None  # the epoch last.pt was saved in the middle of
    if s.resume:
        state = load_checkpoint(last_path, map_location="cpu")
        partial = check_last(state, last_path)
        restore_last(state, last_path, model=model, optimizer=s.optimizer, scaler=scaler, scheduler=s.scheduler,
                     history=history)
    start_epoch = len(history.epochs)

    # 3. Loggers and the run's record.
    loggers = _make_loggers(s.loggers, s.progress) + list(callbacks)
    threads = ComputeThreads(device, (s.train_loader, s.valid_loader), s.cpu_threads)  # cores for the loader
    info = RunInfo(name, run_dir, s.epochs, start_epoch, str(device), dict(s.tags), config, s.resume, s.loader_bound_share,
                   threads.reason if device.type == "cpu" else "")
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
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    write_run_json(run_dir, record, history)
    for logger in loggers:
        logger.start(info, history)

    def save_last(epoch_done: int, partial_state: dict[str, Any] | None, rng: dict[str, Any] | None = None) -> None:
        save_checkpoint(
            {
                "format": CHECKPOINT_FORMAT,
                "model": model.state_dict(),
                "optimizer": s.optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
                "epoch": epoch_done,
                "best_acc": history.best_acc,
                "best_epoch": history.best_epoch,
                "history": history.state_dict(),
                "rng": rng if rng is not None else get_rng_state(),
                "partial": partial_state,
                "name": name,
                "tags": dict(s.tags),
                "config": config,
            },
            last_path,
        )

    try:
        with StopRequest() as stop, threads:
            for epoch in range(start_epoch + 1, s.epochs + 1):  # 1-based
                if stop.requested:  # asked between epochs: last.pt already holds the finished ones
                    raise KeyboardInterrupt
                here = partial if partial is not None and partial["epoch"] == epoch else None
                batches = _batches(s.train_loader, s.valid_loader)
                for logger in loggers:
                    logger.epoch_start(epoch, batches)

                # 4. Train: per batch copy, zero, forward under autocast, loss, backward, step.
                #    A resumed epoch starts from the saved tallies, seconds and loader position.
                model.train()
                _set_epoch(s.train_loader, epoch - 1)  # the shuffle order is a function of the epoch
                train, train_timer = Tally("train", epoch, _len(s.train_loader)), PhaseTimer(device)
                lr = s.optimizer.param_groups[0]["lr"]
                if here is not None:
                    train.load_state_dict(here["train"])
                    train_timer = PhaseTimer(device, **here["train_timer"])
                    lr = here["lr"]
                    if here["phase"] == "train":
                        restore_loader(s.train_loader, here["loader"], last_path, epoch)
                if here is None or here["phase"] == "train":
                    for batch, (images, labels) in enumerate(train_timer.iterate(s.train_loader), start=train.batches + 1):
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
                                f"{last_path} still holds the last good point. Lower the learning "
                                "rate, check the data for bad values, or use amp='bf16' instead of 'fp16'"
                            )
                        train.add(loss_value, int(hits), labels.shape[0])
                        notify_batch_end(loggers, train.progress(train_timer), stop)
                        # 4b. At a step boundary: a periodic checkpoint, or the stop that was asked for.
                        if batch % s.grad_accum == 0 and (stop.requested or _due(s, batch)):
                            if not resumable:
                                raise KeyboardInterrupt  # no loader position to save: last.pt keeps the last epoch
                            save_last(epoch - 1, mid_epoch_entry(epoch, "train", train, train_timer, lr, cast(Any, s.train_loader).state_dict()))
                            if stop.requested:
                                _say_saved(last_path, epoch, f"after batch {batch}")
                                raise KeyboardInterrupt
                    if train.batches % s.grad_accum:
                        _step(s, scaler)  # the last, partial accumulation window
                if train.samples == 0:
                    raise TrainingError(f"epoch {epoch}: the train loader gave no batches; check the data and drop_last")
                trained_rng = get_rng_state()  # validation draws nothing, but a stop during it resumes from here

                # 5. Validate in eval mode without gradients (a stop saves the epoch as trained).
                valid, valid_timer = Tally("valid", epoch, _len(s.valid_loader)), PhaseTimer(device)
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
                            valid.add(loss_value, int(hits), labels.shape[0])
                            notify_batch_end(loggers, valid.progress(valid_timer), stop)
                            if stop.requested:
                                save_last(epoch - 1, mid_epoch_entry(epoch, "valid", train, train_timer, lr, None), trained_rng)
                                _say_saved(last_path, epoch, "after training, during validation (it is redone)")
                                raise KeyboardInterrupt

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
                save_last(epoch, None)
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


def _due(s: Scenario, batch: int) -> bool:
    """Whether a periodic mid-epoch checkpoint is due after ``batch`` (at a step boundary)."""
    every = s.checkpoint_every_steps
    return every is not None and (batch // s.grad_accum) % every == 0


def _say_saved(path: Path, epoch: int, where: str) -> None:
    log.warning("interrupted in epoch %d %s: %s holds this point; continue with --resume (stoker train --name RUN --resume)",
                epoch, where, path)


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
