"""``stoker pack``: pack one or more sources into checksummed Arrow shards."""

from __future__ import annotations

import re
import time

import click

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_bytes(text: str) -> int:
    """``"256MB"`` -> 268435456 (K, M, G are powers of 1024)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a size; write for example 256MB, 1GB or 1048576")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value < 1:
        raise click.BadParameter(f"{text!r} must be at least one byte")
    return value


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"112x112"`` (height x width) -> (112, 112); a single number is a square."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:[xX,]\s*([0-9]+))?\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a size; write HxW, for example 112x112")
    height = int(match.group(1))
    return height, int(match.group(2) or height)


def parse_split(text: str | None) -> float | None:
    """``"valid=0.1"`` -> 0.1."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*valid\s*=\s*([0-9]*\.?[0-9]+)\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r}: write valid=FRACTION, for example valid=0.1")
    return float(match.group(1))


def parse_crop(text: str | None) -> tuple[int, int, int, int] | None:
    """``"40,20,138,138"`` (top, left, height, width) -> a crop box."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 4 or not all(re.fullmatch(r"[0-9]{1,6}", p.strip()) for p in parts) or min(
        int(parts[2]), int(parts[3])
    ) < 1:
        raise click.BadParameter(
            f"{text!r}: write TOP,LEFT,HEIGHT,WIDTH in pixels (whole numbers: TOP and LEFT from 0, HEIGHT and WIDTH "
            "from 1), for example 40,20,138,138"
        )
    top, left, height, width = (int(p) for p in parts)
    return top, left, height, width


def parse_sources(sources: list[str]) -> list[str] | dict[str, list[str]]:
    """``["a", "b"]`` stays a list; ``["train=a", "valid=b"]`` becomes ``{split: [paths]}``."""
    named = [re.fullmatch(r"([A-Za-z][A-Za-z0-9_-]*)=(.+)", s) for s in sources]
    if not any(named):
        return list(sources)
    if not all(named):
        plain = next(s for s, m in zip(sources, named, strict=True) if m is None)
        raise click.BadParameter(f"{plain!r}: name every SRC's split (train=DIR valid=DIR) or none of them")
    splits: dict[str, list[str]] = {}
    for match in named:
        splits.setdefault(match.group(1), []).append(match.group(2))  # type: ignore[union-attr]
    return splits


@click.command("pack")
@click.argument("paths", nargs=-1, required=True, metavar="SRC... OUT")
@click.option("--store", type=click.Choice(["encoded", "pixels"]), default="encoded", show_default=True,
              help="encoded: keep each file's bytes (compact, decoded when read); "
                   "pixels: decoded uint8 pixels at --size (no decoding when read, larger).")
@click.option("--size", metavar="HxW", help="Image size: stored size for pixels (default: the first image's), "
                                             "read size for encoded (default: each file's own).")
@click.option("--shard-samples", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Most samples per shard.")
@click.option("--shard-bytes", default="256MB", show_default=True, help="About the most bytes per shard (K/M/G = 1024^n).")
@click.option("--split", "split_spec", metavar="valid=F", help="Hold out a fraction F of each class as the valid split.")
@click.option("--workers", type=click.IntRange(min=0), default=None, help="Processes writing shards [default: CPU count].")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle (and split) seed.")
@click.option("--no-shuffle", is_flag=True,
              help="Keep the source order (only to measure what an unshuffled pack does; training wants shuffled).")
@click.option("--overwrite", is_flag=True,
              help="Replace the shard set already in OUT (a folder or a bucket prefix); the old set stays readable "
                   "until the new one is complete, and files stoker did not write are kept.")
@click.option("--labels", metavar="FILE",
              help="Label file ('<file> <label>' lines) of a single SRC folder that holds several .txt files.")
@click.option("--crop", metavar="T,L,H,W", help="Crop box (top,left,height,width) for every image of every SRC.")
@click.option("--channels", type=click.Choice(["3", "1"]), default="3", show_default=True,
              help="pixels: 1 stores one gray channel (a third of the bytes; colour becomes its luma); "
                   "readers return 1xHxW images, which stoker's preprocessing broadcasts to 3 channels.")
@click.option("--label-order", type=click.Choice(["auto", "sorted"]), default="auto", show_default=True,
              help="auto: numeric class folder names are the labels; sorted: folder names numbered in sorted order.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes here; ray: one Ray task per shard on the cluster ray.init() finds "
                   "(or a local one); needs pip install 'stoker[ray]'.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def pack(paths: tuple[str, ...], store: str, size: str | None, shard_samples: int, shard_bytes: str,
         split_spec: str | None, workers: int | None, seed: int, no_shuffle: bool, overwrite: bool, labels: str | None,
         crop: str | None, channels: str, label_order: str, engine: str, quiet: bool) -> None:
    """Pack SRC... into shuffled, checksummed Arrow shards in OUT.

    SRC is a folder of class folders, a folder with a label file (identity_CelebA.txt or
    another *.txt beside img/), a folder with ids.json/ids.csv, or an existing shard set
    (re-pack to another mode or size), or a folder of split folders (train/, val/). Several
    SRC are laid side by side (their labels do not clash); SPLIT=SRC (train=DIR valid=DIR)
    gives each split its own source, with one label mapping for all. The same arguments give byte-identical shards; an interrupted pack
    re-run with the same arguments resumes where it stopped.

    \b
    Examples:
      stoker pack data/digiface packed --store pixels --size 112x112 --split valid=0.1
      stoker pack data/celeba data/digiface packed --size 112x112
      stoker pack train=imagenet/train valid=imagenet/val packed --store encoded
    """
    if len(paths) < 2:
        raise click.UsageError("give at least one SRC and the OUT folder: stoker pack SRC... OUT")
    *sources, out = paths
    from stoker.packer import pack as run_pack

    start = time.perf_counter()
    manifest = run_pack(
        parse_sources(sources),
        out,
        store=store,
        size=parse_size(size),
        shard_samples=shard_samples,
        shard_bytes=parse_bytes(shard_bytes),
        valid=parse_split(split_spec),
        seed=seed,
        shuffle=not no_shuffle,
        workers=workers,
        overwrite=overwrite,
        progress=not quiet,
        engine=engine,
        labels=labels,
        crop=parse_crop(crop),
        label_order="sorted" if label_order == "sorted" else "auto",
        channels=int(channels),
    )
    seconds = time.perf_counter() - start
    splits = ", ".join(f"{name} {sum(i.samples for i in infos):,}" for name, infos in manifest.splits.items())
    size_text = f"{manifest.image_size[0]}x{manifest.image_size[1]}" if manifest.image_size else "own size"
    click.echo(
        f"packed {manifest.samples:,} samples ({splits}) into {len(manifest.shards)} shards, "
        f"{manifest.bytes / 2**20:,.1f} MiB, {manifest.store} {size_text}, in {seconds:,.1f} s "
        f"({manifest.samples / max(seconds, 1e-9):,.0f} samples/s) -> {out}"
    )
