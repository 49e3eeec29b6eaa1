"""What is inside a shard set: counts per split and class, bytes, how it was made, a grid of samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stoker.decode.image import resize
from stoker.errors import ConfigError
from stoker.shards.format.manifest import Manifest
from stoker.shards.read.dataset import load_shard_image
from stoker.shards.read.reader import ShardSet

__all__ = ["ShardSetSummary", "SplitSummary", "summarize", "write_grid"]


def _bytes_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class SplitSummary:
    """One split: samples, shards, bytes, and samples per class (``class_counts[label]``)."""

    name: str
    samples: int
    shards: int
    bytes: int
    class_counts: np.ndarray


@dataclass(frozen=True)
class ShardSetSummary:
    """A shard set at a glance; :meth:`format` renders it for a person."""

    root: str
    manifest: Manifest
    splits: tuple[SplitSummary, ...]

    def format(self, max_classes: int = 20) -> str:
        """The summary as text: the set, its splits, and the first ``max_classes`` classes."""
        m = self.manifest
        size = f"{m.image_size[0]}x{m.image_size[1]}" if m.image_size else "each image's own size"
        layout = "uint8 RGB CHW" if m.channels == 3 else "uint8 gray, 1 channel (CHW)"
        store = f"pixels, {size} {layout}" if m.store == "pixels" else f"encoded (original files), read at {size}"
        made = m.made_by
        sources = ", ".join(
            f"{s.name} ({s.root}" + (f", crop {','.join(map(str, s.crop))})" if s.crop else ")") for s in m.sources
        )
        made_text = (
            f"stoker {made.get('stoker_version', '?')}, seed {made.get('seed', '?')}, "
            f"shard_samples {made.get('shard_samples', '?')}, "
            f"shard_bytes {_bytes_text(made['shard_bytes']) if isinstance(made.get('shard_bytes'), int) else '?'}, "
            f"valid {made.get('valid')}, shuffle {made.get('shuffle', True)}"
        )
        lines = [
            f"shard set  {self.root}  ({m.format} v{m.version})",
            f"store      {store}",
            f"samples    {m.samples:,} in {len(m.shards)} shards, {_bytes_text(m.bytes)}",
            f"classes    {len(m.classes):,}",
            f"sources    {sources}",
            f"made by    {made_text}",
            f"from       {', '.join(map(str, made.get('source', []))) or '?'}",
            "",
            f"{'split':<10} {'samples':>10} {'shards':>7} {'bytes':>12} {'classes seen':>13}",
        ]
        for s in self.splits:
            seen = int(np.count_nonzero(s.class_counts))
            lines.append(f"{s.name:<10} {s.samples:>10,} {s.shards:>7} {_bytes_text(s.bytes):>12} {seen:>13,}")
        shown = min(len(m.classes), max_classes)
        lines += ["", f"samples per class{'' if shown == len(m.classes) else f' (first {shown} of {len(m.classes)})'}:"]
        name_width = min(max([len("class"), *(len(c) for c in m.classes[:shown])]), 24)
        header = f"  {'label':>6}  {'class':<{name_width}}" + "".join(f" {s.name:>10}" for s in self.splits)
        lines.append(header)
        for label in range(shown):
            counts = "".join(f" {int(s.class_counts[label]):>10,}" for s in self.splits)
            lines.append(f"  {label:>6}  {m.classes[label][:24]:<{name_width}}{counts}")
        empty = [i for i in range(len(m.classes)) if not any(int(s.class_counts[i]) for s in self.splits)]
        if empty:
            names = ", ".join(m.classes[i] for i in empty[:10]) + (" ..." if len(empty) > 10 else "")
            lines += ["", f"warning: {len(empty)} of {len(m.classes)} classes have no samples ({names}); "
                      "numbered folders from 1? re-pack with --label-order sorted"]
        return "\n".join(lines)


def summarize(root: str | os.PathLike[str]) -> ShardSetSummary:
    """Count a shard set's samples per split and class (reads only the label columns).

    Raises:
        ShardError: the manifest or a shard is missing or damaged.

    Example:
        >>> print(summarize("packed").format())
        shard set  packed  (stoker-shards v1)
        store      pixels, 32x32 uint8 RGB CHW
        ...
    """
    manifest = Manifest.load(root)
    splits = []
    for name, infos in manifest.splits.items():
        shards = ShardSet(root, name)
        try:
            counts = np.bincount(shards.all_labels(), minlength=len(manifest.classes))
        finally:
            shards.close()
        splits.append(SplitSummary(name, sum(i.samples for i in infos), len(infos), sum(i.bytes for i in infos), counts))
    return ShardSetSummary(str(root), manifest, tuple(splits))


def write_grid(
    root: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    split: str = "train",
    count: int = 32,
    columns: int = 8,
    cell: int = 112,
    seed: int = 0,
) -> Path:
    """Write a PNG grid of ``count`` random samples of ``split``, each captioned with its label.

    Args:
        root: the shard set folder.
        path: the image file to write (``.png``).
        split: which split to draw from.
        count: how many samples (at most the split's size).
        columns: samples per row of the grid.
        cell: the side, in pixels, each sample is drawn at.
        seed: which samples are drawn.

    Returns:
        ``path``.

    Example:
        >>> write_grid("packed", "grid.png", split="valid", count=4)
        PosixPath('grid.png')
    """
    from PIL import Image, ImageDraw

    if count < 1 or columns < 1 or cell < 8:
        raise ConfigError(f"count and columns must be >= 1 and cell >= 8, got {count}, {columns}, {cell}")
    shards = ShardSet(root, split)
    classes = shards.manifest.classes
    picked = np.sort(np.random.default_rng(seed).permutation(len(shards))[: min(count, len(shards))])
    caption = 14
    rows = (len(picked) + columns - 1) // columns
    grid = Image.new("RGB", (columns * cell, rows * (cell + caption)), "white")
    draw = ImageDraw.Draw(grid)
    try:
        for n, i in enumerate(picked.tolist()):
            image = resize(load_shard_image(shards, i), (cell, cell))
            x, y = (n % columns) * cell, (n // columns) * (cell + caption)
            grid.paste(Image.fromarray(image.permute(1, 2, 0).numpy()), (x, y))
            label = int(shards.read_labels(np.asarray([i]))[0])
            text = f"{label}: {classes[label]}" if classes[label] != str(label) else str(label)
            draw.text((x + 2, y + cell + 1), text[: cell // 6], fill="black")
    finally:
        shards.close()
    path = Path(path)
    grid.save(path)
    return path
