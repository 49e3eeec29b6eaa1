"""``stoker compare``: many runs' curves on one plot, coloured by group, and a table."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--group-by", metavar="TAG",
              help="Colour runs by this tag (run.tags), or a dotted key of run.json such as config.model.name.")
@click.option("--metric", default="acc/valid", show_default=True,
              help="Column of metrics.csv to draw: acc/valid, acc/train, loss/valid, loss/train, img_per_s, data_wait_share.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("compare.png"), show_default=True,
              help="The image to write.")
def compare(runs: tuple[Path, ...], group_by: str | None, metric: str, out: Path) -> None:
    """Draw the curves of RUNS (run folders, or folders of run folders) on one plot.

    One colour per group, one line style per run, a legend; then a table of each run's
    best valid accuracy and its epoch, time, img/s and data-wait share.

    \b
    Example:
      stoker compare runs/* --group-by category --out compare.png
    """
    from stoker.train.runner.compare import compare_runs, find_runs, format_table

    summaries, _ = compare_runs(find_runs(runs), group_by=group_by, metric=metric, out=out)
    click.echo(format_table(summaries))
    groups = len({s.group for s in summaries})
    click.echo(f"wrote {out} ({len(summaries)} runs, {groups} group(s), {metric})")
