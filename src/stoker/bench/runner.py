"""Time one loading method for one setting, and check that its epoch was right.

:func:`run_method` iterates the batches a method makes, for a whole epoch or until a
time limit, while a :class:`~stoker.bench.monitor.ProcessMonitor` watches memory and CPU
of every process. It counts samples and labels as they come, so it can tell whether
every sample was seen exactly once (the label counts of each class equal the index's),
and it keeps the label stream to score how well the method shuffles.

A method that drops or repeats samples is marked ``"incorrect"`` and its time is not
reported: a fast wrong loader is not a result.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stoker.bench.monitor import ProcessMonitor
from stoker.errors import StokerError
from stoker.mixing import ShuffleQuality, shuffle_quality
from stoker.train.engine.timing import PhaseTimer

__all__ = ["STATUSES", "Expected", "MethodResult", "Step", "run_method", "split_batch"]

# ok: a whole epoch, correct. partial: stopped by the time limit; what was seen is
# consistent. incorrect: samples missing, repeated or malformed. failed: raised an error.
# unsupported: the method cannot run with this backend (for example a stream on threads).
STATUSES: tuple[str, ...] = ("ok", "partial", "incorrect", "failed", "unsupported")

Step = Callable[[torch.Tensor, torch.Tensor], None]  # one training step on a batch


def label_checksum(label_counts: np.ndarray) -> str:
    """A short hash of per-class label counts: equal for any order of the same samples."""
    return hashlib.sha256(np.ascontiguousarray(label_counts, dtype=np.int64).tobytes()).hexdigest()[:12]


@dataclass(frozen=True)
class Expected:
    """What one epoch must deliver: the sample count and the count of every label."""

    samples: int
    label_counts: np.ndarray

    @classmethod
    def of(cls, labels: np.ndarray, num_classes: int) -> Expected:
        """The expectation for a data set with these labels."""
        labels = np.asarray(labels, dtype=np.int64)
        return cls(len(labels), np.bincount(labels, minlength=num_classes))

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.label_counts)

    @property
    def checksum(self) -> str:
        """:func:`label_checksum` of the expected label counts."""
        return label_checksum(self.label_counts)


@dataclass
class MethodResult:
    """One method, one setting: how fast, how heavy, and whether it was right (each field described below)."""

    method: str
    """The method's name (``files``, ``pipe``, ``shards-encoded``, ...)."""
    workers: int
    """Loader workers (0: the main process loads)."""
    backend: str
    """``"process"`` or ``"thread"``."""
    status: str = "ok"
    """One of :data:`STATUSES`."""
    reason: str = ""
    """Why the status is not ``"ok"`` (empty when it is)."""
    samples: int = 0
    """Samples seen (over all epochs)."""
    batches: int = 0
    """Batches seen."""
    epochs: int = 0
    """Whole epochs run."""
    epoch_s: float | None = None
    """Seconds per epoch (mean), or of the part run when ``partial``; ``None`` when the result is not a valid timing."""
    img_per_s: float | None = None
    """Samples per second over the run; ``None`` when not valid."""
    first_batch_s: float | None = None
    """Seconds until the first batch arrived (worker start-up, first reads)."""
    steady_img_per_s: float | None = None
    """Samples per second after the first batch (start-up left out), what a loader with persistent workers keeps up;
    ``None`` when not valid."""
    peak_rss_bytes: int = 0
    """Peak of the summed RSS of this process and its workers."""
    peak_pss_bytes: int = 0
    """Peak of the summed PSS (shared pages counted once), where known."""
    cpu_cores_used: float = 0.0
    """Mean cores busy over the run, all processes together."""
    cpu_seconds: float = 0.0
    """User + system CPU seconds of the run, this process (every thread) and its worker processes together."""
    data_wait_share: float | None = None
    """In train mode, the share of step time spent waiting for data."""
    label_checksum: str = ""
    """Hash of the label counts seen (equal for every correct method)."""
    shuffle: ShuffleQuality | None = None
    """How well the label stream was mixed."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the caller adds (limits, fractions)."""

    @property
    def timed(self) -> bool:
        """True when the timing is a valid result (a correct whole or partial epoch)."""
        return self.status in ("ok", "partial")

    @property
    def cpu_s_per_1k_img(self) -> float | None:
        """CPU seconds (all processes) per 1,000 images delivered, or None when nothing was."""
        return 1000.0 * self.cpu_seconds / self.samples if self.samples else None

    @property
    def peak_memory_bytes(self) -> int:
        """Peak memory of all processes: PSS (shared pages counted once) where known, else RSS."""
        return self.peak_pss_bytes or self.peak_rss_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with ``cpu_s_per_1k_img`` and ``peak_memory_bytes``)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("shuffle", "extra")}
        out["cpu_s_per_1k_img"] = self.cpu_s_per_1k_img
        out["peak_memory_bytes"] = self.peak_memory_bytes
        out["shuffle"] = self.shuffle.to_dict() if self.shuffle is not None else None
        out.update(self.extra)
        return out


def split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of a batch, or a StokerError saying what the batch looked like."""
    if isinstance(batch, dict) and "image" in batch and "label" in batch:
        batch = (batch["image"], batch["label"])
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise StokerError(f"a batch must be (images, labels); got {type(batch).__name__}")
    images, labels = batch
    if not isinstance(labels, torch.Tensor) or labels.ndim != 1:
        raise StokerError(f"batch labels must be a 1-D tensor, got {type(labels).__name__}")
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) != len(labels):
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise StokerError(f"batch images must be a [B, C, H, W] tensor with B = {len(labels)} labels, got {shape}")
    return images, labels


def _check_epoch(seen: np.ndarray, expected: Expected, whole: bool) -> str:
    """Empty when the label counts ``seen`` fit ``expected``; else what is wrong."""
    if len(seen) > expected.num_classes:
        return f"saw label {len(seen) - 1}, but the data set has {expected.num_classes} classes"
    seen = np.pad(seen, (0, expected.num_classes - len(seen)))
    total, want = int(seen.sum()), expected.samples
    if whole:
        if total != want:
            what = "missing" if total < want else "extra"
            return f"saw {total} samples in an epoch of {want} ({abs(want - total)} {what})"
        wrong = np.flatnonzero(seen != expected.label_counts)
        if len(wrong):
            return f"label counts differ from the index for {len(wrong)} class(es) (first: class {int(wrong[0])})"
        return ""
    over = np.flatnonzero(seen > expected.label_counts)
    if total > want or len(over):
        return f"saw more samples of {len(over)} class(es) than the data set holds: repeated samples"
    return ""


def run_method(
    make_batches: Callable[[], Iterable[Any]],
    expected: Expected,
    *,
    method: str,
    workers: int,
    backend: str,
    epochs: int = 1,
    max_seconds: float | None = None,
    step: Step | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    on_batch: Callable[[int], Any] | None = None,
) -> MethodResult:
    """Run ``epochs`` epochs of a method and measure them.

    Args:
        make_batches: builds the method's iterable of ``(images, labels)`` batches (a
            loader); called once, and iterated once per epoch.
        expected: what a whole epoch must deliver.
        method, workers, backend: labels for the result.
        epochs: epochs to run.
        max_seconds: stop when the run has taken this long; the result is then
            ``"partial"`` and only checked for repeats.
        step: in train mode, one training step on each batch; its time counts as compute.
        batch_size: for the shuffle-quality histograms (default: the first batch's size).
        seed: seed of the shuffle-quality baseline.
        on_batch: called with the size of each batch (a progress bar's ``update``).

    Returns:
        A :class:`MethodResult`; errors of the method are caught and reported as ``"failed"``.
    """
    result = MethodResult(method, workers, backend)
    counts = np.zeros(expected.num_classes, dtype=np.int64)
    stream: list[np.ndarray] = []
    wait_s = compute_s = 0.0
    first_batch_samples = 0
    stopped_early = False
    loader: Iterable[Any] | None = None
    with ProcessMonitor() as monitor, warnings.catch_warnings():
        # More workers than cores is a setting the benchmark tries on purpose.
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        start = time.perf_counter()
        try:
            loader = make_batches()
            for _ in range(epochs):
                epoch_counts = np.zeros(expected.num_classes, dtype=np.int64)
                timer = PhaseTimer(torch.device("cpu"))  # the step, if any, syncs its own device
                batches = timer.iterate(loader)
                try:
                    for batch in batches:
                        images, labels = split_batch(batch)
                        if result.first_batch_s is None:
                            result.first_batch_s = time.perf_counter() - start
                            first_batch_samples = len(labels)
                            monitor.sample_now()  # the workers are up and loaded: measure what they share
                        label_array = labels.cpu().numpy().astype(np.int64, copy=False)
                        if label_array.size and (label_array.min() < 0 or label_array.max() >= expected.num_classes):
                            raise StokerError(f"label {int(label_array.max())} is outside 0..{expected.num_classes - 1}")
                        epoch_counts += np.bincount(label_array, minlength=expected.num_classes)
                        stream.append(label_array)
                        result.batches += 1
                        if on_batch is not None:
                            on_batch(len(label_array))
                        if step is not None:
                            before = time.perf_counter()
                            step(images, labels)
                            compute_s += time.perf_counter() - before
                        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
                            stopped_early = True
                            break
                finally:
                    batches.close()  # closes the loader's iterator too: its workers shut down now
                    wait_s += timer.data_wait_s
                counts += epoch_counts
                problem = _check_epoch(epoch_counts, expected, whole=not stopped_early)
                if problem:
                    result.status, result.reason = "incorrect", problem
                    break
                if stopped_early:
                    break
                result.epochs += 1
        except StokerError as exc:
            result.status, result.reason = "failed", str(exc).splitlines()[0]
        except Exception as exc:  # a benchmark reports a broken method and goes on to the next
            result.status, result.reason = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            del loader  # let persistent workers go before the monitor's last reading
        elapsed = time.perf_counter() - start

    result.samples = int(counts.sum())
    result.label_checksum = label_checksum(counts)
    result.peak_rss_bytes = monitor.peak_rss_bytes
    result.peak_pss_bytes = monitor.peak_pss_bytes
    result.cpu_cores_used = monitor.cpu_cores_used
    result.cpu_seconds = monitor.cpu_seconds
    if stream:
        labels_seen = np.concatenate(stream)
        result.shuffle = shuffle_quality(labels_seen, batch_size or len(stream[0]), expected.num_classes, seed)
    if result.status == "ok" and stopped_early:
        result.status = "partial"
        result.reason = f"stopped after {max_seconds:g} s ({result.samples} of {expected.samples * epochs} samples); checked for repeats only"
    if result.timed and result.samples:
        result.epoch_s = elapsed / max(result.epochs, 1) if not stopped_early else elapsed
        result.img_per_s = result.samples / elapsed
        steady_s = elapsed - (result.first_batch_s or 0.0)
        if result.samples > first_batch_samples and steady_s > 0:
            result.steady_img_per_s = (result.samples - first_batch_samples) / steady_s
        if step is not None and wait_s + compute_s > 0:
            result.data_wait_share = wait_s / (wait_s + compute_s)
    elif result.timed:
        result.status, result.reason = "incorrect", "the method yielded no samples"
    return result
