"""``verify``: check every byte of a shard set — checksums, structure, and that every sample decodes."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from stoker.cores import usable_cores
from stoker.decode.jpeg import decode_stored, is_jpeg
from stoker.errors import ConfigError, DataError, NetworkError, ShardError, StokerError
from stoker.fs import Location, where
from stoker.lifetime import die_with_parent
from stoker.shards.cache.manifests import offline_since, require_cached
from stoker.shards.cache.store import ShardCache
from stoker.shards.format.manifest import Manifest, ShardInfo
from stoker.shards.format.schema import MANIFEST_NAME, shard_schema
from stoker.shards.read.shard_file import ShardFile
from stoker.terminal import bar_disable

__all__ = ["Fault", "VerifyReport", "verify"]

@dataclass(frozen=True)
class Fault:
    """One problem found: the shard (or ``manifest.json``), the row when known, and what is wrong."""

    shard: str
    row: int | None
    problem: str
    decodes_badly: bool = False  # a row that does not decode as training reads it (not damage: a re-pack writes it again)

    def __str__(self) -> str:
        where = self.shard if self.row is None else f"{self.shard} row {self.row}"
        return f"{where}: {self.problem}"


@dataclass
class VerifyReport:
    """What :func:`verify` checked and found.

    Attributes:
        root: the shard set folder.
        shards: shards checked.
        samples: samples checked.
        faults: every problem found, in manifest order (every bad row).
    """

    root: str
    shards: int = 0
    samples: int = 0
    faults: list[Fault] = field(default_factory=list)
    checked: str = ""  # a set at a URL: how its store was checked (read, compared checksums, or offline)
    offline: bool = False  # a set at a URL whose store could not be reached: only the cached copies were checked

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.faults

    @property
    def first_fault(self) -> Fault | None:
        """The first problem, in manifest order."""
        return self.faults[0] if self.faults else None

    @property
    def first_bad_row(self) -> Fault | None:
        """The first fault that names a row, in the first bad shard (None if no row is known)."""
        if not self.faults:
            return None
        shard = self.faults[0].shard
        return next((f for f in self.faults if f.shard == shard and f.row is not None), None)

    def summary(self) -> str:
        """One line for a person."""
        how = f" ({self.checked})" if self.checked else ""
        if self.ok:
            return f"ok: {self.shards} shards, {self.samples} samples verified in {self.root}{how}"
        row = self.first_bad_row
        first = str(self.faults[0]) + (f" (first bad row: {row.row}: {row.problem})" if row and row != self.faults[0] else "")
        bad_rows = [f for f in self.faults if f.row is not None]
        shards = len({f.shard for f in bad_rows})
        counted = f" ({len(bad_rows)} bad row(s) in {shards} shard(s))" if bad_rows else ""
        advice = []
        if any(not f.decodes_badly for f in self.faults):
            advice.append(
                "Delete the damaged shards and re-run the same `stoker pack` command (it rewrites only the "
                "missing ones), or re-pack with --overwrite."
            )
        undecodable = sum(f.decodes_badly for f in self.faults)
        if undecodable:
            advice.append(
                f"{undecodable} row(s) do not decode as training reads them, and the same `stoker pack` command "
                "would write them again: fix the source files, or the setting that makes them unreadable (a crop "
                "box that does not fit the images: --crop), then re-pack with --overwrite."
            )
        return f"FAULTY: {len(self.faults)} problem(s) in {self.root}{counted}; first: {first}. {' '.join(advice)}{how}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _verify_shard(root: Path, manifest: Manifest, info: ShardInfo, decode: bool, path: Path | None = None) -> list[Fault]:
    """Every fault of one shard (file, checksum, structure, rows); ``path``: where its bytes are, if not root/name."""
    path = path if path is not None else root / info.name
    faults: list[Fault] = []
    try:
        st = path.stat()
    except FileNotFoundError:
        return [Fault(info.name, None, "file is missing")]
    except OSError as exc:
        return [Fault(info.name, None, f"cannot read ({exc.strerror})")]
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO would block forever
        return [Fault(info.name, None, "not a regular file (a FIFO, device or folder)")]
    size = st.st_size
    if size != info.bytes:
        return [Fault(info.name, None, f"{size} bytes on disk, the manifest says {info.bytes} (truncated or changed)")]
    try:
        if _sha256(path) != info.sha256:
            faults.append(Fault(info.name, None, "SHA-256 does not match the manifest (the file changed or is damaged)"))
    except OSError as exc:
        return [Fault(info.name, None, f"cannot read ({exc.strerror})")]
    try:
        opened = ShardFile(root, info, shard_schema(manifest.store, manifest.image_size, manifest.channels), len(manifest.classes), path=path)
    except ShardError as exc:
        return faults + [Fault(info.name, None, str(exc).split("; run `stoker verify")[0])]
    try:
        crops = {s.name: s.crop for s in manifest.sources}
        sources, files = opened.column("source"), opened.column("file")
        crcs = opened.crc32().tolist()
        for row in range(len(opened)):
            # ndarray has the buffer protocol; numpy's stubs declare __buffer__ only for Python >= 3.12
            if zlib.crc32(opened.image_bytes(row)) != crcs[row]:  # type: ignore[arg-type]
                faults.append(Fault(info.name, row, "image bytes do not match their CRC-32 (damaged)"))
                continue
            if sources[row] not in crops:
                faults.append(Fault(info.name, row, f"source {sources[row]!r} is not in the manifest"))
                continue
            if decode and manifest.store == "encoded":
                problem = _decode_problem(opened.encoded(row), f"{sources[row]}/{files[row]}", crops[sources[row]], manifest.image_size)
                if problem is not None:
                    faults.append(Fault(info.name, row, problem, decodes_badly=True))
    finally:
        opened.close()
    return faults


def _decode_problem(data: Any, name: str, box: Any, size: tuple[int, int] | None) -> str | None:
    """Why a stored image does not decode as training decodes it, or None when it does.

    Training decodes through :func:`stoker.decode.jpeg.decode_stored`: the full path with
    ``decoder="full"`` (and wherever the fast JPEG path does not take an image), the fast
    path first by default. Both are run and must give the same pixels (one file, one
    answer: docs/format-pixels.md), so "ok" holds whichever decoder a run uses (the GPU
    path falls back to the CPU's for whatever nvJPEG does not decode).
    """
    try:
        full = decode_stored(data, name, box, size, reduced=False)
        if size is not None and is_jpeg(data):
            fast = decode_stored(data, name, box, size, reduced=True)
            if not torch.equal(fast, full):
                differ = int((fast.int() - full.int()).abs().max())
                return (
                    f"{name}: the fast JPEG decoder gives other pixels than the full decode (up to {differ} grey "
                    "levels), so a run would read other pixels than a folder of the same files; please report it, "
                    "and read the set with ShardDataset(..., decoder=\"full\") meanwhile"
                )
    except DataError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - escaped a decoder's guard: a fault to report, never a verify that dies
        return f"{name}: the decoder raised {type(exc).__name__}: {exc} (training would stop here; please report it)"
    return None


def _verify_in_worker(root: Path, manifest: Manifest, info: ShardInfo, decode: bool, path: Path | None) -> list[Fault]:
    torch.set_num_threads(1)
    return _verify_shard(root, manifest, info, decode, path)


def _store_sha256(place: Location, name: str) -> tuple[str, bool]:
    """(hex SHA-256 of an object in the store, whether it was read): the store's own checksum where trustworthy, else every byte."""
    kept = place.sha256(name)
    if kept is not None:
        return kept, False
    digest = hashlib.sha256()
    with place.open(name) as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest(), True


def _check_store(place: Location, manifest: Manifest, cache: ShardCache, progress: bool) -> tuple[dict[str, Path], list[Fault], str]:
    """Check every object of a remote set in its store against the manifest; the shards' verified cache copies to check deeper.

    A shard not in the cache is downloaded into it (the download is hashed and compared
    with the manifest). A cached one is checked against the store too — by the store's
    own SHA-256 where it keeps a trustworthy one (S3's ``ChecksumSHA256``), else by
    reading the object — so a shard changed in the store after it was cached is a fault.
    """
    paths: dict[str, Path] = {}
    faults: list[Fault] = []
    sizes = place.sizes()
    read = compared = 0
    with tqdm(total=manifest.bytes, unit="B", unit_scale=True, desc="check store", disable=bar_disable(progress), file=sys.stderr) as bar:
        for info in manifest.shards:
            bar.update(info.bytes)
            size = sizes[info.name] if info.name in sizes else place.size(info.name)
            if size is None:
                faults.append(Fault(info.name, None, f"{place.url_of(info.name)} is missing in the store"))
                continue
            if size != info.bytes:
                faults.append(Fault(info.name, None, f"{size} bytes in the store, the manifest says {info.bytes} (truncated or changed)"))
                continue
            if not cache.has(info):
                try:
                    paths[info.name] = cache.fetch(place, info)  # read whole, hashed and compared on the way in
                    read += 1
                except ShardError as exc:
                    faults.append(Fault(info.name, None, str(exc).removeprefix(f"shard {info.name}: ")))
                continue
            try:
                digest, was_read = _store_sha256(place, info.name)
            except FileNotFoundError:
                faults.append(Fault(info.name, None, f"{place.url_of(info.name)} is missing in the store"))
                continue
            read, compared = read + was_read, compared + (not was_read)
            if digest != info.sha256:
                faults.append(Fault(info.name, None, f"the object in the store does not match the manifest's SHA-256 "
                                                     f"(it was changed after packing, or is damaged): {place.url_of(info.name)}"))
                continue
            paths[info.name] = cache.path_of(info)
    how = [f"read {read} objects" if read else "", f"compared {compared} store SHA-256 checksums" if compared else ""]
    return paths, faults, "checked the store: " + " and ".join(h for h in how if h) if read or compared else "checked the store"


def _cached_only(url: str, manifest: Manifest, cache: ShardCache) -> tuple[dict[str, Path], list[Fault], str]:
    """Offline: the cached copies of a remote set's shards (NetworkError if one is not cached: nothing to check it by)."""
    for split, infos in manifest.splits.items():
        require_cached(url, split, infos, cache.has)
    paths = {info.name: cache.path_of(info) for info in manifest.shards}
    faults: list[Fault] = []
    since = offline_since(url)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(since)) if since is not None else "never"
    return paths, faults, f"offline: checked the cached copies, not the store; last checked against the store {when}"


def verify(
    root: str | os.PathLike[str],
    *,
    decode: bool = True,
    workers: int | None = None,
    progress: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> VerifyReport:
    """Check a shard set end to end: manifest, every shard's SHA-256 and structure, every sample.

    Unlike opening a :class:`ShardDataset`, this reads every byte; damaged data is a :class:`Fault`, never raised.

    A set at a URL is checked in its store, then its cached copies; unreachable, from the
    cache (``report.offline``). The object-store guide says how.

    Args:
        root: the shard set folder, or its URL.
        decode: decode every encoded image (pixel shards have nothing to decode).
        workers: processes checking shards in parallel (default: CPU count; 0 or 1: here).
        progress: show a progress bar on stderr when it is a terminal (never under ``--quiet``).
        cache_dir, storage_options: a remote set's cache folder and fsspec options.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is False on any fault, and
        ``report.first_fault`` names the first bad shard and row.

    Raises:
        NetworkError, ConfigError: the store is unreachable (and the set not cached) or errs; access denied.

    Example:
        >>> report = verify("packed")
        >>> report.ok, report.summary()
        (True, 'ok: 2 shards, 40 samples verified in packed')
    """
    if workers is not None and workers < 0:
        raise ConfigError(f"workers must be >= 0, got {workers}")
    place = where(root, storage_options)
    report = VerifyReport(str(place))
    try:
        manifest = Manifest.load(place, cache_dir=cache_dir)
    except NetworkError:
        raise  # the store cannot be reached and nothing is cached: that is no fault of the set
    except StokerError as exc:
        report.faults.append(Fault(MANIFEST_NAME, None, str(exc)))
        return report
    paths: dict[str, Path] = {}
    fetch_faults: list[Fault] = []
    local = place.local_path  # shards are memory-mapped: a set at a URL is fetched into the verified cache first
    if local is None:
        cache = ShardCache(cache_dir)
        if offline_since(place.url) is not None:
            paths, fetch_faults, report.checked = _cached_only(place.url, manifest, cache)
            report.offline = True
        else:
            paths, fetch_faults, report.checked = _check_store(place, manifest, cache, progress)
        root = Path(".")  # unused: every shard's path is given
    else:
        root = local
    if workers is None:
        workers = usable_cores()
    failed = {f.shard for f in fetch_faults}
    infos = [info for info in manifest.shards if info.name not in failed]
    with tqdm(total=len(infos), unit="shard", desc="verify", disable=bar_disable(progress), file=sys.stderr) as bar:
        if workers <= 1 or len(infos) <= 1:
            results = []
            for info in infos:
                results.append(_verify_shard(root, manifest, info, decode, paths.get(info.name)))
                bar.update()
        else:
            with ProcessPoolExecutor(min(workers, len(infos)), initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
                futures = [
                    pool.submit(_verify_in_worker, root, manifest, info, decode, paths.get(info.name)) for info in infos
                ]
                results = []
                for future in futures:
                    results.append(future.result())
                    bar.update()
    by_name = dict(zip((i.name for i in infos), results, strict=True))
    for info in manifest.shards:
        report.faults.extend(by_name.get(info.name, [f for f in fetch_faults if f.shard == info.name]))
        report.shards += 1
        report.samples += info.samples
    # Keys must be unique within a split, so that every sample traces back to one file.
    report.faults.extend(_duplicate_keys(root, manifest, paths))
    return report


def _duplicate_keys(root: Path, manifest: Manifest, paths: dict[str, Path]) -> list[Fault]:
    """A fault for the first repeated key of each split (keys trace samples back to files)."""
    faults = []
    schema = shard_schema(manifest.store, manifest.image_size, manifest.channels)
    for split, infos in manifest.splits.items():
        seen: dict[str, str] = {}
        for info in infos:
            try:
                if paths and info.name not in paths:
                    continue  # a remote shard that did not download: already reported
                opened = ShardFile(root, info, schema, len(manifest.classes), path=paths.get(info.name))
            except ShardError:
                continue  # already reported
            try:
                for row, key in enumerate(opened.column("key")):
                    if key in seen:
                        faults.append(Fault(info.name, row, f"key {key!r} of split {split!r} is also in {seen[key]}"))
                        break
                    seen[key] = info.name
            finally:
                opened.close()
    return faults
