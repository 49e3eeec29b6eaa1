"""``bench()``: every loading method x workers x backend on the same data, side by side.

The steps, in order:

1. open the data (any layout stoker reads) and settle the image size;
2. measure this machine's limits on it (decode, memory copy, storage read);
3. pack the shard variants once into a temporary folder (or reuse ``packed``), timing
   the packing as a one-off cost;
4. run each method for each setting: one epoch (or ``max_seconds`` of one), checked
   for correctness, timed, with memory and CPU of every process and, in train mode,
   the share of each step spent waiting for data;
5. return a :class:`BenchResult`; :mod:`stoker.bench.report` shows it.

Example:
    >>> from stoker.bench import bench, render_markdown
    >>> result = bench("digiface/", methods=["files", "shards-pixels"], workers=[0, 2])  # doctest: +SKIP
    >>> print(render_markdown(result))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stoker.bench.limits import Limits, evict_from_page_cache, measure_limits, measure_sequential_read
from stoker.bench.methods import BenchData, Method, resolve_methods
from stoker.bench.runner import Expected, RunResult, Step, run_method
from stoker.bench.settings import BACKENDS, METHODS, LoaderSettings
from stoker.errors import ConfigError
from stoker.fs import where
from stoker.mixing import suggest_buffer_size
from stoker.sources.dataset import FileDataset

__all__ = ["DEFAULT_METHODS", "DEFAULT_WORKERS", "BenchResult", "bench", "open_data", "pack_for_bench", "quick_bench"]

DEFAULT_METHODS: tuple[str, ...] = METHODS
DEFAULT_WORKERS: tuple[int, ...] = (0, 1, 2, 4)
_SIZE_PROBES = 16  # images decoded to check that all share one size

Echo = Callable[[str], None]


@dataclass
class BenchResult:
    """Everything one benchmark measured.

    Attributes:
        description: what was measured (the data's name).
        samples: samples per epoch.
        num_classes: classes of the data.
        size: ``(height, width)`` images were resized to, or ``None``.
        batch_size: samples per batch.
        mode: ``"load"`` (batches only) or ``"train"`` (a training step per batch).
        model: the model trained in train mode.
        epochs: epochs per run.
        max_seconds: the time limit of each run, if any.
        limits: the machine's measured limits.
        pack_s: seconds the packing of each shard store took (a one-off cost).
        packed_reused: the shards were packed before (``packed=``), so not timed.
        runs: one :class:`RunResult` per method x backend x workers.
        expected_checksum: the label checksum every correct whole epoch must show.
        source_order_labels: labels in the order the data lists them (the Pipe's input).
        machine: CPU count, memory, torch version, device.
        cold: the page cache was dropped before each run.
    """

    description: str
    samples: int
    num_classes: int
    size: tuple[int, int] | None
    batch_size: int
    mode: str
    model: str | None
    epochs: int
    max_seconds: float | None
    limits: Limits
    pack_s: dict[str, float] = field(default_factory=dict)
    packed_reused: bool = False
    runs: list[RunResult] = field(default_factory=list)
    expected_checksum: str = ""
    shuffle_buffer: int = 10_000
    source_order_labels: np.ndarray | None = field(default=None, repr=False)
    machine: dict[str, Any] = field(default_factory=dict)
    cold: bool = False
    _suggested_buffer: int | None = field(default=None, repr=False)

    def run(self, method: str, workers: int, backend: str = "process") -> RunResult:
        """The result of one method, workers and backend.

        Raises:
            ConfigError: no such run.
        """
        for r in self.runs:
            if (r.method, r.workers, r.backend) == (method, workers, backend):
                return r
        raise ConfigError(f"no run of {method} with {workers} workers on {backend}")

    @property
    def best(self) -> RunResult | None:
        """The fastest correct run (whole epochs preferred to partial ones)."""
        timed = [r for r in self.runs if r.timed and r.img_per_s]
        return max(timed, key=lambda r: (r.status == "ok", r.img_per_s or 0.0), default=None)

    def _enough_buffer(self) -> int:
        if self._suggested_buffer is None and self.source_order_labels is not None:
            self._suggested_buffer = suggest_buffer_size(self.source_order_labels, self.batch_size, self.num_classes)
        return self._suggested_buffer or 0

    def notes(self) -> list[str]:
        """Plain-language remarks: wrong methods, poor shuffling, partial runs, the cache."""
        notes: list[str] = []
        for r in self.runs:
            if r.status == "incorrect":
                notes.append(f"{r.method} ({r.workers} workers, {r.backend}) is INCORRECT: {r.reason}; its time is not a result.")
            elif r.status == "failed":
                notes.append(f"{r.method} ({r.workers} workers, {r.backend}) failed: {r.reason}.")
        flagged: set[str] = set()
        for r in self.runs:
            if r.shuffle is None or r.shuffle.ok or r.method in flagged or not r.timed:
                continue
            flagged.add(r.method)
            text = f"{r.method}: the label stream is {r.shuffle.verdict}ly mixed ({r.shuffle.summary()})"
            if r.method == "pipe":
                text += f"; the shuffle buffer of {self.shuffle_buffer} is too small for the order the files are listed in"
                if self.source_order_labels is not None:
                    text += f": a buffer of {self._enough_buffer()} or more mixes well (--shuffle-buffer)"
            elif r.method.startswith("shards"):
                text += "; these shards were not shuffled thoroughly before writing: repack them with shuffling"
            notes.append(text + ".")
        if any(r.status == "partial" for r in self.runs):
            notes.append(
                "partial: a run stopped at the time limit; it is checked for repeated samples only, "
                "not for missing ones, and its speed includes start-up over a shorter time."
            )
        correct = [r for r in self.runs if r.status == "ok"]
        if correct:
            notes.append(
                f"every whole epoch above saw each sample once (label checksum {self.expected_checksum}, "
                f"equal across {len(correct)} runs)."
            )
        over = [r for r in self.runs if (r.extra.get("fraction_of_limit") or 0.0) > 1.0]
        if any(r.extra.get("limit_name") == "storage read" for r in over):
            notes.append(
                "a share above 100% of the storage read limit means the data came from the page cache, "
                "not the disk (--cold drops it before each run)."
            )
        if any(r.extra.get("limit_name") == "decode" for r in over):
            notes.append(
                "a share above 100% of the decode limit means the single-core decode rate was measured "
                "low, most likely while other programs kept the cores busy; rerun on a quiet machine."
            )
        if not self.limits.read_cold:
            notes.append("storage read rate may be the page cache's: the OS did not drop the files first.")
        notes.append(
            "runs read through the page cache (cold=True / --cold drops it before each run)."
            if not self.cold
            else "the page cache was dropped before each run (--cold)."
        )
        return notes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole result."""
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
            "notes": self.notes(),
            "runs": [r.to_dict() for r in self.runs],
        }


def open_data(data: str | os.PathLike[str] | FileDataset) -> tuple[FileDataset, str]:
    """The data set and a short name for it: a FileDataset as it is, or a path in any layout."""
    if isinstance(data, FileDataset):
        return data, ",".join(s.name for s in data.index.sources)
    from stoker.data import open_data as open_any  # the one way in

    path = where(data)  # a local Path, or a Location for a URL (never a folder named "s3:")
    opened = open_any(path)
    dataset = opened["train"]
    if opened.is_shards or not isinstance(dataset, FileDataset):
        raise ConfigError(
            f"{path}: is a shard set; benchmark the data it was packed from, and pass the shard sets "
            f"with --packed (packed=) to reuse them"
        )
    return dataset, (path.resolve().name if isinstance(path, Path) else path.name) or str(path)


def _settle_size(dataset: FileDataset, size: tuple[int, int] | None) -> tuple[int, int] | None:
    """Check that images share one size when no ``size`` is given (batches need it)."""
    if size is not None:
        if len(size) != 2 or min(size) < 1:
            raise ConfigError(f"size must be (height, width) of positive integers, got {size!r}")
        return (int(size[0]), int(size[1]))
    rows = np.unique(np.linspace(0, len(dataset) - 1, min(_SIZE_PROBES, len(dataset))).astype(int))
    shapes = {tuple(dataset.load_image(int(i)).shape[-2:]) for i in rows}
    if len(shapes) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in sorted(shapes))
        raise ConfigError(
            f"images differ in size ({shown}); pass one size to resize to, e.g. --size 112x112 (size=(112, 112))"
        )
    return None


def pack_for_bench(dataset: FileDataset, store: str, out: Path, size: tuple[int, int] | None, seed: int) -> float:
    """Pack ``dataset`` into ``out`` with ``store``, shuffled; return the seconds it took."""
    from stoker.packer import pack

    start = time.perf_counter()
    pack(dataset, out, store=store, size=size, seed=seed, progress=False, overwrite=True)
    return time.perf_counter() - start


def _train_step(model_name: str, num_classes: int, device: torch.device) -> Step:
    """One SGD step of a fresh ``model_name`` on each batch, as ``stoker train`` would run it."""
    from stoker.train.models import build_model
    from stoker.train.scenario import Preprocess

    model = build_model(model_name, max(num_classes, 2)).to(device)
    preprocess = Preprocess().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(device, non_blocking=True)  # [B, 3, H, W] uint8
        labels = labels.to(device, non_blocking=True)
        loss = loss_fn(model(preprocess(images)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # wait for the device, so the next wait for data is real idle time

    return step


def _check_choices(methods: Sequence[Method], workers: Sequence[int], backends: Sequence[str], mode: str) -> None:
    if not workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in workers):
        raise ConfigError(f"workers must be whole numbers >= 0, got {list(workers)!r}")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ConfigError(f"backends must be among {', '.join(BACKENDS)}, got {list(backends)!r}")
    if mode not in ("load", "train"):
        raise ConfigError(f"mode must be 'load' or 'train', got {mode!r}")


def bench(
    data: str | os.PathLike[str] | FileDataset,
    methods: Sequence[str | Method] = DEFAULT_METHODS,
    workers: Sequence[int] = DEFAULT_WORKERS,
    backends: Sequence[str] = ("process",),
    *,
    mode: str = "load",
    model: str = "resnet18",
    batch_size: int = 256,
    epochs: int = 1,
    max_seconds: float | None = None,
    size: tuple[int, int] | None = None,
    packed: str | os.PathLike[str] | None = None,
    prefetch_factor: int = 2,
    shuffle_buffer: int = 10_000,
    device: str | None = "auto",
    cold: bool = False,
    limits_time_s: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    echo: Echo | None = None,
) -> BenchResult:
    """Time every method x workers x backend on the same data and check each epoch.

    Args:
        data: a folder in any layout stoker reads, or a stoker data set.
        methods: built-in method names (``files``, ``pipe``, ``shards-encoded``,
            ``shards-pixels``) or :class:`~stoker.bench.methods.Method` objects.
        workers: numbers of loader workers to try.
        backends: ``"process"`` and/or ``"thread"``.
        mode: ``"load"`` only loads batches; ``"train"`` also runs a training step of
            ``model`` on each, and reports the share of time spent waiting for data.
        model: the model of train mode (``small_cnn`` or a torchvision classifier).
        batch_size: samples per batch.
        epochs: epochs per run (each checked).
        max_seconds: stop each run after this long (the result is then ``partial``).
        size: ``(height, width)`` to resize every image to; needed when sizes differ.
        packed: a folder holding ``encoded/`` and/or ``pixels/`` shard sets of this data
            to reuse (packing is then not timed); by default they are packed into a
            temporary folder that is removed afterwards.
        prefetch_factor: batches each worker loads ahead.
        shuffle_buffer: the Pipe's shuffle buffer.
        device: where batches go (``"auto"``: CUDA when present).
        cold: drop the data's files from the page cache before each run.
        limits_time_s: seconds for each limit measurement.
        seed: seed of every shuffle and of the packing.
        progress: show a progress bar per run on stderr.
        echo: called with one line per finished run (default: nothing).

    Returns:
        A :class:`BenchResult`; show it with :func:`~stoker.bench.report.render_markdown`.

    Raises:
        ConfigError: a bad argument (unknown method, negative workers...).
        DataError: the data cannot be opened or decoded.

    Example:
        >>> result = bench("digiface/", methods=["files", "pipe"], workers=[0, 2], max_seconds=10)  # doctest: +SKIP
        >>> result.run("files", 2).img_per_s  # doctest: +SKIP
        1650.2
    """
    chosen = resolve_methods(methods)
    _check_choices(chosen, workers, backends, mode)
    if batch_size < 1 or epochs < 1:
        raise ConfigError(f"batch_size and epochs must be >= 1, got {batch_size} and {epochs}")
    if max_seconds is not None and max_seconds <= 0:
        raise ConfigError(f"max_seconds must be positive, got {max_seconds}")
    if prefetch_factor < 1 or shuffle_buffer < 1:
        raise ConfigError(f"prefetch_factor and shuffle_buffer must be >= 1, got {prefetch_factor} and {shuffle_buffer}")
    say = echo or (lambda line: None)
    dataset, description = open_data(data)
    size = _settle_size(dataset, size)
    expected = Expected.of(dataset.labels, dataset.num_classes)
    resolved_device = torch.device("cpu")
    if mode == "train" or device not in (None, "cpu"):
        from stoker.loading import resolve_device

        resolved_device = resolve_device(device)

    say(f"measuring the limits of this machine on {description} ({len(dataset)} images) ...")
    limits = measure_limits(dataset, size=size, time_s=limits_time_s, seed=seed)
    result = BenchResult(
        description=description,
        samples=len(dataset),
        num_classes=dataset.num_classes,
        size=size,
        batch_size=batch_size,
        mode=mode,
        model=model if mode == "train" else None,
        epochs=epochs,
        max_seconds=max_seconds,
        limits=limits,
        expected_checksum=expected.checksum,
        shuffle_buffer=shuffle_buffer,
        source_order_labels=np.asarray(dataset.labels),
        machine={
            "cpus": os.cpu_count(),
            "memory_bytes": _total_memory(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "device": str(resolved_device),
        },
        cold=cold,
    )

    stores = sorted({m.store for m in chosen if m.store})
    workdir = Path(tempfile.mkdtemp(prefix="stoker-bench-")) if stores and packed is None else None
    try:
        pack_root = Path(packed) if packed is not None else workdir
        data_ = BenchData.of(dataset, size, batch_size=batch_size, device=device, seed=seed, shuffle_buffer=shuffle_buffer)
        for store in stores:
            target = Path(pack_root or ".") / store
            if packed is None:
                say(f"packing {len(dataset)} images as {store} shards (a one-off cost) ...")
                result.pack_s[store] = pack_for_bench(dataset, store, target, size, seed)
            elif not target.is_dir():
                raise ConfigError(f"{packed}: no {store}/ shard set inside; pack one with `stoker pack DATA {target} --store {store}`")
            data_.packed[store] = target
        result.packed_reused = packed is not None
        if data_.packed:
            shard_files = sorted(str(p) for root in data_.packed.values() for p in root.glob("*.arrow"))
            result.limits = replace(limits, sequential_read_bytes_per_s=measure_sequential_read(shard_files, limits_time_s))
        _warm_up(data_)
        _run_all(result, data_, chosen, workers, backends, expected, resolved_device, model, mode,
                 prefetch_factor, epochs, max_seconds, cold, seed, progress, say)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _warm_up(data: BenchData) -> None:
    """Load one batch in this process before timing, so no run pays one-off start-up costs.

    The first batch a process collates starts torch's thread pool and loads lazy
    modules; on a busy machine that took over a second, charged to whichever run came first.
    """
    from stoker.bench.methods import build_files

    batches = iter(build_files(data, LoaderSettings(workers=0)))
    next(batches, None)
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _run_all(
    result: BenchResult,
    data: BenchData,
    methods: Sequence[Method],
    workers: Sequence[int],
    backends: Sequence[str],
    expected: Expected,
    device: torch.device,
    model: str,
    mode: str,
    prefetch_factor: int,
    epochs: int,
    max_seconds: float | None,
    cold: bool,
    seed: int,
    progress: bool,
    say: Echo,
) -> None:
    from tqdm import tqdm

    plan = [(m, b, w) for m in methods for b in backends for w in workers]
    for number, (method, backend, w) in enumerate(plan, start=1):
        label = f"[{number}/{len(plan)}] {method.name}, {w} workers, {backend}"
        if backend not in method.backends:
            result.runs.append(
                RunResult(method.name, w, backend, status="unsupported", reason=f"{method.name} runs on {', '.join(method.backends)} only")
            )
            continue
        settings = LoaderSettings(
            workers=w,
            backend=backend,
            prefetch_factor=prefetch_factor,
            method=method.name if method.name in METHODS else "files",
        )
        if cold:
            evict_from_page_cache([str(p) for p in data.dataset.index.paths])
            for root in data.packed.values():
                evict_from_page_cache([str(p) for p in root.rglob("*") if p.is_file()])
        step = _train_step(model, expected.num_classes, device) if mode == "train" else None
        total = expected.samples * epochs
        with tqdm(total=total, desc=label, unit="img", leave=False, file=sys.stderr, disable=not progress, dynamic_ncols=True) as bar:
            run = run_method(
                partial(method.build, data, settings),
                expected,
                method=method.name,
                workers=w,
                backend=backend,
                epochs=epochs,
                max_seconds=max_seconds,
                step=step,
                batch_size=data.batch_size,
                seed=seed,
                on_batch=bar.update,
            )
        limit, limit_name = result.limits.limit(method.work, w, sequential=method.store is not None)
        run.extra["limit_img_per_s"] = limit
        run.extra["limit_name"] = limit_name
        run.extra["fraction_of_limit"] = run.img_per_s / limit if run.timed and run.img_per_s else None
        result.runs.append(run)
        if run.timed:
            say(f"{label}: {run.status}, {run.epoch_s:,.1f} s, {run.img_per_s:,.0f} img/s ({run.extra['fraction_of_limit']:.0%} of the {limit_name} limit)")
        else:
            say(f"{label}: {run.status.upper()}: {run.reason}")


def quick_bench(
    data: str | os.PathLike[str] | FileDataset,
    echo: Echo = print,
    workers: Sequence[int] = (0, 2),
    batch_size: int = 64,
    max_seconds: float = 10.0,
    size: tuple[int, int] | None = None,
) -> BenchResult:
    """A small benchmark for a small data set (``stoker demo``): every method, a few seconds each.

    Runs the four built-in methods with ``workers`` on the process backend, each for at
    most ``max_seconds``, then echoes the table and the notes. Takes well under a minute
    for the demo's few hundred images on two cores.

    Example:
        >>> quick_bench("stoker-demo/data/digiface")  # doctest: +SKIP
    """
    from stoker.bench.report import render_markdown

    result = bench(
        data,
        workers=workers,
        batch_size=batch_size,
        max_seconds=max_seconds,
        size=size,
        limits_time_s=0.5,
        progress=False,
    )
    echo(render_markdown(result, details=False))
    echo("")
    echo(f"Limits on this machine: {result.limits.summary()}.")
    for note in result.notes():
        echo(f"- {note}")
    return result
