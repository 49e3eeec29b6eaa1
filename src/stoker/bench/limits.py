"""The limits no loader can beat on this machine, measured on this data.

A loader cannot be faster than the slowest of: decoding (one core's decode rate times
the cores it uses), copying the decoded pixels in memory, and reading the bytes from
storage. :func:`measure_limits` measures all three in a second or two each, so that a
benchmark figure can be read as a fraction of what the machine allows.

Storage is read two ways, and each is measured: from the disk (the files dropped from
the page cache first) and from the page cache (the same files read again at once). A
run that reads through the page cache (the benchmark's default) is held to the second,
a ``--cold`` run to the first (holding a warm run to the disk's rate would give shares
far above 100 %).

Example:
    >>> from stoker import ClassFolderDataset
    >>> limits = measure_limits(ClassFolderDataset("data/digiface"), time_s=0.2)
    >>> limits.decode_img_per_s > 0  # one core
    True
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from stoker.bench.methods import Work  # decode it, or only read and copy its pixels
from stoker.cores import usable_cores
from stoker.decode.image import resize
from stoker.errors import ConfigError
from stoker.fs import local_path
from stoker.sources.dataset import FileDataset

__all__ = ["Limits", "Work", "evict_from_page_cache", "measure_limits", "measure_sequential_read", "measure_sequential_reads"]

_MEMCPY_BYTES = 64 << 20  # large enough to leave the CPU caches
_READ_CHUNK = 8 << 20  # bytes per read() of the sequential test


@dataclass(frozen=True)
class Limits:
    """Measured ceilings of this machine for this data.

    Attributes:
        cores: CPU cores available to this process.
        decode_img_per_s: images one core decodes (and resizes) per second (0 when
            nothing was decoded: a set of pixel shards benchmarked as it is).
        memcpy_bytes_per_s: bytes per second one core copies in memory.
        read_bytes_per_s: bytes per second read from the data's storage, file by file.
        read_cold: whether the files were dropped from the page cache before the read
            test (``posix_fadvise``); when False the figure may be the cache's speed.
        sequential_read_bytes_per_s: bytes per second read from large files (packed
            shards) front to back, or ``None`` when not measured; methods that read
            shards are held to this rate instead of the file-by-file one.
        cached_read_bytes_per_s: bytes per second one core reads the same files file by
            file from the page cache, or ``None`` when not measured.
        cached_sequential_read_bytes_per_s: the same for shards read front to back.
        shards_downloaded: the shards are at a URL: the sequential rate is the rate they
            were downloaded at (the network is their storage).
        files_read: the read rates were measured on sample files; False for a shard set
            benchmarked as it is (there are no files: only the shard rates mean anything).
        encoded_bytes_per_img: mean size of a sample file.
        decoded_bytes_per_img: mean size of a decoded (and resized) uint8 image.
    """

    cores: int
    decode_img_per_s: float
    memcpy_bytes_per_s: float
    read_bytes_per_s: float
    read_cold: bool
    encoded_bytes_per_img: float
    decoded_bytes_per_img: float
    sequential_read_bytes_per_s: float | None = None
    cached_read_bytes_per_s: float | None = None
    cached_sequential_read_bytes_per_s: float | None = None
    shards_downloaded: bool = False
    files_read: bool = True

    def read_rate(self, sequential: bool = False, cached: bool = False) -> tuple[float, str]:
        """``(bytes per second, limit name)`` of reading storage as a method reads it.

        ``sequential``: shards front to back (when measured), else file by file.
        ``cached``: through the page cache (when measured): the name is then
        ``"page-cache read"``, and the rate is one core's (:meth:`bounds` scales it).
        """
        if cached:
            rate = self.cached_sequential_read_bytes_per_s if sequential else self.cached_read_bytes_per_s
            if sequential and rate is None:
                rate = self.cached_read_bytes_per_s
            if rate is not None:
                return rate, "page-cache read"
        if sequential and self.sequential_read_bytes_per_s is not None:
            return self.sequential_read_bytes_per_s, "storage read"
        return self.read_bytes_per_s, "storage read"

    def bounds(self, work: Work, workers: int, sequential: bool = False, cached: bool = False) -> dict[str, float]:
        """Images per second each limit allows a method doing ``work`` with ``workers``.

        Decoding scales with the cores in use (``max(workers, 1)``, at most
        :attr:`cores`); a method of pixel shards decodes nothing but reads more bytes.
        ``sequential`` methods (reading shards) are held to the sequential read rate
        when it was measured. ``cached`` methods read through the page cache: they are
        held to its rate, which scales with the cores in use like decoding (each core
        makes its own system calls and copies), instead of the disk's.
        """
        cores_used = min(max(workers, 1), self.cores)
        stored = self.decoded_bytes_per_img if work == "pixels" else self.encoded_bytes_per_img
        read_rate, read_name = self.read_rate(sequential, cached)
        if read_name == "page-cache read":
            read_rate *= cores_used
        out = {
            read_name: read_rate / max(stored, 1.0),
            "memory copy": self.memcpy_bytes_per_s / max(self.decoded_bytes_per_img, 1.0),
        }
        if work == "decode":
            out["decode"] = self.decode_img_per_s * cores_used
        return out

    def limit(self, work: Work, workers: int, sequential: bool = False, cached: bool = False) -> tuple[float, str]:
        """The binding limit: ``(img_per_s, name)`` of the slowest of :meth:`bounds`."""
        bounds = self.bounds(work, workers, sequential, cached)
        name = min(bounds, key=bounds.__getitem__)
        return bounds[name], name

    def machine_limit(self, work: Work, sequential: bool = False, cached: bool = False) -> tuple[float, str]:
        """The most the whole machine allows a method doing ``work``: :meth:`limit` with every core.

        The benchmark states each run's rate as a share of this, so one yardstick holds
        for every number of workers: 1 worker at 50 % and 2 workers at 100 % means the
        second worker doubled the rate (a share of "the cores used" would call both 100 %).
        """
        return self.limit(work, self.cores, sequential, cached)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict of the measurements."""
        return asdict(self)

    def summary(self) -> str:
        """One line: the three measured rates."""
        cache = "cold" if self.read_cold else "may be cached"
        shards = "downloading shards" if self.shards_downloaded else "reading shards front to back"
        reads = [] if not self.files_read else [f"{self.read_bytes_per_s / 1e6:,.0f} MB/s file by file ({cache})"]
        if self.sequential_read_bytes_per_s is not None:
            reads.append(f"{self.sequential_read_bytes_per_s / 1e6:,.0f} MB/s {shards}")
        cached = []
        if self.cached_read_bytes_per_s is not None and self.files_read:
            cached.append(f"{self.cached_read_bytes_per_s / 1e6:,.0f} MB/s per core file by file")
        if self.cached_sequential_read_bytes_per_s is not None:
            cached.append(f"{self.cached_sequential_read_bytes_per_s / 1e6:,.0f} MB/s per core reading shards")
        decode = (
            f"decode {self.decode_img_per_s:,.0f} img/s per core x {self.cores} cores"
            if self.decode_img_per_s > 0
            else f"nothing to decode (pixel shards), {self.cores} cores"
        )
        per_image = f"{self.encoded_bytes_per_img / 1e3:,.1f} KB per {'file' if self.files_read else 'stored image'}"
        return (
            f"{decode}; "
            f"memory copy {self.memcpy_bytes_per_s / 1e9:,.1f} GB/s; "
            f"storage read {', '.join(reads)}"
            + (f"; page-cache read {', '.join(cached)}" if cached else "")
            + f"; {per_image}, {self.decoded_bytes_per_img / 1e3:,.1f} KB per decoded image"
        )


def evict_from_page_cache(paths: list[str]) -> bool:
    """Ask the OS to drop these local files from its page cache; True if it could be asked.

    Clean pages go; pages still being written back stay, so a file written a moment ago
    may still read at memory speed.
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    done = False
    for path in paths:
        local = local_path(path)
        if local is None:  # a URL: no page cache here
            continue
        try:
            fd = os.open(local, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done = True
        finally:
            os.close(fd)
    return done


def _decode_rate(dataset: FileDataset, rows: np.ndarray, size: tuple[int, int] | None, time_s: float) -> tuple[float, float]:
    """(images per second on one core, mean decoded bytes) over the given samples."""
    from stoker.decode.image import decode_sample

    blobs = [(dataset.read_bytes(int(i)), str(dataset.index.paths[i]), dataset.index.crop_of(int(i))) for i in rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        decoded_bytes, done = 0, 0
        start = time.perf_counter()
        while True:
            for data, name, box in blobs:
                image = resize(decode_sample(data, name, box), size)
                decoded_bytes += image.numel() * image.element_size()
                done += 1
            elapsed = time.perf_counter() - start
            if elapsed >= time_s:
                break
    finally:
        torch.set_num_threads(threads)
    return done / elapsed, decoded_bytes / done


def _memcpy_rate(time_s: float) -> float:
    """Bytes per second of ``Tensor.copy_`` between two large buffers on one core."""
    src = torch.ones(_MEMCPY_BYTES, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dst.copy_(src)  # fault the pages in before timing
        copies = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < time_s or copies < 2:
            dst.copy_(src)
            copies += 1
    finally:
        torch.set_num_threads(threads)
    return copies * _MEMCPY_BYTES / elapsed


def _read_rate(dataset: FileDataset, rows: np.ndarray, time_s: float, cold: bool) -> tuple[float, bool, float, float]:
    """(bytes per second, whether the cache was dropped, mean file bytes, bytes per second
    from the page cache) reading whole files.

    The page-cache rate reads again, round after round, only the files the first pass
    read (they are in the cache now), for half of ``time_s``.
    """
    paths = [str(dataset.index.paths[i]) for i in rows]
    evicted = evict_from_page_cache(paths) if cold else False
    total, done = 0, 0
    start = time.perf_counter()
    for i in rows:
        total += len(dataset.read_bytes(int(i)))
        done += 1
        if time.perf_counter() - start >= time_s:
            break
    elapsed = max(time.perf_counter() - start, 1e-9)
    read = rows[:done]
    cached_total = 0
    start = time.perf_counter()
    while (cached_s := time.perf_counter() - start) < time_s / 2:
        for i in read:
            cached_total += len(dataset.read_bytes(int(i)))
    return total / elapsed, evicted, total / done, cached_total / max(cached_s, 1e-9)


def measure_limits(
    dataset: FileDataset,
    size: tuple[int, int] | None = None,
    time_s: float = 1.0,
    max_samples: int = 256,
    cold: bool = True,
    seed: int = 0,
) -> Limits:
    """Measure the decode, memory-copy and storage-read limits for ``dataset`` here.

    Args:
        dataset: the data, as a stoker file data set.
        size: ``(height, width)`` images are resized to, as the benchmark does.
        time_s: about how long each of the three measurements runs.
        max_samples: the most sample files read for the decode and read tests.
        cold: drop the read test's files from the page cache first (where the OS allows).
        seed: which samples are picked.

    Returns:
        The :class:`Limits`.

    Raises:
        ConfigError: ``time_s`` or ``max_samples`` is not positive.
        DataError: a sample cannot be read or decoded.
    """
    if time_s <= 0 or max_samples < 1:
        raise ConfigError(f"measure_limits: time_s and max_samples must be positive, got {time_s} and {max_samples}")
    rng = np.random.default_rng(seed)
    n = len(dataset)
    order = rng.permutation(n)
    decode_rows = order[: min(max_samples, n, 64)]
    # Read different files from the ones just decoded (they are in the cache now) when there are enough.
    read_rows = order[len(decode_rows) :][:max_samples] if n > 2 * len(decode_rows) else order[:max_samples]
    read_bps, read_cold, file_bytes, cached_bps = _read_rate(dataset, read_rows, time_s, cold)
    decode_ips, decoded_bytes = _decode_rate(dataset, decode_rows, size, time_s)
    return Limits(
        cores=usable_cores(),
        decode_img_per_s=decode_ips,
        memcpy_bytes_per_s=_memcpy_rate(time_s / 2),
        read_bytes_per_s=read_bps,
        read_cold=read_cold,
        encoded_bytes_per_img=file_bytes,
        decoded_bytes_per_img=decoded_bytes,
        cached_read_bytes_per_s=cached_bps,
    )


def _read_front_to_back(paths: list[str], time_s: float, max_bytes: int | None = None) -> tuple[int, float]:
    """(bytes read, seconds) reading ``paths`` in order in big chunks until ``time_s`` or ``max_bytes``."""
    total = 0
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(_READ_CHUNK):
                total += len(chunk)
                if time.perf_counter() - start >= time_s or (max_bytes is not None and total >= max_bytes):
                    return total, time.perf_counter() - start
    return total, time.perf_counter() - start


def measure_sequential_reads(paths: list[str], time_s: float = 1.0, cold: bool = True) -> tuple[float, float | None]:
    """``(from storage, from the page cache)``: bytes per second reading ``paths`` (shards) front to back.

    The first figure reads the files (dropped from the page cache first when ``cold``);
    the second reads again, round after round, only the bytes the first read (in the
    cache now), for half of ``time_s``.
    """
    if cold:
        evict_from_page_cache(paths)
    total, elapsed = _read_front_to_back(paths, time_s)
    if not total:
        return 0.0, None
    cached_total, start = 0, time.perf_counter()
    while time.perf_counter() - start < time_s / 2:
        cached_total += _read_front_to_back(paths, time_s, max_bytes=total)[0]
    return total / max(elapsed, 1e-9), cached_total / max(time.perf_counter() - start, 1e-9)


def measure_sequential_read(paths: list[str], time_s: float = 1.0, cold: bool = True) -> float:
    """Bytes per second reading ``paths`` (large files: shards) front to back in big chunks.

    Args:
        paths: the files, read in order until ``time_s`` has passed.
        time_s: about how long to read.
        cold: drop the files from the page cache first (where the OS allows).
    """
    if cold:
        evict_from_page_cache(paths)
    total, elapsed = _read_front_to_back(paths, time_s)
    return total / max(elapsed, 1e-9)
