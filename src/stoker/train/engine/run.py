"""A run of :func:`~stoker.train.fit` in progress: what every step needs, set up once, and its checkpoints.

:func:`set_up` finds the ranks and the device, makes (or finds) the run folder and
puts the model on the device; :func:`resume` brings back everything ``last.pt`` holds;
:func:`wrap_model` then wraps the model for several ranks and ``torch.compile``. The
:class:`Run` they fill in is what the epoch's phases (:mod:`stoker.train.engine.epoch`) read,
and it writes ``last.pt`` and ``best.pt`` (rank 0 only, atomically).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stoker.errors import CheckpointError, ConfigError
from stoker.fs import local_path
from stoker.loading import resolve_device
from stoker.train.engine import staging
from stoker.train.engine.checkpoint import get_rng_state, load_checkpoint, save_checkpoint, save_checkpoint_bytes
from stoker.train.engine.distributed import Ranks, join_launch, unwrap
from stoker.train.engine.handover import find_holder
from stoker.train.engine.history import EpochStats, History
from stoker.train.engine.layout import Layout, choose_layout
from stoker.train.engine.record import BEST_FILE, LAST_FILE, prepare_run_dir, run_dir_of
from stoker.train.engine.resume import CHECKPOINT_FORMAT, check_last, restore_last
from stoker.train.engine.scenario import SYNC_EVERY_CUDA, Scenario
from stoker.train.loggers import Logger

if TYPE_CHECKING:
    from stoker.train.engine.adapt import Adapter

__all__ = ["Run", "resolve_amp", "resume", "set_up", "wrap_model"]

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_amp(amp: str, device: torch.device) -> str:
    """The precision a run takes: ``"auto"`` is bf16 on a CUDA device that supports it, else off; others as given.

    One rule for ``stoker train`` and ``stoker bench --mode train``'s step, so the bench times the step the run does.

    Example:
        >>> resolve_amp("auto", torch.device("cpu")), resolve_amp("fp16", torch.device("cpu"))
        ('off', 'fp16')
    """
    if amp != "auto":
        return amp
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "off"

Forward = Callable[[torch.Tensor], torch.Tensor]  # float [B, C, H, W] -> logits [B, classes]


@dataclass
class Run:
    """What the steps of one ``fit`` share.

    Attributes:
        scenario: what to train and how.
        ranks: this process's place among the ranks (alone: rank 0 of 1).
        device: where the model trains.
        name, run_dir: the run's name and folder.
        model: the model itself, on the device: what is saved (never a wrapper, so no ``module.`` prefix).
        preprocess: ``scenario.preprocess``, on the device.
        amp, amp_dtype: the precision in force (``"auto"`` resolved: :func:`resolve_amp`); its autocast dtype or None.
        layout: the memory format of the model and its input batches, and why (:mod:`stoker.train.engine.layout`).
        sync_every: batches between read-backs of the loss.
        scaler: the GradScaler (a plain step unless ``amp="fp16"``).
        config: ``scenario.config`` in plain types (checkpoints load with ``weights_only``).
        resumable: the train loader has ``state_dict``/``load_state_dict`` (mid-epoch ``last.pt``).
        history: the epochs so far (with the ones before a resume).
        partial: this rank's mid-epoch entry of ``last.pt``, or ``None``.
        forward, evaluate: what training calls (the model, in DDP and ``torch.compile`` as asked); validation (no DDP).
        no_sync: DDP's ``no_sync`` inside an accumulation window, or ``None``.
        loggers: the loggers and callbacks (rank 0 only; empty elsewhere).
        saved: a ``last.pt`` of this run exists (resumed from, or written since).
        holder: the rank whose folder holds the ``last.pt`` to resume from (:mod:`stoker.train.engine.handover`).
        url: the run folder's URL when ``log_dir`` is one (``run_dir``: the copy :meth:`publish` uploads).
        adapter: what reads the train loader while adapt tries settings (``None``: off).
    """

    scenario: Scenario
    ranks: Ranks
    device: torch.device
    name: str
    run_dir: Path
    model: nn.Module
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None
    amp: str
    amp_dtype: torch.dtype | None
    layout: Layout
    sync_every: int
    scaler: torch.amp.GradScaler
    config: dict[str, Any]
    resumable: bool
    history: History
    partial: dict[str, Any] | None = None
    forward: Forward | None = None
    evaluate: Forward | None = None
    no_sync: Callable[[], AbstractContextManager[Any]] | None = None
    loggers: list[Logger] = field(default_factory=list)
    saved: bool = False
    holder: int = 0
    url: str | None = None
    adapter: Adapter | None = None

    @property
    def last_path(self) -> Path:
        """``run_dir/last.pt``."""
        return self.run_dir / LAST_FILE

    @property
    def last_named(self) -> str:
        """``last.pt`` as messages name it: at the run folder's URL for a run at one, not this machine's copy."""
        return f"{self.url.rstrip('/')}/{LAST_FILE}" if self.url else str(self.last_path)

    def save_last(self, epoch_done: int, partial: dict[str, Any] | None, rng: dict[str, Any] | None = None) -> None:
        """Write ``last.pt`` (rank 0): everything a resume needs after ``epoch_done`` epochs and ``partial``."""
        s = self.scenario
        if self.ranks.main:
            save_checkpoint(
                {
                    "format": CHECKPOINT_FORMAT,
                    "model": self.model.state_dict(),
                    "optimizer": s.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
                    "epoch": epoch_done,
                    "best_acc": self.history.best_acc,
                    "best_epoch": self.history.best_epoch,
                    "history": self.history.state_dict(),
                    "rng": rng if rng is not None else get_rng_state(),
                    "partial": partial,
                    "name": self.name,
                    "tags": dict(s.tags),
                    "config": self.config,
                },
                self.last_path,
            )
            if partial is not None:  # a mid-epoch last.pt (every N steps, or a stop): the epoch's end publishes the others
                self.publish()
        self.saved = True  # on every rank: they all call this at the same points

    def publish(self) -> None:
        """Upload what changed in the run folder to its URL (rank 0, when ``log_dir`` is a URL; else nothing).

        Raises:
            NetworkError: an upload failed (the local copy keeps everything; the next publish retries).
        """
        if self.url is not None and self.ranks.main:
            staging.push(self.run_dir, self.url)

    def save_best(self, stats: EpochStats) -> None:
        """Write ``best.pt`` (rank 0): the model after the epoch of ``stats``."""
        if self.ranks.main:
            save_checkpoint(
                {"format": CHECKPOINT_FORMAT, "model": self.model.state_dict(), "epoch": stats.epoch,
                 "valid_acc": stats.valid_acc, "name": self.name, "tags": dict(self.scenario.tags), "config": self.config},
                self.run_dir / BEST_FILE,
            )


def set_up(s: Scenario) -> Run:
    """Ranks, device, run folder (rank 0 makes it and names it), the model on the device, AMP.

    Raises:
        ConfigError: ``checkpoint_every_steps`` without a resumable train loader; the run
            folder cannot be made, holds a run, or (to resume) holds no ``last.pt``.
    """
    ranks = join_launch(s.device) if torch.distributed.is_available() and torch.distributed.is_initialized() else Ranks()
    ranks.note_processes()  # a rank lost later is then named by the others
    device = ranks.device if ranks.active else resolve_device(s.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed image sizes: let cuDNN pick the fastest kernels
    resumable = hasattr(s.train_loader, "state_dict") and hasattr(s.train_loader, "load_state_dict")
    if s.checkpoint_every_steps is not None and not resumable:
        raise ConfigError(
            "Scenario.checkpoint_every_steps needs a train loader with state_dict/load_state_dict "
            f"(stoker's make_loader); got a {type(s.train_loader).__name__}"
        )
    name, run_dir, holder = _prepare_run_dir(ranks, s)
    amp = resolve_amp(s.amp, device)
    model = unwrap(s.model).to(device)
    layout = _layout(s, device, model)
    if layout.channels_last:
        model.to(memory_format=torch.channels_last)  # in place, before DDP builds its gradient buckets
    return Run(
        scenario=s,
        ranks=ranks,
        device=device,
        name=name,
        run_dir=run_dir,
        model=model,
        preprocess=s.preprocess.to(device) if isinstance(s.preprocess, nn.Module) else s.preprocess,
        amp=amp,
        amp_dtype=AMP_DTYPES[amp],
        layout=layout,
        sync_every=s.sync_every if s.sync_every is not None else (SYNC_EVERY_CUDA if device.type == "cuda" else 1),
        scaler=torch.amp.GradScaler(device.type, enabled=amp == "fp16"),
        config=json.loads(json.dumps(dict(s.config), default=str)),  # plain types, for weights_only checkpoints
        resumable=resumable,
        history=History(run_dir=run_dir),
        holder=holder,
        url=staging.run_url(s.log_dir, name),
    )


def _layout(s: Scenario, device: torch.device, model: nn.Module) -> Layout:
    """The run's memory format; never a change under a DDP wrapper the caller made (its buckets keep the old strides)."""
    layout = choose_layout(s.channels_last, device, resolve_amp(s.amp, device), model)
    if layout.channels_last and isinstance(s.model, nn.parallel.DistributedDataParallel):
        return Layout(False, "off: the model came wrapped in DistributedDataParallel, whose gradient buckets keep "
                             "the layout it was wrapped in; convert it to channels_last before wrapping it")
    return layout


def resume(run: Run) -> None:
    """Bring back from ``last.pt`` everything that shapes the next batch (every rank reads rank 0's file).

    Raises:
        CheckpointError: ``last.pt`` cannot be read, is not a stoker ``last.pt``, does not
            fit this run, or was saved mid-epoch on another number of ranks.
    """
    s = run.scenario
    state = _load_last(run.ranks, run.last_path, run.holder)
    run.partial = _my_partial(check_last(state, run.last_path), run.ranks, run.last_path)
    restore_last(state, run.last_path, model=run.model, optimizer=s.optimizer, scaler=run.scaler,
                 scheduler=s.scheduler, history=run.history)
    run.saved = True


def wrap_model(run: Run) -> None:
    """What training and validation call: DDP over several ranks (after the resume: it starts every
    rank from rank 0's weights), ``torch.compile`` when asked."""
    s, ranks, model = run.scenario, run.ranks, run.model
    net: nn.Module = model
    if ranks.active:
        net = s.model if isinstance(s.model, nn.parallel.DistributedDataParallel) else nn.parallel.DistributedDataParallel(
            model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    run.forward = torch.compile(net) if s.compile else net
    # Accumulating under DDP: the gradients are all-reduced once per optimizer step, not once per batch.
    # (Not with torch.compile, whose graph of the DDP module is not known to honour no_sync.)
    run.no_sync = getattr(net, "no_sync", None) if ranks.active and s.grad_accum > 1 and not s.compile else None
    run.evaluate = run.forward if not ranks.active else (torch.compile(model) if s.compile else model)  # no collectives


def _prepare_run_dir(ranks: Ranks, s: Scenario) -> tuple[str, Path, int]:
    """Rank 0 finds or makes the run folder and names it; every rank gets the name (or the same error).

    Resuming over several ranks with a local ``log_dir``, each machine's run folder is its
    own: the ranks agree which holds the newest ``last.pt`` (the third item, its rank) and
    rank 0 makes its folder to keep it in.
    """
    if not ranks.active:
        return (*prepare_run_dir(s.log_dir, s.name, s.resume), 0)
    handover = s.resume and local_path(s.log_dir) is not None  # a URL: rank 0 fetches it, the others need none
    answer: dict[str, str] = {}
    if ranks.main:
        try:
            answer["name"] = prepare_run_dir(s.log_dir, s.name, s.resume, elsewhere=handover)[0]
        except ConfigError as exc:
            answer["error"] = str(exc)
    answer = json.loads(ranks.broadcast_text(json.dumps(answer)) or "{}")
    if "error" in answer:
        raise ConfigError(answer["error"])
    name = answer["name"]
    run_dir = run_dir_of(s.log_dir, name)
    if not handover:
        return name, run_dir, 0
    holder = find_holder(ranks, run_dir)  # the same answer, or the same error, on every rank
    if ranks.main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{run_dir}: cannot create the run folder ({exc.strerror}); check log_dir") from None
    return name, run_dir, holder.rank


def _load_last(ranks: Ranks, path: Path, holder: int = 0) -> dict[str, Any]:
    """``last.pt`` as rank ``holder`` reads it, on every rank (the others need not see the run folder).

    When the holder is not rank 0 (the newest ``last.pt`` is on another machine than rank
    0's), rank 0 keeps it and the holder's ``best.pt`` in its own run folder: it writes there from now on.
    """
    if not ranks.active:
        return load_checkpoint(path, map_location="cpu")
    mine = ranks.rank == holder
    data = ranks.broadcast_bytes(path.read_bytes() if mine and path.is_file() else None, holder)
    if holder != 0:
        best_path = path.with_name(BEST_FILE)
        best = ranks.broadcast_bytes(best_path.read_bytes() if mine and best_path.is_file() else None, holder)
        if ranks.main and data is not None:
            save_checkpoint_bytes(data, path)
            if best is not None:
                save_checkpoint_bytes(best, best_path)
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
