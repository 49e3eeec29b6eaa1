"""Plots: a run's ``curves.png`` and the comparison of many runs.

Figures are drawn with matplotlib's object API (no pyplot), so plotting never opens a
window, touches global state or needs a display.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LINE_STYLES", "group_colours", "plot_compare", "plot_curves"]

Rows = Sequence[Mapping[str, float]]

LINE_STYLES: tuple[str, ...] = ("-", "--", ":", "-.")


def _series(rows: Rows, column: str) -> tuple[list[float], list[float]]:
    points = [(r["epoch"], r[column]) for r in rows if column in r and not math.isnan(r[column])]
    return [p[0] for p in points], [p[1] for p in points]


def plot_curves(rows: Rows, out: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw loss and accuracy, train vs valid, per epoch, into ``out`` (e.g. ``curves.png``).

    Args:
        rows: one mapping per epoch with ``epoch``, ``loss/train``, ``loss/valid``,
            ``acc/train``, ``acc/valid`` (``History.rows()`` or ``read_csv(...)``).
        out: the image file to write.
        title: shown above both charts (e.g. the run name).

    Returns:
        ``out`` as a Path.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    for ax, metric, label in ((loss_ax, "loss", "Loss"), (acc_ax, "acc", "Accuracy")):
        for phase, style in (("train", "-"), ("valid", "--")):
            x, y = _series(rows, f"{metric}/{phase}")
            if x:
                ax.plot(x, y, style, marker="o", markersize=3, label=phase)
        if metric == "acc":
            x, y = _series(rows, "acc/valid")
            if y:
                best = max(range(len(y)), key=lambda i: (y[i], -i))
                ax.plot([x[best]], [y[best]], "*", markersize=12, color="gold", markeredgecolor="black",
                        label=f"best {y[best]:.3f} (epoch {x[best]:.0f})")
        ax.set_title(label)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend()
    if title:
        fig.suptitle(title)
    out = Path(out)
    fig.savefig(out, dpi=100)
    return out


def group_colours(groups: Sequence[str], palette_size: int) -> dict[str, int]:
    """A palette index per group, fixed by the group's name (the same colour in every chart).

    The palette is tab20's: pairs of a dark and a light shade of one hue (indices ``2h``
    and ``2h + 1``). A group's hue comes from a hash of its name, so ``shards`` has one
    colour whatever other groups a chart shows, in the dark shade. Two groups of one
    chart never share a hue while a hue is free: the later (by name) moves to the next
    free hue; only past as many groups as hues do light shades come in.

    Example:
        >>> group_colours(["files", "shards"], 20)["shards"] == group_colours(["pipe", "shards"], 20)["shards"]
        True
    """
    hues = max(palette_size // 2, 1)
    taken: set[int] = set()
    out: dict[str, int] = {}
    for group in sorted(groups):
        hue = int.from_bytes(hashlib.blake2b(group.encode(), digest_size=4).digest(), "big") % hues
        # dark shades of every hue first (from this group's own), then the light ones
        order = [2 * ((hue + k) % hues) for k in range(hues)] + [2 * ((hue + k) % hues) + 1 for k in range(hues)]
        index = next((i for i in order if i < palette_size and i not in taken), order[0] % palette_size)
        taken.add(index)
        out[group] = index
    return out


def plot_compare(
    runs: Sequence[tuple[str, str, Rows]],
    metric: str = "acc/valid",
    out: str | os.PathLike[str] | None = None,
) -> Figure:
    """Draw many runs' ``metric`` on one chart: one colour per group, one line style per run.

    Args:
        runs: ``(run name, group, rows)`` per run, in the order to draw.
        metric: the column to draw, e.g. ``acc/valid``, ``loss/train``, ``img_per_s``.
        out: the image file to write, if any.

    Returns:
        The matplotlib Figure.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    drawn = [(name, group, _series(rows, metric)) for name, group, rows in runs]
    empty = [name for name, _, (x, _) in drawn if not x]
    drawn = [run for run in drawn if run[2][0]]  # a run with no epochs has nothing to draw or list
    groups = list(dict.fromkeys(group for _, group, _ in drawn))
    # tab20 is a ListedColormap (a list of RGB tuples); the registry is typed as a plain Colormap.
    palette: Sequence[Any] = colormaps["tab20"].colors  # type: ignore[attr-defined]
    colour_of = {group: palette[i] for group, i in group_colours(groups, len(palette)).items()}
    styles_left = {group: itertools.cycle(LINE_STYLES) for group in groups}

    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    for name, group, (x, y) in drawn:
        ax.plot(x, y, next(styles_left[group]), color=colour_of[group], marker="o", markersize=3, label=name if group == name else f"{group} / {name}")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    left_out = f" ({len(empty)} run(s) with no epochs left out: {', '.join(empty[:3])})" if empty else ""
    ax.set_title(f"{metric} by run{left_out}", fontsize="medium")
    ax.grid(alpha=0.3)
    if drawn:  # beside the axes, never over the curves
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if out is not None:
        fig.savefig(Path(out), dpi=100)
    return fig
