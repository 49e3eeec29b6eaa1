"""``stoker tune DATA``: measure which loader settings are fastest here, and save them."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import click

from stoker.bench.methods import method_names
from stoker.cli.bench import parse_size, split_list
from stoker.cli.paths import require_paths
from stoker.errors import ConfigError
from stoker.terminal import set_quiet


def parse_duration(text: str) -> float:
    """``"60s"``, ``"2m"``, ``"1.5min"`` or ``"90"`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", text)
    if not match:
        raise ConfigError(f"--budget: expected a duration such as 60s or 2m, got {text!r}")
    value = float(match.group(1))
    return value * {"m": 60, "min": 60, "h": 3600}.get(match.group(2) or "s", 1)


@click.command("tune")
@click.argument("data")  # a path or a URL (a str: pathlib would mangle s3://)
@click.option("--budget", "budget_text", default="60s", show_default=True, help="Time the search may take (60s, 2m).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("loader.toml"), show_default=True,
              help="Where to write the chosen settings (read by `stoker train --loader-config`).")
@click.option("--storages", default=",".join(method_names(tunable=True)), show_default=True,
              help="Comma-separated storages to consider.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="The training batch size.")
@click.option("--size", "size_text", default=None, help="Resize every image to HEIGHTxWIDTH (needed when sizes differ).")
@click.option("--max-workers", type=click.IntRange(min=0), default=None, help="The most workers to try.")
@click.option("--cold", is_flag=True, help="Drop the sample's files from the page cache before each trial.")
@click.option("--device", default="auto", show_default=True, help="Where batches go: auto, cpu, cuda, cuda:N.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bars (there are none either when stderr is not a terminal).")
def tune(
    data: str,
    budget_text: str,
    out: Path,
    storages: str,
    batch_size: int,
    size_text: str | None,
    max_workers: int | None,
    cold: bool,
    device: str,
    seed: int,
    quiet: bool,
) -> None:
    """Search workers, backend, prefetch depth and storage for DATA within a time budget.

    DATA is a folder in any layout stoker reads, a label file, or a URL (s3://, gs://, ...
    through fsspec): trials on the files read them from the bucket; trials on shards
    pack the sample into a local temporary folder first. A shard set made by `stoker
    pack` (a folder or a URL) is tuned as it is, on its own storage.

    Every setting is measured, not guessed; the command prints each trial and why it
    chose, and writes the chosen settings as a [data] TOML table to --out.

    Example: stoker tune digiface/ --budget 60s && stoker train run.toml --loader-config loader.toml
    """
    require_paths([data])
    set_quiet(quiet)
    from stoker.bench import save_settings, search_settings

    budget_s = parse_duration(budget_text)
    result = search_settings(
        data,
        budget_s,
        storages=split_list(storages, "storages"),
        batch_size=batch_size,
        size=parse_size(size_text),
        max_workers=max_workers,
        cold=cold,
        device=device,
        seed=seed,
        echo=lambda line: click.echo(line, err=True),
    )
    click.echo(result.report())
    comment = (
        f"written by `stoker tune {data} --budget {budget_text}` on {datetime.now():%Y-%m-%d %H:%M}, "
        f"trials on {result.sample_size} samples"
    )
    path = save_settings(result.settings, out, comment)
    tuned = result.settings
    click.echo(f"wrote {path}, tuned for {tuned.method} of {tuned.data or data}; use it with "
               f"`stoker train CONFIG --loader-config {path}` (on other storage it stops and says how to re-tune)")
