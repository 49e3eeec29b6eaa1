"""``fit``: the training loop, top to bottom.

One function, numbered steps. What it guarantees:

* the epoch loss is the sum of each batch's mean loss times its size, over the number
  of samples (exact when the last batch is short); accuracy is the share of argmax hits;
* the time of every epoch is split into waiting for data and computing (see
  :mod:`stoker.train.timing`; on CUDA by events, honestly although the host runs ahead);
* the host waits for the device only every ``sync_every`` batches (16 on CUDA, 1
  elsewhere): the batches' loss and hits stay on the device and are read back in one
  copy (:class:`~stoker.train.tally.PendingBatches`), always before a checkpoint, a stop
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
  there (see :mod:`stoker.train.interrupt`); during validation it saves the epoch as
  trained and the resumed run redoes the validation, which changes no weights;
* a non-finite loss stops the run at the read-back that finds it, naming the epoch and
  its own batch, and leaves the last good checkpoint as it was (a checkpoint due after
  it reads back first, and is not written).

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
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from stoker.errors import CheckpointError, ConfigError, TrainingError
from stoker.loading import resolve_device
from stoker.train.checkpoint import get_rng_state, load_checkpoint, save_checkpoint
from stoker.train.distributed import Ranks, join_launch, unwrap
from stoker.train.history import EpochStats, History
from stoker.train.interrupt import StopRequest
from stoker.train.loggers import ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger
from stoker.train.plots import plot_curves
from stoker.train.record import BEST_FILE, LAST_FILE, device_name, prepare_run_dir, versions, write_run_json
from stoker.train.resume import CHECKPOINT_FORMAT, check_last, restore_last, restore_loader
from stoker.train.scenario import SYNC_EVERY_CUDA, Scenario
from stoker.train.tally import PendingBatches, Tally, mid_epoch_entry, notify_batch_end
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
    ranks = join_launch(s.device) if torch.distributed.is_available() and torch.distributed.is_initialized() else Ranks()
    device = ranks.device if ranks.active else resolve_device(s.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed image sizes: let cuDNN pick the fastest kernels
    resumable = hasattr(s.train_loader, "state_dict") and hasattr(s.train_loader, "load_state_dict")
    if s.checkpoint_every_steps is not None and not resumable:
        raise ConfigError(
            "Scenario.checkpoint_every_steps needs a train loader with state_dict/load_state_dict "
            f"(stoker's make_loader); got a {type(s.train_loader).__name__}"
        )
    name, run_dir = _prepare_run_dir(ranks, s)
    last_path = run_dir / LAST_FILE
    model = unwrap(s.model).to(device)  # state is saved from `model`, never a wrapper: no `module.` prefix
    preprocess = s.preprocess.to(device) if isinstance(s.preprocess, nn.Module) else s.preprocess
    amp_dtype = _AMP_DTYPES[s.amp]
    sync_every = s.sync_every if s.sync_every is not None else (SYNC_EVERY_CUDA if device.type == "cuda" else 1)
    scaler = torch.amp.GradScaler(device.type, enabled=s.amp == "fp16")
    config = json.loads(json.dumps(dict(s.config), default=str))  # plain types, for weights_only checkpoints

    # 2. Resume: everything that shapes the next batch comes back from last.pt.
    history = History(run_dir=run_dir)
    partial: dict[str, Any] | None = None  # the epoch last.pt was saved in the middle of
    if s.resume:
        state = _load_last(ranks, last_path)
        partial = _my_partial(check_last(state, last_path), ranks, last_path)
        restore_last(state, last_path, model=model, optimizer=s.optimizer, scaler=scaler, scheduler=s.scheduler,
                     history=history)
    start_epoch = len(history.epochs)
    net: nn.Module = model
    if ranks.active:  # after the resume: DDP starts every rank from rank 0's weights
        net = s.model if isinstance(s.model, nn.parallel.DistributedDataParallel) else nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    forward = torch.compile(net) if s.compile else net
    # Accumulating under DDP: the gradients are all-reduced once per optimizer step, not once per batch.
    # (Not with torch.compile, whose graph of the DDP module is not known to honour no_sync.)
    no_sync = getattr(net, "no_sync", None) if ranks.active and s.grad_accum > 1 and not s.compile else None
    evaluate = forward if not ranks.active else (torch.compile(model) if s.compile else model)  # no collectives

    # 3. Loggers and the run's record.
    loggers = _make_loggers(s.loggers, s.progress) + list(callbacks) if ranks.main else []
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
        "sync_every": sync_every,
        "epochs": s.epochs,
        "world_size": ranks.world_size,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    if ranks.main:
        write_run_json(run_dir, record, history)
    for logger in loggers:
        logger.start(info, history)

    def save_last(epoch_done: int, partial_state: dict[str, Any] | None, rng: dict[str, Any] | None = None) -> None:
        if not ranks.main:
            return
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
                if ranks.agree(stop.requested)[0]:  # asked between epochs: last.pt already holds the finished ones
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
                trimmed = 0  # samples this rank had but did not train on, so that every rank runs the same steps
                if here is None or here["phase"] == "train":
                    stream, batch, first = train_timer.iterate(s.train_loader), train.batches, train.batches
                    pending = PendingBatches(train, sync_every)  # losses and hits not yet read back from the device
                    report = _reporter(loggers, train, train_timer, stop)
                    bad: tuple[int, float] | None = None  # (batch, loss) of the first non-finite loss read back
                    while True:
                        # 4a. Fetch; read back a full window of losses (every rank at the same batches; the device
                        #     finished them while the batch was on its way); agree with the other ranks in one tiny
                        #     all-reduce (local when alone): does every rank have a batch, was a stop asked for,
                        #     was a loss read back not finite?
                        at_step = batch % s.grad_accum == 0  # only here can last.pt be written mid-epoch
                        position = cast(Any, s.train_loader).state_dict() if resumable and at_step else None  # resumes here
                        item = next(stream, None)
                        if pending.full:
                            bad = pending.flush(report)
                        ended, stopping, non_finite = ranks.agree(item is None, stop.requested, bad is not None)
                        # 4b. A checkpoint, a stop and the end of the epoch need exact figures: read back the rest
                        #     first, so last.pt is never written after a bad loss.
                        saving = batch > first and at_step and (stopping or _due(s, batch))
                        if (saving or ended) and len(pending) and not non_finite:
                            bad = pending.flush(report)
                            non_finite = ranks.agree(bad is not None)[0]
                        if non_finite:
                            raise _non_finite(ranks, bad, epoch, last_path)
                        # 4c. At a step boundary: a periodic checkpoint, or the stop that was asked for.
                        if saving:
                            if not resumable:
                                raise KeyboardInterrupt  # no loader position to save: last.pt keeps the last epoch
                            save_last(epoch - 1, _mid_epoch(ranks, epoch, "train", train, train_timer, lr, position))
                            if stopping:
                                if ranks.main:
                                    _say_saved(last_path, epoch, f"after batch {batch}")
                                raise KeyboardInterrupt
                        if ended:  # some rank is out of batches: all stop here; count what this one leaves
                            if item is not None:  # read the rest of this rank's share (a few batches at most) to count it
                                trimmed += _size(item) + sum(_size(rest) for rest in stream)
                            break
                        # 4d. Copy, zero, forward under autocast, loss, backward, step; the loss and hits stay
                        #     on the device until the next read-back.
                        images, labels = cast(Any, item)
                        batch += 1
                        images = images.to(device, non_blocking=True)  # uint8 [B, C, H, W]; no-op if the loader moved it
                        labels = labels.to(device, non_blocking=True)  # int64 [B]
                        if (batch - 1) % s.grad_accum == 0:
                            s.optimizer.zero_grad(set_to_none=True)
                        x = preprocess(images) if preprocess is not None else images  # float [B, C, H, W], on the device
                        local = no_sync() if no_sync is not None and batch % s.grad_accum else contextlib.nullcontext()
                        with local:  # no all-reduce inside an accumulation window under DDP
                            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                                logits = forward(x)  # [B, classes]
                                loss = s.loss_fn(logits, labels)  # mean over the batch
                            scaler.scale(loss / s.grad_accum).backward()
                        if batch % s.grad_accum == 0:
                            _step(s, scaler)
                        pending.add(loss, (logits.argmax(1) == labels).sum(), labels.shape[0])
                    if train.batches % s.grad_accum:  # the last, partial accumulation window
                        if no_sync is not None:
                            ranks.average_gradients(model)  # its backward passes all ran under no_sync
                        _step(s, scaler)
                if ranks.sum([train.samples])[0] == 0:
                    raise TrainingError(f"epoch {epoch}: the train loader gave no batches; check the data and drop_last")
                trained_rng = get_rng_state()  # validation draws nothing, but a stop during it resumes from here

                # 5. Validate in eval mode without gradients (a stop saves the epoch as trained).
                valid, valid_timer = Tally("valid", epoch, _len(s.valid_loader)), PhaseTimer(device)
                if s.valid_loader is not None:
                    model.eval()
                    ranks.broadcast_buffers(model)  # BatchNorm statistics: rank 0's, like the weights
                    _set_epoch(s.valid_loader, epoch - 1)
                    pending_valid, report_valid = PendingBatches(valid, sync_every), _reporter(loggers, valid, valid_timer, stop)
                    with torch.no_grad():
                        for images, labels in valid_timer.iterate(s.valid_loader):
                            images = images.to(device, non_blocking=True)
                            labels = labels.to(device, non_blocking=True)
                            x = preprocess(images) if preprocess is not None else images
                            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                                logits = evaluate(x)
                                loss = s.loss_fn(logits, labels)
                            pending_valid.add(loss, (logits.argmax(1) == labels).sum(), labels.shape[0])
                            if pending_valid.full:
                                pending_valid.flush(report_valid, check_finite=False)  # a bad loss shows in valid_loss
                            if stop.requested and not ranks.active:  # several ranks: agreed at the next epoch's start
                                save_last(epoch - 1, mid_epoch_entry(epoch, "valid", train, train_timer, lr, None), trained_rng)
                                _say_saved(last_path, epoch, "after training, during validation (it is redone)")
                                raise KeyboardInterrupt
                    pending_valid.flush(report_valid, check_finite=False)

                # 6. Epoch figures, over all ranks (sums of loss x n, hits and n; the slowest rank's
                #    time and data-wait share); the scheduler steps after them so `lr` is the one this epoch used.
                skipped = len(getattr(s.train_loader, "skipped", ())) + len(getattr(s.valid_loader, "skipped", ()))
                time_s = train_timer.wall_s + valid_timer.wall_s
                wait_s = train_timer.data_wait_s + valid_timer.data_wait_s
                (t_loss, t_hits, t_n, v_loss, v_hits, v_n, wait_sum, trimmed_all, skipped_all) = ranks.sum(
                    [train.loss_sum, train.hits, train.samples, valid.loss_sum, valid.hits, valid.samples, wait_s,
                     trimmed + getattr(s.train_loader, "split_trimmed", 0), skipped])
                time_max, train_time_max, share_max = ranks.max(
                    [time_s, train_timer.wall_s, wait_s / time_s if time_s > 0 else 0.0])
                wait_mean = wait_sum / ranks.world_size
                stats = EpochStats(
                    epoch=epoch,
                    train_loss=t_loss / t_n if t_n else math.nan,
                    train_acc=t_hits / t_n if t_n else math.nan,
                    valid_loss=v_loss / v_n if v_n else math.nan,
                    valid_acc=v_hits / v_n if v_n else math.nan,
                    time_s=time_max,
                    train_time_s=train_time_max,
                    data_wait_s=wait_mean,
                    compute_s=time_max - wait_mean,
                    img_per_s=t_n / train_time_max if train_time_max > 0 else 0.0,
                    data_wait_share=wait_mean / time_max if time_max > 0 else 0.0,
                    lr=lr,
                    train_samples=int(t_n),
                    valid_samples=int(v_n),
                    skipped=int(skipped_all),
                    trimmed=int(trimmed_all),
                    slowest_data_wait_share=share_max,
                )
                if trimmed_all and ranks.main:
                    log.info("epoch %d: %d training sample(s) trimmed so that all %d ranks ran the same number of steps",
                             epoch, int(trimmed_all), ranks.world_size)
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
                if improved and ranks.main:
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
        if ranks.main:
            write_run_json(run_dir, record, history)
        if s.plot and history.epochs and ranks.main:
            plot_curves(history.rows(), run_dir / "curves.png", title=name)
    return history


def _prepare_run_dir(ranks: Ranks, s: Scenario) -> tuple[str, Path]:
    """Rank 0 finds or makes the run folder and names it; every rank gets the name (or the same error)."""
    if not ranks.active:
        return prepare_run_dir(s.log_dir, s.name, s.resume)
    answer: dict[str, str] = {}
    if ranks.main:
        try:
            answer["name"] = prepare_run_dir(s.log_dir, s.name, s.resume)[0]
        except ConfigError as exc:
            answer["error"] = str(exc)
    answer = json.loads(ranks.broadcast_text(json.dumps(answer)) or "{}")
    if "error" in answer:
        raise ConfigError(answer["error"])
    return answer["name"], Path(s.log_dir) / answer["name"]


def _mid_epoch(ranks: Ranks, epoch: int, phase: str, train: Tally, timer: PhaseTimer, lr: float,
               loader: Any) -> dict[str, Any]:
    """The ``partial`` entry of a mid-epoch ``last.pt``; several ranks: every rank's position and tallies.

    Rank 0's own figures stay at the top level (as one process writes them); ``ranks``
    lists each rank's ``{"loader", "train", "train_timer"}``, gathered as JSON bytes.
    """
    entry = mid_epoch_entry(epoch, phase, train, timer, lr, loader)
    if not ranks.active:
        return entry
    mine = json.dumps({k: entry[k] for k in ("loader", "train", "train_timer")})
    entry["ranks"] = [json.loads(text) for text in ranks.gather_text(mine)]
    entry["world_size"] = ranks.world_size
    return entry


def _load_last(ranks: Ranks, path: Path) -> dict[str, Any]:
    """``last.pt`` as rank 0 reads it, on every rank (the others need not see the run folder)."""
    if not ranks.active:
        return load_checkpoint(path, map_location="cpu")
    data = ranks.broadcast_bytes(path.read_bytes() if ranks.main and path.is_file() else None)
    return load_checkpoint(path, map_location="cpu", data=data)


def _my_partial(partial: dict[str, Any] | None, ranks: Ranks, path: Path) -> dict[str, Any] | None:
    """This rank's view of a mid-epoch entry: its own loader position and tallies.

    Raises:
        CheckpointError: the entry was saved on another number of ranks (an epoch
            boundary resumes on any number; the middle of one only on the same).
    """
    if partial is None:
        return None
    saved = int(partial.get("world_size", 1))
    if saved != ranks.world_size:
        raise CheckpointError(
            f"{path}: it was saved in the middle of epoch {partial['epoch']} on {saved} rank(s), and each rank's "
            f"loader position is its own, so it resumes on {saved} rank(s) only, not {ranks.world_size}. Resume "
            f"with --nproc-per-node {saved} (or that many ranks in all), or from an epoch boundary"
        )
    if "ranks" not in partial:
        return partial
    return {**partial, **partial["ranks"][ranks.rank]}


def _reporter(loggers: Sequence[Logger], tally: Tally, timer: PhaseTimer, stop: StopRequest) -> Callable[[], None] | None:
    """What a read-back calls after each batch it counts: the loggers' ``batch_end`` (nothing without loggers)."""
    if not loggers:
        return None
    return lambda: notify_batch_end(loggers, tally.progress(timer), stop)


def _non_finite(ranks: Ranks, bad: tuple[int, float] | None, epoch: int, last_path: Path) -> TrainingError:
    """The error for a non-finite loss, naming its batch: the earliest any rank read back (all ranks say the same)."""
    batch = bad[0] if bad is not None else math.inf
    if ranks.active:  # every rank gets here together (they agreed); one more small reduce, on the way out
        batch = -ranks.max([-batch])[0]
    value = f"{bad[1]}" if bad is not None and not ranks.active else "on at least one rank"
    return TrainingError(
        f"non-finite loss ({value}) at epoch {epoch}, batch {int(batch)}; the run stopped and "
        f"{last_path} still holds the last good point. Lower the learning "
        "rate, check the data for bad values, or use amp='bf16' instead of 'fp16'"
    )


def _size(batch: Any) -> int:
    """Samples in an ``(images, labels)`` batch."""
    try:
        return len(batch[1])
    except (TypeError, IndexError):
        return 0


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
