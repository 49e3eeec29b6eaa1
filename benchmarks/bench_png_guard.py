"""PNG decoders side by side in one run: speed (interleaved rounds, as ratios) and the GIL.

torchvision's libpng path crashes the process on PNGs whose zlib data is broken but
whose CRCs are valid (see ``docs/reliability.md``), so stoker never gives it a PNG. The
candidates, timed on the same files in the same run, one thread, files in memory, in
interleaved rounds (A, B, C, ..., A, B, C, ...) so that a busy moment of the machine
falls on one round of every path rather than on one path:

* ``torchvision alone``: ``torchvision.io.decode_image`` (unsafe: the speed to beat);
* ``zlib check + torchvision``: a full check before libpng sees the file (every chunk's
  CRC, the header, the whole image data inflated with Python's zlib); safe, but it
  inflates twice;
* ``Pillow (stoker before)``: ``stoker.decode.image._decode_with_pil``, what stoker did for
  every PNG before libspng: the reference pixels;
* ``stoker (libspng)``: ``stoker.decode.image.decode_image`` today: CRC walk, size check, then
  libspng through ``imagecodecs`` (Pillow for what libspng cannot read);
* ``pyspng alone``, ``imagecodecs libspng alone``, ``imagecodecs libpng alone``: the
  candidates, without stoker's checks or its conversion to RGB CHW.

Then the GIL: the longest pause of a Python loop while another thread decodes one
2000x2000 PNG (a decoder that holds the GIL stops it for the whole decode), and two
threads decoding side by side against one (scaling; on a loaded machine this scatters).

With ``--loader N``, the same question a training run asks: N DigiFace-like files
(``stoker make-data digiface``) packed as encoded shards, read by ``make_loader`` with 2
worker processes and with 2 threads (libspng; and worker processes with Pillow, as
before), against a hand-written torchvision Dataset in a DataLoader with 2 workers, batch
256, interleaved epochs, as ratios to that Dataset per round.

Run::

    python benchmarks/bench_png_guard.py            # about a minute
    python benchmarks/bench_png_guard.py --quick
    python benchmarks/bench_png_guard.py --loader 3000 --rounds 5 --out /tmp/png-loader
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

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

    from stoker.decode.image import _decode_with_pil
    from stoker.decode.image import decode_image as stoker_decode

    def tv(data: bytes) -> object:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    def zlib_tv(data: bytes) -> object:
        check_png(memoryview(data), "bench.png")
        return tv(data)

    def pillow(data: bytes) -> object:
        return _decode_with_pil(memoryview(data), "bench.png", 89_478_485)

    paths: dict[str, Callable[[bytes], object]] = {
        "torchvision alone": tv,
        "zlib check + torchvision": zlib_tv,
        "Pillow (stoker before)": pillow,
        "stoker (libspng)": stoker_decode,
    }
    try:
        import pyspng

        paths["pyspng alone"] = lambda data: pyspng.load(data, "RGB")
    except ImportError:
        pass
    try:
        import imagecodecs

        paths["imagecodecs libspng alone"] = imagecodecs.spng_decode
        paths["imagecodecs libpng alone"] = imagecodecs.png_decode
    except ImportError:
        pass
    return paths


def _rate(fn: Callable[[bytes], object], files: list[bytes], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while True:
        for data in files:
            fn(data)
        done += len(files)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def _spread(values: list[float]) -> str:
    return f"{' / '.join(f'{v:.2f}' for v in sorted(values))} (median {statistics.median(values):.2f})"


def speed(rounds: int, seconds: float) -> None:
    """img/s of every path per image kind, and stoker's ratios per round."""
    kinds = [
        ("112x112 RGBA (DigiFace-like)", _images(112, 112, 32, "RGBA")),
        ("256x256 RGB", _images(256, 256, 16, "RGB")),
        ("448x448 RGB", _images(448, 448, 4, "RGB")),
    ]
    paths = _paths()
    print(f"## Speed: median img/s of {rounds} interleaved rounds, one thread, files in memory\n")
    print("| image | " + " | ".join(paths) + " |")
    print("|---|" + "---|" * len(paths))
    ratios: list[tuple[str, list[float], list[float]]] = []
    for label, files in kinds:
        rates: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, fn in paths.items():
                rates[name].append(_rate(fn, files, seconds))
        median = {n: statistics.median(r) for n, r in rates.items()}
        cells = [f"{median[n]:,.0f}" for n in paths]
        kb = sum(map(len, files)) / len(files) / 1024
        print(f"| {label}, {kb:.0f} KiB | " + " | ".join(cells) + " |")
        new, tv, pil = rates["stoker (libspng)"], rates["torchvision alone"], rates["Pillow (stoker before)"]
        ratios.append((label, [a / b for a, b in zip(new, tv, strict=True)], [a / b for a, b in zip(new, pil, strict=True)]))
    print("\n| image | stoker (libspng) / torchvision alone, per round | stoker (libspng) / Pillow, per round |")
    print("|---|---|---|")
    for label, to_tv, to_pil in ratios:
        print(f"| {label} | {_spread(to_tv)} | {_spread(to_pil)} |")


def gil(threads: int = 2) -> None:
    """Whether each decoder lets other Python threads run while it decodes, and thread scaling."""
    from PIL import Image

    rng = np.random.default_rng(0)
    big = io.BytesIO()
    Image.fromarray((rng.integers(0, 256, (2000, 2000, 4)) // 8).astype(np.uint8), "RGBA").save(big, "PNG")
    data = big.getvalue()
    small = _images(112, 112, 32, "RGBA") * 4
    paths = _paths()
    paths.pop("zlib check + torchvision")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    print("\n## The GIL: one 2000x2000 PNG in a thread; 112x112 RGBA in 1 and 2 threads\n")
    print("| decoder | one decode | longest pause of a Python loop meanwhile | GIL | "
          f"1 thread | {threads} threads | scaling |")
    print("|---|---|---|---|---|---|---|")
    try:
        for name, fn in paths.items():
            start = time.perf_counter()
            fn(data)
            alone = time.perf_counter() - start
            done = threading.Event()

            def decode_big(fn: Callable[[bytes], object] = fn, done: threading.Event = done) -> None:
                fn(data)
                done.set()

            worker = threading.Thread(target=decode_big)
            pause, last = 0.0, time.perf_counter()
            worker.start()
            while not done.is_set():
                now = time.perf_counter()
                pause, last = max(pause, now - last), now
            worker.join()
            held = "held" if pause > 0.6 * alone else "released"

            def run(fn: Callable[[bytes], object] = fn) -> None:
                for item in small:
                    fn(item)

            start = time.perf_counter()
            run()
            one = len(small) / (time.perf_counter() - start)
            team = [threading.Thread(target=run) for _ in range(threads)]
            start = time.perf_counter()
            for t in team:
                t.start()
            for t in team:
                t.join()
            many = threads * len(small) / (time.perf_counter() - start)
            print(f"| {name} | {alone * 1e3:.0f} ms | {pause * 1e3:.0f} ms | {held} | {one:,.0f} img/s | "
                  f"{many:,.0f} img/s | {many / one:.2f}x |")
    finally:
        sys.setswitchinterval(switch)


def loader(n: int, rounds: int, out: Path) -> None:
    """Encoded PNG shards through make_loader against a hand-written torchvision Dataset."""
    from torch.utils.data import DataLoader, Dataset
    from torchvision.io import ImageReadMode, decode_image

    from stoker.decode import image as decode
    from stoker.loading.loader import make_loader
    from stoker.packer import pack
    from stoker.shards import ShardDataset
    from stoker.sources.synthetic import make_digiface

    marker = out / f"made-{n}"
    if not marker.exists():
        make_digiface(out / "files", n=n, classes=10, overwrite=True)
        pack(out / "files", out / "encoded", store="encoded", workers=0, progress=False, overwrite=True)
        marker.touch()
    files = sorted((out / "files").rglob("*.png"))

    class Files(Dataset[tuple[torch.Tensor, int]]):
        """What one writes by hand: torchvision.io (libpng) on each file."""

        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return decode_image(str(files[i]), mode=ImageReadMode.RGB), 0

    def epoch(batches: object) -> float:
        start, done = time.perf_counter(), 0
        for images, _ in batches:  # type: ignore[attr-defined]
            done += len(images)
        return done / (time.perf_counter() - start)

    methods: dict[str, object] = {
        "torchvision Dataset, 2 workers": DataLoader(Files(), batch_size=256, num_workers=2, shuffle=True,
                                                     persistent_workers=True),
    }
    real = decode._spng_decode
    decode._spng_decode = None  # type: ignore[assignment]  # the worker processes forked now keep Pillow
    before = make_loader(ShardDataset(out / "encoded"), batch_size=256, num_workers=2, backend="process", shuffle=True)
    epoch(before)
    decode._spng_decode = real
    for backend in ("process", "thread"):
        methods[f"encoded shards, {backend} x2 (libspng)"] = make_loader(
            ShardDataset(out / "encoded"), batch_size=256, num_workers=2, backend=backend, shuffle=True)
    methods["encoded shards, process x2 (Pillow, before)"] = before
    for batches in methods.values():
        epoch(batches)  # the workers start
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, batches in methods.items():
            rates[name].append(epoch(batches))
    base = rates["torchvision Dataset, 2 workers"]
    print(f"\n## Loaders: {n:,} 112x112 RGBA PNGs, batch 256, {rounds} interleaved epochs\n")
    print("| loader | median img/s | / torchvision Dataset, per round |")
    print("|---|---|---|")
    for name, got in rates.items():
        print(f"| {name} | {statistics.median(got):,.0f} | {_spread([a / b for a, b in zip(got, base, strict=True)])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.6, help="time per path, image kind and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="0.1 s per measurement, 2 rounds (a smoke test)")
    parser.add_argument("--loader", type=int, default=0, metavar="N", help="also time loaders on N generated files")
    parser.add_argument("--out", type=Path, default=Path("/tmp/stoker-png-loader"), help="where --loader makes its data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seconds, rounds = (0.1, 2) if args.quick else (args.seconds, args.rounds)
    speed(rounds, seconds)
    gil()
    if args.loader:
        loader(args.loader, rounds, args.out)
    print(f"\n{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end.")


if __name__ == "__main__":
    main()
