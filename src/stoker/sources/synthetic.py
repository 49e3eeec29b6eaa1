"""Deterministic synthetic image data sets laid out like the real ones people have.

Three layouts, each mimicking a data set that exists in the wild, so that every reader,
the demo, the tests and the benchmarks can run without downloading anything::

    celeba    DIR/img/000001.jpg ...        178 wide x 218 tall RGB JPEGs (~10 KB each)
              DIR/identity_CelebA.txt       "000001.jpg 3" per line, identities 1..C
    digiface  DIR/<class>/<i>.png           112 x 112 RGBA PNGs, class folders 0..C-1
    ids       DIR/data/id-00001.pt ...      uint8 CHW tensors 3 x 64 x 64 (torch.save)
              DIR/ids.json                  {"partition": {"train": [...], "validation": [...]},
                                             "labels": {"id-00001": 0, ...}}  (labels 0..C-1)
              DIR/ids.csv                   id,label,split  (the same, as a table)

The images are learnable (each class has its own palette and stripe pattern, each sample
jitters it and adds noise), and a class looks the same whatever the seed: data sets made
with different seeds are draws from one task. Everything is a function of ``(seed, sample
index)``: the same seed gives byte-identical files, whatever the number of workers.

Example::

    from stoker.sources.synthetic import make_data

    root = make_data("celeba", "data/celeba", n=1000, seed=0, classes=10, progress=False)
"""

from __future__ import annotations

import colorsys
import csv
import functools
import io
import json
import math
import multiprocessing
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from stoker.errors import ConfigError
from stoker.terminal import bar_disable

__all__ = [
    "CELEBA_SIZE",
    "DIGIFACE_SIZE",
    "IDS_SIZE",
    "KINDS",
    "make_celeba",
    "make_data",
    "make_digiface",
    "make_ids",
    "render",
]

KINDS: tuple[str, ...] = ("celeba", "digiface", "ids")

# (height, width) of each kind's images, as in the real data sets.
CELEBA_SIZE: tuple[int, int] = (218, 178)
DIGIFACE_SIZE: tuple[int, int] = (112, 112)
IDS_SIZE: tuple[int, int] = (64, 64)

CELEBA_LABEL_FILE = "identity_CelebA.txt"
IDS_JSON_FILE = "ids.json"
IDS_CSV_FILE = "ids.csv"
VALIDATION_FRACTION = 0.2

# Show a progress bar only when there is enough work for it to be worth a line.
PROGRESS_MIN_N = 300

_JPEG_QUALITY = 86  # with the noise levels below: ~10 KB per 178x218 image, like CelebA
_PNG_COMPRESS_LEVEL = 1  # zlib level: 1 is twice as fast as 3 and barely larger here
_NOISE_BLOCK = 4  # pixels per side of one cell of the blotchy colour noise
_BLOTCH_SIGMA = 10.0  # std of the per-cell colour noise, in 0..255 units
_GRAIN_SIGMA = 3.0  # std of the per-pixel grain
_GRAIN_BANK_SIZE = 1 << 18  # floats; fine grain is a random window of this fixed bank

# Tags that keep the random streams of labels, splits and samples apart.
_STREAM_LABELS = 1
_STREAM_SPLIT = 2
_STREAM_SAMPLE = 3

# Class looks are points of Roberts' R3 low-discrepancy sequence in (hue, angle, frequency):
# any set of classes 0..C-1 is spread evenly, so no two classes look alike by accident.
_PHI3 = 1.2207440846057596  # root of x**4 = x + 1, the golden ratio of 3 dimensions
_R3 = (1.0 / _PHI3, 1.0 / _PHI3**2, 1.0 / _PHI3**3)


# --- rendering -------------------------------------------------------------------------


def _class_look(label: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Return (background RGB, stripe RGB, stripe angle in radians, cycles per width)."""
    hue, angle01, cycles01 = ((0.5 + label * a) % 1.0 for a in _R3)
    background = np.array(colorsys.hsv_to_rgb(hue, 0.55, 0.85), np.float32) * 255.0
    stripes = np.array(colorsys.hsv_to_rgb((hue + 0.08) % 1.0, 0.85, 0.40), np.float32) * 255.0
    return background, stripes, angle01 * math.pi, 2.5 + 4.0 * cycles01


@functools.lru_cache(maxsize=8)
def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Return centred coordinates y (Hp, 1), x (1, Wp) in image widths, and Hp, Wp.

    The canvas is padded to a multiple of the noise cell so that the blotchy noise is
    added through a reshaped view, without an upsampled copy.
    """
    padded_h = -(-height // _NOISE_BLOCK) * _NOISE_BLOCK
    padded_w = -(-width // _NOISE_BLOCK) * _NOISE_BLOCK
    y = ((np.arange(padded_h, dtype=np.float32) - height / 2) / width)[:, None]
    x = ((np.arange(padded_w, dtype=np.float32) - width / 2) / width)[None, :]
    y.setflags(write=False)
    x.setflags(write=False)
    return y, x, padded_h, padded_w


@functools.lru_cache(maxsize=1)
def _grain_bank() -> np.ndarray:
    # Drawing fresh per-pixel noise for every image costs more than the rest of the
    # rendering together; a random window of one fixed bank looks the same and is free.
    bank = np.random.default_rng(0x57_0C_E4).standard_normal(_GRAIN_BANK_SIZE, dtype=np.float32)
    bank *= np.float32(_GRAIN_SIGMA)
    bank.setflags(write=False)
    return bank


def _sample_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAM_SAMPLE, index])


def _render(label: int, rng: np.random.Generator, height: int, width: int, channels: int) -> np.ndarray:
    """Draw one sample of class ``label`` as an (height, width, channels) uint8 array."""
    y, x, padded_h, padded_w = _grid(height, width)
    background, stripes, angle, cycles = _class_look(label)

    # 1. per-sample jitter, drawn in a fixed order (the order is part of the format)
    angle += rng.normal(0.0, 0.12)
    cycles *= 1.0 + rng.normal(0.0, 0.06)
    phase = rng.uniform(0.0, 2.0 * math.pi)
    brightness = rng.uniform(0.75, 1.25)
    centre_y, centre_x = rng.normal(0.0, 0.05, 2)
    radius_y = 0.30 * (height / width) * rng.uniform(0.8, 1.1)
    radius_x = 0.26 * rng.uniform(0.8, 1.1)
    skin = np.array([rng.uniform(120, 235), rng.uniform(90, 190), rng.uniform(70, 160)], np.float32)
    blotches = rng.standard_normal((3, padded_h // _NOISE_BLOCK, 1, padded_w // _NOISE_BLOCK, 1), dtype=np.float32)
    blotches *= np.float32(_BLOTCH_SIGMA)
    grain_start = int(rng.integers(0, _GRAIN_BANK_SIZE - padded_h * padded_w))

    # 2. stripes in [0, 1] and a soft face-like ellipse mask in [0, 1], both (Hp, Wp)
    k = 2.0 * math.pi * cycles
    wave = np.sin(x * np.float32(k * math.cos(angle)) + y * np.float32(k * math.sin(angle)) + np.float32(phase))
    wave *= np.float32(0.5)
    wave += np.float32(0.5)
    mask = ((y - np.float32(centre_y)) / np.float32(radius_y)) ** 2
    mask = mask + ((x - np.float32(centre_x)) / np.float32(radius_x)) ** 2
    np.subtract(np.float32(1.0), mask, out=mask)
    mask *= np.float32(6.0)
    np.clip(mask, 0.0, 1.0, out=mask)
    wave -= wave * mask  # stripes only outside the face

    # 3. colour = brightness * (background + (stripes - background) * wave + (skin - background) * mask)
    #    one channel at a time: (Hp, Wp) temporaries are several times cheaper than (3, Hp, Wp)
    grain = _grain_bank()[grain_start : grain_start + padded_h * padded_w].reshape(padded_h, padded_w)
    out = np.empty((height, width, channels), np.uint8)
    plane = np.empty((padded_h, padded_w), np.float32)
    cells = plane.reshape(padded_h // _NOISE_BLOCK, _NOISE_BLOCK, padded_w // _NOISE_BLOCK, _NOISE_BLOCK)
    for c in range(3):
        np.multiply(wave, np.float32(brightness * (stripes[c] - background[c])), out=plane)
        plane += mask * np.float32(brightness * (skin[c] - background[c]))
        plane += np.float32(brightness * background[c])
        cells += blotches[c]  # a view of plane: each noise cell covers _NOISE_BLOCK^2 pixels
        plane += grain
        np.clip(plane, 0.0, 255.0, out=plane)
        out[..., c] = plane[:height, :width]  # float -> uint8 truncates, deterministically
    if channels == 4:
        out[..., 3] = 255  # opaque alpha
    return out


def render(label: int, height: int, width: int, *, seed: int = 0, index: int = 0, channels: int = 3) -> np.ndarray:
    """Draw the synthetic image of class ``label`` for sample ``index`` of data set ``seed``.

    This is the picture the ``make_*`` functions write, before encoding; tests that need
    a small realistic image in memory can call it directly.

    Args:
        label: class, 0-based.
        height, width: image size in pixels.
        seed: data set seed.
        index: sample number; with ``seed`` it fixes every random choice.
        channels: 3 for RGB, 4 for RGBA with an opaque alpha channel.

    Returns:
        A (height, width, channels) uint8 array.

    Raises:
        ConfigError: a negative label, seed or index, a bad size or channel count.

    Example::

        >>> render(3, 64, 64, seed=0, index=7).shape
        (64, 64, 3)
    """
    _check_int("label", label, minimum=0)
    _check_int("height", height, minimum=1)
    _check_int("width", width, minimum=1)
    _check_int("seed", seed, minimum=0)
    _check_int("index", index, minimum=0)
    if channels not in (3, 4):
        raise ConfigError(f"render: channels must be 3 (RGB) or 4 (RGBA), got {channels!r}")
    padded = (-(-height // _NOISE_BLOCK) * _NOISE_BLOCK) * (-(-width // _NOISE_BLOCK) * _NOISE_BLOCK)
    if padded >= _GRAIN_BANK_SIZE:
        raise ConfigError(
            f"render: {height}x{width} is too large for synthetic images; "
            f"use at most {_GRAIN_BANK_SIZE - 1} pixels (for example 448x448)"
        )
    return _render(label, _sample_rng(seed, index), height, width, channels)


# --- writing samples (runs in worker processes) -----------------------------------------

# One unit of work: (kind, root, seed, [(sample index, label, path relative to root), ...]).
_Item = tuple[int, int, str]
_Chunk = tuple[str, str, int, list[_Item]]


def _write_chunk(chunk: _Chunk) -> int:
    """Render and write the samples of one chunk; return how many were written."""
    kind, root, seed, items = chunk
    for index, label, relpath in items:
        path = os.path.join(root, relpath)
        rng = _sample_rng(seed, index)
        if kind == "celeba":
            image = _render(label, rng, *CELEBA_SIZE, channels=3)
            Image.fromarray(image, "RGB").save(path, "JPEG", quality=_JPEG_QUALITY)
        elif kind == "digiface":
            image = _render(label, rng, *DIGIFACE_SIZE, channels=4)
            Image.fromarray(image, "RGBA").save(path, "PNG", compress_level=_PNG_COMPRESS_LEVEL)
        else:
            import torch  # only this kind needs torch; image workers start faster without it

            image = _render(label, rng, *IDS_SIZE, channels=3)
            # torch.save is byte-stable for the same tensor and file name (the archive
            # inside the zip is named after the file); test_synthetic.py pins this.
            torch.save(torch.from_numpy(image).permute(2, 0, 1).contiguous(), path)
    return len(items)


# --- planning: names, labels, splits ----------------------------------------------------


def _balanced_labels(n: int, classes: int, seed: int) -> np.ndarray:
    """Labels 0..classes-1, as equal in count as n allows, in a seeded random order."""
    labels = np.arange(n, dtype=np.int64) % classes
    return np.random.default_rng([seed, _STREAM_LABELS]).permutation(labels)


def _validation_mask(labels: np.ndarray, seed: int) -> np.ndarray:
    """Pick ~20% of samples for validation, stratified: every class gives its share.

    Samples are visited class by class in rounds (one random sample of each class per
    round, classes in random order) and the first ``round(0.2 n)`` visited are validation.
    """
    n = len(labels)
    n_validation = min(max(round(n * VALIDATION_FRACTION), 1), n - 1)
    visit = np.random.default_rng([seed, _STREAM_SPLIT]).permutation(n)
    visited_labels = labels[visit]
    by_label = np.argsort(visited_labels, kind="stable")
    sorted_labels = visited_labels[by_label]
    rank = np.empty(n, dtype=np.int64)
    rank[by_label] = np.arange(n) - np.searchsorted(sorted_labels, sorted_labels, side="left")
    order = np.lexsort((np.arange(n), rank))  # by round, then by visiting position
    mask = np.zeros(n, dtype=bool)
    mask[visit[order[:n_validation]]] = True
    return mask


def _digits(n: int, minimum: int) -> int:
    return max(minimum, len(str(n)))


# --- checks -----------------------------------------------------------------------------


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")


def _check_arguments(kind: str, n: int, seed: int, classes: int, workers: int | None) -> None:
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    _check_int("n", n, minimum=1)
    _check_int("seed", seed, minimum=0)
    _check_int("classes", classes, minimum=2)
    if classes > n:
        raise ConfigError(
            f"classes ({classes}) is more than n ({n}): every class needs at least one "
            f"sample; raise n or lower classes"
        )
    if workers is not None:
        _check_int("workers", workers, minimum=1)


# What each kind writes into DIR: removed first when overwriting, nothing else is touched.
def _owned_entries(kind: str, root: Path) -> list[Path]:
    if kind == "celeba":
        return [root / "img", root / CELEBA_LABEL_FILE]
    if kind == "ids":
        return [root / "data", root / IDS_JSON_FILE, root / IDS_CSV_FILE]
    return [p for p in root.iterdir() if p.name.isdigit() and p.is_dir()]


def _prepare_folder(kind: str, root: Path, overwrite: bool) -> None:
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: exists and is not a folder; choose a folder path for the data set")
    if root.is_dir() and any(root.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"{root}: folder is not empty; choose an empty or new folder, or pass "
                f"--overwrite (overwrite=True in Python) to replace the {kind} files in it"
            )
        for entry in _owned_entries(kind, root):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()
    root.mkdir(parents=True, exist_ok=True)


# --- the driver -------------------------------------------------------------------------


def _chunks(kind: str, root: Path, seed: int, items: Sequence[_Item], size: int) -> Iterator[_Chunk]:
    for start in range(0, len(items), size):
        yield (kind, str(root), seed, list(items[start : start + size]))


def _progress_bar(kind: str, n: int, progress: bool) -> tqdm:
    disable = not progress or n < PROGRESS_MIN_N
    return tqdm(total=n, desc=f"make {kind}", unit="img", file=sys.stderr, disable=disable or bar_disable(), dynamic_ncols=True)


def _write_all(kind: str, root: Path, seed: int, items: Sequence[_Item], workers: int, progress: bool) -> None:
    """Write every sample, in ``workers`` processes."""
    n = len(items)
    chunk_size = max(1, min(64, n // (workers * 8)))
    workers = min(workers, -(-n // chunk_size))
    chunks = _chunks(kind, root, seed, items, chunk_size)
    if workers == 1:
        with _progress_bar(kind, n, progress) as progress_bar:
            for chunk in chunks:
                progress_bar.update(_write_chunk(chunk))
        return
    # The platform's default start method, as torch's DataLoader uses (fork on Linux,
    # so no `if __name__ == "__main__"` guard is needed there). The pool starts before
    # the bar, whose monitor thread must not be forked. Each sample's randomness comes
    # from (seed, index), so the files do not depend on which worker wrote them.
    # close() + join() once every result is in: Pool.__exit__ alone terminates, and a
    # worker the pool restarts while it terminates can wait forever on the task queue's
    # lock (seen under load: the test suite hung in join).
    with multiprocessing.get_context().Pool(processes=workers) as pool:
        with _progress_bar(kind, n, progress) as progress_bar:
            for count in pool.imap_unordered(_write_chunk, chunks):
                progress_bar.update(count)
        pool.close()
        pool.join()


def _write_text(path: Path, text: str) -> None:
    # Label files are written last and renamed into place: an interrupted run leaves
    # no label file, so it cannot pass for a complete data set.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    os.replace(tmp, path)


def make_data(
    kind: str,
    root: str | os.PathLike[str],
    n: int,
    seed: int = 0,
    classes: int = 10,
    *,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write a synthetic data set of ``n`` images in the layout of ``kind`` into ``root``.

    Args:
        kind: ``"celeba"``, ``"digiface"`` or ``"ids"`` (layouts in the module docstring).
        root: folder to write into; created if missing, must be empty unless ``overwrite``.
        n: number of images.
        seed: data set seed; the same seed gives byte-identical files.
        classes: number of classes, 2..n; classes are balanced (counts differ by at most 1).
        workers: processes that render and encode (default ``min(2, cpu count)``; the same files).
        progress: show a progress bar on stderr (only when ``n >= 300``).
        overwrite: write into a non-empty folder, first removing what this kind writes (and nothing else).

    Returns:
        ``root`` as a Path.

    Raises:
        ConfigError: a bad argument, or a non-empty folder without ``overwrite``.

    Example:
        >>> make_data("ids", "ids-demo", n=100, classes=4, progress=False)
        PosixPath('ids-demo')
    """
    _check_arguments(kind, n, seed, classes, workers)
    root = Path(root)
    _prepare_folder(kind, root, overwrite)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)

    if kind == "digiface":
        # class folders 0..C-1, files 0.png.. inside each; sample index runs class by class
        counts = [n // classes + (c < n % classes) for c in range(classes)]
        items: list[_Item] = []
        for label, count in enumerate(counts):
            (root / str(label)).mkdir()
            items.extend((len(items), label, f"{label}/{i}.png") for i in range(count))
        _write_all(kind, root, seed, items, workers, progress)
        return root

    labels = _balanced_labels(n, classes, seed)
    if kind == "celeba":
        width = _digits(n, 6)
        names = [f"{i + 1:0{width}d}.jpg" for i in range(n)]
        (root / "img").mkdir()
        items = [(i, int(labels[i]), f"img/{names[i]}") for i in range(n)]
        _write_all(kind, root, seed, items, workers, progress)
        _write_text(root / CELEBA_LABEL_FILE, "".join(f"{name} {label + 1}\n" for name, label in zip(names, labels, strict=True)))
        return root

    # ids
    width = _digits(n, 5)
    ids = [f"id-{i + 1:0{width}d}" for i in range(n)]
    (root / "data").mkdir()
    items = [(i, int(labels[i]), f"data/{ids[i]}.pt") for i in range(n)]
    _write_all(kind, root, seed, items, workers, progress)
    validation = _validation_mask(labels, seed)
    table = {
        "partition": {
            "train": [id_ for id_, v in zip(ids, validation, strict=True) if not v],
            "validation": [id_ for id_, v in zip(ids, validation, strict=True) if v],
        },
        "labels": {id_: int(label) for id_, label in zip(ids, labels, strict=True)},
    }
    _write_text(root / IDS_JSON_FILE, json.dumps(table, indent=1) + "\n")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "label", "split"])
    for id_, label, in_validation in zip(ids, labels, validation, strict=True):
        writer.writerow([id_, int(label), "validation" if in_validation else "train"])
    _write_text(root / IDS_CSV_FILE, buffer.getvalue())
    return root


def make_celeba(
    root: str | os.PathLike[str],
    n: int,
    seed: int = 0,
    classes: int = 10,
    *,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write ``DIR/img/000001.jpg ...`` (178x218 RGB JPEG) and ``DIR/identity_CelebA.txt``.

    Identities in the label file are 1-based (1..classes), as in CelebA; file numbers
    are in random order with respect to identity. Arguments as :func:`make_data`.

    Example::

        >>> make_celeba("/tmp/celeba-demo", n=50, classes=5, progress=False, overwrite=True)
        PosixPath('/tmp/celeba-demo')
    """
    return make_data("celeba", root, n, seed, classes, workers=workers, progress=progress, overwrite=overwrite)


def make_digiface(
    root: str | os.PathLike[str],
    n: int,
    seed: int = 0,
    classes: int = 10,
    *,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write ``DIR/<class>/<i>.png``: 112x112 RGBA PNGs in class folders ``0..classes-1``.

    Like DigiFace-1M, the folder name is the class and files are numbered from 0 inside
    each folder; the alpha channel is opaque. Arguments as :func:`make_data`.

    Example::

        >>> make_digiface("/tmp/digiface-demo", n=50, classes=5, progress=False, overwrite=True)
        PosixPath('/tmp/digiface-demo')
    """
    return make_data("digiface", root, n, seed, classes, workers=workers, progress=progress, overwrite=overwrite)


def make_ids(
    root: str | os.PathLike[str],
    n: int,
    seed: int = 0,
    classes: int = 10,
    *,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write ``DIR/data/<id>.pt`` (uint8 CHW 3x64x64 tensors), ``DIR/ids.json`` and ``DIR/ids.csv``.

    Ids are ``id-00001 ...``; labels are 0-based; the seeded train/validation partition
    is ~80/20 and stratified by class. Load a tensor with
    ``torch.load(path, weights_only=True)``. Arguments as :func:`make_data`.

    Example::

        >>> make_ids("/tmp/ids-demo", n=50, classes=5, progress=False, overwrite=True)
        PosixPath('/tmp/ids-demo')
    """
    return make_data("ids", root, n, seed, classes, workers=workers, progress=progress, overwrite=overwrite)
