"""``fit``: the training loop, top to bottom.

One function, numbered steps; the set-up and the checkpoints are in
:mod:`stoker.train.engine.run`, the phases of an epoch in :mod:`stoker.train.engine.epoch`. What it
guarantees:

* the epoch loss is the sum of each batch's mean loss times its size, over the number
  of samples (exact when the last batch is short); accuracy is the share of argmax hits;
* the time of every epoch is split into waiting for data and computing (see
  :mod:`stoker.train.engine.timing`; on CUDA by events, honestly although the host runs ahead);
* the host waits for the device only every ``sync_every`` batches (16 on CUDA, 1
  elsewhere): the batches' loss and hits stay on the device and are read back in one
  copy (:class:`~stoker.train.engine.tally.PendingBatches`), always before a checkpoint, a stop
  and the end of a phase, so the figures and what is saved are the same, to the bit, for
  every ``sync_every``. Loggers hear of the batches at read-backs, several at once.
  Under ``amp="fp16"`` torch's ``GradScaler.step`` still reads its inf-gradient flag
  back at every optimizer step (not with a fused optimizer); a batch whose step it skips
  counts in the figures with its finite loss, as it always did;
* ``last.pt`` after every epoch (and every ``checkpoint_every_steps`` optimizer steps)
  and ``best.pt`` whenever validation accuracy improves, both written atomically;
  resuming from ``last.pt`` continues exactly (weights, optimizer, scaler, scheduler,
  epoch, RNG states, best so far, history, and mid-epoch the loader's position and the
  partial epoch's tallies and seconds);
* Ctrl-C or SIGTERM stops at the next optimizer-step boundary and saves ``last.pt``
  there (see :mod:`stoker.train.engine.interrupt`); during validation it saves the epoch as
  trained and the resumed run redoes the validation, which changes no weights;
* a non-finite loss stops the run at the read-back that finds it, naming the epoch and
  its own batch, and leaves the last good checkpoint as it was (a checkpoint due after
  it reads back first, and is not written); before the first checkpoint it says that
  there is nothing to resume.

Under ``torch.distributed`` (``torchrun``, or a group the caller initialised) ``fit`` is
one run spread over the ranks: the model is wrapped in ``DistributedDataParallel``;
before every step the ranks agree, in one small all-reduce, whether each still has a
batch, whether a stop was asked for and whether a loss read back was not finite (every
rank reads back at the same batches, and agrees once more after a read-back that a
checkpoint, a stop or the epoch's end called for), so every rank runs the same number of
steps and stops at the same step (a rank's batches past the
shortest rank's are trimmed and counted in ``EpochStats.trimmed``); the epoch figures
are sums over ranks; validation runs on the unwrapped model without collectives (so
unequal validation shares cannot hang); rank 0 alone writes the run folder and calls
the loggers; ``last.pt`` holds every rank's loader position mid-epoch.

Resume is bit-exact when the data order is a function of the epoch, as with stoker's
:class:`~stoker.Loader` (``fit`` calls ``loader.set_epoch``, and mid-epoch its
``state_dict``). Random augmentations in worker processes draw from per-worker
generators that a checkpoint does not hold: with them a resumed run is statistically,
not bitwise, the same.
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
from stoker.train.engine.record import device_name, versions, write_run_json
from stoker.train.engine.resume import CHECKPOINT_FORMAT
from stoker.train.engine.run import Run, resume, set_up, wrap_model
from stoker.train.engine.scenario import Scenario
from stoker.train.engine.threads import ComputeThreads
from stoker.train.loggers import ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger

__all__ = ["CHECKPOINT_FORMAT", "fit"]


def fit(scenario: Scenario, callbacks: Sequence[Logger] = ()) -> History:
    """Train ``scenario.model`` for ``scenario.epochs`` epochs, validating after each.

    The run folder ``log_dir/name`` receives ``metrics.csv``, ``run.json``, TensorBoard
    events, ``last.pt``, ``best.pt`` and, at the end, ``curves.png``.

    Args:
        scenario: what to train and how.
        callbacks: more loggers, called after the scenario's own (any object with the
            :class:`~stoker.train.loggers.Logger` methods). Under torch.distributed,
            loggers and callbacks run on rank 0 only.

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
    with _ending(run, record), StopRequest() as stop, threads:
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
                   adapting=run.adapter is not None and run.adapter.active)
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
