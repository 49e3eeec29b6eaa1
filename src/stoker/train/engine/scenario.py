"""The :class:`Scenario`: everything one training run needs, in one dataclass."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from torch import nn

from stoker.errors import ConfigError
from stoker.train.runner.config import AMP_MODES, RunConfig

__all__ = [
    "AMP_MODES", "Amp", "IMAGENET_MEAN", "IMAGENET_STD", "Preprocess", "SCENARIO_KEYS", "SYNC_EVERY_CUDA", "Scenario",
    "check_scenario_values",
]

Amp = Literal["auto", "off", "bf16", "fp16"]  # AMP_MODES, the values of run.amp

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# Batches between read-backs of the loss on CUDA when Scenario.sync_every is not given: a
# wait for the device every 16 steps instead of every step; a window's figures are a few
# dozen bytes on the device.
SYNC_EVERY_CUDA = 16


# The [run] keys a Scenario takes under the same name: fit's Python callers pass them,
# and Scenario checks them with the checks of those very fields (check_scenario_values).
SCENARIO_KEYS: tuple[str, ...] = (
    "epochs", "device", "amp", "compile", "grad_accum", "log_dir", "name", "tags", "patience", "resume",
    "cpu_threads", "checkpoint_every_steps", "sync_every", "progress", "loader_bound_share", "adapt", "channels_last",
)


def check_scenario_values(values: Mapping[str, Any], where: str = "Scenario") -> dict[str, Any]:
    """Check Python values of :data:`SCENARIO_KEYS` with the checks of their ``[run]`` keys.

    ``device`` may be a ``torch.device`` and ``log_dir`` a path (checked as their text);
    the returned dict holds the clean values of the others (``tags`` as text to text).

    Raises:
        ConfigError: ``"{where}: {key} must be ..."``, the message the key gets in a
            config file, with the key's Python name.

    Example:
        >>> check_scenario_values({"grad_accum": True})
        Traceback (most recent call last):
        ...
        stoker.errors.ConfigError: Scenario: grad_accum must be a whole number >= 1, got True
    """
    known = {f.name: f for f in fields(RunConfig)}
    clean: dict[str, Any] = {}
    for name, value in values.items():
        if name not in SCENARIO_KEYS:
            raise ConfigError(f"{where}: {name} is not a run key; the keys are {', '.join(SCENARIO_KEYS)}")
        raw = os.fspath(value) if name == "log_dir" and isinstance(value, os.PathLike) else value
        if name == "device" and not isinstance(value, str):
            raw = str(value)  # a torch.device: checked by its name
        try:
            checked = known[name].metadata["check"](raw, name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        clean[name] = value if name in ("device", "log_dir") else checked
    return clean


class Preprocess(nn.Module):
    """uint8 images in [0, 255] to normalised float, on the device.

    This is the one place where pixels become floats. Loaders ship uint8 over the bus
    (a quarter of the bytes of float32) and :func:`~stoker.train.fit` applies this right
    after the non-blocking copy, so the conversion runs on the accelerator. Float input
    is taken to be in [0, 1] already and is only normalised.

    Args:
        mean: per-channel mean of [0, 1] pixels (default: ImageNet's).
        std: per-channel standard deviation (default: ImageNet's).

    Example:
        >>> Preprocess()(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)).dtype
        torch.float32
    """

    mean: torch.Tensor  # buffers, registered in __init__
    std: torch.Tensor

    def __init__(self, mean: Iterable[float] = IMAGENET_MEAN, std: Iterable[float] = IMAGENET_STD) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # [B, C, H, W] uint8 or float
        if images.dtype == torch.uint8:
            images = images.float().div_(255.0)
        return (images - self.mean.to(images.device)) / self.std.to(images.device)


@dataclass
class Scenario:
    """Everything one training run needs; pass it to :func:`~stoker.train.fit`.

    Args:
        model: the network; it receives the output of ``preprocess`` (float [B, C, H, W]).
        optimizer: an optimizer over ``model``'s parameters.
        loss_fn: ``loss_fn(logits, labels)`` returning the *mean* loss of the batch
            (``nn.CrossEntropyLoss()``); the epoch loss weights it by batch size.
        train_loader: yields ``(images, labels)`` batches; a stoker :class:`~stoker.Loader`
            (its shuffle order is fixed per epoch, which makes resume exact) or any iterable.
            Over a :class:`~stoker.shards.ShardStream`, how well its batches are mixed is
            measured here, before training, and a poor mix is logged with the setting
            that fixes it (:func:`stoker.shards.check.quality.warn_if_poorly_mixed`).
        valid_loader: the same for validation, or ``None`` to skip validation (then no
            ``best.pt`` and no patience).
        epochs: total number of epochs (a resumed run continues up to this number).
        device: ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda:1"``...
        amp: ``"off"``, ``"bf16"`` or ``"fp16"`` (fp16 uses a GradScaler); ``"auto"``: bf16 on a
            CUDA device that supports it, else off (``stoker train``'s default, and ``stoker bench``'s step).
        log_dir: the run folder is ``log_dir/name``.
        name: the run's name (default: the time it started, ``YYYYmmdd-HHMMSS``).
        tags: free labels kept in ``run.json`` to group runs later, e.g. ``{"category": "shards"}``.
        scheduler: an LR scheduler; stepped after every epoch (``scheduler_interval="epoch"``,
            ``ReduceLROnPlateau`` gets the validation loss) or after every optimizer step (``"step"``).
        scheduler_interval: ``"epoch"`` or ``"step"``.
        grad_accum: batches whose gradients add up before one optimizer step.
        compile: run the model through ``torch.compile``.
        channels_last: the model and every input batch in ``torch.channels_last`` memory
            format (``None``: on for a convolutional model on CUDA under AMP, else off;
            :mod:`stoker.train.engine.layout`). The choice and its reason are in ``run.json``.
        preprocess: applied to every image batch on the device before the model;
            default :class:`Preprocess` (uint8 -> float, ImageNet normalisation).
        patience: stop after this many epochs without a better validation accuracy (``None``: never).
        resume: continue from ``last.pt`` in the run folder: weights, optimizer, scaler,
            scheduler, epoch, RNG states, best so far, history; mid-epoch, from the
            very next batch.
        cpu_threads: torch's compute threads during a CPU run; default: the cores the
            loader workers leave (:mod:`stoker.train.engine.threads`).
        checkpoint_every_steps: also write ``last.pt`` every this many optimizer steps
            of an epoch, with the train loader's position (``None``: after every epoch
            only). Needs a loader with ``state_dict`` (stoker's ``make_loader``).
        sync_every: read the batches' loss and accuracy back from the device every this
            many batches (``None``: :data:`SYNC_EVERY_CUDA` on CUDA, 1 elsewhere). A
            read-back waits for the device to finish, so the host cannot queue the next
            step meanwhile; in between, the figures wait on the device. The results are
            the same, to the bit, for every value: a checkpoint, a stop and the end of
            a phase read back first, and a non-finite loss is named by its own batch (the
            run stops at the read-back that finds it, before any later checkpoint). What
            changes: loggers get their ``batch_end`` calls at read-backs, several at once
            (a progress bar moves in steps of ``sync_every``), and a stop asked for by a
            logger takes effect at the step boundary after that read-back. On CUDA the
            data-wait/compute split is measured with events and stays honest for any
            value; elsewhere it is by wall clock, honest on the CPU for any value and on
            other accelerators (MPS) with 1 only.
        adapt: in the first steps, try the train loader's workers, backend and prefetch
            depth on the real model and data, keep the fastest, and try again when the
            data-wait share rises; it changes no figure or weight (see
            :mod:`stoker.train.engine.adapt`, which also says what it leaves alone). ``False``:
            the loader's settings as given.
        loader_bound_share: an epoch that waits for data longer than this share of its
            time is reported as loader-bound.
        loggers: built-in loggers by name (``"console"``, ``"csv"``, ``"tensorboard"``)
            or Logger objects; ``fit``'s ``callbacks`` are added to these.
        progress: show the console's progress bar.
        config: the run's configuration, stored in ``run.json`` and checkpoints for the record.
        plot: write ``curves.png`` at the end of the run.

    The arguments that are also keys of a config's ``[run]`` table (``epochs``, ``amp``,
    ``grad_accum``, ``patience``, ``sync_every``... :data:`SCENARIO_KEYS`)
    are checked by that key's own check: a value a TOML file or a flag would be refused
    (``grad_accum=True``, ``epochs=0``) is refused here with the same message.

    Raises:
        ConfigError: a bad value, naming the argument and what it accepts.

    Example:
        >>> scenario = Scenario(model, torch.optim.AdamW(model.parameters()), nn.CrossEntropyLoss(),
        ...                     train_loader, valid_loader, epochs=5, tags={"category": "files"})  # doctest: +SKIP
        >>> history = fit(scenario)  # doctest: +SKIP
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    train_loader: Iterable[Any]
    valid_loader: Iterable[Any] | None
    epochs: int
    device: str | torch.device = "auto"
    amp: Amp = "off"
    log_dir: str | os.PathLike[str] = "runs"
    name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    scheduler: Any | None = None
    scheduler_interval: Literal["epoch", "step"] = "epoch"
    grad_accum: int = 1
    compile: bool = False
    channels_last: bool | None = None
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None = field(default_factory=Preprocess)
    patience: int | None = None
    resume: bool = False
    checkpoint_every_steps: int | None = None
    sync_every: int | None = None
    cpu_threads: int | None = None
    loader_bound_share: float = 0.3
    adapt: bool = True
    loggers: tuple[Any, ...] = ("console", "csv", "tensorboard")
    progress: bool = True
    config: Mapping[str, Any] = field(default_factory=dict)
    plot: bool = True

    def __post_init__(self) -> None:
        # The keys a config's [run] table has too are checked by that table's own checks
        # (stoker.train.runner.config): a value is refused here exactly when it is in a TOML file.
        for name, value in check_scenario_values({n: getattr(self, n) for n in SCENARIO_KEYS}).items():
            setattr(self, name, value)
        if self.scheduler_interval not in ("epoch", "step"):
            raise ConfigError(f"Scenario: scheduler_interval must be 'epoch' or 'step', got {self.scheduler_interval!r}")
        if self.patience is not None and self.valid_loader is None:
            raise ConfigError("Scenario: patience watches validation accuracy; give a valid_loader or drop patience")
        _check_stream_mixing(self.train_loader)


def _check_stream_mixing(loader: Iterable[Any]) -> None:
    """A train loader over a ShardStream: say before training when its batches are poorly mixed (once, rank 0)."""
    from torch.utils.data import DataLoader

    from stoker.loading import Loader
    from stoker.shards import ShardStream
    from stoker.shards.check.quality import warn_if_poorly_mixed

    if isinstance(loader, (Loader, DataLoader)) and isinstance(loader.dataset, ShardStream) and loader.batch_size:
        warn_if_poorly_mixed(loader.dataset, int(loader.batch_size), int(loader.num_workers))
