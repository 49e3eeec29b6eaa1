"""``BenchResult``: everything one benchmark measured, as data (:mod:`stoker.bench.report` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.bench.limits import Limits
from stoker.bench.runner import MethodResult
from stoker.bench.step import Ceiling, StepSetting
from stoker.errors import ConfigError
from stoker.loading.backends import BACKENDS
from stoker.mixing import ShuffleQuality, suggest_buffer_size

__all__ = ["BenchResult"]


@dataclass
class BenchResult:
    """Everything one benchmark measured; each field is described where it is declared."""

    description: str
    """What was measured (the data's name)."""
    samples: int
    """Samples per epoch."""
    num_classes: int
    """Classes of the data."""
    size: tuple[int, int] | None
    """``(height, width)`` images were resized to, or ``None``."""
    batch_size: int
    """Samples per batch."""
    mode: str
    """``"load"`` (batches only) or ``"train"`` (a training step per batch)."""
    model: str | None
    """The model trained in train mode."""
    epochs: int
    """Epochs per run."""
    max_seconds: float | None
    """The time limit of each run, if any."""
    limits: Limits
    """The machine's measured limits."""
    pack_s: dict[str, float] = field(default_factory=dict)
    """Seconds the packing of each shard store took (a one-off cost)."""
    packed_reused: bool = False
    """The shards were packed before (``packed=``), so not timed."""
    runs: list[MethodResult] = field(default_factory=list)
    """One :class:`MethodResult` per method x backend x workers."""
    expected_checksum: str = ""
    """The label checksum every correct whole epoch must show."""
    shuffle_buffer: int = 10_000
    source_order_labels: np.ndarray | None = field(default=None, repr=False)
    """Labels in the order the data lists them (the Pipe's input)."""
    machine: dict[str, Any] = field(default_factory=dict)
    """CPU count, memory, torch version, device."""
    cold: bool = False
    """The page cache was dropped before each run."""
    stream_quality: dict[str, dict[int, ShuffleQuality]] = field(default_factory=dict)
    """For each packed store, how well a :class:`~stoker.shards.ShardStream` over those shards is mixed as a
    DataLoader with each benchmarked number of workers delivers it (buffer ``shuffle_buffer``): ``{store:
    {workers: quality}}``."""
    stream_fixes: dict[str, str] = field(default_factory=dict)
    """For each store whose stream is not well mixed, the setting that fixes it, in words
    (:meth:`stoker.shards.check.quality.MixingCheck.advice`)."""
    step: StepSetting | None = None
    """Train mode: how the training step ran (model, device, precision, memory format, optimizer), else ``None``."""
    ceiling: Ceiling | None = None
    """Train mode: the step's rate with no loading (one batch already on the device), the yardstick of every run,
    else ``None``."""
    gray: bool = False
    """Every image looked at was gray (:func:`stoker.bench.advice.looks_gray`): the pack advice names ``--channels
    1``."""
    _suggested_buffer: int | None = field(default=None, repr=False)

    def run(self, method: str, workers: int, backend: str = BACKENDS[0]) -> MethodResult:
        """The result of one method, workers and backend.

        Raises:
            ConfigError: no such run.
        """
        for r in self.runs:
            if (r.method, r.workers, r.backend) == (method, workers, backend):
                return r
        raise ConfigError(f"no run of {method} with {workers} workers on {backend}")

    @property
    def best(self) -> MethodResult | None:
        """The fastest correct run (whole epochs preferred to partial ones)."""
        timed = [r for r in self.runs if r.timed and r.img_per_s]
        return max(timed, key=lambda r: (r.status == "ok", r.img_per_s or 0.0), default=None)

    def suggested_buffer(self) -> int:
        """The smallest shuffle buffer that mixes the data's listed order well (0 when unknown)."""
        if self._suggested_buffer is None and self.source_order_labels is not None:
            self._suggested_buffer = suggest_buffer_size(self.source_order_labels, self.batch_size, self.num_classes)
        return self._suggested_buffer or 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of what was measured (``bench.json`` adds the notes and the recommendation:
        :func:`~stoker.bench.report.report_dict`)."""
        return {
            "description": self.description,
            "samples": self.samples,
            "num_classes": self.num_classes,
            "size": list(self.size) if self.size else None,
            "batch_size": self.batch_size,
            "mode": self.mode,
            "model": self.model,
            "epochs": self.epochs,
            "max_seconds": self.max_seconds,
            "cold": self.cold,
            "limits": self.limits.to_dict(),
            "pack_s": self.pack_s,
            "packed_reused": self.packed_reused,
            "expected_checksum": self.expected_checksum,
            "shuffle_buffer": self.shuffle_buffer,
            "machine": self.machine,
            "stream_quality": {
                store: {str(w): q.to_dict() for w, q in by_workers.items()} for store, by_workers in self.stream_quality.items()
            },
            "stream_fixes": dict(self.stream_fixes),
            "step": self.step.to_dict() if self.step is not None else None,
            "ceiling": self.ceiling.to_dict() if self.ceiling is not None else None,
            "runs": [r.to_dict() for r in self.runs],
        }
