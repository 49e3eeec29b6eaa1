"""``bench()``: every loading method x workers x backend on the same data, side by side.

The steps of :func:`run_bench`, in order:

1. open the data (any layout stoker reads) and settle the image size;
2. measure this machine's limits on it (decode, memory copy, storage read);
3. pack the shard variants once into a temporary folder (or reuse ``packed``), timing
   the packing as a one-off cost;
4. run each method for each setting: one epoch (or ``max_seconds`` of one), checked
   for correctness, timed, with memory and CPU of every process and, in train mode,
   the share of each step spent waiting for data;
5. return a :class:`~stoker.bench.results.BenchResult`; :mod:`stoker.bench.report` shows it.

What to run is a :class:`~stoker.bench.plan.BenchPlan`; :func:`bench` takes its fields
as keyword arguments.

Example:
    >>> from stoker.bench import bench, render_markdown
    >>> result = bench("data/digiface", methods=["files"], workers=[0], batch_size=8, max_seconds=2, progress=False)
    >>> print(render_markdown(result))
    **digiface** — 40 images, 4 classes, batch 8, mode load, at most 2 s per run
    ...
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from stoker.bench.advice import looks_gray
from stoker.bench.limits import Limits, evict_from_page_cache, measure_limits, measure_sequential_reads
from stoker.bench.methods import METHODS, PACK_SPLIT, BenchData, Method
from stoker.bench.plan import DEFAULT_WORKERS, TRAIN_OPTIMIZER, BenchPlan
from stoker.bench.results import BenchResult
from stoker.bench.runner import Expected, MethodResult, Step, run_method, split_batch
from stoker.bench.settings import LoaderSettings
from stoker.bench.shard_data import check_packed, fetch_all, measure_shard_limits, open_shard_set, shard_methods
from stoker.bench.shares import share_text
from stoker.bench.step import StepSetting, make_train_step, measure_ceiling
from stoker.decode.image import resize
from stoker.errors import ConfigError
from stoker.fs import where
from stoker.loading.backends import BACKENDS
from stoker.mixing import ShuffleQuality
from stoker.shards.read.dataset import ShardDataset
from stoker.sources.dataset import FileDataset
from stoker.terminal import bar_disable, bars_shown

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_WORKERS",
    "BenchPlan",
    "BenchResult",
    "bench",
    "open_data",
    "pack_for_bench",
    "quick_bench",
    "run_bench",
]

DEFAULT_METHODS: tuple[str, ...] = tuple(METHODS)  # the built-in methods (bench's default is every registered one)
_SIZE_PROBES = 16  # images decoded to check that all share one size

Echo = Callable[[str], None]


def open_data(data: str | os.PathLike[str] | FileDataset) -> tuple[FileDataset, str]:
    """The data set and a short name for it: a FileDataset as it is, or a path in any layout."""
    if isinstance(data, FileDataset):
        return data, ",".join(s.name for s in data.index.sources)
    from stoker.data import open_data as open_any  # the one way in

    path = where(data)  # a local path or a URL (never a folder named "s3:")
    opened = open_any(path)
    dataset = opened["train"]
    if opened.is_shards or not isinstance(dataset, FileDataset):
        raise ConfigError(
            f"{path}: is a shard set; benchmark the data it was packed from, and pass the shard sets "
            f"with --packed (packed=) to reuse them"
        )
    return dataset, path.resolve().name or str(path)


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


def pack_for_bench(
    dataset: FileDataset, store: str, out: Path, size: tuple[int, int] | None, seed: int, progress: bool = False
) -> float:
    """Pack ``dataset`` into ``out`` with ``store``, shuffled (a bar on stderr when ``progress``); return the seconds it took."""
    from stoker.packer import pack

    start = time.perf_counter()
    pack(dataset, out, store=store, size=size, seed=seed, progress=progress, overwrite=True)
    return time.perf_counter() - start


def _train_step(plan: BenchPlan, num_classes: int, device: torch.device) -> tuple[Step, StepSetting]:
    """A fresh model and the step ``stoker train`` would run on ``device`` (:mod:`stoker.bench.step`)."""
    return make_train_step(plan.model, num_classes, device, amp=plan.amp, channels_last=plan.channels_last,
                           optimizer=plan.optimizer)


def bench(
    data: str | os.PathLike[str] | FileDataset,
    methods: Sequence[str | Method] | None = None,
    workers: Sequence[int] = DEFAULT_WORKERS,
    backends: Sequence[str] = BACKENDS[:1],
    *,
    mode: str = "load",
    model: str = "resnet18",
    amp: str | None = None,
    channels_last: bool | None = None,
    optimizer: str = TRAIN_OPTIMIZER,
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

    This is ``run_bench(BenchPlan(data, ...), echo)``: every argument but ``echo`` is a field
    of :class:`~stoker.bench.plan.BenchPlan`, which describes each.

    Args:
        data: a folder in any layout stoker reads, or a stoker data set.
        methods: registered method names or :class:`~stoker.bench.methods.Method` objects (default: all).
        workers, backends: loader worker counts, and ``"process"`` and/or ``"thread"``, to try.
        echo: called with one line per finished run (default: nothing).

    Returns:
        A :class:`BenchResult`; show it with :func:`~stoker.bench.report.render_markdown`.

    Raises:
        ConfigError: a bad argument (unknown method, negative workers...).
        DataError: the data cannot be opened or decoded.

    Example:
        >>> result = bench("data/digiface", methods=["files"], workers=[0], batch_size=8, max_seconds=2, progress=False)
        >>> run = result.run("files", 0)
        >>> run.status, run.samples, run.img_per_s > 0
        ('ok', 40, True)
    """
    plan = BenchPlan(
        data, methods, workers, backends, mode=mode, model=model, amp=amp, channels_last=channels_last,
        optimizer=optimizer, batch_size=batch_size, epochs=epochs,
        max_seconds=max_seconds, size=size, packed=packed, prefetch_factor=prefetch_factor,
        shuffle_buffer=shuffle_buffer, device=device, cold=cold, limits_time_s=limits_time_s, seed=seed,
        progress=progress,
    )
    return run_bench(plan, echo)


def run_bench(plan: BenchPlan, echo: Echo | None = None) -> BenchResult:
    """Run ``plan``: open the data, measure the limits, pack, and time every run.

    Args:
        plan: what to run (already checked when it was made).
        echo: called with one line per step and per finished run (default: nothing).

    Raises:
        ConfigError: the data cannot be benchmarked as planned (sizes differ, no packed set...).
        DataError: the data cannot be opened or decoded.

    Example:
        >>> plan = BenchPlan("data/digiface", methods=("files",), workers=(0,), batch_size=8, max_seconds=2, progress=False)
        >>> run_bench(plan).run("files", 0).status
        'ok'
    """
    say = echo or (lambda line: None)
    shard_set = open_shard_set(plan.data) if not isinstance(plan.data, FileDataset) else None
    if shard_set is not None:
        shard_methods(plan.resolved_methods(), shard_set.store, shard_set.root)  # before a byte is downloaded
    packed = {store: check_packed(plan.packed, store) for store in _stores(plan)} if plan.packed is not None else None
    device = torch.device("cpu")
    if plan.mode == "train" or plan.device not in (None, "cpu"):
        from stoker.loading import resolve_device

        device = resolve_device(plan.device)

    dataset: FileDataset | None = None
    if shard_set is None:
        dataset, description = open_data(plan.data)
        size = _settle_size(dataset, plan.size)
        labels = np.asarray(dataset.labels)
        say(f"measuring the limits of this machine on {description} ({len(dataset)} images) ...")
        limits = measure_limits(dataset, size=size, time_s=plan.limits_time_s, seed=plan.seed)
    else:
        description = shard_set.root
        say(f"reading {description} ({len(shard_set)} images in {len(shard_set.shards.infos)} {shard_set.store} shards"
            + (f", {shard_set.shards.download_bytes() / 2**20:,.1f} MiB to download" if shard_set.shards.remote else "")
            + ") and measuring the limits of this machine on it ...")
        labels, download_rate = fetch_all(shard_set)
        size = plan.size if plan.size is not None else shard_set.image_size
        limits = measure_shard_limits(shard_set, size, plan.limits_time_s, download_rate, seed=plan.seed)
        packed = {shard_set.store: description}
    num_classes = dataset.num_classes if dataset is not None else shard_set.num_classes  # type: ignore[union-attr]
    expected = Expected.of(labels, num_classes)
    result = BenchResult(
        description=description,
        samples=len(labels),
        num_classes=num_classes,
        size=size,
        batch_size=plan.batch_size,
        mode=plan.mode,
        model=plan.model if plan.mode == "train" else None,
        epochs=plan.epochs,
        max_seconds=plan.max_seconds,
        limits=limits,
        expected_checksum=expected.checksum,
        shuffle_buffer=plan.shuffle_buffer,
        source_order_labels=labels,
        machine={
            "cpus": os.cpu_count(),
            "memory_bytes": _total_memory(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "device": str(device),
        },
        cold=plan.cold,
        gray=dataset is not None and looks_gray(dataset),  # the pack advice names --channels 1
    )

    stores = _stores(plan)
    workdir = Path(tempfile.mkdtemp(prefix="stoker-bench-")) if stores and packed is None else None
    try:
        kwargs = dict(batch_size=plan.batch_size, device=plan.device, seed=plan.seed, shuffle_buffer=plan.shuffle_buffer)
        if dataset is not None:
            data = BenchData.of(dataset, size, **kwargs)  # type: ignore[arg-type]
        else:
            data = BenchData(None, size, **kwargs)  # type: ignore[arg-type]
            if shard_set is not None and size is not None and size != shard_set.image_size:
                data.shard_transform = partial(resize, size=size)
        if packed is None and dataset is not None:
            for store in stores:
                say(f"packing {len(dataset)} images as {store} shards (a one-off cost) ...")
                target = Path(workdir or ".") / store
                result.pack_s[store] = pack_for_bench(dataset, store, target, size, plan.seed, plan.progress)
                data.packed[store] = target
        else:
            data.packed.update(packed or {})
        result.packed_reused = plan.packed is not None
        if data.packed and shard_set is None:  # first: a URL's download rate is measured as its shards come
            result.limits = _packed_reads(limits, list(data.packed.values()), plan.limits_time_s)
        result.stream_quality, result.stream_fixes = _stream_qualities(data, plan)
        batch_images, batch_labels = _warm_up(data)
        if plan.mode == "train":
            _measure_ceiling(result, plan, batch_images, batch_labels, expected, device, say)
        _run_all(result, data, plan, expected, device, say)
        if plan.mode == "train":  # again after the runs: the faster of the two is the step's own rate
            _measure_ceiling(result, plan, batch_images, batch_labels, expected, device, say)
            for run in result.runs:
                if "fraction_of_ceiling" in run.extra and result.ceiling is not None:
                    run.extra["fraction_of_ceiling"] = (run.img_per_s or 0.0) / result.ceiling.img_per_s
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _stores(plan: BenchPlan) -> list[str]:
    """The shard stores the plan's methods read."""
    return sorted({m.store for m in plan.resolved_methods() if m.store})


def _packed_reads(limits: Limits, roots: list[str | Path], time_s: float) -> Limits:
    """``limits`` with the rates of reading the packed shard sets front to back: from storage, and
    from the page cache. A set at a URL is fetched into the cache first (the runs read all of it),
    and its storage rate is the download rate."""
    paths: list[str] = []
    download_rates: list[float] = []
    for root in roots:
        shards = ShardDataset(root, PACK_SPLIT)
        rate = fetch_all(shards)[1]
        if rate is not None:
            download_rates.append(rate)
        paths += [str(shards.shards.local_path(s)) for s in range(len(shards.shards.infos))]
        shards.shards.close()
    disk, cached = measure_sequential_reads(paths, time_s, cold=not download_rates)
    return replace(limits, sequential_read_bytes_per_s=min(download_rates) if download_rates else disk,
                   cached_sequential_read_bytes_per_s=cached, shards_downloaded=bool(download_rates))


def _stream_qualities(data: BenchData, plan: BenchPlan) -> tuple[dict[str, dict[int, ShuffleQuality]], dict[str, str]]:
    """How well a ShardStream over each packed store is mixed, as each benchmarked worker count reads it,
    and for a store poorly mixed at some worker count, what fixes it (:meth:`MixingCheck.advice`)."""
    from stoker.bench.methods import PACK_SPLIT
    from stoker.shards.check.quality import check_pack

    out: dict[str, dict[int, ShuffleQuality]] = {}
    fixes: dict[str, str] = {}
    for store, root in data.packed.items():
        out[store] = {}
        for w in sorted(set(plan.workers)):
            check = check_pack(root, PACK_SPLIT, plan.batch_size, plan.shuffle_buffer, plan.seed, workers=w,
                               find_fix=store not in fixes)[1]
            out[store][w] = check.quality
            if not check.ok and store not in fixes:
                fixes[store] = f"with {w} workers, " + check.advice({"shuffle_buffer": "--shuffle-buffer"})
    return out, fixes


def _measure_ceiling(result: BenchResult, plan: BenchPlan, images: torch.Tensor, labels: torch.Tensor,
                     expected: Expected, device: torch.device, say: Echo) -> None:
    """The no-loading row: the step on one real batch already on the device, as many steps as an epoch has.

    Measured before the runs and after them; the faster measurement is kept (the ceiling is
    the most the step takes, and another program on the machine only slows a measurement).
    """
    step, result.step = _train_step(plan, expected.num_classes, device)
    steps = max(3, -(-expected.samples * plan.epochs // plan.batch_size))
    ceiling = measure_ceiling(step, images, labels, device, steps, plan.max_seconds)
    if result.ceiling is None or ceiling.step_s < result.ceiling.step_s:
        result.ceiling = ceiling
    say(f"no loading ({result.step.describe()}): {ceiling.step_s * 1e3:,.1f} ms per step of {len(labels)}, "
        f"{ceiling.img_per_s:,.0f} img/s" + (": the ceiling" if result.ceiling is ceiling else ""))


def _warm_up(data: BenchData) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one batch in this process before timing, so no run pays one-off start-up costs; return it.

    The first batch a process collates starts torch's thread pool and loads lazy
    modules; on a busy machine that took over a second, charged to whichever run came first.
    """
    from stoker.bench.methods import build_files, build_shards

    if data.dataset is not None:
        batches = iter(build_files(data, LoaderSettings(workers=0)))
    else:
        batches = iter(build_shards(next(iter(data.packed)), data, LoaderSettings(workers=0)))
    first = next(batches, None)
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    if first is None:
        raise ConfigError("the data gave no batch; check that it holds samples and that --batch-size is not above their number")
    return split_batch(first)


def _total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _unsupported(method: Method, backend: str, data: BenchData) -> str:
    """Why ``method`` cannot run on ``backend`` with ``data`` (empty when it can)."""
    if backend not in method.backends:
        return f"{method.name} runs on {', '.join(method.backends)} only"
    if data.dataset is None and method.store is None:
        return f"{method.name} reads files, and DATA is a shard set; bench the folder it was packed from to compare"
    if data.dataset is None and method.store not in data.packed:
        return f"DATA holds {', '.join(data.packed)} shards, not {method.store}"
    return ""


def _run_all(result: BenchResult, data: BenchData, plan: BenchPlan, expected: Expected, device: torch.device, say: Echo) -> None:
    """Time every run of ``plan`` on ``data``, adding each to ``result.runs``."""
    from tqdm import tqdm

    runs = plan.runs()
    for number, (method, backend, w) in enumerate(runs, start=1):
        label = f"[{number}/{len(runs)}] {method.name}, {w} workers, {backend}"
        reason = _unsupported(method, backend, data)
        if reason:
            result.runs.append(MethodResult(method.name, w, backend, status="unsupported", reason=reason))
            continue
        settings = LoaderSettings(
            workers=w,
            backend=backend,
            prefetch_factor=plan.prefetch_factor,
            method=method.name if method.name in METHODS else "files",
        )
        if plan.cold:
            if data.dataset is not None:
                evict_from_page_cache([str(p) for p in data.dataset.index.paths])
            for root in data.packed.values():
                local = where(root).local_path  # a URL's shards are in the cache: its files stay warm
                if local is not None:
                    evict_from_page_cache([str(p) for p in local.rglob("*") if p.is_file()])
        step = _train_step(plan, expected.num_classes, device)[0] if plan.mode == "train" else None
        total = expected.samples * plan.epochs
        with tqdm(total=total, desc=label, unit="img", leave=False, file=sys.stderr, disable=bar_disable(plan.progress), dynamic_ncols=True) as bar:
            run = run_method(
                partial(method.build, data, settings),
                expected,
                method=method.name,
                workers=w,
                backend=backend,
                epochs=plan.epochs,
                max_seconds=plan.max_seconds,
                step=step,
                batch_size=data.batch_size,
                seed=plan.seed,
                on_batch=bar.update,
            )
        # One yardstick for every row: the machine's limit with all its cores, not the cores this run used;
        # a run that reads through the page cache is held to the cache's read rate, a --cold one to the disk's.
        limit, limit_name = result.limits.machine_limit(method.work, sequential=method.store is not None, cached=not plan.cold)
        run.extra["limit_img_per_s"] = limit
        run.extra["limit_name"] = limit_name
        run.extra["fraction_of_limit"] = run.img_per_s / limit if run.timed and run.img_per_s else None
        if result.ceiling is not None and run.timed and run.img_per_s:
            run.extra["fraction_of_ceiling"] = run.img_per_s / result.ceiling.img_per_s
        result.runs.append(run)
        if run.timed:
            say(f"{label}: {run.status}, {run.epoch_s:,.1f} s, {run.img_per_s:,.0f} img/s ({share_text(run)})")
        else:
            say(f"{label}: {run.status.upper()}: {run.reason}")


def quick_bench(
    data: str | os.PathLike[str] | FileDataset,
    echo: Echo = print,
    workers: Sequence[int] = (0, 2),
    batch_size: int = 64,
    max_seconds: float = 10.0,
    size: tuple[int, int] | None = None,
    out: str | os.PathLike[str] | None = None,
) -> BenchResult:
    """A small benchmark for a small data set (``stoker demo``): every method, a few seconds each.

    Runs every registered method with ``workers`` on the process backend, each for at
    most ``max_seconds``, then echoes the table and the notes. While it runs it echoes
    each step (limits, packing, each finished run) and shows each run's bar on stderr,
    so the wait before the table is never silent. With ``out``, it writes ``bench.md``,
    ``bench.json`` and ``bench.png`` there, as ``stoker bench`` does
    (:func:`~stoker.bench.report.save_report`), and says where.

    Example:
        >>> result = quick_bench("data/digiface", echo=lambda line: None, workers=(0,), batch_size=8, max_seconds=1)
        >>> {run.status for run in result.runs} <= {"ok", "partial", "unsupported"}  # partial: cut at max_seconds
        True
    """
    from stoker.bench.report import recommendation, render_markdown, result_notes, save_report

    plan = BenchPlan(data, workers=workers, batch_size=batch_size, max_seconds=max_seconds, size=size,
                     limits_time_s=0.5, progress=bars_shown())
    result = run_bench(plan, echo=lambda line: echo(f"   {line}"))
    echo("")
    echo(render_markdown(result, details=False, recommend=False))  # the recommendation is the last line, once
    echo("")
    echo(f"Limits on this machine: {result.limits.summary()}.")
    for note in result_notes(result):
        echo(f"- {note}")
    echo("")
    echo(recommendation(result))
    if out is not None:
        paths = save_report(result, out)
        echo(f"\nwrote {paths['markdown']}, {paths['json']} and {paths['png']}")
    return result
