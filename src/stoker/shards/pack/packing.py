"""``pack``: write a data set's samples, shuffled, into checksummed Arrow shards.

The steps, in order:

1. open the source (any file layout, several concatenated, or a shard set) and check
   every argument — before a byte is written;
2. plan: shuffle each split with the seed and cut it into shards (:mod:`stoker.shards.pack.plan`);
3. lock the output folder (a second pack into it fails at once) and claim it: an empty
   or new folder, the same pack half done (resume), or, with ``overwrite`` over a set,
   a staging folder beside it (:mod:`stoker.shards.pack.replace`), so the old set stays
   whole until the new one is complete — even when a set is re-packed into itself (a
   bucket: a lock object and new object names, :mod:`stoker.shards.pack.upload`);
4. write every shard not already finished, each one whole by one worker process (which
   dies with the pack, even after a ``kill -9``), to a temporary name that is renamed
   when complete; a full disk is a :class:`ShardError` saying how much space is needed;
5. write ``manifest.json`` last and remove ``pack-plan.json``; when staging, swap the
   new set in and remove only the old set's stoker files.

The shards depend only on the arguments, not on the number of workers or on
interruptions: the same arguments give byte-identical shards and manifest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from stoker.cores import usable_cores
from stoker.decode.headers import declared_size
from stoker.decode.image import ARRAY_SUFFIXES, check_box, resize
from stoker.errors import ConfigError, DataError, ShardError
from stoker.fs import Location, where
from stoker.lifetime import die_with_parent
from stoker.shards.format.manifest import Manifest, ShardInfo
from stoker.shards.format.schema import (
    PLAN_NAME,
    STORES,
    check_channels,
    check_split_name,
    image_row_bytes,
    shard_schema,
)
from stoker.shards.pack.claim import check_place, claim, reuse_finished
from stoker.shards.pack.plan import PackPlan, ShardPlan, make_plan
from stoker.shards.pack.ray_engine import ENGINES, import_ray, write_on_ray
from stoker.shards.pack.replace import LOCK_NAME, finish_swap, is_ours, pack_lock, staging_dir, swap_in
from stoker.shards.pack.rows import RowSource, as_rows, row_values
from stoker.shards.pack.upload import RemoteOut, upload_shard
from stoker.shards.pack.writer import WrittenShard, say_resized
from stoker.shards.read.dataset import ShardDataset
from stoker.sources.dataset import FileDataset
from stoker.sources.index import Source
from stoker.terminal import bar_disable
from stoker.types import PathLike

__all__ = ["write_shards"]

SourceArg = FileDataset | ShardDataset | Mapping[str, Any]

_PROGRESS_EVERY = 32  # rows between progress reports from a worker


def _stoker_version() -> str:
    try:
        return version("stoker")
    except PackageNotFoundError:
        return "0.0.0+unknown"


# -- 1. the source and the arguments --------------------------------------------------


def _check_args(store: str, size: tuple[int, int] | None, shard_samples: int, shard_bytes: int, valid: float | None, workers: int | None) -> None:
    if store not in STORES:
        raise ConfigError(f"store must be one of {', '.join(STORES)}, got {store!r}")
    if size is not None:
        if len(size) != 2 or any(isinstance(v, bool) or int(v) != v or v < 1 for v in size):
            raise ConfigError(f"size must be (height, width) of positive integers, got {size!r}")
        shard_schema(store, (int(size[0]), int(size[1])))  # checks the range
    if shard_samples < 1:
        raise ConfigError(f"shard_samples must be >= 1, got {shard_samples}")
    if shard_bytes < 1:
        raise ConfigError(f"shard_bytes must be >= 1, got {shard_bytes}")
    if valid is not None and not 0.0 < valid < 1.0:
        raise ConfigError(f"valid must be a fraction between 0 and 1, got {valid}")
    if workers is not None and workers < 0:
        raise ConfigError(f"workers must be >= 0, got {workers}")


def _open(source: SourceArg) -> tuple[dict[str, Any], list[str]]:
    """``({split: data set}, source description)``; the data sets are file data sets or shard sets."""
    if isinstance(source, (FileDataset, ShardDataset)):
        split = source.split if isinstance(source, ShardDataset) else "train"
        return {split: source}, [s.root for s in _sources_of(source)]
    if isinstance(source, Mapping):
        datasets = {check_split_name(str(k)): v for k, v in source.items()}
        if not datasets:
            raise ConfigError("pack: the mapping of splits is empty")
        return datasets, list(dict.fromkeys(s.root for ds in datasets.values() for s in _sources_of(ds)))
    raise ConfigError(
        f"write_shards takes a stoker data set or a {{split: data set}} mapping, got {type(source).__name__}; "
        "to pack the data at a path use stoker.pack"
    )


def _sources_of(dataset: FileDataset | ShardDataset) -> tuple[Source, ...]:
    if isinstance(dataset, ShardDataset):
        return dataset.manifest.sources
    if isinstance(dataset, FileDataset):
        return dataset.index.sources
    raise ConfigError(f"pack reads stoker file data sets or shard sets, got {type(dataset).__name__}")


def _split_valid(datasets: dict[str, Any], valid: float | None, seed: int) -> dict[str, Any]:
    if valid is None:
        return datasets
    if set(datasets) != {"train"}:
        raise ConfigError(
            f"the source has splits already ({', '.join(datasets)}); leave out --split valid=... to keep them"
        )
    train = datasets["train"]
    if not isinstance(train, FileDataset):
        raise ConfigError("--split valid=... splits file sources; a shard set keeps the splits it has")
    train, held_out = train.split(valid, seed)
    return {"train": train, "valid": held_out}


def _ordered(datasets: dict[str, Any]) -> dict[str, Any]:
    first = [s for s in ("train", "valid") if s in datasets]
    return {s: datasets[s] for s in first + [s for s in datasets if s not in first]}


def _merge_sources(rows: Mapping[str, RowSource]) -> tuple[Source, ...]:
    merged: dict[str, Source] = {}
    for split_rows in rows.values():
        for src in split_rows.sources:
            if src.name in merged and merged[src.name] != src:
                raise ConfigError(
                    f"two sources are both named {src.name!r} ({merged[src.name].root}, {src.root}); give them distinct names"
                )
            merged.setdefault(src.name, src)
    used = {str(n) for split_rows in rows.values() for n in np.unique(split_rows.source_names)}
    return tuple(s for s in merged.values() if s.name in used)


def _merge_classes(rows: Mapping[str, RowSource]) -> tuple[str, ...]:
    longest = max((r.classes for r in rows.values()), key=len)
    for split, r in rows.items():
        if tuple(longest[: len(r.classes)]) != tuple(r.classes):
            raise ConfigError(f"split {split!r} names its classes differently from the others; give every split the same classes")
    return tuple(longest)


# -- 3 and 4. the output folder (stoker.shards.pack.claim), then writing shards --------------------------------------------------------------------


@dataclass
class _Job:
    """What every shard writer needs (sent once to each worker process)."""

    out: Path
    store: str
    size: tuple[int, int] | None
    rows: dict[str, RowSource]
    remote: Location | None = None  # packing to a URL: out is the staging folder, shards go here
    channels: int = 3


def _pixels(rows: RowSource, i: int, size: tuple[int, int], channels: int = 3) -> tuple[torch.Tensor, bool]:
    """Row ``i``'s pixels at ``size`` and ``channels``, and whether they had to be resized."""
    image = rows.read_pixels(i)
    if image.dtype != torch.uint8:
        raise DataError(
            f"{rows.source_names[i]}/{rows.files[i]}: pixels must be uint8, got {image.dtype}; "
            "convert the files or use store='encoded'"
        )
    resized = tuple(image.shape[-2:]) != tuple(size)
    image = resize(image, size)
    if channels == 3 and image.shape[0] == 1:  # re-packing a gray pixels set as RGB
        image = image.expand(3, -1, -1)
    if channels == 1 and image.shape[0] != 1:
        from torchvision.transforms.v2 import functional as F

        # Gray data decodes to three equal channels: keep one. Colour becomes its luma (ITU-R 601).
        image = image[:1] if bool((image[0] == image[1]).all() and (image[0] == image[2]).all()) else F.rgb_to_grayscale(image)
    return image.contiguous(), resized


def _check_crop(rows: RowSource, i: int, data: bytes | np.ndarray, crops: Mapping[str, Any]) -> None:
    """Refuse an encoded row whose source's crop box does not fit the image (a pixel pack finds it by decoding).

    The size comes from the header; an image whose header stoker does not read (an array
    file, a BMP or TIFF) is decoded and cropped to check it.

    Raises:
        DecodeError: the box does not fit (the message names the file).
    """
    box = crops.get(str(rows.source_names[i]))
    if box is None:
        return
    name = f"{rows.source_names[i]}/{rows.files[i]}"
    size = None if str(rows.files[i]).lower().endswith(ARRAY_SUFFIXES) else declared_size(data)
    if size is None:
        rows.read_pixels(i)  # decodes and crops: raises the error that names the file
        return
    width, height = size
    check_box(tuple(box), (height, width), name)  # type: ignore[arg-type]


def _write_shard(job: _Job, plan: ShardPlan, report: Callable[[int], None]) -> ShardInfo:
    from stoker.shards.pack.writer import ShardWriter

    rows = job.rows[plan.split]
    pending = resized = 0
    crops = {s.name: s.crop for s in rows.sources}
    with ShardWriter(job.out / plan.name, plan.split, job.store, job.size, channels=job.channels) as writer:
        for i in plan.rows.tolist():
            if job.store == "encoded":
                image: Any = rows.read_encoded(i)
                _check_crop(rows, i, image, crops)
            else:
                image, changed = _pixels(rows, i, job.size, job.channels)  # type: ignore[arg-type]
                resized += changed
            writer.write_row(row_values(rows, i), image)  # every column of format.COLUMNS, by name
            pending += 1
            if pending == _PROGRESS_EVERY:
                report(pending)
                pending = 0
    report(pending)
    info = writer.close()
    if job.remote is not None:
        upload_shard(job.remote, job.out, info)
    return WrittenShard(**asdict(info), resized=resized) if resized else info


_WORKER: dict[str, Any] = {}


def _init_worker(job: _Job, counter: Any, parent_pid: int) -> None:
    die_with_parent(parent_pid)  # a kill -9 of the pack must not leave workers behind
    torch.set_num_threads(1)  # one shard per process; the processes use the cores
    _WORKER["job"], _WORKER["counter"] = job, counter


def _worker_task(plan: ShardPlan) -> ShardInfo:
    counter = _WORKER["counter"]

    def report(n: int) -> None:
        with counter.get_lock():
            counter.value += n

    return _write_shard(_WORKER["job"], plan, report)


def _write_all(job: _Job, todo: list[ShardPlan], workers: int, bar: tqdm) -> dict[str, ShardInfo]:
    done: dict[str, ShardInfo] = {}
    if workers <= 1 or len(todo) <= 1:
        for plan in todo:
            done[plan.name] = _write_shard(job, plan, bar.update)
        return done
    counter = multiprocessing.Value("q", 0)
    start = bar.n
    pool = ProcessPoolExecutor(min(workers, len(todo)), initializer=_init_worker, initargs=(job, counter, os.getpid()))
    futures: dict[Future[ShardInfo], ShardPlan] = {}
    try:
        futures = {pool.submit(_worker_task, plan): plan for plan in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            bar.update(start + counter.value - bar.n)
            for future in finished:
                info = future.result()
                done[info.name] = info
        bar.update(start + counter.value - bar.n)
    except BaseException:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return done


# -- the whole ---------------------------------------------------------------------------


def write_shards(
    source: SourceArg,
    out: PathLike,
    *,
    store: str = "encoded",
    size: tuple[int, int] | None = None,
    shard_samples: int = 10_000,
    shard_bytes: int = 256 * 2**20,
    valid: float | None = None,
    seed: int = 0,
    shuffle: bool = True,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    origin: Sequence[str] | None = None,
    engine: str = "local",
    storage_options: dict[str, Any] | None = None,
    cache_dir: PathLike | None = None,
    channels: int = 3,
) -> Manifest:
    """Pack a data set into shuffled, checksummed Arrow shards plus ``manifest.json``; returns the :class:`Manifest`.

    Args:
        source: a stoker data set or a ``{split: data set}`` mapping (:func:`stoker.pack` takes paths).
        out, overwrite: the output folder (new, empty, or this pack half done) or a URL; ``overwrite``
            replaces a set there (the old one stays readable until the new one is complete).
        store, channels: ``"encoded"`` keeps each file's bytes; ``"pixels"`` stores decoded pixels, 3 (RGB) or 1 channel.
        size: ``(height, width)``: the stored size (``pixels``; default: the first image's), else the read size.
        shard_samples, shard_bytes: the most samples, and about the most bytes, per shard.
        valid: hold out this fraction of each class as the ``valid`` split (sources without splits).
        seed, shuffle: the shuffle (and split) seed (the same arguments, the same bytes); ``False``: source order.
        workers, engine: processes writing shards (default: the CPU count; 0 or 1 writes here),
            on this machine (``"local"``) or as Ray tasks (``"ray"``; the same bytes).
        origin, progress: the source the manifest records; a bar on stderr when it is a terminal.
        storage_options, cache_dir: fsspec options for a URL ``out``, and the local folder it is staged in.

    Raises:
        ConfigError, DataError, ShardError: a bad argument or an occupied ``out``; a bad source file; a damaged set.

    Example:
        >>> from stoker import ClassFolderDataset
        >>> manifest = write_shards(ClassFolderDataset("data/digiface"), "out", store="pixels", size=(32, 32),
        ...                         valid=0.1, workers=0, progress=False)
        >>> manifest.split_samples("valid"), manifest.split_samples("train")
        (4, 36)
    """
    place = where(out, storage_options)
    local = place.local_path  # shards are written to local disk: a URL out is staged, then uploaded
    remote = RemoteOut(place, os.fspath(cache_dir) if cache_dir is not None else None) if local is None else None
    out = local if local is not None else remote.staging  # type: ignore[union-attr]
    _check_args(store, size, shard_samples, shard_bytes, valid, workers)
    channels = check_channels(channels, store)
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "ray":
        import_ray()  # before a byte is written
    size = (int(size[0]), int(size[1])) if size is not None else None
    datasets, described = _open(source)
    if origin is not None:
        described = list(origin)
    datasets = _ordered(_split_valid(datasets, valid, seed))
    rows = {split: as_rows(ds) for split, ds in datasets.items()}
    if any(len(r) == 0 for r in rows.values()):
        raise ConfigError(f"split {next(s for s, r in rows.items() if len(r) == 0)!r} has no samples")
    first = next(iter(datasets.values()))
    size_given = size is not None
    if size is None and isinstance(first, ShardDataset):
        size = first.image_size
    if store == "pixels" and size is None:
        image = next(iter(rows.values())).read_pixels(0)
        size = (int(image.shape[-2]), int(image.shape[-1]))
    sources = _merge_sources(rows)
    classes = _merge_classes(rows)
    settings = {
        "store": store,
        "image_size": list(size) if size else None,
        "shard_samples": shard_samples,
        "shard_bytes": shard_bytes,
        "seed": seed,
        "valid": valid,
        "classes": list(classes),
        "sources": [[s.name, s.root, list(s.crop) if s.crop else None] for s in sources],
    }
    if not shuffle:  # recorded only when off, so default packs keep their bytes
        settings["shuffle"] = False
    if channels != 3:  # likewise
        settings["channels"] = channels
    plan: PackPlan = make_plan(
        rows, store=store, image_size=size, seed=seed, shard_samples=shard_samples, shard_bytes=shard_bytes,
        settings=settings, shuffle=shuffle, channels=channels,
    )
    made_by: dict[str, Any] = {
        "tool": "stoker",
        "stoker_version": _stoker_version(),
        "source": described,
        "seed": seed,
        "valid": valid,
        "shard_samples": shard_samples,
        "shard_bytes": shard_bytes,
        "plan": plan.fingerprint,
        **({} if shuffle else {"shuffle": False}),
    }
    in_place = _replacing_its_source(datasets, out)
    if in_place:  # recorded only here, so other packs keep their bytes
        made_by["replaced_in_place"] = _fingerprint_of(settings)
    write = _Writing(plan, rows, store, size, workers, progress, classes, sources, made_by, engine, place.name, channels,
                     size_given=size_given)
    if remote is not None:
        with remote.lock:  # one pack per prefix (stoker.shards.pack.bucket_lock), renewed while it runs
            finished, known, write.plan = remote.claim(sources, plan, overwrite)  # the plan with its object names
            if finished is not None:
                return finished
            remote.start(write.plan)
            manifest = write.into(out, known, remote)
            remote.finish(manifest)  # the manifest last; only then does an old set go
        return manifest
    check_place(out, sources)
    with pack_lock(out):
        if in_place:
            done = _replaced_already(out, made_by["replaced_in_place"])
            if done is not None:
                return done
        target, finished, known = _claim_target(out, sources, plan.fingerprint, overwrite)
        if finished is not None:
            return finished
        try:
            manifest = write.into(target, known)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ShardError(_disk_full(target, plan, rows, store, size, channels)) from None
            raise
        if target != out:
            swap_in(target, out)  # the new set is complete: only now does the old one go
    return manifest


def _replacing_its_source(datasets: Mapping[str, Any], out: Path) -> bool:
    """Whether this pack re-packs the shard set in ``out`` into ``out`` itself (``stoker pack S S --overwrite``)."""
    for dataset in datasets.values():
        root = dataset.shards.root if isinstance(dataset, ShardDataset) else None
        if isinstance(root, Path) and root.resolve() == out.resolve():
            return True
    return False


def _fingerprint_of(settings: Mapping[str, Any]) -> str:
    """A SHA-256 of a pack's settings (not of its rows): what an in-place re-pack records and compares."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _replaced_already(out: Path, fingerprint: str) -> Manifest | None:
    """The set in ``out`` when these same settings already re-packed it in place; finishes an interrupted swap.

    A re-run of ``stoker pack S S --overwrite`` interrupted after the swap would read the
    new set and shuffle it again: the set it made is the answer, so it is kept (and what
    the swap left of the old set beside it is cleared). Re-running it after a complete
    pack keeps the set too: the same arguments give the same shards.
    """
    try:
        manifest = Manifest.load(out)
    except ShardError:
        return None
    if manifest.made_by.get("replaced_in_place") != fingerprint:
        return None
    for info in manifest.shards:
        path = out / info.name
        if not path.is_file() or path.stat().st_size != info.bytes:
            return None  # a shard missing or changed since: not the finished set (the pack decides as before)
    finish_swap(out)
    return manifest


def _claim_target(
    out: Path, sources: tuple[Source, ...], fingerprint: str, overwrite: bool
) -> tuple[Path, Manifest | None, dict[str, str]]:
    """Where to write: ``out``, or (replacing a set) a staging folder beside it; see :func:`claim`."""
    replacing = overwrite and any(is_ours(n) and n != LOCK_NAME for n in os.listdir(out))
    if not replacing:
        return (out, *claim(out, sources, fingerprint, overwrite))
    staging = staging_dir(out)
    try:
        finished, known = claim(staging, sources, fingerprint, False)  # resume an interrupted replacement
    except ConfigError:
        finished, known = claim(staging, sources, fingerprint, True)
    if finished is not None:  # staged completely last time, interrupted before the swap
        swap_in(staging, out)
        return out, finished, known
    return staging, None, known


@dataclass
class _Writing:
    """Everything a pack writes, fixed before it starts; :meth:`into` writes it into a folder."""

    plan: PackPlan
    rows: dict[str, RowSource]
    store: str
    size: tuple[int, int] | None
    workers: int | None
    progress: bool
    classes: tuple[str, ...]
    sources: tuple[Source, ...]
    made_by: dict[str, Any]
    engine: str
    name: str
    channels: int = 3
    size_given: bool = True  # False: the pixel size is the first image's (the note then says how to choose)

    def into(self, out: Path, known: dict[str, str], remote: Any = None) -> Manifest:
        """Write every shard not already finished into ``out`` (a remote pack's staging folder), then the manifest."""
        plan, rows, store, size = self.plan, self.rows, self.store, self.size
        if remote is None:
            plan.save(out)
        remote_sizes = remote.place.sizes() if remote is not None else {}
        infos: dict[str, ShardInfo] = {}
        todo: list[ShardPlan] = []
        for shard in plan.shards:
            if remote is None:
                reused = reuse_finished(out, shard, rows[shard.split], store, size, known.get(shard.name), self.channels)
            else:
                reused = remote.reuse(shard, known.get(shard.name), remote_sizes)
            if reused is not None:
                infos[shard.name] = reused
            else:
                todo.append(shard)
        workers = self.workers
        if workers is None:
            workers = usable_cores()
        job = _Job(out, store, size, rows, remote.place if remote is not None else None, self.channels)
        with tqdm(
            total=sum(len(p.rows) for p in plan.shards),
            initial=sum(i.samples for i in infos.values()),
            unit="img",
            desc=f"pack {self.name}",
            disable=bar_disable(self.progress),  # a bar on a terminal only, never frames in a log
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.1,
        ) as bar:
            if self.engine == "ray" and todo:
                infos.update(write_on_ray(_write_shard, job, todo, bar))
            else:
                infos.update(_write_all(job, todo, workers, bar))
        resized = sum(getattr(info, "resized", 0) for info in infos.values())
        if resized:
            say_resized(resized, sum(len(p.rows) for p in todo), size, self.size_given)  # type: ignore[arg-type]
        manifest = Manifest(
            store=store,
            image_size=size,
            classes=self.classes,
            sources=self.sources,
            shards=tuple(ShardInfo(**{k: v for k, v in asdict(infos[s.name]).items() if k != "resized"}) for s in plan.shards),
            made_by=self.made_by,
            channels=self.channels,
        )
        if remote is None:
            manifest.save(out)
            (out / PLAN_NAME).unlink(missing_ok=True)
        return manifest


def _disk_full(
    out: Path, plan: PackPlan, rows: dict[str, RowSource], store: str, size: tuple[int, int] | None, channels: int = 3
) -> str:
    """The message for a full disk: how much the pack needs, and how much is free."""
    if store == "pixels":
        needed = sum(len(p.rows) for p in plan.shards) * image_row_bytes(size, channels)  # type: ignore[arg-type]
    else:
        needed = int(sum(int(r.encoded_sizes().sum()) for r in rows.values()))
    written = sum(f.stat().st_size for f in out.iterdir() if f.is_file() and is_ours(f.name))
    free = shutil.disk_usage(out).free
    return (
        f"{out}: the disk is full: the pack needs about {needed / 2**20:,.1f} MiB, {written / 2**20:,.1f} MiB are "
        f"written and {free / 2**20:,.1f} MiB are free; free at least {max(needed - written - free, 0) / 2**20 + 1:,.1f} MiB "
        "more (or pack to another disk) and re-run the same command: it resumes"
    )
