"""``stoker verify``: check every checksum and every sample of a shard set."""

from __future__ import annotations

import sys

import click


@click.command("verify")
@click.argument("root", metavar="OUT")
@click.option("--no-decode", is_flag=True, help="Check checksums and structure only; do not decode images.")
@click.option("--workers", type=click.IntRange(min=0), default=None, help="Processes checking shards [default: CPU count].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--accept-cache", is_flag=True,
              help="For a URL whose store cannot be reached: exit 0 when the cached copies check out.")
def verify(root: str, no_decode: bool, workers: int | None, quiet: bool, accept_cache: bool) -> None:
    """Check a shard set: the manifest, every shard's SHA-256, and that every sample decodes.

    Prints the first bad shard and row; the exit status is 1 on any fault, and for a URL
    whose store could not be reached (only the cached copies checked) unless --accept-cache.
    """
    from stoker.shards import verify as run_verify
    from stoker.shards.cache.store import download_note

    note = download_note(root)  # a URL: the manifest is read first, to say what will be downloaded
    if note is not None:
        click.echo(note, err=True)

    report = run_verify(root, decode=not no_decode, workers=workers, progress=not quiet)
    for fault in report.faults[:20]:
        click.echo(f"fault: {fault}", err=True)
    if len(report.faults) > 20:
        click.echo(f"... and {len(report.faults) - 20} more", err=True)
    click.echo(report.summary(), err=not report.ok)
    if not report.ok:
        sys.exit(1)
    if report.offline and not accept_cache:
        click.echo(
            f"error: {root}: the store could not be reached, so only the cached copies were checked, not the store; "
            "run again when it is reachable, or pass --accept-cache to accept a check of the cache",
            err=True,
        )
        sys.exit(1)
