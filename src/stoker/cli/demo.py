"""``stoker demo``: the guided tour on generated data."""

from __future__ import annotations

from pathlib import Path

import click

from stoker.terminal import set_quiet


@click.command("demo")
@click.option("--dir", "root", type=click.Path(file_okay=False, path_type=Path), default=Path("stoker-demo"),
              show_default=True, help="Folder for the generated data and the run outputs.")
@click.option("--n", type=click.IntRange(min=20), default=600, show_default=True,
              help="Images per generated data set.")
@click.option("--classes", type=click.IntRange(min=2), default=10, show_default=True, help="Classes per data set.")
@click.option("--quiet", is_flag=True, help="No progress bars (there are none either when stderr is not a terminal).")
def demo(root: Path, n: int, classes: int, quiet: bool) -> None:
    """Generate a small data set in each layout and show stoker's parts working on it.

    Writes everything under --dir (data is reused by later runs with the same settings)
    and finishes in a few minutes on 2 CPU cores.
    """
    # Importing torch and torchvision takes seconds (over ten on a busy machine): say so before, not after.
    click.echo(f"stoker demo: a guided tour under {root}; loading torch and stoker first ...")
    set_quiet(quiet)
    from stoker.demo import run_demo

    run_demo(root, n=n, classes=classes, echo=click.echo)
