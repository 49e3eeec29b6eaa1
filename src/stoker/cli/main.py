"""Entry point of the ``stoker`` command: one click group, one module per command."""

from __future__ import annotations

import importlib
import os
import sys

import click

from stoker.errors import StokerError
from stoker.terminal import set_for_the_command

# (module under stoker.cli, click command object name). Each command lives in its own
# module so that `stoker --help` stays fast and commands do not import each other.
_COMMANDS: list[tuple[str, str]] = [
    ("make_data", "make_data"),
    ("demo", "demo"),
    ("bench", "bench"),
    ("tune", "tune"),
    ("train", "train"),
    ("compare", "compare"),
    ("pack", "pack"),
    ("verify", "verify"),
    ("inspect", "inspect"),
]


_SKIP_ADVICE = "load with on_error='skip'"  # the library's spelling, in every bad-sample message
_SKIP_FLAG = {"train": "pass --on-error skip"}  # the commands that have a flag for it


def cli_spelling(message: str, command: str | None) -> str:
    """``message`` as the command line says it: the flag that does what the library's advice names,
    or, for a command with no such flag, the advice left out."""
    if _SKIP_ADVICE in message:
        flag = _SKIP_FLAG.get(command or "")
        message = (message.replace(_SKIP_ADVICE, flag) if flag
                   else message.replace(f", or {_SKIP_ADVICE} to skip bad samples", ""))
    return message


class _Group(click.Group):
    """A group that turns any StokerError into a one-line message, in the command line's spelling, and exit status 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except StokerError as exc:
            click.echo(f"error: {cli_spelling(str(exc), ctx.invoked_subcommand)}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stoker")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Where shards read from a URL are cached, verified (default: $STOKER_CACHE, else ~/.cache/stoker).")
@click.option("--cache-limit", default=None, metavar="SIZE",
              help="The most disk the cache folder takes, open shards and downloads included, e.g. 20GB "
                   "(default: $STOKER_CACHE_LIMIT, else no limit).")
def main(cache_dir: str | None, cache_limit: str | None) -> None:
    """stoker keeps the GPU fed: load, pack, stream, train and benchmark image data sets.

    Start with `stoker demo`, which generates a small data set and shows every part.
    """
    if cache_dir is not None:  # what every reader of a remote set, and its loader workers, take as the default
        set_for_the_command("STOKER_CACHE", os.path.abspath(os.path.expanduser(cache_dir)))
    if cache_limit is not None:  # likewise: every ShardCache takes its limit from there
        from stoker.shards.cache.store import parse_bytes

        set_for_the_command("STOKER_CACHE_LIMIT", str(parse_bytes(cache_limit)))


for _module, _name in _COMMANDS:
    main.add_command(getattr(importlib.import_module(f"stoker.cli.{_module}"), _name))


if __name__ == "__main__":  # `python -m stoker.cli.main`; `python -m stoker` (stoker/__main__.py) is the short form
    main()
