"""Crafted and damaged image files, and a guarded runner that survives a crashing decoder.

Used by the reliability tests and by ``benchmarks/fuzz_decode.py``: every reader of
untrusted bytes is fed cases from here. A case is made from a seed alone, so a failure
is reproduced by its number. The runner decodes each case in its own forked
process (and restarts its helper should that die), so a segmentation fault is counted
as an outcome instead of ending the run.

Example:
    >>> from fuzzing.png import png_case, run_guarded
    >>> kind, data = png_case(7)
    >>> counts = run_guarded("png", range(100))  # doctest: +SKIP
    >>> counts["crash"]  # doctest: +SKIP
    0
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from stoker.errors import ConfigError, StokerError

__all__ = ["DECODERS", "OUTCOMES", "PNG_MUTATIONS", "png_case", "run_guarded"]

#: What decoding one case can give: an image, a clear DecodeError, another exception
#: (a bug: it escapes stoker's error family), or the child process died.
OUTCOMES = ("decoded", "DecodeError", "other error", "crash")

#: What :func:`run_guarded` can feed the cases to: stoker's decoder, or one library alone.
DECODERS = ("stoker", "torchvision", "pyspng", "imagecodecs", "imagecodecs-spng", "pillow")

#: How a PNG is damaged; every one keeps valid chunk CRCs, so a CRC check alone cannot tell.
PNG_MUTATIONS = (
    "flip bit in IDAT",
    "set byte in IDAT",
    "truncate IDAT",
    "overwrite 4 bytes in IDAT",
    "bad filter byte",
    "too little data",
    "too much data",
    "header size changed",
    "header depth or colour changed",
    "huge declared size",
    "IDAT split by a chunk",
)

_MODES = ("RGB", "RGBA", "L", "P", "LA", "I;16")


def _image(rng: random.Random) -> bytes:
    height, width = rng.randint(1, 48), rng.randint(1, 48)
    mode = rng.choice(_MODES)
    array = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (height, width, 3), dtype=np.uint8)
    array[: height // 2] //= 16  # some smooth rows, so that every filter type turns up
    from PIL import Image

    image = Image.fromarray(array, "RGB")
    if mode == "P":
        image = image.quantize(16)
    elif mode == "I;16":
        image = Image.fromarray(array[:, :, 0].astype(np.uint16) * 257)
    elif mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, "PNG", optimize=False, interlace=rng.random() < 0.3)
    return out.getvalue()


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    pos, out = 8, []
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        out.append((data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return out


def _build(chunks: list[tuple[bytes, bytes]]) -> bytes:
    parts = [b"\x89PNG\r\n\x1a\n"]
    for kind, body in chunks:
        parts.append(struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body)))
    return b"".join(parts)


def _with_raw(chunks: list[tuple[bytes, bytes]], change: object) -> list[tuple[bytes, bytes]]:
    """Replace the image data by ``change(raw)`` (raw: the inflated rows), recompressed."""
    raw = bytearray(zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT")))
    raw = change(raw)  # type: ignore[operator]
    rest = [c for c in chunks if c[0] != b"IDAT"]
    return rest[:-1] + [(b"IDAT", zlib.compress(bytes(raw)))] + rest[-1:]


def png_case(seed: int) -> tuple[str, bytes]:
    """Crafted PNG number ``seed``: ``(mutation, bytes)``, with every chunk CRC valid."""
    rng = random.Random(seed)
    chunks = _chunks(_image(rng))
    kind = PNG_MUTATIONS[seed % len(PNG_MUTATIONS)]
    at = next(i for i, (k, _) in enumerate(chunks) if k == b"IDAT")
    body = bytearray(chunks[at][1])
    header = bytearray(chunks[0][1])
    if kind == "flip bit in IDAT":
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
    elif kind == "set byte in IDAT":
        body[rng.randrange(len(body))] = rng.randrange(256)
    elif kind == "truncate IDAT":
        body = body[: rng.randrange(len(body))]
    elif kind == "overwrite 4 bytes in IDAT":
        p = rng.randrange(len(body))
        body[p : p + 4] = rng.randbytes(4)
    elif kind == "bad filter byte":

        def bad_filter(raw: bytearray) -> bytearray:
            raw[0] = rng.randint(5, 255)
            return raw

        chunks = _with_raw(chunks, bad_filter)
    elif kind == "too little data":
        chunks = _with_raw(chunks, lambda raw: raw[: rng.randrange(len(raw))])
    elif kind == "too much data":
        chunks = _with_raw(chunks, lambda raw: raw + rng.randbytes(rng.randint(1, 64)))
    elif kind == "header size changed":
        field = rng.choice((0, 4))
        value = max(1, int.from_bytes(header[field : field + 4], "big") + rng.choice((-1, 1, 7)))
        header[field : field + 4] = value.to_bytes(4, "big")
    elif kind == "header depth or colour changed":
        header[8 + rng.randrange(2)] = rng.choice((1, 2, 3, 4, 6, 8, 16))
    elif kind == "huge declared size":
        header[0:8] = struct.pack(">II", rng.randint(20_000, 2**31 - 1), rng.randint(20_000, 2**31 - 1))
    elif kind == "IDAT split by a chunk":
        cut = rng.randrange(1, max(len(body), 2))
        chunks[at : at + 1] = [(b"IDAT", bytes(body[:cut])), (b"tEXt", b"k\x00v"), (b"IDAT", bytes(body[cut:]))]
        return kind, _build(chunks)
    if kind in ("flip bit in IDAT", "set byte in IDAT", "truncate IDAT", "overwrite 4 bytes in IDAT"):
        chunks[at] = (b"IDAT", bytes(body))
    if kind.startswith("header") or kind == "huge declared size":
        chunks[0] = (b"IHDR", bytes(header))
    return kind, _build(chunks)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a guarded child: this package importable (it lives in ``tests/support``)."""
    support = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = support + os.pathsep + env.get("PYTHONPATH", "")
    return env


_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from stoker.decode.image import decode_image
from stoker.errors import DecodeError
from fuzzing.png import png_case
if sys.argv[1] != "stoker":
    # A library alone, without stoker's checks: any exception it raises counts as a clear error.
    if sys.argv[1] == "torchvision":
        from torchvision.io import ImageReadMode, decode_image as tv_decode

        def library(data):
            return tv_decode(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    elif sys.argv[1] == "pyspng":
        import pyspng

        def library(data):
            return pyspng.load(data, "RGB")
    elif sys.argv[1] == "imagecodecs":
        import imagecodecs

        def library(data):
            return imagecodecs.png_decode(data)
    elif sys.argv[1] == "imagecodecs-spng":
        import imagecodecs

        def library(data):
            return imagecodecs.spng_decode(data)
    elif sys.argv[1] == "pillow":
        import io
        from PIL import Image

        def library(data):
            return Image.open(io.BytesIO(data)).convert("RGB")

    def decode_image(data, name):
        try:
            return library(data)
        except Exception as exc:
            raise DecodeError(str(exc)) from None
import os
CODES = {0: "decoded", 1: "DecodeError", 2: "other error"}
for line in sys.stdin:
    seed = int(line)
    kind, data = png_case(seed)
    print(json.dumps([seed, kind, "start"]), flush=True)
    # torchvision crashes often: each case in its own process, so a crash ends only that one.
    # stoker's cases run here, one after another (a crash ends this helper, and it restarts).
    pid = os.fork() if sys.argv[1] == "torchvision" else 0
    if pid == 0:
        try:
            decode_image(data, f"case-{seed}.png")
            code = 0
        except DecodeError:
            code = 1
        except Exception as exc:
            print(json.dumps([seed, kind, "note", f"{type(exc).__name__}: {exc}"[:200]]), flush=True)
            code = 2
        if sys.argv[1] != "torchvision":
            print(json.dumps([seed, kind, CODES[code]]), flush=True)
            continue
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    outcome = CODES.get(os.WEXITSTATUS(status), "crash") if os.WIFEXITED(status) else "crash"
    print(json.dumps([seed, kind, outcome]), flush=True)
"""


def run_guarded(
    kind: str, seeds: Iterable[int], timeout_s: float = 600.0, decoder: str = "stoker"
) -> Counter[tuple[str, str]]:
    """Decode the crafted cases in a child process; count ``(mutation, outcome)`` pairs.

    The child is restarted after a crash, so every case has an outcome. ``kind`` names
    the case family (only ``"png"`` for now). ``decoder`` is ``"stoker"``
    (:func:`stoker.decode.image.decode_image`) or one library alone, without stoker's checks, to
    show what they prevent or to judge a candidate decoder: ``"torchvision"``
    (``torchvision.io.decode_image``, each case in its own forked process: it crashes
    often), ``"pyspng"`` (libspng), ``"imagecodecs"`` (its libpng), ``"imagecodecs-spng"`` (its
    libspng) or ``"pillow"``; any
    exception a library raises counts as a clear error.

    Returns:
        A counter of ``(mutation, outcome)``; outcomes are :data:`OUTCOMES`.
    """
    if kind != "png":
        raise ConfigError(f"run_guarded: unknown case family {kind!r}; use 'png'")
    if decoder not in DECODERS:
        raise ConfigError(f"run_guarded: decoder must be one of {', '.join(map(repr, DECODERS))}, got {decoder!r}")
    todo = list(seeds)
    counts: Counter[tuple[str, str]] = Counter()
    while todo:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, decoder],
            input="".join(f"{s}\n" for s in todo),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_env(),
        )
        done: set[int] = set()
        started: tuple[int, str] | None = None
        for line in child.stdout.splitlines():
            seed, mutation, what = json.loads(line)[:3]
            if what == "start":
                started = (seed, mutation)
            elif what in OUTCOMES:
                counts[(mutation, what)] += 1
                done.add(seed)
                started = None
        if child.returncode == 0 and started is None:
            break
        if started is None:  # died before it began a case: nothing to blame, stop
            raise StokerError(f"fuzz child failed (rc {child.returncode}): {child.stderr[-500:]}")
        counts[(started[1], "crash")] += 1
        done.add(started[0])
        todo = [s for s in todo if s not in done]
    return counts
