"""What the PNG guard costs: the decode paths for PNG, side by side, in one run.

torchvision's libpng path crashes the process on PNGs whose zlib data is broken but
whose CRCs are valid (see ``docs/reliability.md``). The candidates, timed on the same
files in the same run, one core, files in memory:

* ``torchvision alone``: ``torchvision.io.decode_image`` (unsafe: the baseline speed);
* ``CRC check + torchvision``: what stoker did before (catches random damage only);
* ``zlib check + torchvision``: a full check before libpng sees the file: every chunk's
  CRC, the header, and the whole image data inflated with Python's zlib (exact size,
  valid filter bytes); safe (0 crashes in ``fuzz_decode.py``), but it inflates twice;
* ``stoker (Pillow)``: ``stoker.decode.decode_image`` today, which decodes PNG with
  Pillow's own decoder (no libpng; it raises on damaged data) and checks the size first.

A guarded subprocess per image was not timed: a process round trip (~1 ms and more)
costs more than decoding a 112x112 PNG many times over.

Run::

    python benchmarks/bench_png_guard.py            # about 30 s
    python benchmarks/bench_png_guard.py --quick
"""

from __future__ import annotations

import argparse
import io
import time
import warnings
import zlib
from collections.abc import Callable

import numpy as np
import torch

from stoker.errors import DecodeError

_HINT = "bad file"

warnings.filterwarnings("ignore", message="The image decoding")


def _images(height: int, width: int, n: int, mode: str) -> list[bytes]:
    from PIL import Image

    from stoker.sources.synthetic import render

    out = []
    for i in range(n):
        array = render(i % 10, height, width, seed=0, index=i)  # HWC uint8, photo-like
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array[:, :, :3])).convert(mode).save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


def _crc_walk(data: memoryview) -> None:
    """The check stoker ran before: every chunk's length and CRC-32 (copied from the old decode.py)."""
    pos, end = 8, len(data)
    while pos + 12 <= end:
        length = int.from_bytes(data[pos : pos + 4], "big")
        stop = pos + 8 + length
        if zlib.crc32(data[pos + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            raise ValueError("crc")
        if data[pos + 4 : pos + 8] == b"IEND":
            return
        pos = stop + 4


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Adam7 passes: (first column, first row, column step, row step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def check_png(data: memoryview, name: str, max_pixels: int | None = None) -> None:
    """Check a PNG completely before libpng sees it, so that libpng cannot fail while decoding rows.

    torchvision 0.29's PNG decoder kills the whole process (a segmentation fault) when
    libpng reports an error while it reads the image rows (broken zlib data, too little
    data, a bad filter byte), where it should raise; errors in the header it does raise.
    So every chunk's length and CRC-32 is checked, the header is checked, and the whole
    image data stream is inflated with Python's zlib: it must end cleanly, hold exactly
    the bytes the header declares, and every row must start with a valid filter type.

    Raises:
        DecodeError: the file is damaged or crafted, or declares more than ``max_pixels`` pixels.
    """
    pos, end = 8, len(data)
    header: memoryview | None = None
    idat: list[memoryview] = []
    idat_done = False
    while pos + 12 <= end:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8].tobytes()
        stop = pos + 8 + length
        if stop + 4 > end:
            raise DecodeError(f"{name}: PNG is truncated in its {kind!r} chunk; {_HINT}")
        if zlib.crc32(data[pos + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            raise DecodeError(f"{name}: PNG {kind.decode('latin-1')!r} chunk fails its CRC (corrupt file); {_HINT}")
        if header is None:
            if kind != b"IHDR" or length != 13:
                raise DecodeError(f"{name}: PNG does not start with its IHDR header chunk; {_HINT}")
            header = data[pos + 8 : stop]
        elif kind == b"IDAT":
            if idat_done:
                raise DecodeError(f"{name}: PNG image data (IDAT) is split by other chunks; {_HINT}")
            idat.append(data[pos + 8 : stop])
        elif idat:
            idat_done = True
        if kind == b"IEND":
            break
        pos = stop + 4
    else:
        raise DecodeError(f"{name}: PNG ends before its IEND chunk (truncated file); {_HINT}")
    if header is None or not idat:
        raise DecodeError(f"{name}: PNG has no image data (IDAT); {_HINT}")
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour, interlace = header[8], header[9], header[12]
    if not (0 < width < 2**31 and 0 < height < 2**31) or depth not in _PNG_DEPTHS.get(colour, ()) or interlace > 1:
        raise DecodeError(
            f"{name}: PNG header is invalid ({width}x{height}, bit depth {depth}, colour type {colour}, "
            f"interlace {interlace}); {_HINT}"
        )
    if width * height > (max_pixels or 89_478_485):
        raise DecodeError(f"{name}: too many pixels")
    bits = _PNG_CHANNELS[colour] * depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    rows: list[tuple[int, int]] = []  # (row count, bytes per row with its filter byte) of each pass
    for x0, y0, dx, dy in passes:
        pass_width, pass_height = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if pass_width > 0 and pass_height > 0:
            rows.append((pass_height, 1 + (pass_width * bits + 7) // 8))
    expected = sum(n * stride for n, stride in rows)
    inflater = zlib.decompressobj()
    raw = bytearray()
    try:
        for part in idat:
            raw += inflater.decompress(part, expected + 1 - len(raw))
            if len(raw) > expected or inflater.unconsumed_tail:
                raise DecodeError(f"{name}: PNG holds more image data than its header declares; {_HINT}")
        raw += inflater.flush()
    except zlib.error as exc:
        raise DecodeError(f"{name}: PNG image data does not decompress ({exc}); {_HINT}") from None
    if not inflater.eof or len(raw) != expected:
        what = "ends early" if len(raw) < expected or not inflater.eof else "holds more than its header declares"
        raise DecodeError(f"{name}: PNG image data {what} (damaged or crafted file); {_HINT}")
    flat = np.frombuffer(raw, dtype=np.uint8)
    start = 0
    for n, stride in rows:
        if int(flat[start : start + n * stride : stride].max()) > 4:
            raise DecodeError(f"{name}: PNG row has an invalid filter type (damaged or crafted file); {_HINT}")
        start += n * stride




def _paths() -> dict[str, Callable[[bytes], object]]:
    from torchvision.io import ImageReadMode, decode_image

    from stoker.decode import decode_image as stoker_decode

    def tv(data: bytes) -> object:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    def crc_tv(data: bytes) -> object:
        _crc_walk(memoryview(data))
        return tv(data)

    def zlib_tv(data: bytes) -> object:
        check_png(memoryview(data), "bench.png")
        return tv(data)

    return {
        "torchvision alone": tv,
        "CRC check + torchvision (before)": crc_tv,
        "zlib check + torchvision": zlib_tv,
        "stoker today (Pillow)": stoker_decode,
    }


def _rate(fn: Callable[[bytes], object], files: list[bytes], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while True:
        for data in files:
            fn(data)
        done += len(files)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per path and image kind, each of 3 rounds")
    parser.add_argument("--quick", action="store_true", help="0.3 s per measurement")
    args = parser.parse_args()
    seconds = 0.3 if args.quick else args.seconds
    torch.set_num_threads(1)
    kinds = [
        ("112x112 RGBA (DigiFace-like)", _images(112, 112, 32, "RGBA")),
        ("256x256 RGB", _images(256, 256, 16, "RGB")),
        ("448x448 RGB", _images(448, 448, 4, "RGB")),
    ]
    paths = _paths()
    print("| image | " + " | ".join(paths) + " |")
    print("|---|" + "---|" * len(paths))
    for label, files in kinds:
        rates = {name: 0.0 for name in paths}
        for _ in range(3):  # interleaved rounds; the best of each, so a busy moment hurts all alike
            for name, fn in paths.items():
                rates[name] = max(rates[name], _rate(fn, files, seconds))
        base = rates["torchvision alone"]
        cells = [f"{rates[n]:,.0f} img/s ({rates[n] / base:.2f}x)" for n in paths]
        kb = sum(map(len, files)) / len(files) / 1024
        print(f"| {label}, {kb:.0f} KiB | " + " | ".join(cells) + " |")
    print("\nimg/s on one core, files in memory; (ratio) is to torchvision alone, best of 3 interleaved rounds.")


if __name__ == "__main__":
    main()
