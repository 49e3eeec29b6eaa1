"""What a share of the machine's limit means, in the words every bench report and tune reason use.

A run's rate is shown as a share of the most this machine allows the method (see
:meth:`~stoker.bench.limits.Limits.machine_limit`). Up to 100 % it is a number; above,
it is a sentence: the yardstick did not fit that run (the page cache served a --cold
run, or a limit was measured low on a busy machine), and a share of 662 % would say
something false.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker.bench.runner import MethodResult

if TYPE_CHECKING:
    from stoker.bench.results import BenchResult

__all__ = ["share_explanation", "share_phrase", "share_text"]


def share_phrase(share: float, limit_name: str) -> str:
    """``"38% of this machine's decode limit"``, or, above 100 %, that the rate beat the limit and why.

    A share above 100 % is not printed as a number: it says the yardstick was wrong for
    this run, and the text says how (the page cache served a --cold run, or the limit
    was measured low on a busy machine).
    """
    if share <= 1.0:
        return f"{share:.0%} of this machine's {limit_name} limit"
    why = {
        "storage read": "part of the data came from the page cache",
        "page-cache read": "the method copies less than the read test",
        "decode": "the decode rate was measured low on a busy machine",
    }.get(limit_name, "the limit was measured low")
    return f"above this machine's {limit_name} limit: {why}"


def share_text(run: MethodResult) -> str:
    """The share of a run as a table cell and a progress line show it (see :func:`share_phrase`)."""
    share = run.extra.get("fraction_of_limit")
    if share is None:
        return "—"
    name = str(run.extra.get("limit_name", "?"))
    return f"{share:.0%}" if share <= 1.0 else f"above the {name} limit"


def share_explanation(result: BenchResult) -> str:
    """The one sentence that says what the percentages, CPU and memory figures of the table mean."""
    cores = result.limits.cores
    decoding = (f"decoding ({result.limits.decode_img_per_s:,.0f} img/s per core x {cores}, for methods that decode), "
                if result.limits.decode_img_per_s > 0 else "")
    return (
        f"In brackets: img/s as a share of the most this machine allows that method with all its {cores} "
        f"core{'s' if cores != 1 else ''}: the tightest of {decoding}memory copy and storage read "
        f"({'from the disk: --cold' if result.cold else 'from the page cache, which these runs read through'}). "
        "It is the same yardstick "
        "for every row, so shares of 1 and 2 workers compare directly (a second worker that doubles the rate "
        "doubles the share). CPU-s/1k img: CPU seconds of all processes (the main one and every worker "
        "process or thread) per 1,000 images; GB: their peak memory together (PSS: shared pages counted once)."
    )
