"""``stoker make-data``: write a deterministic synthetic data set in one of three layouts."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

# How to open each layout with stoker, printed after the summary: (reader, call).
_LOAD_HINTS: dict[str, tuple[str, str]] = {
    "celeba": ("LabelFileDataset", '("{root}/img", "{root}/identity_CelebA.txt")  # labels 1..C as written'),
    "digiface": ("ClassFolderDataset", '("{root}")  # folder name = label'),
    "ids": ("IdDataset", '.from_json("{root}/ids.json", split="train")  # or split="validation"'),
}


def _folder_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            total += os.path.getsize(os.path.join(folder, name))
    return total


# The kinds of stoker.sources.synthetic.KINDS, spelled out so `stoker --help` need not
# import torch (a test keeps the two equal).
_KINDS = ("celeba", "digiface", "ids")


@click.command("make-data")
@click.argument("kind", type=click.Choice(_KINDS))
@click.argument("root", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--n", "n", type=int, default=1000, show_default=True, help="Number of images.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed; the same seed writes byte-identical files.")
@click.option("--classes", type=int, default=10, show_default=True, help="Number of classes (balanced), 2..N.")
@click.option("--workers", type=int, default=None, help="Processes that render and encode  [default: min(2, CPUs)].")
@click.option("--overwrite", is_flag=True, help="Write into a non-empty DIR, replacing what this KIND writes there.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr  [default: when stderr is a terminal].")
def make_data(
    kind: str, root: Path, n: int, seed: int, classes: int, workers: int | None, overwrite: bool, progress: bool | None
) -> None:
    """Write N synthetic images of KIND into DIR, laid out like the real data set.

    Each class has its own colours and stripe pattern, jittered per image, so a small
    model learns the class within a few epochs. Classes are balanced; file numbers are
    in random order with respect to class.

    \b
    celeba    DIR/img/000001.jpg ...     178 wide x 218 tall RGB JPEG, ~10 KB each
              DIR/identity_CelebA.txt    "000001.jpg 3" per line, identities 1..C
    digiface  DIR/<class>/<i>.png        112x112 RGBA PNG, class folders 0..C-1,
                                         files numbered from 0 in each folder
    ids       DIR/data/id-00001.pt ...   uint8 CHW tensor 3x64x64 (torch.save)
              DIR/ids.json               {"partition": {"train": [ids], "validation": [ids]},
                                          "labels": {id: label}}, labels 0..C-1, ~80/20 split
              DIR/ids.csv                the same as a table: id,label,split

    \b
    Example:
      stoker make-data celeba data/celeba --n 20000 --classes 100
    """
    from stoker.sources.synthetic import make_data as make

    if progress is None:
        progress = sys.stderr.isatty()
    start = time.perf_counter()
    make(kind, root, n, seed, classes, workers=workers, progress=progress, overwrite=overwrite)
    seconds = time.perf_counter() - start
    size_mb = _folder_bytes(root) / 1e6
    click.echo(
        f"made {kind}: {n} images, {classes} classes, seed {seed} in {root} "
        f"({size_mb:.1f} MB) in {seconds:.1f} s ({n / seconds:.0f} img/s)"
    )
    reader, call = _LOAD_HINTS[kind]
    click.echo(f"load it with: from stoker.sources import {reader}")
    click.echo(f"              {reader}{call.format(root=root.as_posix())}")
