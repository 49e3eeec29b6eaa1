"""stoker against its peers, in the settings stoker picks itself, inside a training process's thread setting.

Every comparison is a ratio of two methods timed one right after the other, in rounds
of A B B A (B A A B in the next round; each part half of ``--seconds``), at least 5 of
them, so a drift of the machine's load within a round cancels and a claim is never one
lucky round on a shared machine; the table shows each ratio's rounds, median and
spread. The measuring process runs ``torch.set_num_threads(1)``, as ``fit`` sets it on a
machine whose cores go to the loaders (max(1, cores - workers)). Generated data, batch
256, uint8 3x112x112 out:

- **jpeg**: CelebA-like JPEGs (178x218, crop ``(40, 20, 138, 138)``, resized to 112):
  encoded JPEG shards through ``make_loader`` with the settings the data set picks,
  against a hand-written torchvision Dataset + DataLoader (2 workers) on the same files,
  and against FFCV where ``import ffcv`` works (its Loader, 2 threads, over the same
  whole JPEGs, the same centred box cut and resized; ``pip install ffcv`` builds against
  OpenCV and libturbojpeg:
  ``apt-get install libopencv-dev libturbojpeg0-dev pkg-config`` first, then run this
  script with the python it was installed in). Also the same stoker loader with torch's
  default intra-op threads against 1 (its resize must not depend on it);
- **files**: the same CelebA-like JPEG files read as files: stoker's file data set
  (``open_data`` with the crop and ``image_size``, every guard on: paths inside the
  root, regular files only, the size and pixel limits, the error policy) through
  ``make_loader`` with 2 worker processes, against the hand-written torchvision Dataset +
  DataLoader with 2 workers (both prefetch 4, persistent workers): what stoker's reading
  of a file costs per sample beyond the decode and resize both do;
- **png**: DigiFace-like PNGs (112x112 RGBA): encoded PNG shards (stoker's pick) against
  the torchvision Dataset (2 workers) and against LitData (0 workers, where ``import
  litdata`` works);
- **pixels**: pixel shards through ``make_loader`` (its pick: in the training process)
  against a numpy memory-map fancy index in a DataLoader (0 workers), on a PNG-like layout
  (many small shards) and a JPEG-like one (one shard of several record batches), and
  against the 2-thread copy of the mapped pixels that ``benchmarks/bench_decode.py``
  calls the limit, against the data set's own ``__getitems__`` with no loader (what
  the loader's machinery costs per batch), the same holding the last batch (what writing
  into memory out of the cache costs), the copy limit again into two buffers in turn
  (what a loader whose user holds the last batch can reach), and against itself with two
  gather threads (``ShardSet.gather_threads = 2``; the default picks 1 or 2 by the cores'
  load), and against itself with torch's default intra-op threads (the cores: a user's
  own training loop, or ``fit`` with 0 workers) against 1 (its copying threads must not
  spread each copy over torch's threads).
  And ``ShardStream`` over the same pixel shards through ``make_loader`` (its defaults),
  against the map-style ``ShardDataset`` and against the same stream as it was read
  before its reads became the loader's batches: item by item (each sample handed out
  alone and stacked again) on 2 worker processes, the fallback it took then.

torch's intra-op threads are set back to 1 before every timing, since a peer may set
them for the whole process (FFCV's Loader calls ``torch.set_num_threads``).

Each loader is made once (persistent workers stay up); a timing starts a new pass and
counts the images after its first batch, whole passes until ``--seconds``.

Run::

    python benchmarks/bench_peers.py --n 6000 --rounds 5
    python benchmarks/bench_peers.py --quick   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.data import open_data  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.loading.collate import collate  # noqa: E402
from stoker.packer import pack  # noqa: E402
from stoker.shards import ShardDataset, ShardStream  # noqa: E402
from stoker.sources.synthetic import make_celeba, make_digiface  # noqa: E402

SIZE = (112, 112)
CROP = (40, 20, 138, 138)
BATCH = 256  # --batch sets it
Timer = Callable[[float], float]  # seconds -> images per second


# -- data ------------------------------------------------------------------------------


def prepare(root: Path, n: int, classes: int, cores: int) -> dict[str, Path]:
    """Generate, pack and lay out every data set once per folder (reused by later runs)."""
    p = {name: root / name for name in ("digiface", "celeba", "png", "jpeg", "pixels-png", "pixels-jpeg")}
    if not (root / ".complete").exists():
        make_digiface(p["digiface"], n, classes=classes, workers=cores, progress=False, overwrite=True)
        make_celeba(p["celeba"], n, classes=classes, workers=cores, progress=False, overwrite=True)
        common: dict[str, Any] = {"seed": 0, "progress": False, "workers": cores, "overwrite": True}
        pack([p["digiface"]], p["png"], store="encoded", size=SIZE, **common)
        pack([p["celeba"]], p["jpeg"], store="encoded", size=SIZE, crop=CROP, label_order="sorted", **common)
        # PNG-like pixel layout: small shards, so a random batch spans many (as bench_decode.py)
        pack([p["digiface"]], p["pixels-png"], store="pixels", size=SIZE,
             shard_bytes=max(1 << 20, n * 3 * SIZE[0] * SIZE[1] // 8), **common)
        # JPEG-like pixel layout: the default shard size, one shard of several record batches
        pack([p["celeba"]], p["pixels-jpeg"], store="pixels", size=SIZE, crop=CROP, label_order="sorted", **common)
        for name in ("pixels-png", "pixels-jpeg"):
            shards = ShardDataset(p[name]).shards
            array = np.lib.format.open_memmap(root / f"{name}.npy", "w+", np.uint8, (len(shards), shards.row_bytes))
            shards.read_pixels(np.arange(len(shards)), array)
            array.flush()
            del array
        (root / ".complete").write_text("")
    return p


def files_of(folder: Path) -> tuple[list[Path], list[int]]:
    """The image files of a generated set and their labels (CelebA's label file, or class folders)."""
    labels_file = folder / "identity_CelebA.txt"
    if labels_file.exists():
        words = labels_file.read_text().split()
        return [folder / "img" / name for name in words[0::2]], [int(x) - 1 for x in words[1::2]]
    classes = sorted(d for d in folder.iterdir() if d.is_dir())
    pairs = [(f, k) for k, d in enumerate(classes) for f in sorted(d.iterdir())]
    return [f for f, _ in pairs], [k for _, k in pairs]


# -- the peers ---------------------------------------------------------------------------


class TorchvisionFiles(torch.utils.data.Dataset):
    """The hand-written baseline: read a file, ``torchvision.io.decode_image`` (RGB), crop, resize."""

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
        if tuple(image.shape[-2:]) != SIZE:
            image = F.resize(image, list(SIZE), antialias=True)
        return image, self.labels[i]


class MemmapBatches(torch.utils.data.Dataset):
    """The pixel baseline: one numpy fancy index over one memory-mapped array per batch (``__getitems__``)."""

    def __init__(self, path: Path, labels: np.ndarray) -> None:
        self.array = np.load(path, mmap_mode="r")
        self.labels = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.array)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        images = torch.from_numpy(self.array[idx]).view(len(idx), 3, *SIZE)
        return images, self.labels[idx]


def _as_is(batch: Any) -> Any:
    return batch


def timer_of(make: Callable[[], Iterable[Any]]) -> Timer:
    """Images per second of a loader made once (on first use): a new pass per timing, counted after its first batch."""
    made: list[Iterable[Any]] = []

    def timed(seconds: float) -> float:
        if not made:
            made.append(make())
        loader, seen, start = made[0], 0, None
        while start is None or time.perf_counter() - start < seconds:
            for images, labels in loader:
                if tuple(images.shape[1:]) != (3, *SIZE):
                    raise RuntimeError(f"unexpected batch {tuple(images.shape)}")
                if start is None:
                    start = time.perf_counter()
                    continue
                seen += len(labels)
                if time.perf_counter() - start >= seconds:
                    break
        return seen / (time.perf_counter() - start)

    return timed


def with_torch_threads(threads: int, timer: Timer) -> Timer:
    """``timer`` run with torch's intra-op threads set to ``threads`` (and set back after)."""

    def timed(seconds: float) -> float:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return timer(seconds)
        finally:
            torch.set_num_threads(before)

    return timed


def mapped_copy_limit(path: Path, buffers: int = 1) -> Timer:
    """bench_decode.py's gather limit: 2 threads copying contiguous runs of the mapped pixels into a reused buffer.

    ``buffers=2``: into two buffers in turn, as a loader whose user holds the last batch
    must write (the one just written stays untouched while the next is copied).
    """
    array = np.load(path, mmap_mode="r")
    batch = min(BATCH, len(array))
    dsts = itertools.cycle([np.empty((batch, array.shape[1]), dtype=np.uint8) for _ in range(buffers)])
    pool = ThreadPoolExecutor(1)
    runs = itertools.cycle(np.random.default_rng(1).integers(0, max(1, len(array) - batch), 64).tolist())
    half = batch // 2

    def timed(seconds: float) -> float:
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or done == 0:
            first, dst = next(runs), next(dsts)
            other = pool.submit(np.copyto, dst[:half], array[first : first + half])
            np.copyto(dst[half:], array[first + half : first + batch])
            other.result()
            done += batch
        return done / elapsed

    return timed


def getitems_timer(dataset: ShardDataset, hold: bool = False) -> Timer:
    """The data set's own batch read with no loader around it (shuffled batches): what the loader machinery adds shows.

    ``hold``: keep the last batch while the next is read, as a training loop (and the
    loader's user) does; otherwise each batch is dropped at once, so a reused buffer
    stays hot in the cache.
    """
    n = len(dataset)
    batch = min(BATCH, n)
    order = itertools.cycle(np.random.default_rng(2).permutation(n - n % batch).reshape(-1, batch).tolist())

    def timed(seconds: float) -> float:
        done, start, held = 0, time.perf_counter(), None
        while (elapsed := time.perf_counter() - start) < seconds or done == 0:
            if hold:
                held = dataset.__getitems__(next(order))
            else:
                dataset.__getitems__(next(order))
            done += batch
        del held
        return done / elapsed

    return timed


def litdata_timer(folder: Path, root: Path, cores: int) -> Timer | str:
    """LitData's StreamingDataset (0 workers) over the PNG bytes, decoded as the torchvision baseline; or why not."""
    try:
        import litdata
    except ImportError:
        return "not installed (pip install litdata)"
    out = root / "litdata-png"
    files, labels = files_of(folder)
    if not (out / "index.json").exists():
        litdata.optimize(fn=_litdata_item, inputs=list(zip(map(str, files), labels, strict=True)), output_dir=str(out),
                         chunk_bytes="64MB", num_workers=1, mode="overwrite", verbose=False)

    def make() -> Iterable[Any]:
        dataset = litdata.StreamingDataset(str(out), shuffle=True, transform=_litdata_decode)
        return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0)

    return timer_of(make)


class _RGBImages(torch.utils.data.Dataset):
    """What FFCV's writer stores: each image as PIL RGB (which its writer re-encodes as JPEG), and its label."""

    def __init__(self, files: list[Path], labels: list[int]) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        with Image.open(self.files[i]) as image:
            return image.convert("RGB"), self.labels[i]


def ffcv_timer(folder: Path, root: Path, cores: int) -> Timer | str:
    """FFCV's Loader over the same JPEGs, 2 threads, the crop box cut and resized to 112; or why not.

    The whole image is stored (FFCV's writer re-encodes it as JPEG), as stoker's encoded
    shards keep the whole file: both decode the whole image, cut the box and resize it.
    The box of this layout is centred, so FFCV's ``CenterCropRGBImageDecoder`` cuts it:
    its side is ``ratio`` times the image's shorter side. FFCV decodes with libjpeg-turbo
    and resizes with OpenCV on its own threads (``num_workers``).
    """
    try:
        from ffcv.fields import IntField, RGBImageField
        from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import Squeeze, ToTensor, ToTorchImage
        from ffcv.writer import DatasetWriter
        from PIL import Image
    except ImportError:
        return ("not importable here; it builds with `apt-get install libopencv-dev libturbojpeg0-dev pkg-config` "
                "then `pip install ffcv` (in a venv with --system-site-packages), then run this script with that python")
    files, labels = files_of(folder)
    with Image.open(files[0]) as first:
        width, height = first.size
    top, left, box_h, box_w = CROP
    if (top, left, box_h) != ((height - box_h) // 2, (width - box_w) // 2, box_w):
        return f"the crop box {CROP} is not a centred square of the {width}x{height} images, which FFCV's decoder cuts"
    out = root / "ffcv-jpeg.beton"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        writer = DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="jpg"), "label": IntField()}, num_workers=cores)
        writer.from_indexed_dataset(_RGBImages(files, labels))
        tmp.rename(out)

    def make() -> Iterable[Any]:
        pipelines = {"image": [CenterCropRGBImageDecoder(SIZE, ratio=box_w / min(width, height)), ToTensor(), ToTorchImage()],
                     "label": [IntDecoder(), ToTensor(), Squeeze()]}
        return Loader(str(out), batch_size=BATCH, num_workers=min(2, cores), order=OrderOption.RANDOM,
                      pipelines=pipelines, os_cache=True)

    return timer_of(make)


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    return {"image": Path(item[0]).read_bytes(), "label": item[1]}


def _litdata_decode(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    from torchvision.io import ImageReadMode, decode_image

    image = decode_image(torch.frombuffer(bytearray(sample["image"]), dtype=torch.uint8), mode=ImageReadMode.RGB)
    return image, sample["label"]


# -- the comparisons ---------------------------------------------------------------------


def comparisons(p: dict[str, Path], root: Path, cores: int) -> tuple[list[tuple[str, str, str, float]], dict[str, Timer], list[str]]:
    """(part, method, against, target ratio or 0) rows; the timers by method name; notes on peers left out."""
    workers = min(2, cores)
    timers: dict[str, Timer] = {}
    rows: list[tuple[str, str, str, float]] = []
    notes: list[str] = []

    def torchvision_loader(folder: Path, box: tuple[int, int, int, int] | None) -> Timer:
        files, labels = files_of(folder)
        dataset = TorchvisionFiles(files, labels, box)
        return timer_of(lambda: torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                                            persistent_workers=workers > 0, prefetch_factor=4 if workers else None))

    def stoker_loader(folder: Path) -> tuple[str, Timer]:
        dataset = ShardDataset(folder)
        probe = make_loader(dataset, batch_size=BATCH, shuffle=True, device=None)  # what stoker picks, not iterated
        name = f"{probe.backend} x{probe.num_workers}"
        return name, timer_of(lambda: make_loader(dataset, batch_size=BATCH, shuffle=True, device=None))

    def peer(part: str, key: str, name: str, timer: Timer | str, method: str, target: float) -> None:
        """A peer that may not be installed: its row and timer, or a note on why it is left out."""
        if isinstance(timer, str):
            notes.append(f"{name}: {timer}")
            return
        timers[f"{part}:{key}"] = timer
        rows.append((part, method, next(label for label, k in KEYS.items() if k == key), target))

    # JPEG
    picked, timers["jpeg:stoker"] = stoker_loader(p["jpeg"])
    timers["jpeg:torchvision"] = torchvision_loader(p["celeba"], CROP)
    rows.append(("jpeg", f"encoded JPEG shards ({picked})", "torchvision Dataset + DataLoader, 2 workers", 1.3))
    peer("jpeg", "ffcv", "FFCV", ffcv_timer(p["celeba"], root, cores), f"encoded JPEG shards ({picked})", 1.3)
    timers["jpeg:stoker, torch default threads"] = with_torch_threads(cores, timers["jpeg:stoker"])
    rows.append(("jpeg", "encoded JPEG shards, torch threads 1", f"the same, torch threads {cores}", 0.95))
    # Files: the same JPEG files, crop, resize and worker count, stoker's file data set against the hand-written one
    files_set = open_data(p["celeba"], split="train", crop=CROP, image_size=SIZE, label_order="sorted")
    timers["files:stoker"] = timer_of(lambda: make_loader(files_set, batch_size=BATCH, shuffle=True, num_workers=workers,
                                                          backend="process", prefetch_factor=4, device=None))
    timers["files:torchvision"] = timers["jpeg:torchvision"]
    rows.append(("files", f"file data set, {workers} worker processes", "torchvision Dataset + DataLoader, 2 workers", 1.0))
    # PNG
    picked, timers["png:stoker"] = stoker_loader(p["png"])
    timers["png:torchvision"] = torchvision_loader(p["digiface"], None)
    rows.append(("png", f"encoded PNG shards ({picked})", "torchvision Dataset + DataLoader, 2 workers", 1.2))
    peer("png", "litdata", "LitData", litdata_timer(p["digiface"], root, cores), f"encoded PNG shards ({picked})", 1.2)
    # pixels
    for layout in ("png", "jpeg"):
        name = f"pixels-{layout}"
        dataset = ShardDataset(p[name])
        labels = dataset.labels
        timers[f"{name}:stoker"] = timer_of(lambda d=dataset: make_loader(d, batch_size=BATCH, shuffle=True, device=None))
        memmap = MemmapBatches(root / f"{name}.npy", labels)
        timers[f"{name}:memmap"] = timer_of(lambda m=memmap: torch.utils.data.DataLoader(
            m, batch_size=BATCH, shuffle=True, num_workers=0, collate_fn=_as_is))
        timers[f"{name}:limit"] = mapped_copy_limit(root / f"{name}.npy")
        timers[f"{name}:limit held"] = mapped_copy_limit(root / f"{name}.npy", buffers=2)
        timers[f"{name}:getitems"] = getitems_timer(dataset)
        timers[f"{name}:getitems held"] = getitems_timer(dataset, hold=True)
        two_threads = ShardDataset(p[name])
        two_threads.shards.gather_threads = 2
        timers[f"{name}:two gather threads"] = timer_of(lambda d=two_threads: make_loader(d, batch_size=BATCH, shuffle=True, device=None))
        rows.append((name, f"pixel shards, {layout.upper()} layout (make_loader's pick)", "numpy memmap fancy index in a DataLoader", 1.0))
        rows.append((name, f"pixel shards, {layout.upper()} layout (make_loader's pick)", "2-thread mapped copy (limit)", 0.9))
        rows.append((name, f"pixel shards, {layout.upper()} layout (make_loader's pick)",
                     "2-thread mapped copy into two buffers in turn (a held batch's limit)", 0))
        rows.append((name, f"pixel shards, {layout.upper()} layout (make_loader's pick)", "its __getitems__ alone, no loader", 0))
        rows.append((name, f"pixel shards, {layout.upper()} layout (make_loader's pick)",
                     "its __getitems__ alone, the last batch held", 0))
        rows.append((name, f"pixel shards, {layout.upper()} layout (copying threads by load, the default)",
                     "the same, 2 gather threads", 0))
        timers[f"{name}:stream"] = timer_of(lambda f=p[name]: make_loader(ShardStream(f, shuffle_buffer=2048), batch_size=BATCH, device=None))
        # The stream as it was read before: 2 worker processes (the fallback it took), its reads handed out item by
        # item and stacked again (any collate_fn other than its own takes that path).
        timers[f"{name}:stream items"] = timer_of(lambda f=p[name]: make_loader(
            ShardStream(f, shuffle_buffer=2048), batch_size=BATCH, device=None, num_workers=2, persistent_workers=True,
            collate_fn=functools.partial(collate)))
        rows.append((name, f"ShardStream, {layout.upper()} layout (its reads handed over as batches)", STREAM_VS_MAP, 0))
        rows.append((name, f"ShardStream, {layout.upper()} layout (its reads handed over as batches)", STREAM_VS_ITEMS, 0))
        timers[f"{name}:stoker, torch default threads"] = with_torch_threads(cores, timers[f"{name}:stoker"])
        rows.append((name, f"pixel shards, {layout.upper()} layout, torch threads {cores} (a process's default)",
                     "the same, torch threads 1", 0.95))
    return rows, timers, notes


KEYS = {
    "torchvision Dataset + DataLoader, 2 workers": "torchvision",
    "LitData StreamingDataset, 0 workers": "litdata",
    "FFCV Loader (JPEG), 2 threads": "ffcv",
    "numpy memmap fancy index in a DataLoader": "memmap",
    "2-thread mapped copy (limit)": "limit",
    "2-thread mapped copy into two buffers in turn (a held batch's limit)": "limit held",
    "its __getitems__ alone, no loader": "getitems",
    "its __getitems__ alone, the last batch held": "getitems held",
    "the same, 2 gather threads": "two gather threads",
}


STREAM_VS_MAP = "pixel shards, map-style ShardDataset (make_loader's pick)"
STREAM_VS_ITEMS = "the same stream as read before: item by item, 2 worker processes (its old defaults)"


def pair_keys(part: str, method: str, against: str) -> tuple[str, str]:
    if against in (STREAM_VS_MAP, STREAM_VS_ITEMS):
        return f"{part}:stream", f"{part}:stoker" if against == STREAM_VS_MAP else f"{part}:stream items"
    if against.startswith("the same, torch threads"):  # one loader under two torch thread counts
        pair = f"{part}:stoker", f"{part}:stoker, torch default threads"
        return pair if part == "jpeg" else (pair[1], pair[0])  # jpeg: 1 against the default; pixels: the default against 1
    return f"{part}:stoker", f"{part}:{KEYS[against]}"


def main() -> None:
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=6000, help="images per data set")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds each method is timed per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 5)")
    parser.add_argument("--only", nargs="+", choices=["jpeg", "files", "png", "pixels"], help="run these parts only")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per batch")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 64 images, batch 16, 0.05 s per timing")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "stoker-bench-peers")
    args = parser.parse_args()
    if args.quick:
        args.n, args.classes, args.seconds, args.batch = 64, 4, 0.05, 16
    BATCH = args.batch
    rounds = max(5, args.rounds)
    torch.set_num_threads(1)  # fit's setting where the loaders take the cores: max(1, cores - workers)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    root = args.out / f"n{args.n}"
    root.mkdir(parents=True, exist_ok=True)
    print(f"[bench_peers] data in {root}", file=sys.stderr, flush=True)
    paths = prepare(root, args.n, args.classes, cores)
    rows, timers, notes = comparisons(paths, root, cores)
    if args.only:
        rows = [r for r in rows if r[0].split("-")[0] in args.only]
    pairs = sorted({pair_keys(*r[:3]) for r in rows})
    ratios: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for r in range(rounds):
        for a, b in pairs:
            # A B B A (B A A B in odd rounds), each for half the time: a drift within the round cancels
            order = (a, b, b, a) if r % 2 == 0 else (b, a, a, b)
            spent = {a: 0.0, b: 0.0}
            for name in order:
                # The measuring process's setting, again before every timing: a peer may change it for the whole
                # process (FFCV's Loader calls torch.set_num_threads(num_workers)), and what runs after it would
                # otherwise be measured under the peer's setting, not this script's.
                torch.set_num_threads(1)
                spent[name] += args.seconds / 2 / timers[name](args.seconds / 2)  # seconds per image, summed
            rate = {name: 2 / spent[name] for name in (a, b)}  # the harmonic mean of the two halves' rates
            ratios[(a, b)].append(rate[a] / rate[b])
            print(f"  round {r + 1}  {a:<28} {rate[a]:>9,.0f} img/s   {b:<36} {rate[b]:>9,.0f} img/s   "
                  f"ratio {rate[a] / rate[b]:.2f}", file=sys.stderr, flush=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    command = "python benchmarks/bench_peers.py " + " ".join(sys.argv[1:])
    print(f"\n`{command}` — {args.n:,} images per data set, batch {BATCH}, uint8 3x112x112, {cores} cores, torch "
          f"{torch.__version__}, torch intra-op threads 1 in the measuring process, {rounds} interleaved rounds of "
          f"{args.seconds:g} s per method, load average at the end {load}\n")
    print("| part | stoker | against | ratio by round | median | spread | target |")
    print("|---|---|---|---|---:|---:|---:|")
    for part, method, against, target in rows:
        values = np.asarray(ratios[pair_keys(part, method, against)])
        met = "" if not target else (" ✓" if values.min() >= target else (" (median)" if np.median(values) >= target else " ✗"))
        print(f"| {part} | {method} | {against} | {' / '.join(f'{v:.2f}' for v in values)} | {np.median(values):.2f} "
              f"| {values.min():.2f}–{values.max():.2f} | {f'>= {target:g}{met}' if target else '—'} |")
    print("\n✓: every round at or above the target; (median): the median is, not every round; ✗: the median is below.")
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
