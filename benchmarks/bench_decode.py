"""Gather, JPEG, PNG and nvJPEG paths side by side, as ratios measured in one run.

Generates DigiFace-like (112x112 RGBA PNG, class folders) and CelebA-like (178x218 JPEG,
label file, crop ``(40, 20, 138, 138)``) data, packs it, and measures, at batch 256 and
uint8 3x112x112 out:

1. **gather**: a random batch gathered from pixel shards (many shards and record batches)
   by ``ShardSet.gather_pixels`` (one fancy index over every shard), by
   ``ShardSet.read_pixels`` into a given buffer with 1 and 2 copying threads, and through
   ``make_loader`` with the settings it picks (``loader_defaults``) and with 2 loader
   threads, against one single-threaded numpy fancy-index gather over one memory-mapped
   array of the same pixels. Limits: the memory-copy rate of the mapped pixels (2 threads
   copying contiguous runs into a reused buffer), the best a 2-thread gather can do (numpy
   ``take`` into a given buffer over one array, 2 threads), and a copy of a cache-resident
   buffer (what the memory system gives when the source is in cache: not reachable by a
   gather of a data set larger than the cache);
2. **jpeg**: encoded CelebA shards (fast decode into reused buffers, batched resize: the default;
   and ``decoder="full"``) against a hand-written torchvision Dataset + DataLoader with 2
   workers on the same files, and against the full-decode limit (one core's
   decode + crop + resize rate of the full path, times 2; the fast path does less work
   and may beat it). Next to it, the same full path run by 2 processes at once with no
   loader: what the two cores give together, which can be less than twice one;
3. **png**: encoded DigiFace shards with worker processes against the thread backend
   (their default follows this), as fractions of the PNG decode limit (one core's rate of
   the full per-image path, ``ShardSet.decode``, times 2), and the same run by 2
   processes at once;
4. **nvjpeg**: ``decoder="nvjpeg"`` (on the GPU when there is one; otherwise its CPU
   fallback, marked so).

Every method is timed once per round and the rounds are interleaved (A/B/A/B), since a
shared machine's speed drifts; the table shows medians over the rounds.

Run::

    python benchmarks/bench_decode.py --n 6000 --rounds 3
    python benchmarks/bench_decode.py --n 64 --seconds 0.2 --rounds 1   # smoke test
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.decode.image import decode_sample, resize  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.packer import pack  # noqa: E402
from stoker.shards import ShardDataset  # noqa: E402
from stoker.sources.synthetic import make_celeba, make_digiface  # noqa: E402

SIZE = (112, 112)
CELEBA_CROP = (40, 20, 138, 138)
BATCH = 256


# -- data ------------------------------------------------------------------------------


def prepare(root: Path, n: int, classes: int, cores: int) -> dict[str, Path]:
    """Generate and pack the data once per folder (reused by later runs)."""
    paths = {"digiface": root / "digiface", "celeba": root / "celeba"}
    if not (root / ".complete").exists():
        make_digiface(paths["digiface"], n, classes=classes, workers=cores, progress=False, overwrite=True)
        make_celeba(paths["celeba"], n, classes=classes, workers=cores, progress=False, overwrite=True)
        # small shards and record batches, so a random batch spans many of each
        shard_bytes = max(1 << 20, n * 3 * SIZE[0] * SIZE[1] // 8)
        pack([paths["digiface"]], root / "pixels", store="pixels", size=SIZE, seed=0, progress=False,
             workers=cores, shard_bytes=shard_bytes, overwrite=True)
        pack([paths["digiface"]], root / "png", store="encoded", size=SIZE, seed=0, progress=False,
             workers=cores, overwrite=True)
        pack([paths["celeba"]], root / "jpeg", store="encoded", size=SIZE, crop=CELEBA_CROP, seed=0,
             progress=False, workers=cores, overwrite=True, label_order="sorted")
        (root / ".complete").write_text("")
    return {**paths, "pixels": root / "pixels", "png": root / "png", "jpeg": root / "jpeg"}


# -- timing ------------------------------------------------------------------------------


def rate_of(step: Callable[[], int], seconds: float) -> float:
    """Items per second of ``step`` (which returns how many it did), after one warm-up call."""
    step()
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done == 0:
        done += step()
    return done / elapsed


def loader_rate(make: Callable[[], object], seconds: float) -> Callable[[], float]:
    """A timer of a loader: images per second after its first batch, whole epochs until ``seconds``."""

    def timed() -> float:
        loader = make()
        seen, start = 0, None
        while start is None or time.perf_counter() - start < seconds:
            for images, labels in loader:  # type: ignore[attr-defined]
                if tuple(images.shape[1:]) != (3, *SIZE):
                    raise RuntimeError(f"unexpected batch {tuple(images.shape)}")
                if start is None:
                    start = time.perf_counter()
                    continue
                seen += len(labels)
        rate = seen / (time.perf_counter() - start)
        del loader
        return rate

    return timed


def one_core_rate(work: Callable[[int], object], count: int, seconds: float) -> float:
    """Images per second of ``work(i)`` on one core (one torch thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        position = [0]

        def step() -> int:
            for _ in range(16):
                work(position[0] % count)
                position[0] += 1
            return 16

        return rate_of(step, seconds)
    finally:
        torch.set_num_threads(threads)


# What the processes of cores_at_once_rate run: filled before any of them is forked.
_AT_ONCE: dict[str, tuple[Callable[[int], object], int]] = {}


def _at_once_child(name: str, seconds: float, results: Any) -> None:
    work, count = _AT_ONCE[name]
    results.put(one_core_rate(work, count, seconds))


def cores_at_once_rate(name: str, work: Callable[[int], object], count: int, seconds: float, processes: int) -> Callable[[], float]:
    """A timer of ``work(i)`` on ``processes`` forked processes at the same time: their rates summed.

    It is the same work as :func:`one_core_rate` times the cores, but measured on all of
    them together: two cores busy at once can give less than twice one (a shared cache,
    the host's scheduling of a virtual machine, another program on the second core), and
    no loader can beat what they give. It is shown next to the "1 core x N" limit, not
    in its place.
    """
    _AT_ONCE[name] = (work, count)

    def timed() -> float:
        context = multiprocessing.get_context("fork")
        results = context.SimpleQueue()
        children = [context.Process(target=_at_once_child, args=(name, seconds, results)) for _ in range(processes)]
        for child in children:
            child.start()
        rates = [results.get() for _ in children]
        for child in children:
            child.join()
        return float(sum(rates))

    return timed


# -- the four parts -----------------------------------------------------------------------


class TorchvisionFiles(torch.utils.data.Dataset):
    """The hand-written baseline: read a file, ``torchvision.io.decode_image``, crop, resize."""

    def __init__(self, files: list[Path], labels: list[int], box: tuple[int, int, int, int] | None) -> None:
        self.files, self.labels, self.box = files, labels, box

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import ImageReadMode, decode_image, read_file
        from torchvision.transforms.v2 import functional as F

        image = decode_image(read_file(str(self.files[i])), mode=ImageReadMode.RGB)
        if self.box is not None:
            top, left, height, width = self.box
            image = image[:, top : top + height, left : left + width]
        return F.resize(image, list(SIZE), antialias=True), self.labels[i]


def celeba_files(root: Path) -> tuple[list[Path], list[int]]:
    lines = (root / "identity_CelebA.txt").read_text().split()
    return [root / "img" / name for name in lines[0::2]], [int(x) - 1 for x in lines[1::2]]


def methods(paths: dict[str, Path], seconds: float, cores: int) -> dict[str, tuple[str, Callable[[], float]]]:
    """name -> (part, timer returning img/s); a round calls every timer once."""
    found: dict[str, tuple[str, Callable[[], float]]] = {}
    workers = min(2, cores)

    # 1. gather -----------------------------------------------------------------------
    pixels = ShardDataset(paths["pixels"])
    shards = pixels.shards
    n, row_bytes = len(shards), shards.row_bytes
    one = Path(paths["pixels"]).parent / "one-array.npy"
    if not one.exists():
        array = np.lib.format.open_memmap(one, "w+", np.uint8, (n, row_bytes))
        shards.read_pixels(np.arange(n), array)
        array.flush()
        del array
    flat = np.load(one, mmap_mode="r")
    batch = min(BATCH, n)
    order = np.random.default_rng(0).permutation(n)
    cursor = [0]

    def next_indices() -> np.ndarray:
        if cursor[0] + batch > n:
            cursor[0] = 0
        cursor[0] += batch
        return order[cursor[0] - batch : cursor[0]]

    def numpy_gather() -> int:
        flat[next_indices()]  # a fresh array, as a loader's batch is
        return batch

    def stoker_gather(threads: int) -> Callable[[], int]:
        def step() -> int:
            out = np.empty((batch, row_bytes), dtype=np.uint8)
            shards.read_pixels(next_indices(), out, threads=threads)
            return batch

        return step

    src, dst = np.ones((batch, row_bytes), np.uint8), np.empty((batch, row_bytes), np.uint8)
    threading_pool = ThreadPoolExecutor(1)
    runs = itertools.cycle(np.random.default_rng(1).integers(0, max(1, n - batch), 64).tolist())

    def two_threads(copy: Callable[[slice], None]) -> int:
        half = slice(0, batch // 2)
        done = threading_pool.submit(copy, half)
        copy(slice(batch // 2, batch))
        done.result()
        return batch

    def memcpy_mapped() -> int:  # contiguous runs of the mapped pixels: what a gather reads, at memory speed
        first = next(runs)
        return two_threads(lambda part: np.copyto(dst[part], flat[first + part.start : first + part.stop]))

    def numpy_take_two() -> int:  # the best a 2-thread gather can do: one array, a given buffer, no Python per row
        indices = next_indices()
        return two_threads(lambda part: np.take(flat, indices[part], axis=0, out=dst[part], mode="clip"))

    def gather_pixels(threads: int) -> Callable[[], int]:
        def step() -> int:
            shards.gather_pixels(next_indices(), threads=threads)
            return batch

        return step

    found["numpy fancy-index, 1 thread (baseline)"] = ("gather", lambda: rate_of(numpy_gather, seconds))
    found["memory copy from the memory map, 2 threads (limit)"] = ("gather", lambda: rate_of(memcpy_mapped, seconds))
    found["memory copy of a cache-resident buffer, 2 threads"] = (
        "gather", lambda: rate_of(lambda: two_threads(lambda part: np.copyto(dst[part], src[part])), seconds))
    found["numpy take into a buffer, one array, 2 threads"] = ("gather", lambda: rate_of(numpy_take_two, seconds))
    found["gather_pixels, 1 thread (one fancy index over every shard)"] = ("gather", lambda: rate_of(gather_pixels(1), seconds))
    found["gather_pixels, 2 threads (into a reused buffer)"] = ("gather", lambda: rate_of(gather_pixels(2), seconds))
    found["read_pixels into a buffer, 1 thread"] = ("gather", lambda: rate_of(stoker_gather(1), seconds))
    found["read_pixels into a buffer, 2 threads"] = ("gather", lambda: rate_of(stoker_gather(2), seconds))
    defaults = pixels.loader_defaults
    found[f"make_loader pixels, defaults {defaults}"] = ("gather", loader_rate(
        lambda: make_loader(pixels, batch_size=BATCH, shuffle=True, device=None), seconds))
    one_thread = ShardDataset(paths["pixels"])
    one_thread.shards.gather_threads = 1
    found["make_loader pixels, in-process, 1 gather thread"] = ("gather", loader_rate(
        lambda: make_loader(one_thread, batch_size=BATCH, shuffle=True, device=None, num_workers=0), seconds))
    two_threads_each = ShardDataset(paths["pixels"])
    two_threads_each.shards.gather_threads = 2
    found["make_loader pixels, in-process, 2 gather threads"] = ("gather", loader_rate(
        lambda: make_loader(two_threads_each, batch_size=BATCH, shuffle=True, device=None, num_workers=0), seconds))
    found["make_loader pixels, loader threads x2, 1 gather thread each"] = ("gather", loader_rate(
        lambda: make_loader(one_thread, batch_size=BATCH, shuffle=True, device=None, backend="thread", num_workers=2),
        seconds))

    # 2. JPEG -------------------------------------------------------------------------
    files, labels = celeba_files(paths["celeba"])
    blobs = [f.read_bytes() for f in files[:512]]
    def full_decode(i: int) -> torch.Tensor:
        return resize(decode_sample(blobs[i], "x.jpg", CELEBA_CROP), SIZE)

    found["full decode limit (1 core x 2)"] = ("jpeg", lambda: workers * one_core_rate(full_decode, len(blobs), seconds / 2))
    found["full decode, 2 processes at once, no loader"] = (
        "jpeg", cores_at_once_rate("jpeg", full_decode, len(blobs), seconds / 2, workers))
    baseline = TorchvisionFiles(files, labels, CELEBA_CROP)
    found["torchvision Dataset + DataLoader, 2 workers (baseline)"] = ("jpeg", loader_rate(
        lambda: torch.utils.data.DataLoader(baseline, batch_size=BATCH, shuffle=True, num_workers=workers,
                                            persistent_workers=True, prefetch_factor=4), seconds))
    jpeg = ShardDataset(paths["jpeg"])
    found[f"encoded JPEG shards, defaults {jpeg.loader_defaults}"] = ("jpeg", loader_rate(
        lambda: make_loader(jpeg, batch_size=BATCH, shuffle=True, device=None), seconds))
    found["encoded JPEG shards, processes x2"] = ("jpeg", loader_rate(
        lambda: make_loader(jpeg, batch_size=BATCH, shuffle=True, device=None, backend="process", num_workers=workers,
                            persistent_workers=True), seconds))
    full = ShardDataset(paths["jpeg"], decoder="full")
    found["encoded JPEG shards, decoder=full, threads x2"] = ("jpeg", loader_rate(
        lambda: make_loader(full, batch_size=BATCH, shuffle=True, device=None, backend="thread", num_workers=workers),
        seconds))
    found["encoded JPEG shards, decoder=full, processes x2"] = ("jpeg", loader_rate(
        lambda: make_loader(full, batch_size=BATCH, shuffle=True, device=None, backend="process", num_workers=workers,
                            persistent_workers=True), seconds))

    # 3. PNG --------------------------------------------------------------------------
    png = ShardDataset(paths["png"])
    png_shard, png_row = png.shards.locate(np.arange(min(512, len(png))))
    png_rows = list(zip(png_shard.tolist(), png_row.tolist(), strict=True))
    def png_decode(i: int) -> torch.Tensor:
        return png.shards.decode(*png_rows[i])

    found["PNG decode limit (1 core x 2)"] = ("png", lambda: workers * one_core_rate(png_decode, len(png_rows), seconds / 2))
    found["PNG decode, 2 processes at once, no loader"] = (
        "png", cores_at_once_rate("png", png_decode, len(png_rows), seconds / 2, workers))
    found["encoded PNG shards, processes x2"] = ("png", loader_rate(
        lambda: make_loader(png, batch_size=BATCH, shuffle=True, device=None, backend="process", num_workers=workers,
                            persistent_workers=True), seconds))
    found["encoded PNG shards, threads x2"] = ("png", loader_rate(
        lambda: make_loader(png, batch_size=BATCH, shuffle=True, device=None, backend="thread", num_workers=workers),
        seconds))

    # 4. nvJPEG -----------------------------------------------------------------------
    where = "GPU" if torch.cuda.is_available() else "no CUDA: its CPU fallback"
    nv = ShardDataset(paths["jpeg"], decoder="nvjpeg")
    found[f"encoded JPEG shards, decoder=nvjpeg ({where}), thread x1"] = ("nvjpeg", loader_rate(
        lambda: make_loader(nv, batch_size=BATCH, shuffle=True, device=None, **nv.loader_defaults), seconds))
    return found


BASELINE = {
    "gather": "numpy fancy-index, 1 thread (baseline)",
    "jpeg": "torchvision Dataset + DataLoader, 2 workers (baseline)",
    "png": "encoded PNG shards, processes x2",
    "nvjpeg": "full decode limit (1 core x 2)",
}
LIMIT = {"gather": "memory copy from the memory map, 2 threads (limit)", "jpeg": "full decode limit (1 core x 2)",
         "png": "PNG decode limit (1 core x 2)", "nvjpeg": "full decode limit (1 core x 2)"}


def table(rates: dict[str, list[float]], parts: dict[str, str]) -> str:
    """Medians over the rounds; each ratio is taken within a round (the method against the
    baseline timed seconds before it), then the median of those ratios is shown."""
    lines = ["| part | method | img/s (median) | x baseline | % of limit | x baseline by round |",
             "|---|---|---:|---:|---:|---|"]
    for name, values in rates.items():
        part = parts[name]
        base = np.asarray(values) / np.asarray(rates[BASELINE[part]])
        limit = np.asarray(values) / np.asarray(rates[LIMIT[part]])
        lines.append(
            f"| {part} | {name} | {np.median(values):,.0f} | {np.median(base):.2f}x | {np.median(limit):.0%} | "
            f"{', '.join(f'{v:.2f}' for v in base)} |"
        )
    lines.append("")
    lines.append("Baselines: gather = one numpy fancy-index gather over one memory-mapped array; jpeg = torchvision "
                 "Dataset + DataLoader (2 workers); png = worker processes; nvjpeg = the CPU full-decode limit.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=6000, help="images per data set")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each method is timed per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    parser.add_argument("--only", nargs="+", choices=["gather", "jpeg", "png", "nvjpeg"], help="run these parts only")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "stoker-bench-decode")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in loader workers; the threads a method uses are its own
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    root = args.out / f"n{args.n}"
    root.mkdir(parents=True, exist_ok=True)
    print(f"[bench_decode] data in {root}", file=sys.stderr, flush=True)
    paths = prepare(root, args.n, args.classes, cores)
    found = methods(paths, args.seconds, cores)
    if args.only:
        keep_parts = set(args.only) | {"jpeg"} if "nvjpeg" in args.only else set(args.only)
        found = {k: v for k, v in found.items() if v[0] in keep_parts}
    rates: dict[str, list[float]] = {name: [] for name in found}
    for r in range(args.rounds):
        for name, (part, timer) in found.items():
            rates[name].append(timer())
            print(f"  round {r + 1} {part:<6} {name:<60} {rates[name][-1]:>10,.0f} img/s", file=sys.stderr, flush=True)
    command = "python benchmarks/bench_decode.py " + " ".join(sys.argv[1:])
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"\n`{command}` — {args.n:,} images per data set, batch {BATCH}, uint8 3x112x112, {cores} cores, "
          f"torch {torch.__version__}, {args.rounds} interleaved rounds, load average at the end {load}\n")
    print(table(rates, {name: part for name, (part, _) in found.items()}))


if __name__ == "__main__":
    main()
