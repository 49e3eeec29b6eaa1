"""``stoker bench DATA``: every loading method x workers x backend, timed on this machine."""

from __future__ import annotations

import re
from pathlib import Path

import click

from stoker.bench.methods import method_names
from stoker.bench.plan import DEFAULT_WORKERS, MODES, TRAIN_OPTIMIZER
from stoker.cli.paths import require_paths
from stoker.errors import ConfigError
from stoker.loading.backends import BACKENDS
from stoker.terminal import bars_shown, set_quiet
from stoker.train.runner.config import AMP_MODES, OPTIMIZERS

_METHODS = ",".join(method_names())


def split_list(text: str, what: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]``; an empty list is an error."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"--{what}: give a comma-separated list, e.g. --{what} {_METHODS if what == 'methods' else '0,2'}")
    return items


def parse_workers(text: str) -> list[int]:
    """``"0,1,2,4"`` -> ``[0, 1, 2, 4]``."""
    try:
        return [int(item) for item in split_list(text, "workers")]
    except ValueError:
        raise ConfigError(f"--workers: expected whole numbers separated by commas, got {text!r}") from None


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"112x112"`` or ``"112"`` -> ``(112, 112)``; ``None`` stays ``None``."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if not match:
        raise ConfigError(f"--size: expected HEIGHTxWIDTH such as 112x112, got {text!r}")
    height = int(match.group(1))
    return height, int(match.group(2) or height)


@click.command("bench")
@click.argument("data")  # a path or a URL (a str: pathlib would mangle s3://)
@click.option("--methods", default=_METHODS, show_default=True,
              help="Comma-separated loading methods to compare (by default also shards-encoded-gpu, JPEG shards "
                   "decoded on the GPU, where CUDA is available).")
@click.option("--workers", "workers_text", default=",".join(map(str, DEFAULT_WORKERS)), show_default=True,
              help="Comma-separated worker counts.")
@click.option("--backend", "backend_text", default=BACKENDS[0], show_default=True,
              help=f"Comma-separated loader backends: {', '.join(BACKENDS)}.")
@click.option("--mode", type=click.Choice(MODES), default=MODES[0], show_default=True,
              help="load: batches only; train: a training step per batch, reporting the data-wait share.")
@click.option("--model", default="resnet18", show_default=True, help="Model of --mode train (small_cnn or a torchvision classifier).")
@click.option("--amp", type=click.Choice(AMP_MODES), default=None,
              help="Precision of --mode train's step, as `stoker train --amp`. [default: auto, as stoker train: bf16 on a CUDA device that supports it, off elsewhere]")
@click.option("--channels-last/--no-channels-last", "channels_last", default=None,
              help="Memory format of --mode train's step, as `stoker train`. [default: on for a convolutional model on "
                   "CUDA under AMP]")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=TRAIN_OPTIMIZER, show_default=True,
              help="Optimizer of --mode train's step, as `stoker train --optimizer`.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop each run after this long (then it is reported as partial).")
@click.option("--size", "size_text", default=None, help="Resize every image to HEIGHTxWIDTH (needed when sizes differ).")
@click.option("--packed", default=None, metavar="DIR|URL",
              help="Reuse shard sets DIR/encoded and DIR/pixels packed from this data (a folder or a URL such as "
                   "s3://bucket/packed), instead of packing.")
@click.option("--prefetch", type=click.IntRange(min=1), default=2, show_default=True, help="Batches each worker loads ahead.")
@click.option("--shuffle-buffer", type=click.IntRange(min=1), default=10_000, show_default=True, help="The Pipe's shuffle buffer (and the ShardStream's, for its mixing score).")
@click.option("--cold", is_flag=True, help="Drop the data's files from the page cache before each run.")
@click.option("--device", default="auto", show_default=True, help="Where batches go: auto, cpu, cuda, cuda:N.")
@click.option("--limit-seconds", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="How long to measure each limit (decode, memory copy, storage read).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("stoker-bench"), show_default=True,
              help="Folder for bench.md, bench.json and bench.png.")
@click.option("--quiet", is_flag=True, help="No progress bars (there are none either when stderr is not a terminal).")
def bench(
    data: str,
    methods: str,
    workers_text: str,
    backend_text: str,
    mode: str,
    model: str,
    amp: str | None,
    channels_last: bool | None,
    optimizer: str,
    batch_size: int,
    epochs: int,
    max_seconds: float | None,
    size_text: str | None,
    packed: str | None,
    prefetch: int,
    shuffle_buffer: int,
    cold: bool,
    device: str,
    limit_seconds: float,
    seed: int,
    out: Path,
    quiet: bool,
) -> None:
    """Time every loading method x workers x backend on DATA and check every epoch.

    DATA is any layout stoker reads, a folder or a URL. Shard methods are packed first
    into a temporary folder (the packing time is shown as a one-off cost). When DATA is
    itself a shard set (say s3://bucket/packed/pixels), the method that reads its store
    is timed on it as it is; shards at a URL are downloaded into the verified cache as
    the runs read them. Prints a markdown table (rows: workers, columns: methods) and
    writes bench.md, bench.json and bench.png.

    Example: stoker bench digiface/ --workers 0,2,4 --max-seconds 60
    """
    require_paths([data])
    set_quiet(quiet)
    from stoker.bench import BenchPlan, render_markdown, run_bench, save_report

    plan = BenchPlan(
        data,
        methods=None if methods == _METHODS else split_list(methods, "methods"),  # None: every method this machine runs
        workers=parse_workers(workers_text),
        backends=split_list(backend_text, "backend"),
        mode=mode,
        model=model,
        amp=amp,
        channels_last=channels_last,
        optimizer=optimizer,
        batch_size=batch_size,
        epochs=epochs,
        max_seconds=max_seconds,
        size=parse_size(size_text),
        packed=packed,
        prefetch_factor=prefetch,
        shuffle_buffer=shuffle_buffer,
        device=device,
        cold=cold,
        limits_time_s=limit_seconds,
        seed=seed,
        progress=bars_shown(),
    )
    result = run_bench(plan, echo=lambda line: click.echo(line, err=True))
    click.echo(render_markdown(result))
    paths = save_report(result, out)
    click.echo(f"\nwrote {paths['markdown']}, {paths['json']} and {paths['png']}", err=True)
