"""Crafted JPEGs through every path that reads them: files, encoded shards (batch and row), verify.

The JPEG arm of the fuzz batteries (:mod:`fuzzing.png` has the PNG one). A case is made
from its seed alone (:func:`jpeg_case`), so a bad outcome is reproduced by its number. The
cases of a run are written as files, packed into an encoded shard set (a block at a
time), and read in a child process four ways:

* ``file``: :func:`stoker.decode.image.decode_sample`, the file-dataset path;
* ``shard batch``: ``ShardDataset(on_error="skip").__getitems__`` at a small image size
  (the fast JPEG path, then the full path for what it does not take);
* ``shard row``: ``ShardDataset(...)[i]`` (:meth:`ShardSet.decode`, as ``stoker inspect``);
* ``verify``: :func:`stoker.shards.verify`, whose faults are matched to rows.

Every path that decodes a case must give the pixels of the file path read at the same
size (``resize(decode_sample(...), SIZE)``), exactly: one file, one answer
(docs/format-pixels.md). A path that decodes to other pixels, or decodes what another
refuses, is the outcome ``"pixels differ"``. The mutations include crafted quantisation
tables and high-frequency (noise) images in every subsampling mode Pillow writes, where a
reduced-scale DCT decode parted from the full path.

Every case's memory is measured: the peak of what Python and numpy allocated
(``tracemalloc``; numpy reports its buffers there, even those never touched) and the
growth of the process's peak resident set (``ru_maxrss``; what the C libraries touched).
A case above the bound is the outcome ``"memory"``, whatever it returned. A row that
``verify`` calls ok but a shard read refuses is ``"verify ok, read failed"``.

Example:
    >>> from fuzzing.jpeg import run_jpeg_guarded
    >>> counts = run_jpeg_guarded(range(200))  # doctest: +SKIP
    >>> {outcome for (_, _, outcome) in counts} <= {"decoded", "DecodeError"}  # doctest: +SKIP
    True
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from stoker.errors import StokerError

__all__ = ["JPEG_MUTATIONS", "JPEG_OUTCOMES", "JPEG_PATHS", "jpeg_case", "run_jpeg_guarded"]

#: How a JPEG is damaged (headers, sampling factors, huge sizes, scan data).
JPEG_MUTATIONS = (
    "luma sampling byte",
    "chroma sampling byte",
    "huge declared size",
    "huge size behind garbage",
    "declared size changed",
    "zero declared size",
    "component count changed",
    "precision changed",
    "quantization table selector",
    "huffman table byte",
    "set byte in a header",
    "flip bit in scan data",
    "truncate",
    "quantization table entry",
    "high-frequency image",
)

#: The ways each case is read (see the module's docstring).
JPEG_PATHS = ("file", "shard batch", "shard row", "verify")

#: What reading one case one way can give. Only the first two are allowed.
JPEG_OUTCOMES = ("decoded", "DecodeError", "other error", "memory", "verify ok, read failed", "pixels differ", "crash")

# The sizes the issue found: 48679x59164 declared in an 80 KB file took 8 GiB.
_HUGE_SIZES = ((48679, 59164), (65535, 65535), (30000, 40000))
_SAMPLING_BYTES = (0x14, 0x41, 0x00, 0x44, 0x13, 0x31, 0x24, 0x42, 0x12, 0x21, 0x11, 0x22, 0xFF, 0x88, 0x0F)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _base_jpeg(rng: random.Random, big: bool) -> bytes:
    """A small photo-like JPEG: RGB or gray, 4:4:4 / 4:2:2 / 4:2:0, sometimes progressive; ``big``: ~80 KB of noise.

    (Pillow cannot write a progressive JPEG as large as ``big`` into its default buffer.)
    """
    from PIL import Image

    if big:
        height = width = 256
    else:
        height, width = rng.randint(8, 64), rng.randint(8, 64)
    pixels = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (height, width, 3), dtype=np.uint8)
    if not big:
        pixels[: height // 2] //= 8  # a smooth half, so the coefficients vary
    image = Image.fromarray(pixels)
    if rng.random() < 0.2:
        image = image.convert("L")
    out = io.BytesIO()
    options: dict[str, object] = {"quality": 95 if big else rng.randint(50, 95), "progressive": rng.random() < 0.25 and not big}
    if image.mode == "RGB":
        options["subsampling"] = rng.choice((0, 1, 2))
    image.save(out, "JPEG", **options)
    return out.getvalue()


def _segments(data: bytes) -> tuple[int, list[tuple[int, int, int]], int]:
    """``(frame header offset, [(marker, offset, length)] before the scan, scan data offset)``."""
    pos, sof, found, scan = 2, -1, [], len(data)
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker, length = data[pos + 1], int.from_bytes(data[pos + 2 : pos + 4], "big")
        found.append((marker, pos, length))
        if marker in _SOF and sof < 0:
            sof = pos
        if marker == 0xDA:
            scan = pos + 2 + length
            break
        pos += 2 + length
    return sof, found, scan


def jpeg_case(seed: int) -> tuple[str, bytes]:
    """Crafted JPEG number ``seed``: ``(mutation, bytes)``."""
    rng = random.Random(seed)
    kind = JPEG_MUTATIONS[seed % len(JPEG_MUTATIONS)]
    big = kind == "high-frequency image" or (kind.startswith(("huge", "quantization table entry")) and rng.random() < 0.5)
    data = bytearray(_base_jpeg(rng, big=big))
    sof, segments, scan = _segments(bytes(data))
    components = data[sof + 9]
    if kind == "luma sampling byte":
        data[sof + 11] = rng.choice(_SAMPLING_BYTES)
    elif kind == "chroma sampling byte":
        data[sof + 11 + 3 * (rng.randrange(1, components) if components > 1 else 0)] = rng.choice(_SAMPLING_BYTES)
    elif kind in ("huge declared size", "huge size behind garbage"):
        height, width = rng.choice((*_HUGE_SIZES, (rng.randint(10_000, 65535), rng.randint(10_000, 65535))))
        data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
        if kind == "huge size behind garbage":  # libjpeg skips stray bytes before a marker (with a warning)
            data[sof:sof] = bytes(rng.randrange(0, 255) for _ in range(rng.randint(1, 9)))
    elif kind == "declared size changed":
        field = sof + rng.choice((5, 7))
        value = int.from_bytes(data[field : field + 2], "big") + rng.choice((-7, -1, 1, 3, 16, 200))
        data[field : field + 2] = max(1, min(value, 65535)).to_bytes(2, "big")
    elif kind == "zero declared size":
        field = sof + rng.choice((5, 7))
        data[field : field + 2] = b"\x00\x00"
    elif kind == "component count changed":
        data[sof + 9] = rng.choice((0, 1, 2, 3, 4, 5, 255))
    elif kind == "precision changed":
        data[sof + 4] = rng.choice((0, 1, 7, 9, 12, 16, 255))
    elif kind == "quantization table selector":
        data[sof + 12 + 3 * rng.randrange(components)] = rng.choice((1, 2, 3, 4, 15, 255))
    elif kind == "huffman table byte":
        tables = [(pos, length) for marker, pos, length in segments if marker == 0xC4]
        pos, length = rng.choice(tables)
        data[pos + 4 + rng.randrange(max(length - 2, 1))] = rng.randrange(256)
    elif kind == "set byte in a header":
        data[rng.randrange(2, scan)] = rng.randrange(256)
    elif kind == "flip bit in scan data":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(scan, len(data) - 2)] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[: rng.randrange(2, len(data))]
    elif kind == "quantization table entry":  # a valid file still: only the dequantised coefficients change
        tables = [(pos, length) for marker, pos, length in segments if marker == 0xDB]
        pos, length = rng.choice(tables)
        for _ in range(rng.randint(1, 3)):
            entry = rng.randrange(1, 64) if rng.random() < 0.5 else rng.randrange(32, 64)  # high frequencies half the time
            table = pos + 4 + 65 * rng.randrange(max(1, (length - 2) // 65))
            data[table + 1 + entry] = rng.choice((1, 2, 100, 200, 255, rng.randrange(1, 256)))
    # "high-frequency image": the noise image as it is (4:4:4, 4:2:2 or 4:2:0, or gray)
    return kind, bytes(data)


_CHILD = r"""
import json, os, resource, sys, tempfile, tracemalloc, warnings
warnings.simplefilter("ignore")
from pathlib import Path
import torch
from stoker.decode.image import decode_sample, resize
from stoker.errors import DataError, DecodeError
from fuzzing.jpeg import jpeg_case
from stoker.packer import pack
from stoker.shards import ShardDataset, verify

bound, block = int(sys.argv[1]), int(sys.argv[2])
seeds = [int(line) for line in sys.stdin]

def say(*parts):
    print(json.dumps(parts), flush=True)

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def measured(seed, kind, path, read):
    say(seed, kind, path, "start")
    tracemalloc.reset_peak()
    held, before = tracemalloc.get_traced_memory()[0], rss()
    try:
        outcome = read()
    except DecodeError:
        outcome = "DecodeError"
    except Exception as exc:
        say(seed, kind, path, "note", f"{type(exc).__name__}: {exc}"[:300])
        outcome = "other error"
    used = max(tracemalloc.get_traced_memory()[1] - held, rss() - before)  # what this case took, above what was held
    say(seed, kind, path, "memory" if used > bound else outcome, used)

SIZE = (32, 32)
reference = {}  # seed: the file path's pixels at SIZE, the answer every path must give

def read_file(data, seed):
    reference[seed] = resize(decode_sample(data, f"case-{seed}.jpg"), SIZE)
    return "decoded"

def same(seed, image):  # one file, one answer: the file path's pixels, exactly (it decoded too)
    ref = reference.get(seed)
    return "decoded" if ref is not None and torch.equal(image, ref) else "pixels differ"

def read_batch(i, seed):
    batch = skipping.__getitems__([i])
    return same(seed, batch[0][0]) if len(batch) == 1 else "DecodeError"

def read_row(i, seed):
    return same(seed, raising[i][0])

tracemalloc.start()
with tempfile.TemporaryDirectory() as tmp:
    for start in range(0, len(seeds), block):
        part = seeds[start : start + block]
        folder = Path(tmp, str(start))
        cases = {seed: jpeg_case(seed) for seed in part}
        for seed, (kind, data) in cases.items():
            measured(seed, kind, "file", lambda data=data, seed=seed: read_file(data, seed))
            out = folder / "src" / "0" / f"case-{seed}.jpg"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        pack(folder / "src", folder / "shards", store="encoded", size=SIZE, progress=False, workers=0,
             shuffle=False, shard_samples=8)  # verify checks every row of a shard of at most 10 faults
        skipping = ShardDataset(folder / "shards", on_error="skip")
        raising = ShardDataset(folder / "shards")
        infos = [skipping.shards.row_info(i) for i in range(len(skipping))]
        row_seed = [int(info["file"].rsplit("-", 1)[1].split(".")[0]) for info in infos]
        for i, seed in enumerate(row_seed):
            kind = cases[seed][0]
            measured(seed, kind, "shard batch", lambda i=i, seed=seed: read_batch(i, seed))
            measured(seed, kind, "shard row", lambda i=i, seed=seed: read_row(i, seed))
        say(part[0], "block", "verify", "start")
        tracemalloc.reset_peak()
        held, before = tracemalloc.get_traced_memory()[0], rss()
        report = verify(folder / "shards", workers=0)
        used = max(tracemalloc.get_traced_memory()[1] - held, rss() - before)
        bad_rows = {(f.shard, f.row) for f in report.faults}
        for info, seed in zip(infos, row_seed):
            # verify's "ok" must mean the file decodes too (verify compares the fast and full decodes itself)
            outcome = "DecodeError" if (info["shard"], info["row"]) in bad_rows else "decoded"
            if outcome == "decoded" and seed not in reference:
                outcome = "pixels differ"
            say(seed, cases[seed][0], "verify", "memory" if used > bound else outcome, used)
        del skipping, raising
"""


def run_jpeg_guarded(
    seeds: Iterable[int],
    *,
    max_pixels: int = 1_000_000,
    memory_bound_bytes: int = 256 << 20,
    block: int = 100,
    timeout_s: float = 600.0,
    peaks: dict[str, int] | None = None,
) -> Counter[tuple[str, str, str]]:
    """Read the crafted JPEGs ``seeds`` every way (:data:`JPEG_PATHS`) in a child process; count the outcomes.

    Args:
        seeds: the cases (:func:`jpeg_case`).
        max_pixels: ``STOKER_MAX_PIXELS`` in the child: what an image may declare.
        memory_bound_bytes: more than this allocated or touched by one case is the
            outcome ``"memory"``.
        block: cases packed into one shard set (verify is measured per block).
        timeout_s: the child's limit per start (a hang fails the run).
        peaks: filled with the most bytes one case (verify: one block) allocated or
            touched, per path.

    Returns:
        A counter of ``(path, mutation, outcome)``; outcomes are :data:`JPEG_OUTCOMES`.
        A crash ends the child: its case counts as ``"crash"`` and the rest run in a new one.

    Raises:
        StokerError: the child failed before it read any case.
    """
    todo = list(seeds)
    env = {**os.environ, "STOKER_MAX_PIXELS": str(max_pixels)}
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    counts: Counter[tuple[str, str, str]] = Counter()
    while todo:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(memory_bound_bytes), str(block)],
            input="".join(f"{s}\n" for s in todo),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
        outcomes: dict[tuple[int, str], str] = {}
        kinds: dict[int, str] = {}
        started: tuple[int, str, str] | None = None
        for line in child.stdout.splitlines():
            record = json.loads(line)
            seed, kind, path, what = record[:4]
            if peaks is not None and what in JPEG_OUTCOMES and len(record) > 4:
                peaks[path] = max(peaks.get(path, 0), int(record[4]))
            if what == "start":
                started = (seed, kind, path)
            elif what in JPEG_OUTCOMES:
                outcomes[(seed, path)] = what
                kinds[seed] = kind
                started = None
        if child.returncode != 0 and started is None:
            raise StokerError(f"JPEG fuzz child failed (rc {child.returncode}) outside a case: {child.stderr[-800:]}")
        if started is not None:  # it died in this case: a crash, and the rest go to a new child
            seed, kind, path = started
            if kind == "block":  # verify of a whole block: every case of it counts the crash
                for s in [s for s in todo if (s, "shard row") in outcomes and (s, "verify") not in outcomes]:
                    outcomes[(s, "verify")] = "crash"
            else:
                outcomes[(seed, path)], kinds[seed] = "crash", kind
        done = {s for s in todo if all((s, p) in outcomes for p in JPEG_PATHS) or (s, "file") in outcomes
                and any(outcomes.get((s, p)) == "crash" for p in JPEG_PATHS)}
        for (seed, path), what in outcomes.items():
            if seed not in done:
                continue
            reads = (outcomes.get((seed, "shard batch")), outcomes.get((seed, "shard row")))
            if path == "verify" and what == "decoded" and any(read != "decoded" for read in reads):
                what = "verify ok, read failed"
            counts[(path, kinds[seed], what)] += 1
        if not done:
            raise StokerError(f"JPEG fuzz child made no progress (rc {child.returncode}): {child.stderr[-800:]}")
        todo = [s for s in todo if s not in done]
    return counts
