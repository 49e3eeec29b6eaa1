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

    Each field is described where it is declared. The fields that are also keys of a
    config's ``[run]`` table (:data:`SCENARIO_KEYS`: ``epochs``, ``amp``, ``grad_accum``...)
    are checked by that key's own check, with the same message a TOML file or flag gets.

    Raises:
        ConfigError: a bad value, naming the argument and what it accepts.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from stoker import ClassFolderDataset, make_loader
        >>> from stoker.train import fit
        >>> data = ClassFolderDataset("data/digiface", transform=lambda im: im[:, :16, :16])
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, data.num_classes))
        >>> scenario = Scenario(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
        ...                     make_loader(data, batch_size=8, num_workers=0), None, epochs=1, log_dir="runs",
        ...                     loggers=(), progress=False, plot=False, adapt=False)
        >>> len(fit(scenario))  # one epoch's figures
        1
    """

    model: nn.Module
    """The network; it receives the output of ``preprocess`` (float [B, C, H, W])."""
    optimizer: torch.optim.Optimizer
    """An optimizer over ``model``'s parameters."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """``loss_fn(logits, labels)``, the *mean* loss of the batch; the epoch loss weights it by batch size."""
    train_loader: Iterable[Any]
    """Yields ``(images, labels)``: a stoker :class:`~stoker.Loader` (a fixed order per epoch,
    so resume is exact) or any iterable. Over a ShardStream, a poor mix of its batches is
    measured and logged before training (:func:`stoker.shards.check.quality.warn_if_poorly_mixed`)."""
    valid_loader: Iterable[Any] | None
    """The same for validation, or ``None`` to skip it (then no ``best.pt`` and no patience)."""
    epochs: int
    """Total number of epochs (a resumed run continues up to this number)."""
    device: str | torch.device = "auto"
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda:1"``..."""
    amp: Amp = "off"
    """``"off"``, ``"bf16"``, ``"fp16"`` (with a GradScaler), or ``"auto"``: bf16 on a CUDA device that supports it."""
    log_dir: str | os.PathLike[str] = "runs"
    """The run folder is ``log_dir/name``."""
    name: str | None = None
    """The run's name (default: the time it started, ``YYYYmmdd-HHMMSS``)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Free labels kept in ``run.json`` to group runs later, e.g. ``{"category": "shards"}``."""
    scheduler: Any | None = None
    """An LR scheduler, stepped per ``scheduler_interval`` (``ReduceLROnPlateau`` gets the validation loss)."""
    scheduler_interval: Literal["epoch", "step"] = "epoch"
    """Step the scheduler after every epoch or after every optimizer step."""
    grad_accum: int = 1
    """Batches whose gradients add up before one optimizer step."""
    compile: bool = False
    """Run the model through ``torch.compile``."""
    channels_last: bool | None = None
    """The model and every batch in ``torch.channels_last`` format (``None``: on for a
    convolutional model on CUDA under AMP; :mod:`stoker.train.engine.layout`); the choice is in ``run.json``."""
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None = field(default_factory=Preprocess)
    """Applied to every image batch on the device before the model (default: uint8 -> float, ImageNet normalisation)."""
    patience: int | None = None
    """Stop after this many epochs without a better validation accuracy (``None``: never)."""
    resume: bool = False
    """Continue from ``last.pt`` in the run folder: weights, optimizer, scaler, scheduler,
    epoch, RNG states, best so far, history; mid-epoch, from the very next batch."""
    checkpoint_every_steps: int | None = None
    """Also write ``last.pt`` every this many optimizer steps, with the train loader's
    position (``None``: after every epoch only); needs a loader with ``state_dict``."""
    sync_every: int | None = None
    """Read the loss and accuracy back from the device every this many batches (``None``:
    :data:`SYNC_EVERY_CUDA` on CUDA, 1 elsewhere). Results are the same to the bit for every
    value; loggers get their batch calls at read-backs (``docs/design.md`` says what it costs)."""
    cpu_threads: int | None = None
    """Torch's compute threads during a CPU run (default: the cores the loader workers leave)."""
    loader_bound_share: float = 0.3
    """An epoch that waits for data longer than this share of its time is reported as loader-bound."""
    adapt: bool = True
    """In the first steps, try the train loader's workers, backend and prefetch on the real
    model and keep the fastest; changes no figure or weight (:mod:`stoker.train.engine.adapt`)."""
    loggers: tuple[Any, ...] = ("console", "csv", "tensorboard")
    """Built-in loggers by name, or Logger objects; ``fit``'s ``callbacks`` are added to these."""
    progress: bool = True
    """Show the console's progress bar."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's configuration, stored in ``run.json`` and checkpoints for the record."""
    plot: bool = True
    """Write ``curves.png`` at the end of the run."""

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
        _check_block_mixing(self.train_loader)


def _check_stream_mixing(loader: Iterable[Any]) -> None:
    """A train loader over a ShardStream: say before training when its batches are poorly mixed (once, rank 0)."""
    from torch.utils.data import DataLoader

    from stoker.loading import Loader
    from stoker.shards import ShardStream
    from stoker.shards.check.quality import warn_if_poorly_mixed

    if isinstance(loader, (Loader, DataLoader)) and isinstance(loader.dataset, ShardStream) and loader.batch_size:
        warn_if_poorly_mixed(loader.dataset, int(loader.batch_size), int(loader.num_workers))


def _check_block_mixing(loader: Iterable[Any]) -> None:
    """A train loader shuffling a shard set in blocks (larger than its cache): say how well mixed, before training (rank 0)."""
    from stoker.loading import Loader
    from stoker.loading.samplers import EpochSampler
    from stoker.shards import ShardDataset
    from stoker.shards.check.quality import warn_if_blocks_poorly_mixed

    if not isinstance(loader, Loader) or not isinstance(loader.dataset, ShardDataset):
        return
    sampler = loader._sampler
    if isinstance(sampler, EpochSampler) and sampler.blocks is not None and sampler.rank == 0:
        warn_if_blocks_poorly_mixed(loader.dataset, sampler.blocks, loader.batch_size, sampler.world_size, sampler.seed)
