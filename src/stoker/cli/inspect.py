"""``stoker inspect``: what is inside a shard set."""

from __future__ import annotations

from pathlib import Path

import click

from stoker.cli.paths import require_paths
from stoker.loading.workers import FALLBACK_WORKERS, batches_follow_workers, default_workers


@click.command("inspect")
@click.argument("root", metavar="DATA")  # a str: a URL must not go through pathlib
@click.option("--grid", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG grid of samples with their labels.")
@click.option("--split", default="train", show_default=True, help="Split the grid draws from.")
@click.option("--count", type=click.IntRange(min=1), default=32, show_default=True, help="Samples in the grid.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Batch size the shuffle-quality check assumes.")
@click.option("--shuffle-buffer", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Buffer of the streaming reader (ShardStream) the shuffle-quality check assumes.")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="DataLoader workers per rank the shuffle-quality check of the stream assumes "
                   "[default: the loader's for a stream over this set: 0 over pixel shards, else "
                   f"{FALLBACK_WORKERS} while a stream's batches depend on its workers, else this rank's share of the cores].")
@click.option("--ranks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Distributed ranks (world size) the shuffle-quality check of the stream assumes.")
@click.option("--shards-at-once", type=click.IntRange(min=1), default=None,
              help="Shards the stream reads at once (ShardStream's shards_at_once) the check assumes "
                   "[default: the stream's, 32 for a local set, 8 for a URL].")
@click.option("--classes", "max_classes", type=click.IntRange(min=0), default=20, show_default=True,
              help="Classes listed with their counts.")
def inspect(
    root: str, grid: Path | None, split: str, count: int, batch_size: int, shuffle_buffer: int, workers: int | None, ranks: int,
    shards_at_once: int | None, max_classes: int,
) -> None:
    """Show what data holds: a shard set's counts per split and class, bytes, storage mode,
    image size and origin; for any other layout, what it is opened as, its splits and classes.

    For a shard set it also scores how well the labels are mixed (1 = like a random permutation, 0 = like
    class-sorted data) in the order a sequential reader meets them on disk, and in the
    order training gets them from the streaming reader (ShardStream): each of --workers
    DataLoader workers on each of --ranks ranks reads its part and makes batches, and the
    loader hands them over in turn. A poorly mixed stream is flagged with a warning that
    names the setting that fixes it (more shards at once, a larger buffer, or a shuffled pack).
    """
    require_paths([root])
    from stoker.data import detect_layout

    if detect_layout(root) != "shards":
        _inspect_files(root, max_classes)
        return
    from stoker.shards import summarize, write_grid
    from stoker.shards.cache.store import download_note
    from stoker.shards.check.quality import check_pack, stream_name

    note = download_note(root)  # a URL: the manifest is read first, to say what will be downloaded
    if note is not None:
        click.echo(note)

    summary = summarize(root)
    if workers is None:  # what make_loader gives a ShardStream over this set (stoker.loading.workers)
        import torch

        from stoker.shards import ShardStream

        pixels = summary.manifest.store == "pixels"  # a pixel stream is read in the training process
        workers = default_workers({"num_workers": 0} if pixels else {}, follows_workers=batches_follow_workers(ShardStream),
                                  accelerator=torch.cuda.is_available())  # as make_loader(device="auto")
    click.echo(summary.format(max_classes=max_classes))
    click.echo(f"\nshuffle quality (batch {batch_size}):")
    warnings: list[str] = []
    for split_summary in summary.splits:
        stored, check = check_pack(root, split_summary.name, batch_size, shuffle_buffer, workers=workers, ranks=ranks,
                                   shards_at_once=shards_at_once)
        for order, quality in (("stored order", stored), (stream_name(shuffle_buffer, workers, ranks), check.quality)):
            click.echo(f"  {split_summary.name:<8} {order:<26} {quality.summary()}")
        if not check.ok:
            warnings.append(check.warning(split_summary.name))
    for line in warnings:
        click.echo(line)
    if grid is not None:
        write_grid(root, grid, split=split, count=count)
        click.echo(f"\nwrote a grid of {count} {split} samples with their labels to {grid}")


def _inspect_files(root: str, max_classes: int) -> None:
    """Splits and class counts of data that is not packed (any layout open_data reads)."""
    import numpy as np

    from stoker.data import open_data

    data = open_data(root)
    click.echo(data.describe())
    for split, dataset in data.items():
        counts = np.bincount(np.asarray(dataset.labels), minlength=data.num_classes)  # type: ignore[attr-defined]
        shown = ", ".join(f"{data.classes[i]}: {int(c)}" for i, c in enumerate(counts[:max_classes]))
        more = f", ... ({data.num_classes - max_classes} more)" if data.num_classes > max_classes else ""
        click.echo(f"  {split:<8} {len(dataset):>8} samples  {shown}{more}")  # type: ignore[arg-type]
    if data.empty_classes:
        names = ", ".join(data.classes[i] for i in data.empty_classes[:10])
        click.echo(f"warning: {len(data.empty_classes)} classes have no samples ({names}); numbered from 1? "
                   "--label-order sorted numbers the folders without gaps")
    from stoker.bench.advice import looks_gray, pack_command

    gray = looks_gray(next(iter(data.values())))
    click.echo(f"not packed: pack it for faster reading with {pack_command(str(root), gray=gray)} "
               f"(`stoker bench {root}` measures which shards read fastest here)"
               + ("; every image looked at is gray: --channels 1 stores one channel, a third of the bytes" if gray else ""))
