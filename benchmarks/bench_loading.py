"""The published comparison, on generated data, on this machine: ``stoker.bench.bench``.

Generates DigiFace-like data (112x112 RGBA PNG in class folders) and, with ``--celeba``,
CelebA-like data too (178x218 JPEG with a label file; both are then resized to 112x112
and combined, as in the published comparison of CelebA + DigiFace-1M), then times every
loading method x workers and writes ``bench.md``, ``bench.json`` and ``bench.png``.

Run::

    python benchmarks/bench_loading.py --n 2000 --out /tmp/stoker-bench-loading
    python benchmarks/bench_loading.py --n 2000 --celeba --workers 0,2,4 --mode train --model small_cnn

The same as the command line, for your own data: ``stoker bench DATA --workers 0,1,2,4``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker import concat  # noqa: E402
from stoker.bench import bench, render_markdown, save_report  # noqa: E402
from stoker.data import open_data  # noqa: E402
from stoker.sources.synthetic import make_celeba, make_digiface  # noqa: E402


def _generate(kind: str, root: Path, n: int, classes: int) -> Path:
    marker = root / ".bench-loading"
    wanted = f"{kind} n={n} classes={classes}\n"
    if not (marker.exists() and marker.read_text() == wanted):
        make = make_digiface if kind == "digiface" else make_celeba
        make(root, n=n, classes=classes, overwrite=True)
        marker.write_text(wanted)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="images per generated data set")
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--celeba", action="store_true", help="add CelebA-like data (resized to 112x112)")
    parser.add_argument("--workers", default="0,1,2,4")
    parser.add_argument("--backends", default="process")
    parser.add_argument("--methods", default="files,pipe,shards-encoded,shards-pixels")
    parser.add_argument("--mode", choices=["load", "train"], default="load")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stoker-bench-loading"))
    args = parser.parse_args(argv)

    data = open_data(_generate("digiface", args.out / "data" / "digiface", args.n, args.classes), "train")
    size = None
    if args.celeba:
        celeba = open_data(_generate("celeba", args.out / "data" / "celeba", args.n, args.classes), "train")
        data, size = concat(celeba, data), (112, 112)
    result = bench(
        data,
        methods=args.methods.split(","),
        workers=[int(w) for w in args.workers.split(",")],
        backends=args.backends.split(","),
        mode=args.mode,
        model=args.model,
        batch_size=args.batch_size,
        max_seconds=args.max_seconds,
        size=size,
        echo=lambda line: print(line, file=sys.stderr),
    )
    print(render_markdown(result))
    paths = save_report(result, args.out / "report")
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
