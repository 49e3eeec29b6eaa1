"""Resuming over several machines without a shared folder: the newest ``last.pt``, wherever it is.

Rank 0 alone writes the run folder, on its own machine. Under torchrun's c10d rendezvous
rank 0 goes to whichever agent arrives first, so the machine that wrote ``last.pt`` need
not be rank 0's machine at the next launch. To resume, every rank looks in its own run
folder, the ranks agree in one all-gather which of them holds the newest ``last.pt``
(:func:`progress_of`: the most epochs done, then the furthest into the next; a tie goes
to the lowest rank, so rank 0 whenever it has the newest), and that rank sends its bytes
to the others: ``last.pt`` to every rank, and ``best.pt`` to rank 0, which keeps both in
its own run folder and writes there from then on. ``stoker train --name RUN --resume``
on a machine without ``run.json`` takes the run's config from the holder's the same way
(:func:`newest_record`).

Example (alone here; under torchrun every rank makes the same calls):
    >>> from stoker.train.engine.checkpoint import save_checkpoint
    >>> from stoker.train.engine.distributed import Ranks
    >>> Path("runs/my-run").mkdir(parents=True)
    >>> _ = save_checkpoint({"epoch": 1}, "runs/my-run/last.pt")
    >>> holder = find_holder(Ranks(), Path("runs/my-run"))
    >>> holder.rank, hand_over(Ranks(), holder, Path("runs/my-run/last.pt")) == Path("runs/my-run/last.pt").read_bytes()
    (0, True)
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stoker.errors import ConfigError
from stoker.train.engine.distributed import Ranks
from stoker.train.engine.record import LAST_FILE, RUN_FILE

__all__ = ["Holder", "Progress", "find_holder", "hand_over", "newest_record", "progress_of"]

Progress = tuple[int, int, int]  # (epochs done, 0 boundary | 1 mid-training | 2 mid-validation, batches into the epoch)
_UNREADABLE: Progress = (-1, 0, 0)  # a damaged last.pt is taken only when there is no other: loading it then says what is wrong


@dataclass(frozen=True)
class Holder:
    """The rank whose run folder holds the newest ``last.pt``.

    Attributes:
        rank: that rank.
        progress: how far its ``last.pt`` got (:func:`progress_of`).
        host: the machine it runs on.
    """

    rank: int
    progress: Progress
    host: str


def progress_of(path: Path) -> Progress | None:
    """How far the run of the ``last.pt`` at ``path`` got, as a key that orders checkpoints; ``None`` if there is none.

    ``(epochs done, phase, batches)``: phase 0 at an epoch boundary, 1 in the middle of
    training the next epoch (after ``batches`` batches), 2 when that epoch's training is
    done and its validation is to be redone. A file that cannot be read counts as older
    than any other.
    """
    if not path.is_file():
        return None
    try:
        state: Any = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        partial = state.get("partial")
        if partial is None:
            return (int(state["epoch"]), 0, 0)
        phase = 2 if partial["phase"] == "valid" else 1
        return (int(state["epoch"]), phase, int(partial["train"]["batches"]))
    except Exception:  # noqa: BLE001 - damaged in any way: loading it later names the damage
        return _UNREADABLE


def find_holder(ranks: Ranks, run_dir: Path) -> Holder:
    """Which rank holds the newest ``run_dir/last.pt``, each rank looking in its own ``run_dir`` (a collective).

    Raises:
        ConfigError: no rank has one (the message names every machine that looked).
    """
    mine = progress_of(run_dir / LAST_FILE)
    answers = [json.loads(text) for text in ranks.gather_text(json.dumps({"progress": mine, "host": socket.gethostname()}))]
    found = [(tuple(a["progress"]), rank, a["host"]) for rank, a in enumerate(answers) if a["progress"] is not None]
    if not found:
        hosts = sorted({a["host"] for a in answers})
        raise ConfigError(
            f"{run_dir}: no {LAST_FILE} to resume from on any of the {ranks.world_size} ranks (each looked in its own "
            f"{run_dir}, on {', '.join(hosts)}); give the --log-dir that holds the run on the machine that wrote it, "
            "or start the run without resume"
        )
    progress, rank, host = max(found, key=lambda f: (f[0], -f[1]))  # newest; of equals, the lowest rank
    return Holder(rank=rank, progress=progress, host=host)  # type: ignore[arg-type]


def hand_over(ranks: Ranks, holder: Holder, path: Path) -> bytes | None:
    """The bytes of the holder's file at ``path`` on every rank (``None``: the holder has no such file); a collective."""
    data = path.read_bytes() if ranks.rank == holder.rank and path.is_file() else None
    return ranks.broadcast_bytes(data, holder.rank)


def newest_record(ranks: Ranks, run_dir: Path) -> str | None:
    """The ``run.json`` beside the newest ``last.pt`` over the ranks, on every rank (``None``: no rank has a
    ``last.pt``, or its holder has no ``run.json``); a collective.

    What ``--name RUN --resume`` takes the run's config from on a machine whose own
    folder holds no run (or an older point of it).
    """
    try:
        holder = find_holder(ranks, run_dir)
    except ConfigError:
        return None  # every rank got the same answer; fit says there is nothing to resume
    data = hand_over(ranks, holder, run_dir / RUN_FILE)
    return data.decode("utf-8", errors="replace") if data is not None else None
