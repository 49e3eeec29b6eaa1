"""``fit``: the training loop, top to bottom.

One function, numbered steps; the set-up and the checkpoints are in
:mod:`stoker.train.engine.run`, the phases of an epoch in :mod:`stoker.train.engine.epoch`.
What it guarantees:

* the epoch loss is weighted by batch size; accuracy is the share of argmax hits;
* every epoch's time is split into waiting for data and computing (:mod:`stoker.train.engine.timing`);
* the host reads figures back from the device every ``sync_every`` batches, and the
  figures and checkpoints are the same, to the bit, for every value;
* ``last.pt`` after every epoch (and every ``checkpoint_every_steps``), ``best.pt`` when
  validation accuracy improves, both atomic; resuming from ``last.pt`` continues exactly;
* Ctrl-C or SIGTERM saves ``last.pt`` at the next optimizer-step boundary;
* a non-finite loss stops the run, naming epoch and batch, and leaves the last good checkpoint;
* under ``torch.distributed``, one run over the ranks: DDP, the same steps on every rank,
  figures summed over ranks, rank 0 alone writes.

The guide (``docs/guides/own-loop.md``, "What fit guarantees") says each in full.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from stoker.errors import ConfigError, TrainingError
from stoker.train.engine.adapt import make_adapter
from stoker.train.engine.epoch import batch_count, reduce_epoch, train_epoch, validate
from stoker.train.engine.history import EpochStats, History
from stoker.train.engine.interrupt import StopRequest
from stoker.train.engine.plots import plot_curves
from stoker.train.engine.record import device_name, resume_command, versions, write_run_json
from stoker.train.engine.resume import CHECKPOINT_FORMAT
from stoker.train.engine.run import Run, resume, set_up, wrap_model
from stoker.train.engine.scenario import Scenario
from stoker.train.engine.threads import ComputeThreads
from stoker.train.loggers import ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger

__all__ = ["CHECKPOINT_FORMAT", "fit"]


def fit(scenario: Scenario, callbacks: Sequence[Logger] = ()) -> History:
    """Train ``scenario.model`` for ``scenario.epochs`` epochs, validating after each.

    Args:
        scenario: what to train and how.
        callbacks: more loggers (:class:`~stoker.train.loggers.Logger`), after the scenario's own (rank 0 only).

    Returns:
        The :class:`History` of every epoch (with those before a resume); files go to ``log_dir/name``.

    Raises:
        TrainingError: the loss became NaN or infinite, or another rank was lost (each named).
        ConfigError: the run folder holds a run and ``resume`` is off, or there is nothing to resume.
        CheckpointError: ``last.pt`` cannot be written or read, or does not fit this run.
        KeyboardInterrupt: Ctrl-C or SIGTERM (after ``last.pt`` was saved at a step boundary).

    Example:
        >>> from torch import nn
        >>> from stoker import ClassFolderDataset, Scenario, make_loader
        >>> parts = ClassFolderDataset("data/digiface", transform=lambda im: im[:, :16, :16]).split(0.25, seed=0)
        >>> model, (train, valid) = nn.Sequential(nn.Flatten(), nn.Linear(768, 4)), parts
        >>> history = fit(Scenario(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
        ...     make_loader(train, 8, num_workers=0), make_loader(valid, 8, num_workers=0), epochs=2,
        ...     loggers=(), progress=False, plot=False, adapt=False))
        >>> len(history), history.best_epoch in (1, 2)
        (2, True)
    """
    s = scenario
    # 1. Ranks, device, run folder (rank 0 makes it and names it), the model on the device, AMP.
    run = set_up(s)
    history = run.history
    # 2. Resume: everything that shapes the next batch comes back from last.pt; then DDP and torch.compile.
    if s.resume:
        resume(run)
    wrap_model(run)
    # 3. Loggers (rank 0), cores for the loader, the run's record.
    run.loggers = _make_loggers(s.loggers, s.progress) + list(callbacks) if run.ranks.main else []
    threads = ComputeThreads(run.device, (s.train_loader, s.valid_loader), s.cpu_threads)
    run.adapter = make_adapter(run)  # 3b. adapt: the train loader's settings, tried on the first steps
    record = _start(run, threads)
    with _ending(run, record), _rank_loss(run), StopRequest(lambda: bool(run.ranks.gone())) as stop, threads:
        for epoch in range(len(history.epochs) + 1, s.epochs + 1):  # 1-based
            if run.ranks.agree(stop.requested)[0]:  # asked between epochs: last.pt already holds the finished ones
                raise KeyboardInterrupt
            here = run.partial if run.partial is not None and run.partial["epoch"] == epoch else None
            batches = _batches(s.train_loader, s.valid_loader)
            for logger in run.loggers:
                logger.epoch_start(epoch, batches)
            # 4. Train: per batch copy, zero, forward under autocast, loss, backward, step.
            trained = train_epoch(run, epoch, here, stop)
            # 5. Validate in eval mode without gradients (a stop saves the epoch as trained).
            valid, valid_timer = validate(run, trained, stop)
            # 6. The epoch's figures over all ranks; then the scheduler, so `lr` is the one this epoch used.
            stats = reduce_epoch(run, trained, valid, valid_timer)
            history.epochs.append(stats)
            if run.adapter is not None:  # loader-bound with its search not over: adapt goes on searching
                run.adapter.epoch_end(stats.data_wait_share)
            _step_scheduler(s, stats)
            # 7. Checkpoints: best.pt first, then last.pt, so a crash between the two
            #    redoes this epoch (deterministically) rather than lose a best model.
            if s.valid_loader is not None and stats.valid_acc > history.best_acc:
                history.best_acc, history.best_epoch = stats.valid_acc, epoch
                run.save_best(stats)
            run.save_last(epoch, None)
            for logger in run.loggers:
                logger.epoch_end(stats)
            run.publish()  # a run folder at a URL gets the epoch's files
            # 8. Stop early when validation accuracy has not improved for `patience` epochs.
            if s.patience is not None and epoch - history.best_epoch >= s.patience:
                history.stopped = "patience"
                break
        else:
            history.stopped = "finished"
    return history


def _start(run: Run, threads: ComputeThreads) -> dict[str, Any]:
    """Write ``run.json`` (rank 0) and start the loggers; returns the run's record."""
    s, ranks, model, device = run.scenario, run.ranks, run.model, run.device
    info = RunInfo(run.name, run.run_dir, s.epochs, len(run.history.epochs), str(device), dict(s.tags), run.config,
                   s.resume, s.loader_bound_share, threads.reason if device.type == "cpu" else "",
                   adapting=run.adapter is not None and run.adapter.active, url=run.url)
    record = {
        "name": run.name,
        "tags": dict(s.tags),
        "config": run.config,
        "device": str(device),
        "device_name": device_name(device),
        "versions": versions(),
        "model": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "amp": run.amp,
        "compile": s.compile,
        "channels_last": run.layout.record(),
        "sync_every": run.sync_every,
        "epochs": s.epochs,
        "world_size": ranks.world_size,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "adapt": run.adapter.record() if run.adapter is not None else {"enabled": False, "reason": "off (adapt=False, "
                 "--no-adapt): the loader's settings as given"},
    }
    _record_decode(record, s.train_loader)
    placement = getattr(s.train_loader, "placement", None)  # stoker.loading.reader_cpu: what its readers apply
    if placement is not None and hasattr(placement, "record"):
        record["reader_placement"] = placement.record()
    if ranks.main:
        write_run_json(run.run_dir, record, run.history)
    for logger in run.loggers:
        logger.start(info, run.history)
    return record


def _record_decode(record: dict[str, Any], loader: Any) -> None:
    """``run.json``'s ``"decode"``: where ``decoder="auto"`` chose to decode the train set, once it has chosen."""
    choice = getattr(getattr(loader, "dataset", None), "decode_choice", None)
    if isinstance(choice, dict):
        record["decode"] = dict(choice)


@contextlib.contextmanager
def _ending(run: Run, record: dict[str, Any]) -> Iterator[None]:
    """9. However the epochs end: say how in ``history.stopped``, close the loggers, update run.json, draw curves.png."""
    history = run.history
    try:
        yield
    except TrainingError as exc:
        history.stopped = exc.stopped
        raise
    except KeyboardInterrupt:
        history.stopped = "interrupted"
        raise
    except BaseException:
        history.stopped = "error"
        raise
    finally:
        for logger in run.loggers:
            logger.end(history)
        if run.adapter is not None:
            record["adapt"] = run.adapter.record()
        _record_decode(record, run.scenario.train_loader)
        if run.ranks.main:
            write_run_json(run.run_dir, record, history)
        if run.scenario.plot and history.epochs and run.ranks.main:
            plot_curves(history.rows(), run.run_dir / "curves.png", title=run.name)
        run.publish()


@contextlib.contextmanager
def _rank_loss(run: Run) -> Iterator[None]:
    """A rank lost mid-run (``kill -9``, out of memory, a machine gone) ends the others with one line, not a backend's traceback.

    Raises:
        TrainingError: which rank is gone (where this machine can tell), where the last point
            saved is and how to continue from it (``stopped`` is ``"lost rank"``).
    """
    try:
        yield
    except Exception as exc:
        lost = run.ranks.lost_rank(exc)
        if lost is None:
            raise
        epoch = len(run.history.epochs) + 1
        if run.saved:
            log_dir, name = run.url.rstrip("/").rsplit("/", 1) if run.url else (str(run.run_dir.parent), run.run_dir.name)
            todo = f"{run.last_named} holds the last point saved: continue with {resume_command(log_dir, name)}"
        else:
            todo = f"nothing was saved yet (no {run.last_path.name}): start the run again"
        raise TrainingError(f"rank {run.ranks.rank} stops in epoch {epoch}: {lost}. {todo}", stopped="lost rank") from None


def _step_scheduler(s: Scenario, stats: EpochStats) -> None:
    """The scheduler's step after an epoch (``ReduceLROnPlateau`` gets the validation loss, else the training loss)."""
    if s.scheduler is not None and s.scheduler_interval == "epoch":
        if isinstance(s.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            s.scheduler.step(stats.valid_loss if s.valid_loader is not None else stats.train_loss)
        else:
            s.scheduler.step()


def _batches(train: Any, valid: Any) -> int | None:
    n_train, n_valid = batch_count(train), (batch_count(valid) if valid is not None else 0)
    return None if n_train is None or n_valid is None else n_train + n_valid


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
