"""The guided tour behind ``stoker demo``: generate data, load it every way, and say where things are."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from stoker.data import open_data
from stoker.loading import make_loader
from stoker.sources.synthetic import make_data
from stoker.terminal import bars_shown

__all__ = ["DemoData", "LoadRate", "generate", "measure_load", "run_demo"]

Echo = Callable[[str], None]


@dataclass(frozen=True)
class DemoData:
    """Where the demo's generated data sets are."""

    celeba: Path
    digiface: Path
    ids: Path


@dataclass(frozen=True)
class LoadRate:
    """One epoch of one layout through one loader setting."""

    layout: str
    workers: int
    samples: int
    seconds: float

    @property
    def img_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def generate(root: Path, n: int, classes: int, seed: int = 0, progress: bool = True) -> DemoData:
    """Write the three synthetic layouts under ``root/data`` (reused when already there)."""
    data = root / "data"
    paths = DemoData(celeba=data / "celeba", digiface=data / "digiface", ids=data / "ids")
    for kind, path in (("celeba", paths.celeba), ("digiface", paths.digiface), ("ids", paths.ids)):
        marker = path / ".stoker-demo"
        wanted = f"{kind} n={n} classes={classes} seed={seed}\n"
        if marker.exists() and marker.read_text() == wanted:
            continue  # made by an earlier run with the same settings
        make_data(kind, path, n=n, seed=seed, classes=classes, progress=progress, overwrite=True)
        marker.write_text(wanted)
    return paths


def accuracy_gap_note(train_acc: float, valid_acc: float) -> str | None:
    """Why epoch 1's valid accuracy can be far above its train accuracy, when it is (else ``None``).

    Train accuracy is the mean over the epoch's batches, counted while the model learns
    (the first batches at chance); valid accuracy is measured after the epoch, with its
    last weights. On data as easy as the demo's, the model is near its best by then.
    """
    if not valid_acc - train_acc > 0.1:  # NaN (no validation) says nothing either
        return None
    return (f"   Epoch 1: valid accuracy {valid_acc:.2f} against train {train_acc:.2f}. Train accuracy is the mean "
            "over the epoch, counted while the model learns from chance; valid accuracy is measured after the "
            "epoch, with its last weights. The demo's classes are easy to tell apart, so the model is near its best "
            "by then, and later epochs gain little.")


def measure_load(name: str, dataset: Dataset, workers: int, batch_size: int = 64) -> LoadRate:
    """Time one full epoch of ``dataset`` through ``make_loader`` (after the workers start)."""
    loader = make_loader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, device="cpu")
    batches = iter(loader)
    first = next(batches)  # worker start-up is not loading speed
    samples = len(first[1])
    start = time.perf_counter()
    for _, labels in batches:
        samples += len(labels)
    seconds = time.perf_counter() - start
    # the first batch was not timed: scale its samples out of the rate
    timed = samples - len(first[1])
    return LoadRate(name, workers, samples, seconds * samples / max(timed, 1))


def run_demo(root: Path, n: int = 600, classes: int = 10, workers: tuple[int, ...] = (0, 2), echo: Echo = print) -> None:
    """The tour: generate, load every layout, pack and verify, read shards, train, benchmark.

    Leaves ``data/``, ``packed/``, ``runs/`` and ``bench/`` (``bench.md``, ``bench.json``,
    ``bench.png``, as ``stoker bench`` writes them) under ``root``.
    """
    from stoker.bench import quick_bench
    from stoker.packer import pack
    from stoker.shards import verify
    from stoker.train import demo_run

    start = time.perf_counter()
    echo(f"1. Generating {n} images in each of three layouts under {root / 'data'} ...")
    data = generate(root, n, classes, progress=bars_shown())
    # open_data detects each layout; the classes stoker.LabelFileDataset, ClassFolderDataset
    # and IdDataset open one layout directly.
    layouts: dict[str, Dataset] = {
        "celeba (label file, JPEG 178x218)": open_data(data.celeba, "train", label_order="sorted"),  # identities from 1
        "digiface (class folders, RGBA PNG 112x112)": open_data(data.digiface, "train"),
        "ids (partition + labels, .pt 64x64)": open_data(data.ids, "train"),
    }
    echo("\n2. One epoch of each layout through make_loader (batch 64):\n")
    echo(f"   {'layout':<44} {'workers':>7} {'samples':>8} {'img/s':>9}")
    for name, dataset in layouts.items():
        for w in workers:
            rate = measure_load(name, dataset, w)
            echo(f"   {name:<44} {w:>7} {rate.samples:>8} {rate.img_per_s:>9.0f}")

    packed = root / "packed"
    echo(f"\n3. Packing digiface into shuffled, checksummed Arrow shards under {packed} ...")
    for store in ("encoded", "pixels"):
        out = packed / store
        manifest = pack(data.digiface, out, store=store, size=(112, 112), valid=0.2, seed=0,
                        shard_samples=max(n // 4, 1), overwrite=True, progress=bars_shown())  # a bar on a terminal
        report = verify(out, workers=0)
        shard_bytes = sum(info.bytes for info in manifest.shards)
        echo(f"   {store:<8} {len(manifest.shards)} shards, {shard_bytes / 2**20:6.1f} MB  verify: {report.summary()}")
        train_split = open_data(out, "train")
        for w in workers:
            rate = measure_load(f"shards-{store}", train_split, w)
            echo(f"   {'':<8} read one epoch with {w} worker{'' if w == 1 else 's'}: {rate.img_per_s:>9.0f} img/s")

    echo("\n4. Training a small CNN on the pixel shards (CPU is fine) ...\n")
    result = demo_run(packed / "pixels", root / "runs", epochs=4, image_size=64, workers=0, echo=echo)
    if result.history.epochs:
        first = result.history.epochs[0]
        note = accuracy_gap_note(first.train_acc, first.valid_acc)
        if note:
            echo(note)
    echo(result.where())

    echo("\n5. Benchmark: every loading method on the digiface data, side by side (a minute or less) ...\n")
    bench_dir = root / "bench"
    quick_bench(data.digiface, echo=echo, workers=workers, out=bench_dir)

    echo(f"\nDone in {time.perf_counter() - start:.0f} s. Everything is under {root}:")
    echo(f"   data      {root / 'data'}   (make your own: stoker make-data --help)")
    echo(f"   shards    {packed}   (stoker inspect {packed / 'pixels'} --grid grid.png)")
    echo(f"   runs      {root / 'runs'}   (tensorboard --logdir {root / 'runs'})")
    echo(f"   bench     {bench_dir / 'bench.md'}   (the table and its notes)")
    echo(f"             {bench_dir / 'bench.json'}   (every run's figures)")
    echo(f"             {bench_dir / 'bench.png'}   (the chart)")
