"""``stoker inspect``: what is inside a shard set."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("inspect")
@click.argument("root", metavar="OUT")
@click.option("--grid", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG grid of samples with their labels.")
@click.option("--split", default="train", show_default=True, help="Split the grid draws from.")
@click.option("--count", type=click.IntRange(min=1), default=32, show_default=True, help="Samples in the grid.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Batch size the shuffle-quality check assumes.")
@click.option("--shuffle-buffer", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Buffer of the streaming reader (ShardStream) the shuffle-quality check assumes.")
@click.option("--classes", "max_classes", type=click.IntRange(min=0), default=20, show_default=True,
              help="Classes listed with their counts.")
def inspect(
    root: str, grid: Path | None, split: str, count: int, batch_size: int, shuffle_buffer: int, max_classes: int
) -> None:
    """Show a shard set's counts per split and class, bytes, storage mode, image size and origin.

    Also scores how well the labels are mixed (1 = like a random permutation, 0 = like
    class-sorted data) in the order a sequential reader meets them on disk, and in the
    order the streaming reader (shuffled shard order, then a buffer) yields them.
    """
    from stoker.shards import summarize, write_grid
    from stoker.shards.cache import download_note
    from stoker.shards.quality import stream_quality

    note = download_note(root)  # a URL: the manifest is read first, to say what will be downloaded
    if note is not None:
        click.echo(note)

    summary = summarize(root)
    click.echo(summary.format(max_classes=max_classes))
    click.echo(f"\nshuffle quality (batch {batch_size}):")
    for split_summary in summary.splits:
        for order, quality in stream_quality(root, split_summary.name, batch_size, shuffle_buffer).items():
            click.echo(f"  {split_summary.name:<8} {order:<26} {quality.summary()}")
    if grid is not None:
        write_grid(root, grid, split=split, count=count)
        click.echo(f"\nwrote a grid of {count} {split} samples with their labels to {grid}")
