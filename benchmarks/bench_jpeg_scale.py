"""What decoding JPEGs at full scale costs against a reduced DCT scale, and what the reduced scale changes, in one run.

stoker's fast JPEG path decodes at full scale (docs/format-pixels.md: a reduced DCT scale
gives other pixels than the full path, by as much as an image's high frequencies make it).
This measures the price of that rule on CelebA-like photos (``make_celeba``, 178x218, crop
``(40, 20, 138, 138)``) at output sizes where a reduced scale would apply (32 px: 1/2 of
the crop still at least twice the output) and where it would not (112 px):

* ``full scale``: decode at full scale, crop, one antialiased resize of the batch (the
  pixels of :func:`stoker.decode.jpeg.decode_jpegs_into`, the path training takes: checked);
* ``reduced scale``: the same, at the smallest scale ``m/8`` that keeps the crop at least
  twice the output (the rule stoker had before); where that is 8/8 the two are the same work;

timed A/B/A/B on one thread, medians reported, and the mean absolute difference of the
reduced result from the full path's pixels (natural images; noise or a crafted
quantisation table make it as large as they like).

Run::

    python benchmarks/bench_jpeg_scale.py --n 256 --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.decode import jpeg  # noqa: E402
from stoker.decode.image import resize  # noqa: E402
from stoker.sources.synthetic import make_celeba  # noqa: E402

BOX = (40, 20, 138, 138)


def reduced_scale(box: tuple[int, int, int, int], size: tuple[int, int]) -> int:
    """The smallest m in 1, 2, 4 with the box on the m/8 grid and at least twice the output; else 8."""
    for m in (1, 2, 4):
        if all(v * m % 8 == 0 for v in box) and min(box[2], box[3]) * m >= 16 * max(size):
            return m
    return 8


def decode_at(m: int, blobs: list[np.ndarray], size: tuple[int, int], out: torch.Tensor) -> None:
    """Decode at scale m/8, crop the scaled box, one antialiased resize of the batch."""
    import simplejpeg

    top, left, height, width = (v * m // 8 for v in BOX)
    crops = []
    for data in blobs:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-h * m // 8), min_width=-(-w * m // 8))
        crops.append(pixels[top : top + height, left : left + width])
    batch = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)
    out.copy_(resize(batch, size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256, help="images")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "stoker-bench-jpeg-scale")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not (args.out / ".complete").exists():
        make_celeba(args.out, args.n, classes=4, workers=1, progress=False, overwrite=True)
        (args.out / ".complete").write_text("")
    blobs = [np.frombuffer(p.read_bytes(), dtype=np.uint8) for p in sorted(args.out.rglob("*.jpg"))[: args.n]]
    print(f"{len(blobs)} CelebA-like JPEGs, crop {BOX}, one thread, {args.rounds} interleaved rounds")
    print("| output | reduced scale | full scale img/s | reduced scale img/s | full / reduced | mean abs diff (worst image) |")
    print("|---|---|---:|---:|---:|---:|")
    for size in ((32, 32), (56, 56), (112, 112)):
        full = torch.empty((len(blobs), 3, *size), dtype=torch.uint8)
        reduced = torch.empty_like(full)
        times: dict[str, list[float]] = {"full": [], "reduced": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            decode_at(8, blobs, size, full)
            times["full"].append(time.perf_counter() - start)
            start = time.perf_counter()
            decode_at(reduced_scale(BOX, size), blobs, size, reduced)
            times["reduced"].append(time.perf_counter() - start)
        training = torch.empty_like(full)
        assert not jpeg.decode_jpegs_into(blobs, [BOX] * len(blobs), size, training)
        assert torch.equal(training, full)  # the full-scale row is what training reads
        full_s, reduced_s = float(np.median(times["full"])), float(np.median(times["reduced"]))
        diff = (full.int() - reduced.int()).abs().float().mean(dim=(1, 2, 3))
        print(f"| {size[0]} px | {reduced_scale(BOX, size)}/8 | {len(blobs) / full_s:,.0f} | {len(blobs) / reduced_s:,.0f} "
              f"| {reduced_s / full_s:.2f} | {diff.mean():.2f} ({diff.max():.2f}) |")


if __name__ == "__main__":
    main()
