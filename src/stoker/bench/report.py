"""Show a benchmark: a markdown table, ``bench.json`` and ``bench.png``.

The main table is shaped like the published comparison: one row per number of
workers, one column per method (and backend), each cell the epoch time and images per
second, with the share of this machine's limit in brackets. A cell says INCORRECT
instead of a time when the method did not deliver every sample exactly once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from stoker.bench.methods import METHODS
from stoker.bench.runner import RunResult
from stoker.loading.backends import BACKENDS

if TYPE_CHECKING:
    from stoker.bench.results import BenchResult

__all__ = ["plot", "render_markdown", "render_summary_table", "result_notes", "save_json", "save_report"]


def _column(run: RunResult, backends: Sequence[str]) -> str:
    return run.method if len(backends) == 1 else f"{run.method} ({run.backend})"


def _seconds(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.2f}" if s < 10 else f"{s:,.1f}"


def _cell(run: RunResult | None) -> str:
    if run is None or run.status == "unsupported":
        return "—"
    if run.status == "incorrect":
        return f"INCORRECT ({run.reason})"
    if run.status == "failed":
        return f"failed ({run.reason})"
    share = run.extra.get("fraction_of_limit")
    share_text = f" ({share:.0%})" if share is not None else ""
    if run.status == "partial":
        return f"partial: {_seconds(run.epoch_s)} s · {run.img_per_s:,.0f} img/s{share_text}"
    return f"{_seconds(run.epoch_s)} s · {run.img_per_s:,.0f} img/s{share_text}"


def render_summary_table(runs: Sequence[RunResult]) -> str:
    """The published-style table: rows are workers, columns methods; cells seconds · img/s (share of limit)."""
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
    return "\n".join(lines)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _details_table(runs: Sequence[RunResult]) -> str:
    total_ram = psutil.virtual_memory().total
    cores = os.cpu_count() or 1
    lines = [
        "| method | backend | workers | status | epoch s | img/s | % of limit (which) | first batch s "
        "| peak memory: RSS · PSS (% of RAM) | CPU cores (% of all) | data wait | shuffle score |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        if r.status == "unsupported":
            continue
        timed = r.timed
        share = r.extra.get("fraction_of_limit")
        memory = r.peak_pss_bytes or r.peak_rss_bytes  # PSS counts shared pages once
        cells = [
            r.method,
            r.backend,
            str(r.workers),
            r.status if not r.reason or r.status == "ok" else f"{r.status}: {r.reason}",
            _seconds(r.epoch_s) if timed else "—",
            f"{r.img_per_s:,.0f}" if timed and r.img_per_s is not None else "—",
            f"{share:.0%} ({r.extra.get('limit_name', '?')})" if timed and share is not None else "—",
            f"{r.first_batch_s:,.2f}" if r.first_batch_s is not None else "—",
            f"{_gb(r.peak_rss_bytes)} · {_gb(r.peak_pss_bytes) if r.peak_pss_bytes else '—'} ({memory / total_ram:.0%})",
            f"{r.cpu_cores_used:.1f} ({r.cpu_cores_used / cores:.0%})",
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
            "a share above 100% of the storage read limit means the data came from the page cache, "
            "not the disk (--cold drops it before each run)."
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


def render_markdown(result: BenchResult, details: bool = True) -> str:
    """The whole report as markdown: the main table, then limits, packing, shuffle and details.

    Args:
        result: what :func:`~stoker.bench.bench` returned.
        details: add the per-run table and the notes after the main table.
    """
    parts = [
        f"**{result.description}** — {result.samples} images, {result.num_classes} classes, "
        f"batch {result.batch_size}, mode {result.mode}"
        + (f" ({result.model})" if result.mode == "train" else "")
        + (f", at most {result.max_seconds:g} s per run" if result.max_seconds else ""),
        "",
        render_summary_table(result.runs),
    ]
    if not details:
        return "\n".join(parts)
    parts += ["", f"Limits on this machine: {result.limits.summary()}. Cells show img/s as a share of the tightest limit."]
    if result.pack_s:
        packing = ", ".join(f"{store} {seconds:,.1f} s" for store, seconds in result.pack_s.items())
        reused = " (reused pack: not measured)" if result.packed_reused else ""
        parts.append(f"Packing, a one-off cost: {packing}{reused}.")
    notes = result.notes()
    if notes:
        parts += [""] + [f"- {note}" for note in notes]
    parts += ["", _details_table(result.runs)]
    return "\n".join(parts)


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def save_json(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result.to_dict()`` as JSON and return the path."""
    path = Path(path)
    path.write_text(json.dumps(result.to_dict(), indent=1, default=_json_default) + "\n", encoding="utf-8")
    return path


def plot(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Bars of img/s per method (groups) and workers (bars); a cross marks an incorrect run."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    runs = [r for r in result.runs if r.status != "unsupported"]
    backends = sorted({r.backend for r in runs}, key=BACKENDS.index)
    columns = list(dict.fromkeys(_column(r, backends) for r in runs))
    workers = sorted({r.workers for r in runs})
    width = 0.8 / max(len(workers), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(columns) + 2), 4.0))
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
        ax.bar(xs, heights, width * 0.95, label=f"{w} workers")
        if bad:  # at the foot of the axes, whatever its scale
            ax.plot(bad, [0.03] * len(bad), "rx", markersize=10, transform=blended_transform_factory(ax.transData, ax.transAxes))
    ax.set_xticks(range(len(columns)), columns)
    if any(r.timed and r.img_per_s for r in runs):
        ax.set_yscale("log")  # methods differ by orders of magnitude
    ax.set_ylabel("images per second (log scale)")
    ax.set_title(f"{result.description}: {result.samples} images, batch {result.batch_size} (x = incorrect or failed)")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
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
