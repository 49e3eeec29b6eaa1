"""``tune()``: measure, within a time budget, which loader settings are fastest here.

No number of workers is best everywhere: it depends on image size, preprocessing, the
disk and the cores. The tuner does not guess; it times short runs on a sample of the
data, one knob at a time (coordinate search), and keeps what was fastest:

1. **storage and workers**: for each storage (files, encoded shards, pixel shards),
   workers 0, 1, 2, 4, ... until one more doubling gains less than 5 %; on a CUDA
   device also encoded shards decoded on the GPU (``shards-encoded-gpu``: 1 and 2
   loader threads), whose win is recorded as ``decoder = "nvjpeg"`` (elsewhere it is
   skipped, and the result says why);
2. **backend**: threads instead of processes for the best so far;
3. **prefetch depth**: 1 and 4 batches per worker next to the default 2.

Each trial is checked like every benchmark run and measured after its first batch; a
setting within 3 % of the fastest that uses fewer workers wins (it leaves cores to the
training). Packing the sample counts against the budget. A shard set is tuned on its own
storage alone. The bench-and-tune guide (``docs/guides/bench-and-tune.md``, "How tune
searches") says more.

Example:
    >>> from stoker.bench import save_settings
    >>> settings = tune("data/digiface", budget_s=3, batch_size=8, max_workers=1)
    >>> save_settings(settings, "loader.toml")
    PosixPath('loader.toml')
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np

from stoker.bench.advice import looks_gray, pack_command
from stoker.bench.benchmark import _settle_size, open_data, pack_for_bench
from stoker.bench.limits import Limits, evict_from_page_cache, measure_limits, measure_sequential_reads
from stoker.bench.methods import METHODS, BenchData, cuda_available, method_names
from stoker.bench.runner import Expected, MethodResult, run_method
from stoker.bench.settings import LoaderSettings, describe_loader
from stoker.bench.shard_data import fetch_all, measure_shard_limits, open_shard_set
from stoker.bench.shares import share_phrase
from stoker.decode.image import resize
from stoker.errors import ConfigError
from stoker.sources.dataset import FileDataset

__all__ = ["DEFAULT_STORAGES", "Trial", "TuneResult", "search_settings", "tune"]

DEFAULT_STORAGES: tuple[str, ...] = method_names(tunable=True)  # the built-in ones: files and the shard stores
_MIN_GAIN = 0.05  # a doubling of workers must gain this much to try the next one
_NEAR_BEST = 0.03  # settings this close to the fastest count as equally fast
_MIN_TRIAL_S = 1.0
_MAX_TRIAL_S = 15.0
_PLANNED_TRIALS = 14  # about how many trials a full search runs; sets each trial's length
_EPOCHS_PER_TRIAL = 1000  # trials stop on time, long before this many passes over the sample
_GPU_DECODE_THREADS = (1, 2)  # loader threads a GPU decode is tried with (it decodes whole batches on the device)

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Trial:
    """One measured setting.

    Attributes:
        settings: what was tried.
        phase: the search step (``"storage and workers"``, ``"backend"``, ``"prefetch"``).
        img_per_s: steady images per second, or ``None`` when the run was not valid.
        status: the run's status (``ok``, ``partial``, ``incorrect``, ``failed``).
        reason: why it was not valid, if it was not.
        peak_memory_bytes: peak memory of all processes during the trial.
    """

    settings: LoaderSettings
    phase: str
    img_per_s: float | None
    status: str
    reason: str = ""
    peak_memory_bytes: int = 0

    @property
    def valid(self) -> bool:
        """True when the trial measured a rate."""
        return self.img_per_s is not None

    def describe(self) -> str:
        """One line: the setting and what it measured."""
        s = self.settings
        what = f"{s.method}, {describe_loader(s.workers, s.backend, s.prefetch_factor)}"
        if self.img_per_s is None:
            return f"{what}: {self.status}: {self.reason}"
        return f"{what}: {self.img_per_s:,.0f} img/s, {self.peak_memory_bytes / 1e9:.2f} GB"


@dataclass
class TuneResult:
    """What the search tried and what it chose.

    Attributes:
        settings: the chosen settings (``img_per_s`` holds their measured rate).
        trials: every trial, in order.
        reason: why these settings were chosen, in a sentence.
        skipped: what the search left out and why (budget, packing time).
        limits: the machine's limits measured first.
        sample_size: samples the trials ran on.
        elapsed_s: how long the search took.
    """

    settings: LoaderSettings
    trials: list[Trial]
    reason: str
    skipped: list[str] = field(default_factory=list)
    limits: Limits | None = None
    sample_size: int = 0
    elapsed_s: float = 0.0

    def report(self) -> str:
        """The trials, the skipped parts and the choice, as printable lines."""
        lines = [f"tried {len(self.trials)} settings on {self.sample_size} samples in {self.elapsed_s:.0f} s:"]
        for trial in self.trials:
            lines.append(f"  [{trial.phase}] {trial.describe()}")
        lines += [f"  skipped: {text}" for text in self.skipped]
        lines.append(f"chose: {self.reason}")
        return "\n".join(lines)


class _Search:
    """The state of one search: the sample, the clock, the packed shards and the trials."""

    def __init__(self, data: BenchData, expected: Expected, budget_s: float, trial_s: float, cold: list[str] | None,
                 echo: Echo) -> None:
        self.data = data
        self.expected = expected
        self.deadline = time.perf_counter() + budget_s
        self.trial_s = trial_s
        self.cold = cold
        self.echo = echo
        self.trials: list[Trial] = []
        self.skipped: list[str] = []

    @property
    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def measure(self, settings: LoaderSettings, phase: str) -> Trial | None:
        """Run one trial, or return None (and note it) when the budget is spent."""
        for done in self.trials:
            if done.settings == settings and done.settings.method == settings.method:
                return done
        if self.left_s < 1.25 * self.trial_s:  # a trial overruns its time by its start-up and shut-down
            self.skipped.append(f"{phase}: {settings.method}, "
                                f"{describe_loader(settings.workers, settings.backend, settings.prefetch_factor)} "
                                "(the budget was spent)")
            return None
        method = METHODS[settings.method]
        if self.cold is not None:  # the files the trials read, dropped from the page cache
            evict_from_page_cache(self.cold)
        run: MethodResult = run_method(
            lambda: method.build(self.data, settings),
            self.expected,
            method=settings.method,
            workers=settings.workers or 0,  # a trial's settings always name their workers
            backend=settings.backend,
            epochs=_EPOCHS_PER_TRIAL,
            max_seconds=self.trial_s,
            batch_size=self.data.batch_size,
            seed=self.data.seed,
        )
        rate = (run.steady_img_per_s or run.img_per_s) if run.timed else None
        trial = Trial(settings, phase, rate, run.status, run.reason, run.peak_pss_bytes or run.peak_rss_bytes)
        self.trials.append(trial)
        self.echo(f"  [{phase}] {trial.describe()}")
        return trial

    def best(self) -> Trial | None:
        valid = [t for t in self.trials if t.valid]
        if not valid:
            return None
        top = max(t.img_per_s or 0.0 for t in valid)
        near = [t for t in valid if (t.img_per_s or 0.0) >= top * (1 - _NEAR_BEST)]
        return min(near, key=lambda t: (t.settings.workers, -(t.img_per_s or 0.0)))


def _worker_candidates(cores: int, max_workers: int | None) -> list[int]:
    top = max_workers if max_workers is not None else min(2 * cores, 16)
    out, w = [0], 1
    while w <= top:
        out.append(w)
        w *= 2
    return out


def _with_gpu_storages(storages: Sequence[str], asked: Sequence[str], device: str | None) -> tuple[list[str], list[str]]:
    """``storages`` with the GPU methods of their shard stores added where this machine runs them (all of them when
    ``asked`` is the default list; those named in it otherwise), and the lines saying which were skipped and why."""
    out, skipped = [s for s in storages if not METHODS[s].needs_cuda], []
    default = tuple(asked) == DEFAULT_STORAGES
    stores = {METHODS[s].store for s in out if METHODS[s].store is not None}
    for name in method_names(tunable=True, cuda=True):
        method = METHODS[name]
        if not method.needs_cuda or not (name in asked or (default and method.store in stores)):
            continue
        on_cuda = device in (None, "auto") or str(device).startswith("cuda")
        if on_cuda and cuda_available():
            out.append(name)
        else:
            why = "torch sees no CUDA device here" if on_cuda else f"batches go to {device}, not a CUDA device"
            skipped.append(f"{name}: decodes on the GPU, and {why}")
    return out, skipped


def _shard_storages(store: str, storages: Sequence[str], root: str) -> list[str]:
    """The storage a shard set of ``store`` is tuned on: its own (the default storages), or a ConfigError."""
    own = next(name for name in method_names(tunable=True) if METHODS[name].store == store)
    if tuple(storages) == DEFAULT_STORAGES or any(METHODS[s].store == store for s in storages):
        return [own]  # and its GPU decode where asked and CUDA runs it (_with_gpu_storages)
    raise ConfigError(
        f"{root}: is a shard set of {store} shards, so only {own} can be tuned on it (asked: {', '.join(storages)}); "
        f"pass --storages {own}, or tune the folder it was packed from to compare every storage"
    )


def _sample(dataset: FileDataset, sample_size: int, seed: int) -> FileDataset:
    if sample_size >= len(dataset):
        return dataset
    rows = np.sort(np.random.default_rng(seed).choice(len(dataset), sample_size, replace=False))
    return dataset.subset(rows)


def _tuned_on(data: str | os.PathLike[str] | FileDataset) -> dict[str, str]:
    """``data`` and ``layout`` of :class:`LoaderSettings` for what was tuned (nothing for a data set object)."""
    if isinstance(data, FileDataset):
        roots = list(dict.fromkeys(str(s.root) for s in data.index.sources))
        return {"data": str(Path(roots[0]).resolve())} if len(roots) == 1 else {}
    from stoker.data import detect_layout
    from stoker.fs import where

    place = where(data)  # a URL stays a URL (pathlib would make s3://b of it s3:/b)
    name = str(place.resolve())
    return {"data": name, "layout": detect_layout(place)}


def search_settings(
    data: str | os.PathLike[str] | FileDataset,
    budget_s: float = 60.0,
    *,
    storages: Sequence[str] = DEFAULT_STORAGES,
    batch_size: int = 256,
    size: tuple[int, int] | None = None,
    max_workers: int | None = None,
    sample_size: int | None = None,
    device: str | None = "auto",
    cold: bool = False,
    seed: int = 0,
    echo: Echo | None = None,
) -> TuneResult:
    """Search loader settings for ``data`` within ``budget_s`` seconds; see the module docs.

    Args:
        data: a folder in any layout stoker reads, a shard set (tuned on its own
            storage), or a stoker data set.
        budget_s: the time the whole search may take (limits, packing and trials).
        storages: the storages to consider (``files``, ``shards-encoded``, ``shards-pixels``).
        batch_size: the training batch size (kept as given: it is a training choice).
        size: ``(height, width)`` to resize to, when images differ in size.
        max_workers: the most workers to try (default: twice the cores, at most 16).
        sample_size: samples the trials run on (default: ``max(8 batches, 2048)``).
        device: where batches go, as in training.
        cold: drop the sample's files from the page cache before each trial.
        seed: seed of the sample, the shuffles and the packing.
        echo: called with a line per trial as the search goes.

    Returns:
        A :class:`TuneResult`; its ``settings`` are valid :func:`stoker.make_loader`
        arguments (``settings.loader_kwargs()``), and record the storage, the data
        and its layout they were measured on (checked by
        :func:`~stoker.bench.settings.check_tuned_for` when they are used).

    Raises:
        ConfigError: a budget too small for one trial, an unknown storage, or a shard
            set with only other storages asked for.
    """
    start = time.perf_counter()
    say = echo or (lambda line: None)
    if budget_s < 3 * _MIN_TRIAL_S:
        raise ConfigError(f"tune: a budget of {budget_s:g} s is too short; give at least {3 * _MIN_TRIAL_S:g} s (e.g. --budget 60s)")
    tunable = method_names(tunable=True, cuda=True)
    unknown = [s for s in storages if s not in tunable]
    if unknown or not storages:
        raise ConfigError(f"tune: storages must be among {', '.join(tunable)}, got {list(storages)!r}")
    asked = list(storages)
    shard_set = open_shard_set(data) if not isinstance(data, FileDataset) else None
    limit_s = min(1.0, budget_s / 30)
    trial_s = float(np.clip(budget_s * 0.85 / _PLANNED_TRIALS, _MIN_TRIAL_S, _MAX_TRIAL_S))
    if shard_set is None:
        dataset, description = open_data(data)
        size = _settle_size(dataset, size)
        sample = _sample(dataset, sample_size or max(8 * batch_size, 2048), seed)
        limits = measure_limits(sample, size=size, time_s=limit_s, seed=seed)
        labels, num_classes, samples = np.asarray(sample.labels), sample.num_classes, len(sample)
        bench_data = BenchData.of(
            sample, size, batch_size=min(batch_size, samples), device=device, seed=seed, persistent_workers=True
        )
        read = [str(p) for p in sample.index.paths]
    else:  # a shard set as it is: its own storage alone, on every sample (trials stop on time)
        storages = _shard_storages(shard_set.store, storages, shard_set.root)
        description = shard_set.root
        labels, download_rate = fetch_all(shard_set)
        num_classes, samples = shard_set.num_classes, len(labels)
        size = size if size is not None else shard_set.image_size
        limits = measure_shard_limits(shard_set, size, limit_s, download_rate, seed=seed)
        bench_data = BenchData(None, size, batch_size=min(batch_size, samples), device=device, seed=seed,
                               persistent_workers=True)
        if size != shard_set.image_size:
            bench_data.shard_transform = partial(resize, size=size)
        bench_data.packed[shard_set.store] = description
        read = [str(shard_set.shards.local_path(k)) for k in range(len(shard_set.shards.infos))]  # fetched: local
    say(f"tuning the loader for {description}: {limits.summary()}")

    storages, gpu_skipped = _with_gpu_storages(storages, asked, device)
    state = _Search(bench_data, Expected.of(labels, num_classes), budget_s - (time.perf_counter() - start), trial_s,
                    read if cold else None, say)
    state.skipped.extend(gpu_skipped)
    workdir = Path(tempfile.mkdtemp(prefix="stoker-tune-"))
    try:
        # 1. storage and workers
        for storage in storages:
            store = METHODS[storage].store
            if store is not None and store not in bench_data.packed:
                work_s = len(sample) / max(limits.decode_img_per_s, 1.0)
                if work_s > 0.3 * state.left_s:
                    state.skipped.append(f"{storage}: packing {len(sample)} samples would take about {work_s:.0f} s of the budget")
                    continue
                say(f"  packing {len(sample)} samples as {store} shards ...")
                pack_for_bench(sample, store, workdir / store, size, seed)
                bench_data.packed[store] = workdir / store
                if limits.sequential_read_bytes_per_s is None:
                    shard_files = sorted(str(p) for p in (workdir / store).glob("*.arrow"))
                    disk, cached = measure_sequential_reads(shard_files, limit_s)
                    limits = replace(limits, sequential_read_bytes_per_s=disk, cached_sequential_read_bytes_per_s=cached)
            best_rate = 0.0
            method = METHODS[storage]
            counts = _GPU_DECODE_THREADS if method.needs_cuda else _worker_candidates(limits.cores, max_workers)
            for w in counts:
                trial = state.measure(LoaderSettings(method=storage, workers=w, backend=method.backends[0],
                                                     decoder=method.decoder), "storage and workers")
                if trial is None or not trial.valid:
                    break
                rate = trial.img_per_s or 0.0
                if w >= 2 and rate < best_rate * (1 + _MIN_GAIN):
                    break  # diminishing returns: more workers only cost memory
                best_rate = max(best_rate, rate)
        # 2. backend
        leader = state.best()
        if leader is not None:
            w = leader.settings.workers or 0  # a trial's settings always name their workers
            top = max_workers if max_workers is not None else 2 * max(w, 1)
            others = [b for b in METHODS[leader.settings.method].backends if b != leader.settings.backend]
            for other in others:
                for workers in dict.fromkeys(min(v, top) for v in (max(w, 1), 2 * max(w, 1))):
                    state.measure(leader.settings.replace(backend=other, workers=workers), "backend")
        # 3. prefetch depth
        leader = state.best()
        if leader is not None and (leader.settings.workers or 0) > 0:
            for depth in (1, 4):
                state.measure(leader.settings.replace(prefetch_factor=depth), "prefetch")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    chosen = state.best()
    if chosen is None:
        settings = LoaderSettings()
        reason = "no trial measured a valid rate; keeping the defaults (" + "; ".join(t.describe() for t in state.trials[:3]) + ")"
    else:
        settings = chosen.settings.replace(img_per_s=round(chosen.img_per_s or 0.0, 1), batch_size=batch_size,
                                           **_tuned_on(data))
        rivals = sorted((t for t in state.trials if t.valid and t is not chosen), key=lambda t: -(t.img_per_s or 0.0))
        reason = f"{chosen.describe()}"
        if rivals:
            runner_up = rivals[0]
            ahead = (chosen.img_per_s or 0.0) / (runner_up.img_per_s or 1.0) - 1
            reason += (
                f" — {ahead:+.0%} against the next best ({runner_up.describe()})"
                + ("; within 3 %, the one with fewer workers wins" if ahead < 0 else "")
            )
        method = METHODS[settings.method]
        bound, limit_name = limits.machine_limit(method.work, sequential=method.store is not None, cached=not cold)
        reason += f"; {share_phrase((chosen.img_per_s or 0.0) / bound, limit_name)} ({bound:,.0f} img/s)"
        if method.store is not None and shard_set is None:
            advice = pack_command("DATA", size, looks_gray(dataset)) if method.store == "pixels" else (
                f"`stoker pack DATA OUT --store {method.store}`")
            reason += f". Pack the data first: {advice}"
    return TuneResult(settings, state.trials, reason, state.skipped, limits, samples, time.perf_counter() - start)


def tune(data: str | os.PathLike[str] | FileDataset, budget_s: float = 60.0, **kwargs: object) -> LoaderSettings:
    """The fastest loader settings for ``data`` found within ``budget_s`` seconds.

    Takes the arguments of :func:`search_settings`; returns only the chosen settings.

    Example:
        >>> from stoker import ClassFolderDataset, make_loader
        >>> settings = tune("data/digiface", budget_s=3, batch_size=8, max_workers=1)
        >>> loader = make_loader(ClassFolderDataset("data/digiface"), batch_size=8, **settings.loader_kwargs())
        >>> sorted(settings.loader_kwargs())
        ['backend', 'num_workers', 'prefetch_factor']
    """
    return search_settings(data, budget_s, **kwargs).settings  # type: ignore[arg-type]
