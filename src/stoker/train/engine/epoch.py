"""The phases of one epoch of :func:`~stoker.train.fit`: train, validate, and the epoch's figures over ranks.

Both phases run every batch through one :func:`forward_loss` (copy to the device,
preprocess, autocast, forward, loss, argmax hits); training adds backward and the
optimizer step. The batches' loss and hits stay on the device and are read back every
``sync_every`` batches (:class:`~stoker.train.engine.tally.PendingBatches`), and always before a
checkpoint, a stop and the end of a phase.

Every rank gets the same number of training batches from the loading layer's guarantee
(:class:`~stoker.loading.EqualSteps`: a stoker loader keeps its ranks in step itself,
any other loader is wrapped), which also counts what it trimmed; ``fit`` does not
re-implement it. Before every training step the ranks agree, in one small all-reduce,
whether a stop was asked for and whether a loss read back was not finite
(:func:`agree_on_step`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from stoker.errors import TrainingError
from stoker.loading.steps import EqualSteps, KeepsStepsEqual
from stoker.train.engine.checkpoint import get_rng_state
from stoker.train.engine.distributed import Ranks
from stoker.train.engine.history import EpochStats
from stoker.train.engine.interrupt import StopRequest
from stoker.train.engine.record import resume_command
from stoker.train.engine.resume import restore_loader, restore_tally
from stoker.train.engine.run import Forward, Run
from stoker.train.engine.scenario import Scenario
from stoker.train.engine.tally import PendingBatches, Tally, mid_epoch_entry, notify_batch_end
from stoker.train.engine.timing import PhaseTimer
from stoker.train.loggers import Logger

__all__ = ["Trained", "agree_on_step", "batch_count", "forward_batch", "forward_loss", "reduce_epoch", "train_epoch", "validate"]

log = logging.getLogger("stoker")


@dataclass
class Trained:
    """What the training phase of an epoch leaves for the rest of it.

    Attributes:
        tally, timer: the phase's running sums and seconds.
        lr: the learning rate the epoch trained with.
        trimmed: samples this rank had but did not train on, so that every rank ran the same steps.
        rng: every generator's state after training (a stop during validation resumes from here).
    """

    tally: Tally
    timer: PhaseTimer
    lr: float
    trimmed: int = 0
    rng: dict[str, Any] = field(default_factory=dict)


def forward_loss(run: Run, model: Forward, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One batch of this run through ``model`` (see :func:`forward_batch`)."""
    return forward_batch(model, images, labels, device=run.device, preprocess=run.preprocess, amp_dtype=run.amp_dtype,
                         loss_fn=run.scenario.loss_fn, memory_format=run.layout.memory_format)


def forward_batch(
    model: Forward,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    device: torch.device,
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None,
    amp_dtype: torch.dtype | None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    memory_format: torch.memory_format | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One batch through ``model``: the copy to the device, preprocess, forward and loss under autocast.

    The one batch body of training, validation and the test split (:mod:`stoker.train.engine.evaluate`).
    With a ``memory_format`` (``torch.channels_last``) the images are put in it on the device,
    after the copy (the bus carries them as the loader made them).

    Returns:
        The batch's mean loss and its argmax hits (0-d tensors, left on the device) and its size.
    """
    images = images.to(device, non_blocking=True)  # uint8 [B, C, H, W]; no-op if the loader moved it
    labels = labels.to(device, non_blocking=True)  # int64 [B]
    if memory_format is not None and images.dim() == 4:
        images = images.contiguous(memory_format=memory_format)  # on the device: uint8, a quarter of float's bytes
    x = preprocess(images) if preprocess is not None else images  # float [B, C, H, W], on the device
    if memory_format is not None and x.dim() == 4:
        x = x.contiguous(memory_format=memory_format)  # a no-op unless preprocess changed the layout
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        logits = model(x)  # [B, classes]
        loss = loss_fn(logits, labels)  # mean over the batch
    return loss, (logits.argmax(1) == labels).sum(), labels.shape[0]


def train_epoch(run: Run, epoch: int, here: dict[str, Any] | None, stop: StopRequest) -> Trained:
    """Train one epoch; a resumed one (``here``: its mid-epoch entry) starts from the saved tallies, seconds and position.

    Raises:
        TrainingError: a non-finite loss, or no rank had a batch.
        KeyboardInterrupt: a stop was asked for (after ``last.pt`` was saved at a step boundary).
    """
    s = run.scenario
    run.model.train()
    _set_epoch(s.train_loader, epoch - 1)  # the shuffle order is a function of the epoch
    trained = Trained(Tally("train", epoch, batch_count(s.train_loader)), PhaseTimer(run.device), s.optimizer.param_groups[0]["lr"])
    if here is not None:
        restore_tally(trained.tally, here["train"], run.last_path)
        trained.timer = PhaseTimer(run.device, **here["train_timer"])
        trained.lr = here["lr"]
        if here["phase"] == "train":
            restore_loader(s.train_loader, here["loader"], run.last_path, epoch)
    if here is None or here["phase"] == "train":
        _train_batches(run, trained, stop)
    elif isinstance(s.train_loader, KeepsStepsEqual):  # trained before the stop: what its split leaves out
        trained.trimmed = s.train_loader.trimmed
    samples, skipped = run.ranks.sum([trained.tally.samples, len(getattr(s.train_loader, "skipped", ()))])
    if samples == 0 and skipped > 0:
        raise TrainingError(
            f"epoch {epoch}: no readable batch: all {int(skipped)} sample(s) the train loader read were skipped as bad "
            "(on_error='skip'; the first is named above); run `stoker verify` on the data and fix what it names",
            stopped="no readable batch",
        )
    if samples == 0:
        raise TrainingError(f"epoch {epoch}: the train loader gave no batches; check the data and drop_last", stopped="no batches")
    trained.rng = get_rng_state()
    return trained


def _train_batches(run: Run, trained: Trained, stop: StopRequest) -> None:
    """The batches of a training phase, from where its tally stands, with the ranks in step."""
    s, ranks, tally, epoch = run.scenario, run.ranks, trained.tally, trained.tally.epoch
    # Every rank the same number of batches (stoker.loading.steps); adapt's settings change between batches only.
    steps = EqualSteps(run.adapter.batches() if run.adapter is not None else s.train_loader)
    stream, batch, first = trained.timer.iterate(steps), tally.batches, tally.batches
    pending = PendingBatches(tally, run.sync_every)  # losses and hits not yet read back from the device
    report = _reporter(run.loggers, tally, trained.timer, stop)
    bad: tuple[int, float] | None = None  # (batch, loss) of the first non-finite loss read back
    while True:
        # 4a. Fetch; read back a full window of losses (every rank at the same batches; the device finished
        #     them while the batch was on its way); agree with the other ranks.
        at_step = batch % s.grad_accum == 0  # only here can last.pt be written mid-epoch
        position = cast(Any, s.train_loader).state_dict() if run.resumable and at_step else None  # resumes here
        item = next(stream, None)
        if pending.full:
            bad = pending.flush(report)
        ended = item is None  # at the same step on every rank: the loading layer keeps the ranks in step
        stopping, non_finite = agree_on_step(ranks, stop, bad)
        # 4b. A checkpoint, a stop and the end of the epoch need exact figures: read back the rest first,
        #     so last.pt is never written after a bad loss.
        saving = batch > first and at_step and (stopping or _due(s, batch))
        if (saving or ended) and len(pending) and not non_finite:
            bad = pending.flush(report)
            non_finite = ranks.agree(bad is not None)[0]
        if non_finite:
            raise _non_finite(run, bad, epoch)
        # 4c. At a step boundary: a periodic checkpoint, or the stop that was asked for.
        if saving:
            _save_mid_epoch(run, trained, position, stopping, batch)
        if ended:
            break
        # 4d. One batch: forward, backward and, at the end of an accumulation window, the optimizer step.
        batch += 1
        pending.add(*_train_step(run, batch, *cast(Any, item)))
    trained.trimmed = steps.trimmed  # what this rank had past the shortest rank's share (and the split's tail)
    if tally.batches % s.grad_accum:  # the last, partial accumulation window
        if run.no_sync is not None:
            ranks.average_gradients(run.model)  # its backward passes all ran under no_sync
        _step(s, run.scaler)


def _train_step(run: Run, batch: int, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Zero (at a window's start), forward, backward (no all-reduce inside a window under DDP), step (at its end)."""
    s = run.scenario
    if (batch - 1) % s.grad_accum == 0:
        s.optimizer.zero_grad(set_to_none=True)
    local = run.no_sync() if run.no_sync is not None and batch % s.grad_accum else contextlib.nullcontext()
    with local:
        loss, hits, size = forward_loss(run, cast(Forward, run.forward), images, labels)
        run.scaler.scale(loss / s.grad_accum).backward()
    if batch % s.grad_accum == 0:
        _step(s, run.scaler)
    return loss, hits, size


def agree_on_step(ranks: Ranks, stop: StopRequest, bad: tuple[int, float] | None) -> tuple[bool, bool]:
    """The handshake before every training step, in one small all-reduce (local when alone).

    Every rank asks: was a stop asked for on some rank (``stopping``), was a loss read
    back not finite on some rank (``non_finite``)? Every rank calls it at the same step
    with the same flags in the same order, so the sequence of collectives is the same on
    all of them. (Whether each rank still has a batch is the loader's to agree on:
    :class:`~stoker.loading.EqualSteps`.)

    Returns:
        ``(stopping, non_finite)``, the same on every rank.
    """
    stopping, non_finite = ranks.agree(stop.requested, bad is not None)
    return stopping, non_finite


def validate(run: Run, trained: Trained, stop: StopRequest) -> tuple[Tally, PhaseTimer]:
    """Validate in eval mode without gradients, on the unwrapped model (no collectives under several ranks).

    Raises:
        KeyboardInterrupt: a stop was asked for (alone: after saving the epoch as trained; the
            resumed run redoes the validation. Several ranks: they agree at the next epoch's start).
    """
    s, epoch = run.scenario, trained.tally.epoch
    tally, timer = Tally("valid", epoch, batch_count(s.valid_loader)), PhaseTimer(run.device)
    if s.valid_loader is None:
        return tally, timer
    run.model.eval()
    run.ranks.broadcast_buffers(run.model)  # BatchNorm statistics: rank 0's, like the weights
    _set_epoch(s.valid_loader, epoch - 1)
    pending, report = PendingBatches(tally, run.sync_every), _reporter(run.loggers, tally, timer, stop)
    with torch.no_grad():
        for images, labels in timer.iterate(s.valid_loader):
            pending.add(*forward_loss(run, cast(Forward, run.evaluate), images, labels))
            if pending.full:
                pending.flush(report, check_finite=False)  # a bad loss shows in valid_loss
            if stop.requested and not run.ranks.active:
                run.save_last(epoch - 1, mid_epoch_entry(epoch, "valid", trained.tally, trained.timer, trained.lr, None),
                              trained.rng)
                _say_saved(run.last_path, epoch, "after training, during validation (it is redone)", run.url)
                raise KeyboardInterrupt
    pending.flush(report, check_finite=False)
    return tally, timer


def reduce_epoch(run: Run, trained: Trained, valid: Tally, valid_timer: PhaseTimer) -> EpochStats:
    """The epoch's figures over all ranks: sums of loss x n, hits and n; the slowest rank's time and data-wait share."""
    s, ranks, train, train_timer = run.scenario, run.ranks, trained.tally, trained.timer
    skipped = len(getattr(s.train_loader, "skipped", ())) + len(getattr(s.valid_loader, "skipped", ()))
    time_s = train_timer.wall_s + valid_timer.wall_s
    wait_s = train_timer.data_wait_s + valid_timer.data_wait_s
    (t_loss, t_hits, t_n, v_loss, v_hits, v_n, wait_sum, trimmed_all, skipped_all) = ranks.sum(
        [train.loss_sum, train.hits, train.samples, valid.loss_sum, valid.hits, valid.samples, wait_s,
         trained.trimmed, skipped])
    time_max, train_time_max, share_max = ranks.max([time_s, train_timer.wall_s, wait_s / time_s if time_s > 0 else 0.0])
    wait_mean = wait_sum / ranks.world_size
    if trimmed_all and ranks.main:
        log.info("epoch %d: %d training sample(s) trimmed so that all %d ranks ran the same number of steps",
                 train.epoch, int(trimmed_all), ranks.world_size)
    return EpochStats(
        epoch=train.epoch,
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
        lr=trained.lr,
        train_samples=int(t_n),
        valid_samples=int(v_n),
        skipped=int(skipped_all),
        trimmed=int(trimmed_all),
        slowest_data_wait_share=share_max,
    )


def _save_mid_epoch(run: Run, trained: Trained, position: Any, stopping: bool, batch: int) -> None:
    """A mid-epoch ``last.pt`` at a step boundary (with every rank's loader position); a stop ends the run there.

    Raises:
        KeyboardInterrupt: after saving, when a stop was asked for; at once when the loader
            has no position to save (``last.pt`` keeps the last epoch).
    """
    if not run.resumable:
        raise KeyboardInterrupt  # only a stop gets here (checkpoint_every_steps needs a resumable loader)
    epoch = trained.tally.epoch
    run.save_last(epoch - 1, _mid_epoch(run.ranks, epoch, "train", trained.tally, trained.timer, trained.lr, position))
    if stopping:
        if run.ranks.main:
            _say_saved(run.last_path, epoch, f"after batch {batch}", run.url)
        raise KeyboardInterrupt


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


def _non_finite(run: Run, bad: tuple[int, float] | None, epoch: int) -> TrainingError:
    """The error for a non-finite loss, naming its batch: the earliest any rank read back (all ranks say the same)."""
    ranks = run.ranks
    batch = bad[0] if bad is not None else math.inf
    if ranks.active:  # every rank gets here together (they agreed); one more small reduce, on the way out
        batch = -ranks.max([-batch])[0]
    value = f"{bad[1]}" if bad is not None and not ranks.active else "on at least one rank"
    if run.saved:
        where = f"the run stopped and {run.last_named} still holds the last good point"
    else:  # the same on every rank: they all save (or not) at the same points
        where = (f"the run stopped before its first checkpoint, so there is no {run.last_path.name} to resume from: "
                 "start the run again (under the same name) once the cause is fixed")
    return TrainingError(
        f"non-finite loss ({value}) at epoch {epoch}, batch {int(batch)}; {where}. Lower the learning "
        "rate, check the data for bad values, or use amp='bf16' instead of 'fp16'"
    )


def _reporter(loggers: Sequence[Logger], tally: Tally, timer: PhaseTimer, stop: StopRequest) -> Callable[[], None] | None:
    """What a read-back calls after each batch it counts: the loggers' ``batch_end`` (nothing without loggers)."""
    if not loggers:
        return None
    return lambda: notify_batch_end(loggers, tally.progress(timer), stop)


def _say_saved(path: Path, epoch: int, where: str, url: str | None = None) -> None:
    """Say where the point is saved: the run folder's URL for a run at one (``path`` is then its local copy)."""
    if url is not None:
        log_dir, name = url.rstrip("/").rsplit("/", 1)
        shown, command = f"{url}/{path.name}", resume_command(log_dir, name)
    else:
        shown, command = str(path), resume_command(path.parent.parent, path.parent.name)
    log.warning("interrupted in epoch %d %s: %s holds this point; continue with %s", epoch, where, shown, command)


def _due(s: Scenario, batch: int) -> bool:
    """Whether a periodic mid-epoch checkpoint is due after ``batch`` (at a step boundary)."""
    every = s.checkpoint_every_steps
    return every is not None and (batch // s.grad_accum) % every == 0


def _step(s: Scenario, scaler: torch.amp.GradScaler) -> None:
    """One optimizer step through the scaler (a plain step when fp16 is off)."""
    scaler.step(s.optimizer)
    scaler.update()
    if s.scheduler is not None and s.scheduler_interval == "step":
        s.scheduler.step()


def batch_count(loader: Any) -> int | None:
    """``len(loader)``, or ``None`` for a loader without a length."""
    try:
        return len(loader)
    except TypeError:
        return None


def _set_epoch(loader: Any, epoch: int) -> None:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
