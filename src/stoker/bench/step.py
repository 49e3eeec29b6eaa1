"""The training step of ``bench --mode train``: the step ``stoker train`` runs, and its rate with no loading at all.

The step is built from the training engine's own parts: the model by name
(:func:`~stoker.train.runner.models.build_model`), the optimizer of ``[optim]``
(:func:`~stoker.train.runner.from_config.build_optimizer`, ``stoker train``'s default
unless told), the batch body of ``fit`` (:func:`~stoker.train.engine.epoch.forward_batch`:
copy, preprocess, autocast, loss), the memory format ``fit`` would choose
(:func:`~stoker.train.engine.layout.choose_layout`) and the GradScaler of fp16. Precision
follows the device unless told: bf16 autocast on CUDA, float32 elsewhere.

The ceiling (:func:`measure_ceiling`) is that step on one batch already on the device,
repeated: what the model consumes when loading costs nothing. Every loading method is
judged as a share of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from stoker.errors import ConfigError

__all__ = ["Ceiling", "StepSetting", "default_amp", "make_train_step", "measure_ceiling"]

Step = Callable[[torch.Tensor, torch.Tensor], None]

_WARM_UP_STEPS = 2  # cuDNN's kernel search and the first allocations are not the step's rate


def default_amp(device: torch.device) -> str:
    """The precision a bench step uses when none is given: ``stoker train``'s default (``amp = "auto"``: bf16 on a
    CUDA device that supports it, ``"off"`` elsewhere), so the bench times the step the run will do."""
    from stoker.train.engine.run import resolve_amp

    return resolve_amp("auto", device)


@dataclass(frozen=True)
class StepSetting:
    """How the benchmark's training step runs (what ``bench.json`` records under ``step``).

    Attributes:
        model: the model's name.
        device: where it trains.
        amp: ``"off"``, ``"bf16"`` or ``"fp16"``.
        channels_last: the model and batches in channels_last.
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
    """

    model: str
    device: str
    amp: str
    channels_last: bool
    optimizer: str

    def describe(self) -> str:
        """``"resnet18, bf16, channels_last, adamw, on cuda"``."""
        precision = "float32" if self.amp == "off" else self.amp
        layout = ", channels_last" if self.channels_last else ""
        return f"{self.model}, {precision}{layout}, {self.optimizer}, on {self.device}"

    def train_flags(self) -> str:
        """The ``stoker train`` flags of the same step: ``--model resnet18 --amp bf16 --optimizer adamw``."""
        return f"--model {self.model} --amp {self.amp} --optimizer {self.optimizer}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def make_train_step(model_name: str, num_classes: int, device: torch.device, *, amp: str | None = None,
                    channels_last: bool | None = None, optimizer: str = "adamw") -> tuple[Step, StepSetting]:
    """A fresh ``model_name`` and one training step of it per call, as ``stoker train`` runs it on ``device``.

    Args:
        model_name: ``small_cnn`` or a torchvision classifier.
        num_classes: outputs of the model (at least 2).
        device: where the step runs.
        amp: ``"off"``, ``"bf16"`` or ``"fp16"``; ``None``: :func:`default_amp`.
        channels_last: as :class:`~stoker.train.Scenario` takes it (``None``: fit's default).
        optimizer: the ``[optim]`` name, with that table's defaults for the rest.

    Returns:
        ``(step, setting)``; ``step(images, labels)`` waits for the device before it returns,
        so the time until the next batch arrives is real idle time.

    Raises:
        ConfigError: an unknown model, precision or optimizer.
    """
    from stoker.train.engine.epoch import forward_batch
    from stoker.train.engine.layout import choose_layout
    from stoker.train.engine.run import AMP_DTYPES
    from stoker.train.engine.scenario import Preprocess
    from stoker.train.runner.config import OptimConfig
    from stoker.train.runner.from_config import build_optimizer
    from stoker.train.runner.models import build_model

    amp = default_amp(device) if amp in (None, "auto") else amp
    if amp not in AMP_DTYPES:
        raise ConfigError(f"--amp must be one of {', '.join(AMP_DTYPES)}; got {amp!r}")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # as fit sets it: fixed image sizes, the fastest kernels
    model = build_model(model_name, max(num_classes, 2)).to(device)
    layout = choose_layout(channels_last, device, amp, model)
    if layout.channels_last:
        model.to(memory_format=torch.channels_last)
    preprocess = Preprocess().to(device)
    opt = build_optimizer(OptimConfig(name=optimizer), model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss, _, _ = forward_batch(model, images, labels, device=device, preprocess=preprocess, amp_dtype=AMP_DTYPES[amp],
                                   loss_fn=loss_fn, memory_format=layout.memory_format)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()  # wait for the device, so the next wait for data is real idle time

    return step, StepSetting(model_name, str(device), amp, layout.channels_last, optimizer)


@dataclass(frozen=True)
class Ceiling:
    """The step's own rate: one batch already on the device, stepped again and again (no loading).

    Attributes:
        step_s: seconds per step (the median of the timed steps).
        batch_size: samples per step.
        steps: steps timed (after the warm-up).
    """

    step_s: float
    batch_size: int
    steps: int

    @property
    def img_per_s(self) -> float:
        return self.batch_size / self.step_s if self.step_s > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"step_s": self.step_s, "batch_size": self.batch_size, "steps": self.steps, "img_per_s": self.img_per_s}


def measure_ceiling(step: Step, images: torch.Tensor, labels: torch.Tensor, device: torch.device, steps: int,
                    max_seconds: float | None = None) -> Ceiling:
    """Time ``step`` on one batch moved to ``device`` once: ``steps`` steps after a warm-up, fewer past ``max_seconds``.

    The median step is taken, so one step slowed by another program does not move it.
    """
    if steps < 1:
        raise ConfigError(f"the ceiling needs at least one step, got {steps}")
    images, labels = images.to(device), labels.to(device)
    for _ in range(_WARM_UP_STEPS):
        step(images, labels)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < steps:
        before = time.perf_counter()
        step(images, labels)
        times.append(time.perf_counter() - before)
        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
            break
    times.sort()
    return Ceiling(times[len(times) // 2], int(labels.shape[0]), len(times))
