"""Show a benchmark: a markdown table, ``bench.json`` and ``bench.png``.

The main table is shaped like the published comparison: one row per number of
workers, one column per method (and backend), each cell the epoch time and images per
second, with the share of this machine's limit in brackets, then the CPU time per 1,000
images and the peak memory. A cell says INCORRECT instead of a time when the method did
not deliver every sample exactly once. In train mode a last row, "no loading", gives the
training step's own rate (one batch already on the device), and every cell says what
share of it the method fed. The report ends with :func:`recommendation`: the fastest
correct setting, in one line; in train mode in training terms (how long the step takes,
what share of it each method feeds, whether the step is the limit), in load mode with
what a training step would have to consume before loading limits it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil

from stoker.bench.advice import pack_command
from stoker.bench.methods import METHODS
from stoker.bench.runner import MethodResult
from stoker.bench.shares import share_explanation, share_phrase, share_text
from stoker.loading.backends import BACKENDS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from stoker.bench.results import BenchResult
    from stoker.bench.step import Ceiling

__all__ = [
    "figure",
    "plot",
    "recommendation",
    "render_markdown",
    "render_summary_table",
    "report_dict",
    "result_notes",
    "save_json",
    "save_report",
    "share_explanation",
    "share_phrase",
    "share_text",
    "step_img_per_s",
]

# How the report names a built-in method in a sentence.
_PLAIN_NAMES: dict[str, str] = {
    "files": "plain files",
    "pipe": "a streaming Pipe",
    "shards-encoded": "encoded shards",
    "shards-pixels": "pixel shards",
}


def _column(run: MethodResult, backends: Sequence[str]) -> str:
    return run.method if len(backends) == 1 else f"{run.method} ({run.backend})"


def _seconds(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.2f}" if s < 10 else f"{s:,.1f}"


def _cost(run: MethodResult) -> str:
    """`` · 0.41 CPU-s/1k img · 1.20 GB``: CPU time per 1,000 images and peak memory, all processes."""
    per_1k = run.cpu_s_per_1k_img
    cpu = f" · {per_1k:,.2f} CPU-s/1k img" if per_1k is not None else ""
    memory = f" · {run.peak_memory_bytes / 1e9:,.2f} GB" if run.peak_memory_bytes else ""
    return cpu + memory


def _cell(run: MethodResult | None) -> str:
    if run is None or run.status == "unsupported":
        return "—"
    if run.status == "incorrect":
        return f"INCORRECT ({run.reason})"
    if run.status == "failed":
        return f"failed ({run.reason})"
    share = f" ({share_text(run)})" if run.extra.get("fraction_of_limit") is not None else ""
    fed = run.extra.get("fraction_of_ceiling")
    feeds = f" · feeds {_share_of_step(fed)}" if fed is not None else ""
    text = f"{_seconds(run.epoch_s)} s · {run.img_per_s:,.0f} img/s{share}{feeds}{_cost(run)}"
    return f"partial: {text}" if run.status == "partial" else text


def render_summary_table(runs: Sequence[MethodResult], ceiling: Ceiling | None = None) -> str:
    """The published-style table: rows are workers, columns methods; with a ``ceiling``, a last "no loading" row.

    A cell is ``seconds · img/s (share of the machine's limit) · CPU-s/1k img · peak GB``
    (train mode: also the share of the step's own rate the method fed).
    """
    backends = sorted({r.backend for r in runs}, key=BACKENDS.index)
    columns = list(dict.fromkeys(_column(r, backends) for r in runs))
    workers = sorted({r.workers for r in runs})
    by_key = {(r.workers, _column(r, backends)): r for r in runs}
    lines = [
        "| workers | " + " | ".join(columns) + " |",
        "|---:|" + "---|" * len(columns),
    ]
    for w in workers:
        lines.append(f"| {w} | " + " | ".join(_cell(by_key.get((w, c))) for c in columns) + " |")
    if ceiling is not None:
        row = (f"{ceiling.step_s * 1e3:,.2f} ms per step · {ceiling.img_per_s:,.0f} img/s: the ceiling "
               "(one batch already on the device)")
        lines.append("| no loading | " + " | ".join([row] + ["—"] * (len(columns) - 1)) + " |")
    return "\n".join(lines)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _details_table(runs: Sequence[MethodResult]) -> str:
    total_ram = psutil.virtual_memory().total
    cores = os.cpu_count() or 1
    lines = [
        "| method | backend | workers | status | epoch s | img/s | % of machine limit (which) | first batch s "
        "| peak memory: RSS · PSS (% of RAM) | CPU cores (% of all) | CPU s per 1,000 img | data wait | shuffle score |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        if r.status == "unsupported":
            continue
        timed = r.timed
        share = r.extra.get("fraction_of_limit")
        memory = r.peak_memory_bytes  # PSS counts shared pages once
        per_1k = r.cpu_s_per_1k_img
        cells = [
            r.method,
            r.backend,
            str(r.workers),
            r.status if not r.reason or r.status == "ok" else f"{r.status}: {r.reason}",
            _seconds(r.epoch_s) if timed else "—",
            f"{r.img_per_s:,.0f}" if timed and r.img_per_s is not None else "—",
            (f"{share:.0%} ({r.extra.get('limit_name', '?')})" if share <= 1.0 else share_text(r))
            if timed and share is not None else "—",
            f"{r.first_batch_s:,.2f}" if r.first_batch_s is not None else "—",
            f"{_gb(r.peak_rss_bytes)} · {_gb(r.peak_pss_bytes) if r.peak_pss_bytes else '—'} ({memory / total_ram:.0%})",
            f"{r.cpu_cores_used:.1f} ({r.cpu_cores_used / cores:.0%})",
            f"{per_1k:,.2f}" if per_1k is not None else "—",
            f"{r.data_wait_share:.0%}" if r.data_wait_share is not None else "—",
            f"{r.shuffle.score:.2f} {r.shuffle.verdict}" if r.shuffle is not None else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def result_notes(result: BenchResult) -> list[str]:
    """Plain-language remarks: wrong methods, poor shuffling, partial runs, the cache."""
    notes: list[str] = []
    for r in result.runs:
        if r.status == "incorrect":
            notes.append(f"{r.method} ({r.workers} workers, {r.backend}) is INCORRECT: {r.reason}; its time is not a result.")
        elif r.status == "failed":
            notes.append(f"{r.method} ({r.workers} workers, {r.backend}) failed: {r.reason}.")
    not_run = dict.fromkeys(f"{r.method}: not run ({r.reason})" for r in result.runs if r.status == "unsupported" and r.reason)
    notes += [f"{text}." for text in not_run]
    flagged: set[str] = set()
    for r in result.runs:
        if r.shuffle is None or r.shuffle.ok or r.method in flagged or not r.timed:
            continue
        flagged.add(r.method)
        text = f"{r.method}: the label stream is {r.shuffle.verdict}ly mixed ({r.shuffle.summary()})"
        shuffled_by = METHODS[r.method].shuffle if r.method in METHODS else None
        if shuffled_by == "buffer":
            text += f"; the shuffle buffer of {result.shuffle_buffer} is too small for the order the files are listed in"
            if result.source_order_labels is not None:
                text += f": a buffer of {result.suggested_buffer()} or more mixes well (--shuffle-buffer)"
        elif shuffled_by == "pack":
            text += "; these shards were not shuffled thoroughly before writing: repack them with shuffling"
        notes.append(text + ".")
    for store, by_workers in result.stream_quality.items():
        poor = {w: q for w, q in by_workers.items() if not q.ok}
        if poor:
            shown = ", ".join(f"{w} workers: score {q.score:.2f} ({q.verdict})" for w, q in poor.items())
            fix = result.stream_fixes.get(store) or (
                "repack them shuffled (`stoker pack` without --no-shuffle) or read them map-style (ShardDataset)")
            notes.append(
                f"a ShardStream over the {store} shards is not well mixed as a loader delivers it ({shown}): its batches "
                f"hold fewer classes than a shuffle gives. To fix it, {fix}. The shards-* methods above read map-style."
            )
    if any(r.status == "partial" for r in result.runs):
        notes.append(
            "partial: a run stopped at the time limit; it is checked for repeated samples only, "
            "not for missing ones, and its speed includes start-up over a shorter time."
        )
    correct = [r for r in result.runs if r.status == "ok"]
    if correct:
        notes.append(
            f"every whole epoch above saw each sample once (label checksum {result.expected_checksum}, "
            f"equal across {len(correct)} runs)."
        )
    over = [r for r in result.runs if (r.extra.get("fraction_of_limit") or 0.0) > 1.0]
    if any(r.extra.get("limit_name") == "storage read" for r in over):
        notes.append(
            "above the storage read limit: the OS kept part of the data in the page cache although --cold asked it to "
            "drop it (pages written or read a moment ago can stay), so that run read faster than the disk allows."
            if result.cold
            else "above the storage read limit: the data came from the page cache, not the disk "
            "(--cold drops it before each run)."
        )
    if any(r.extra.get("limit_name") == "page-cache read" for r in over):
        notes.append(
            "above the page-cache read limit: the method read faster than one core copying the files out of the "
            "page cache, times the cores (a memory map copies less than a read() call); the yardstick is low there."
        )
    if any(r.extra.get("limit_name") == "decode" for r in over):
        notes.append(
            "a share above 100% of the decode limit means the single-core decode rate was measured "
            "low, most likely while other programs kept the cores busy; rerun on a quiet machine."
        )
    if not result.limits.read_cold:
        notes.append("storage read rate may be the page cache's: the OS did not drop the files first.")
    notes.append(
        "runs read through the page cache (cold=True / --cold drops it before each run)."
        if not result.cold
        else "the page cache was dropped before each run (--cold)."
    )
    return notes


def _stream_line(result: BenchResult) -> str:
    """One line: the mixing score of a ShardStream over each packed store, per number of workers."""
    stores = "; ".join(
        f"{store}: " + ", ".join(f"{w} worker{'s' if w != 1 else ''} {q.score:.2f} {q.verdict}" for w, q in by_workers.items())
        for store, by_workers in result.stream_quality.items()
    )
    return (f"Mixing of a ShardStream over these shards, as a DataLoader with each number of workers delivers it "
            f"(buffer {result.shuffle_buffer}, batch {result.batch_size}; 1 = a random shuffle): {stores}.")


def _setting(run: MethodResult, backends: Sequence[str]) -> str:
    """``"2 workers"`` (``"2 worker threads"`` when several backends were run)."""
    noun = "worker" if run.workers == 1 else "workers"
    if len(backends) > 1:
        noun = {"process": "worker processes" if run.workers != 1 else "worker process",
                "thread": "worker threads" if run.workers != 1 else "worker thread"}.get(run.backend, noun)
    return f"{run.workers} {noun}"


def _times(ratio: float) -> str:
    return f"{ratio:,.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


# Decoding is "the limit" when the fastest method that decodes keeps up this share of the
# machine's decode rate (one core's rate x every core): tuning could win at most 1/0.6 =
# 1.7x more, the training process itself needs some of those cores, and pixel shards are
# usually ten times faster ...
NEAR_DECODE_LIMIT = 0.6
# ... and, in train mode, the training step could take this many times what it delivers.
STEP_HEADROOM = 1.25


def step_img_per_s(result: BenchResult) -> float | None:
    """Images per second the training step alone could take (train mode), or ``None``.

    The no-loading row measures it directly (:attr:`BenchResult.ceiling`). Without it, a
    train-mode run spends ``1 - data_wait_share`` of its time computing, so its step
    rate without waiting is ``img_per_s / (1 - data_wait_share)``; the run that waited
    least measures it best (its compute is least disturbed by waiting).
    """
    if result.ceiling is not None:
        return result.ceiling.img_per_s
    measured = [r for r in result.runs if r.timed and r.img_per_s and r.data_wait_share is not None
                and r.data_wait_share < 1.0]
    if not measured:
        return None
    least = min(measured, key=lambda r: r.data_wait_share or 0.0)
    return (least.img_per_s or 0.0) / (1.0 - (least.data_wait_share or 0.0))


def _kept_up(run: MethodResult) -> float:
    """What a run kept up after its first batch (what persistent workers sustain), else its rate over the run."""
    return run.steady_img_per_s or run.img_per_s or 0.0


def _pixels_command(result: BenchResult) -> str:
    return pack_command("DATA", result.size, result.gray)


def _decode_case(result: BenchResult, runs: list[MethodResult], backends: Sequence[str]) -> str:
    """The clause that makes the case for pixel shards when decoding is what limits loading, else ``""``.

    Decoding limits loading when the fastest method that decodes is bound by the decode
    rate (not storage or memory), keeps up :data:`NEAR_DECODE_LIMIT` of it after its
    first batch, and (train mode) is well below what the training step could take
    (:data:`STEP_HEADROOM`).
    """
    decoding = [r for r in runs if r.method in METHODS and METHODS[r.method].work == "decode"]
    if not decoding:
        return ""
    top = max(decoding, key=_kept_up)
    cores = result.limits.cores
    limit = result.limits.bounds("decode", cores)["decode"]
    rate = _kept_up(top)
    step = step_img_per_s(result)
    if top.extra.get("limit_name") != "decode" or rate < NEAR_DECODE_LIMIT * limit:
        return ""
    if step is not None and step < STEP_HEADROOM * rate:
        return (f"; the training step (about {step:,.0f} img/s alone) is the limit here, not decoding "
                f"({rate:,.0f} img/s by {_PLAIN_NAMES.get(top.method, top.method)})")
    text = (f"; decoding is the limit for these images: the fastest method that decodes "
            f"({_PLAIN_NAMES.get(top.method, top.method)}, {_setting(top, backends)}) keeps up {rate:,.0f} img/s "
            f"after its first batch, {rate / limit:.0%} of the {limit:,.0f} img/s this machine decodes on {cores} "
            f"core{'s' if cores != 1 else ''}")
    if step is not None:
        text += f", while the training step alone could take {step:,.0f} img/s"
    else:
        text += " (a training step faster than that waits for data)"
    pixels = max((r for r in runs if r.method == "shards-pixels"), key=_kept_up, default=None)
    if pixels is None:
        ran = any(r.method == "shards-pixels" for r in result.runs)
        if ran:
            return text  # pixel shards ran but gave no timed result: nothing measured to argue with
        return (text + "; pixel shards decode nothing, try them: `stoker bench DATA --methods files,shards-pixels`, "
                f"then {_pixels_command(result)}")
    pixels_rate = _kept_up(pixels)
    if pixels_rate <= rate:
        return text + f"; pixel shards were no faster here ({pixels_rate:,.0f} img/s): memory or storage is the next limit"
    return (text + f"; pixel shards decode nothing: {pixels_rate:,.0f} img/s after their first batch here "
            f"({_setting(pixels, backends)}), {_times(pixels_rate / rate)} the fastest method that decodes: "
            f"pack them once with {_pixels_command(result)}")


def recommendation(result: BenchResult) -> str:
    """One line: what to use, how fast it was, and how many times plain files.

    The fastest correct run wins (whole epochs before partial ones). Its ratio is taken
    against plain files at *their* best setting here (the fastest correct ``files`` run
    over every workers and backend tried), and the line says which setting that was.
    When decoding is what limits loading (the fastest method that decodes is near the
    machine's decode rate and, in train mode, well below what the training step could
    take), the line makes the case for pixel shards, which decode nothing, with the
    measured figures: the pack command when they were faster, how to try them when they
    were not run.

    Example:
        >>> from stoker.bench import bench
        >>> result = bench("data/digiface", methods=["files"], workers=[0], batch_size=8, max_seconds=2, progress=False)
        >>> print(recommendation(result))
        Recommendation: ...
    """
    runs = [r for r in result.runs if r.timed and r.img_per_s]
    best = max(runs, key=lambda r: (r.status == "ok", r.img_per_s or 0.0), default=None)
    if best is None:
        return "Recommendation: none: no method delivered a correct epoch here (see the notes above)."
    backends = sorted({r.backend for r in result.runs if r.status != "unsupported"}, key=BACKENDS.index)
    if result.ceiling is not None:
        return _train_recommendation(result, runs, best, backends)
    name = _PLAIN_NAMES.get(best.method, best.method)
    text = f"Recommendation: use {name} with {_setting(best, backends)}: {best.img_per_s:,.0f} img/s"
    files = max((r for r in runs if r.method == "files"), key=lambda r: r.img_per_s or 0.0, default=None)
    if files is not None and files is not best:
        ratio = (best.img_per_s or 0.0) / (files.img_per_s or 1.0)
        text += f", {_times(ratio)} plain files at their best ({_setting(files, backends)}, {files.img_per_s:,.0f} img/s)"
    elif files is best:
        others = [r for r in runs if r.method != "files"]
        if others:
            runner_up = max(others, key=lambda r: r.img_per_s or 0.0)
            text += (f", ahead of {_PLAIN_NAMES.get(runner_up.method, runner_up.method)} "
                     f"({_setting(runner_up, backends)}, {runner_up.img_per_s:,.0f} img/s): packing does not pay here")
    text += _decode_case(result, runs, backends)
    if best.status == "partial":
        text += " (partial runs: stopped by --max-seconds)"
    return text + "." + (_only_loading(result, best) if result.mode == "load" else "")


# A method that feeds this share of the step's own rate leaves the step the limit: another method gains little.
STEP_LIMIT_SHARE = 0.9

# How to switch to a built-in method, after "pack with" / "use".
_HOW: dict[str, str] = {
    "shards-encoded": "pack with `stoker pack DATA OUT --store encoded`",
    "pipe": "read the files as a streaming Pipe",
}


def _share_of_step(share: float) -> str:
    """``"62% of the step"``; at or above 100 % (the loaded run kept up with the step alone, within noise): ``"all of the step"``."""
    return "all of the step" if share >= 1.0 else f"{share:.0%} of the step"


def _only_loading(result: BenchResult, best: MethodResult) -> str:
    """Load mode's last words: only loading was timed, and what a training step would need for loading to limit it."""
    rate = best.img_per_s or 0.0
    per_batch_ms = result.batch_size / rate * 1e3 if rate else 0.0
    return (f" Only loading was timed: a training step waits for none of these methods only if it takes at least "
            f"{per_batch_ms:,.1f} ms per batch of {result.batch_size} ({rate:,.0f} img/s, the fastest here); "
            f"`stoker bench DATA --mode train --model NAME` times the step itself and each method as a share of it.")


def _train_recommendation(result: BenchResult, runs: list[MethodResult], best: MethodResult, backends: Sequence[str]) -> str:
    """Train mode's line: the step's time, what share of it plain files and the best method feed, and what to do.

    Each method is judged by its fastest correct run as a share of the no-loading rate.
    When plain files feed :data:`STEP_LIMIT_SHARE` of it or more, the step is the limit
    and the line says how little another method can gain.
    """
    ceiling = cast("Ceiling", result.ceiling)
    c = ceiling.img_per_s
    step = result.step
    how = f" ({step.describe()})" if step is not None else ""
    text = f"Recommendation: the step takes {ceiling.step_s * 1e3:,.1f} ms per batch of {ceiling.batch_size}{how}"
    ok = [r for r in runs if r.status == "ok"] or runs
    files = max((r for r in ok if r.method == "files"), key=lambda r: r.img_per_s or 0.0, default=None)
    top = max(ok, key=lambda r: r.img_per_s or 0.0)
    name = _PLAIN_NAMES.get(top.method, top.method)
    if files is None:
        share = (top.img_per_s or 0.0) / c
        text += f"; {name} feed {_share_of_step(share)} ({_setting(top, backends)})"
        return text + (": the step is the limit" if share >= STEP_LIMIT_SHARE else "") + "."
    files_share = (files.img_per_s or 0.0) / c
    text += f"; plain files feed {_share_of_step(files_share)} ({_setting(files, backends)})"
    top_share = (top.img_per_s or 0.0) / c
    if top is files:
        if files_share >= STEP_LIMIT_SHARE:
            return text + ": the step is the limit, and no method tried fed it more: keep plain files."
        return text + f": no method tried fed it more; use plain files with {_setting(files, backends)}."
    if files_share >= STEP_LIMIT_SHARE:
        gain = min(top_share, 1.0) / files_share - 1.0
        gained = f"at most {gain:.0%} faster training" if gain >= 0.01 else "no faster training"
        return (text + f": the step is the limit, so another method gains little: {name} feed "
                f"{_share_of_step(top_share)} ({_setting(top, backends)}), {gained}.")
    how_to = f"pack with {_pixels_command(result)}" if top.method == "shards-pixels" else _HOW.get(top.method, f"use {name}")
    text += f"; {name} {_share_of_step(top_share)} ({_setting(top, backends)}): {how_to}"
    if top_share < STEP_LIMIT_SHARE:
        text += f"; the step still waits for data ({1 - top_share:.0%} of its rate is not fed)"
        on_cpu = step is not None and step.device.startswith("cpu")
        text += (": on the CPU the readers take cores the step itself uses, so no method reaches the step alone"
                 if on_cpu else ": try more workers")
    return text + "."


def render_markdown(result: BenchResult, details: bool = True, recommend: bool = True) -> str:
    """The whole report as markdown: the main table, then limits, packing, shuffle, details and the recommendation.

    Args:
        result: what :func:`~stoker.bench.bench` returned.
        details: add the per-run table and the notes after the main table.
        recommend: end with the recommendation (leave it out to print it elsewhere, once).
    """
    parts = [
        f"**{result.description}** — {result.samples} images, {result.num_classes} classes, "
        f"batch {result.batch_size}, mode {result.mode}"
        + (f" ({result.step.describe() if result.step is not None else result.model})" if result.mode == "train" else "")
        + (f", at most {result.max_seconds:g} s per run" if result.max_seconds else ""),
        "",
        render_summary_table(result.runs, result.ceiling),
        "",
        share_explanation(result),
    ]
    if details:
        parts += ["", f"Limits on this machine: {result.limits.summary()}."]
        if result.pack_s:
            packing = ", ".join(f"{store} {seconds:,.1f} s" for store, seconds in result.pack_s.items())
            reused = " (reused pack: not measured)" if result.packed_reused else ""
            parts.append(f"Packing, a one-off cost: {packing}{reused}.")
        if result.stream_quality:
            parts.append(_stream_line(result))
        notes = result_notes(result)
        if notes:
            parts += [""] + [f"- {note}" for note in notes]
        parts += ["", _details_table(result.runs)]
    if recommend:
        parts += ["", f"**{recommendation(result)}**"]
    return "\n".join(parts)


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def report_dict(result: BenchResult) -> dict[str, Any]:
    """What ``bench.json`` holds: ``result.to_dict()`` with the notes and the recommendation."""
    return {**result.to_dict(), "notes": result_notes(result), "recommendation": recommendation(result)}


def save_json(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Write :func:`report_dict` as JSON and return the path."""
    path = Path(path)
    path.write_text(json.dumps(report_dict(result), indent=1, default=_json_default) + "\n", encoding="utf-8")
    return path


def _log_ticks(low: float, high: float) -> list[float]:
    """1, 2 and 5 times the powers of ten between ``low`` and ``high``: every one gets a label."""
    ticks: list[float] = []
    exponent = math.floor(math.log10(max(low, 1e-12)))
    while 10.0**exponent <= high:
        ticks += [m * 10.0**exponent for m in (1, 2, 5) if low <= m * 10.0**exponent <= high]
        exponent += 1
    return ticks


def figure(result: BenchResult) -> Figure:
    """The bar chart of :func:`plot` as a matplotlib figure (close it when done).

    Groups are methods (and backends), bars are worker counts, each bar labelled with its
    img/s; the log-scale axis labels every tick it draws. A red cross at the foot marks
    an incorrect or failed run, and the title explains the cross only when there is one.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt
    from matplotlib.ticker import NullLocator
    from matplotlib.transforms import blended_transform_factory

    runs = [r for r in result.runs if r.status != "unsupported"]
    backends = sorted({r.backend for r in runs}, key=BACKENDS.index)
    columns = list(dict.fromkeys(_column(r, backends) for r in runs))
    workers = sorted({r.workers for r in runs})
    width = 0.8 / max(len(workers), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(columns) + 2), 4.5))
    any_bad = False
    for j, w in enumerate(workers):
        xs, heights, bad = [], [], []
        for i, column in enumerate(columns):
            run = next((r for r in runs if r.workers == w and _column(r, backends) == column), None)
            if run is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            if run.timed and run.img_per_s is not None:
                xs.append(x)
                heights.append(run.img_per_s)
            else:
                bad.append(x)
        bars = ax.bar(xs, heights, width * 0.95, label=f"{w} worker{'s' if w != 1 else ''}")
        ax.bar_label(bars, labels=[f"{h:,.0f}" for h in heights], fontsize="x-small", padding=1)
        if bad:  # at the foot of the axes, whatever its scale
            any_bad = True
            ax.plot(bad, [0.03] * len(bad), "rx", markersize=10, transform=blended_transform_factory(ax.transData, ax.transAxes))
    ax.set_xticks(range(len(columns)), columns, rotation=20 if len(columns) > 4 else 0)
    rates = [r.img_per_s for r in runs if r.timed and r.img_per_s]
    if rates:
        ax.set_yscale("log")  # methods differ by orders of magnitude
        low, high = min(rates) / 1.6, max(rates) * 1.6
        ax.set_ylim(low, high)
        ticks = _log_ticks(low, high) or [min(rates), max(rates)]
        ax.set_yticks(ticks, [f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_locator(NullLocator())  # unlabelled minor ticks cannot be read
    ax.set_ylabel("images per second (log scale)")
    ax.set_xlabel("loading method")
    title = f"{result.description}: {result.samples} images, batch {result.batch_size}"
    ax.set_title(title + (" (x: an incorrect or failed run)" if any_bad else ""))
    ax.legend(fontsize="small", title="loader", title_fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Write :func:`figure` (bars of img/s per method and workers) as a PNG to ``path``."""
    from matplotlib import pyplot as plt

    fig = figure(result)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save_report(result: BenchResult, out: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``bench.md``, ``bench.json`` and ``bench.png`` into the folder ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = out / "bench.md"
    markdown.write_text(render_markdown(result) + "\n", encoding="utf-8")
    return {"markdown": markdown, "json": save_json(result, out / "bench.json"), "png": plot(result, out / "bench.png")}
