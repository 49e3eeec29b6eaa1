"""Shards against plain files, side by side, as fractions of this machine's limits.

Generates DigiFace-like (112x112 RGBA PNG, class folders) and CelebA-like (178x218 JPEG,
label file, cropped to 138x138) data, packs each into ``encoded`` and ``pixels`` shards,
and times every way of loading them at batch 256, output uint8 3x112x112, on the CPU:

* the plain file Dataset (the foundation's ``ClassFolderDataset``/``LabelFileDataset``),
* ``encoded`` shards (decode + crop + resize when read),
* ``pixels`` shards (no decoding: gather rows from memory-mapped files),

each in-process (0 workers), with worker processes and with threads. In the same run it
measures the limits no loader can beat: the decode limit (one core's decode + crop +
resize rate of this data, times the cores a method uses) and the memory-copy rate
(single-core ``copy_`` of a 64 MiB buffer, as bytes of a batch per second). Each limit is
measured again right before the method it bounds, so a busy moment on a shared machine
lowers both. The CPU-efficiency column (CPU time the images need at the one-core limit
over the CPU time the method used) does not depend on other load at all.

Run::

    python benchmarks/bench_shards.py --n 20000
    python benchmarks/bench_shards.py --quick   # 2,000 images, 3 s per method

The data is generated (and packed) once per ``--out`` folder and reused. All files are in
the page cache when timed (they were just written), so storage speed is not measured.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.decode.image import decode_sample, resize  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.packer import pack  # noqa: E402
from stoker.shards import ShardDataset  # noqa: E402
from stoker.sources import ClassFolderDataset, FileDataset, LabelFileDataset  # noqa: E402

SIZE = (112, 112)
CELEBA_CROP = (40, 20, 138, 138)  # (top, left, height, width) of the 178x218 images
BATCH = 256


# -- data ------------------------------------------------------------------------------


def _own_generator(kind: str, root: Path, n: int, classes: int) -> None:
    """Fallback when stoker.sources.synthetic is not there: noisy images, right sizes and formats."""
    from PIL import Image

    rng = np.random.default_rng(0)
    if kind == "digiface":
        for i in range(n):
            folder = root / str(i % classes)
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 255, (112, 112, 4), dtype=np.uint8)
            pixels[..., 3] = 255
            Image.fromarray(pixels, "RGBA").save(folder / f"{i // classes}.png")
    else:
        (root / "img").mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(n):
            name = f"{i + 1:06d}.jpg"
            Image.fromarray(rng.integers(0, 255, (218, 178, 3), dtype=np.uint8)).save(root / "img" / name, quality=90)
            lines.append(f"{name} {i % classes + 1}")
        (root / "identity_CelebA.txt").write_text("\n".join(lines) + "\n")


def make_data(kind: str, root: Path, n: int, classes: int) -> None:
    if (root / ".complete").exists():
        return
    try:
        from stoker.sources import synthetic

        maker = synthetic.make_digiface if kind == "digiface" else synthetic.make_celeba
        maker(root, n, seed=0, classes=classes, progress=True, overwrite=True)
    except ImportError:
        _own_generator(kind, root, n, classes)
    (root / ".complete").write_text("")


def file_dataset(kind: str, root: Path) -> FileDataset:
    to_size = functools.partial(resize, size=SIZE)
    if kind == "digiface":
        return ClassFolderDataset(root, transform=to_size)
    return LabelFileDataset(root / "img", root / "identity_CelebA.txt", crop=CELEBA_CROP, transform=to_size)


# -- limits ------------------------------------------------------------------------------


def decode_rate(dataset: FileDataset, seconds: float) -> float:
    """Images per second one core decodes, crops and resizes (512 files, already read)."""
    rows = np.random.default_rng(0).permutation(len(dataset))[:512]
    blobs = [(dataset.read_bytes(int(i)), str(dataset.index.paths[i]), dataset.index.crop_of(int(i))) for i in rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or done < 64:
            for data, name, box in blobs:
                resize(decode_sample(data, name, box), SIZE)
                done += 1
                if done % 64 == 0 and time.perf_counter() - start >= seconds:
                    break
    finally:
        torch.set_num_threads(threads)
    return done / elapsed


def memcpy_rate(seconds: float) -> float:
    """Bytes per second one core copies between two 64 MiB buffers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(64 << 20, dtype=torch.uint8)
        dst = torch.zeros_like(src)
        dst.copy_(src)
        copies, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or copies < 3:
            dst.copy_(src)
            copies += 1
    finally:
        torch.set_num_threads(threads)
    return copies * (64 << 20) / elapsed


# -- timing --------------------------------------------------------------------------------


@dataclass
class Result:
    data: str
    method: str
    backend: str
    workers: int
    img_per_s: float
    limit_name: str
    limit_img_per_s: float
    checked: str
    cpu_efficiency: float


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its live children (loader workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def time_loader(loader: object, n: int, seconds: float) -> tuple[float, float, float, str]:
    """Images per second after the first batch, over about ``seconds``: whole epochs for fast
    methods, part of the first epoch for slow ones; and a check that every whole epoch
    delivered ``n`` samples."""
    seen, start, complete = 0, None, []
    while True:
        total, stopped = 0, False
        for images, labels in loader:  # type: ignore[attr-defined]
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, *SIZE):
                raise RuntimeError(f"unexpected batch {images.dtype} {tuple(images.shape)}")
            total += len(labels)
            if start is None:  # the first batch pays for starting workers and opening files
                start, cpu_start = time.perf_counter(), cpu_seconds()
                continue
            seen += len(labels)
            if not complete and time.perf_counter() - start >= seconds:
                stopped = True
                break
        if not stopped:
            complete.append(total)
        if stopped or time.perf_counter() - start >= seconds:  # type: ignore[operator]
            break
    elapsed = time.perf_counter() - start  # type: ignore[operator]
    cpu = cpu_seconds() - cpu_start
    if not complete:
        checked = "part of an epoch"
    elif all(c == n for c in complete):
        checked = f"{len(complete)} epoch(s), complete"
    else:
        checked = f"WRONG: epochs of {complete}, expected {n}"
    return seen / max(elapsed, 1e-9), elapsed, cpu, checked


def run(
    results: list[Result], data: str, method: str, dataset: object, backend: str, workers: int,
    seconds: float, limit: tuple[str, float, int],
) -> None:
    loader = make_loader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, device=None,  # type: ignore[arg-type]
                         backend=backend, prefetch_factor=4, persistent_workers=True)
    rate, timed_s, cpu, checked = time_loader(loader, len(dataset), seconds)  # type: ignore[arg-type]
    del loader
    # CPU efficiency: the CPU time the images need at the one-core rate of the limit, over
    # the CPU time the method used. Unlike img/s it hardly depends on what else runs here.
    name, per_core, cores_used = limit
    efficiency = (rate * timed_s / per_core) / cpu if cpu > 0 else float("nan")
    results.append(Result(data, method, backend, workers, rate, name, per_core * cores_used, checked, efficiency))
    print(f"  {method:<16} {backend:<8} w{workers}  {rate:>10,.0f} img/s  ({rate / (per_core * cores_used):.0%} of {name}; "
          f"CPU efficiency {efficiency:.0%})", file=sys.stderr, flush=True)


def bench_kind(kind: str, root: Path, n: int, classes: int, seconds: float, cores: int) -> tuple[list[Result], dict[str, float]]:
    data_dir = root / kind
    print(f"[{kind}] generating {n} images in {data_dir}", file=sys.stderr, flush=True)
    make_data(kind, data_dir, n, classes)
    files = file_dataset(kind, data_dir)
    crop = CELEBA_CROP if kind == "celeba" else None
    packed = {}
    for store in ("encoded", "pixels"):
        out = root / f"{kind}-{store}"
        start = time.perf_counter()
        source = [data_dir] if kind == "digiface" else [data_dir]
        manifest = pack(source, out, store=store, size=SIZE, crop=crop, seed=0, progress=False, workers=cores)
        print(f"[{kind}] packed {store}: {manifest.bytes / 2**20:,.0f} MiB in {len(manifest.shards)} shards, "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        packed[store] = out

    # The machine may be shared, so each limit is measured again right before the method it
    # bounds, and each method is compared with the limit of its own moment.
    row_bytes = 3 * SIZE[0] * SIZE[1]

    def decode_limit(workers: int) -> tuple[str, float, int]:
        used = min(max(workers, 1), cores)
        return f"decode x{used}", decode_rate(files, max(seconds / 3, 1.0)), used

    def memcpy_limit(workers: int) -> tuple[str, float, int]:
        return "memcpy", memcpy_rate(max(seconds / 6, 0.5)) / row_bytes, 1

    results: list[Result] = []
    encoded = ShardDataset(packed["encoded"])
    pixels = ShardDataset(packed["pixels"])
    plan: list[tuple[str, object, str, int, Callable[[int], tuple[str, float, int]]]] = [
        ("files", files, "process", 0, decode_limit),
        ("files", files, "process", cores, decode_limit),
        ("files", files, "thread", cores, decode_limit),
        ("encoded shards", encoded, "process", 0, decode_limit),
        ("encoded shards", encoded, "process", cores, decode_limit),
        ("encoded shards", encoded, "thread", cores, decode_limit),
        ("pixels shards", pixels, "process", 0, memcpy_limit),
        ("pixels shards", pixels, "thread", 1, memcpy_limit),
        ("pixels shards", pixels, "thread", cores, memcpy_limit),
        ("pixels shards", pixels, "process", cores, memcpy_limit),
    ]
    for method, dataset, backend, workers, limit in plan:
        run(results, kind, method, dataset, backend, workers, seconds, limit(workers))
    decode = [r.limit_img_per_s / int(r.limit_name.split("x")[-1]) for r in results if r.limit_name.startswith("decode")]
    copy = [r.limit_img_per_s for r in results if r.limit_name == "memcpy"]
    limits = {"decode_1core": float(np.median(decode)), "memcpy_img_per_s": float(np.median(copy))}
    print(f"[{kind}] decode+crop+resize {limits['decode_1core']:,.0f} img/s on 1 core (median); memcpy "
          f"{limits['memcpy_img_per_s'] * row_bytes / 1e9:.2f} GB/s = {limits['memcpy_img_per_s']:,.0f} img/s of 3x112x112 "
          "(median)", file=sys.stderr, flush=True)
    return results, limits


def table(results: list[Result], limits: dict[str, dict[str, float]]) -> str:
    lines = [
        "| data | method | backend | workers | img/s | limit (img/s) | % of limit | CPU efficiency | x files (2 workers) | epochs |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in results:
        base = next(x.img_per_s for x in results if x.data == r.data and x.method == "files" and x.backend == "process" and x.workers > 0)
        backend = "in-process" if r.workers == 0 else r.backend
        lines.append(
            f"| {r.data} | {r.method} | {backend} | {r.workers} | {r.img_per_s:,.0f} | {r.limit_name} "
            f"({r.limit_img_per_s:,.0f}) | {r.img_per_s / r.limit_img_per_s:.0%} | {r.cpu_efficiency:.0%} | "
            f"{r.img_per_s / base:.1f}x | {r.checked} |"
        )
    return "\n".join(lines)


def verdict(results: list[Result]) -> str:
    """The issue's targets, each marked met or not, from this run's numbers."""

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def where(r: Result) -> str:
        return "in-process" if r.workers == 0 else f"{r.backend}, {r.workers} workers"

    out = []
    for data in dict.fromkeys(r.data for r in results):
        rows = [r for r in results if r.data == data]
        base = next(r.img_per_s for r in rows if r.method == "files" and r.backend == "process" and r.workers > 0)
        encoded = [r for r in rows if r.method == "encoded shards"]
        single = max((r for r in encoded if r.workers <= 1), key=lambda r: r.img_per_s / r.limit_img_per_s)
        multi = max((r for r in encoded if r.workers > 1), key=lambda r: r.img_per_s / r.limit_img_per_s)
        pix = max((r for r in rows if r.method == "pixels shards"), key=lambda r: r.img_per_s / r.limit_img_per_s)
        fastest = max((r for r in rows if r.method == "pixels shards"), key=lambda r: r.img_per_s)
        for r, limit in ((single, 0.9), (multi, 0.9)):
            share = r.img_per_s / r.limit_img_per_s
            out.append(f"- {data}: encoded shards, {where(r)}: {share:.0%} of {r.limit_name} "
                       f"(CPU efficiency {r.cpu_efficiency:.0%}); target >= 90%: {mark(share >= limit)}")
        share = pix.img_per_s / pix.limit_img_per_s
        out.append(f"- {data}: pixels shards, {where(pix)}: {share:.0%} of memcpy; target >= 60%: {mark(share >= 0.6)}")
        out.append(f"- {data}: pixels shards, {where(fastest)}: {fastest.img_per_s / base:.0f}x plain files with "
                   f"{next(r.workers for r in rows if r.method == 'files' and r.workers > 0)} worker processes; "
                   f"target >= 20x: {mark(fastest.img_per_s >= 20 * base)}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="images per data set (default 20000)")
    parser.add_argument("--classes", type=int, default=100, help="classes per data set")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds each method is timed (at most one epoch)")
    parser.add_argument("--quick", action="store_true", help="2,000 images and 3 s per method")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "stoker-bench-shards",
                        help="working folder; its data is reused by later runs (default: a folder in the temp dir)")
    parser.add_argument("--only", choices=["digiface", "celeba"], help="run one data set only")
    args = parser.parse_args()
    n, seconds = (2_000, 3.0) if args.quick else (args.n, args.seconds)
    # One torch thread here, as in DataLoader workers: the in-process and thread methods are
    # then measured on the cores they claim, and torch's thread pool does not spin against
    # the loader's own processes and threads (or anything else running on the machine).
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    root = args.out / f"n{n}"
    root.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    limits: dict[str, dict[str, float]] = {}
    for kind in (args.only,) if args.only else ("digiface", "celeba"):
        found, limits[kind] = bench_kind(kind, root, n, args.classes, seconds, cores)
        results.extend(found)
    command = "python benchmarks/bench_shards.py " + " ".join(sys.argv[1:])
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"\n`{command}` — {n:,} images per data set, batch {BATCH}, uint8 3x112x112, {cores} cores, "
          f"torch {torch.__version__}, 1 torch thread in the timing process, files in the page cache, "
          f"load average at the end {load}\n")
    for kind, found in limits.items():
        print(f"- {kind}: decode + crop + resize {found['decode_1core']:,.0f} img/s per core, memory copy "
              f"{found['memcpy_img_per_s'] * 3 * SIZE[0] * SIZE[1] / 1e9:.1f} GB/s = {found['memcpy_img_per_s']:,.0f} "
              "img/s (medians of the measurements taken before each method)")
    print()
    print(table(results, limits))
    print()
    print(verdict(results))


if __name__ == "__main__":
    main()
