"""``stoker inspect``: what is inside a shard set."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("inspect")
@click.argument("root", type=click.Path(path_type=Path), metavar="OUT")
@click.option("--grid", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG grid of samples with their labels.")
@click.option("--split", default="train", show_default=True, help="Split the grid draws from.")
@click.option("--count", type=click.IntRange(min=1), default=32, show_default=True, help="Samples in the grid.")
@click.option("--classes", "max_classes", type=click.IntRange(min=0), default=20, show_default=True,
              help="Classes listed with their counts.")
def inspect(root: Path, grid: Path | None, split: str, count: int, max_classes: int) -> None:
    """Show a shard set's counts per split and class, bytes, storage mode, image size and origin."""
    from stoker.shards import summarize, write_grid

    click.echo(summarize(root).format(max_classes=max_classes))
    if grid is not None:
        write_grid(root, grid, split=split, count=count)
        click.echo(f"\nwrote a grid of {count} {split} samples with their labels to {grid}")
