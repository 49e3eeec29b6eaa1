"""Resuming a run: what ``last.pt`` must hold, and putting it back with clear errors.

``last.pt`` is a plain dict: the model, optimizer, scaler and scheduler ``state_dict``s,
the RNG states, the history, and — when it was written in the middle of an epoch — a
``partial`` entry: the epoch, the phase (``"train"``: mid-training, or ``"valid"``:
training done, validation to redo), the train loader's ``state_dict``, the partial
tallies (loss sum, hits, samples, batches), the partial timer seconds and the epoch's
learning rate. A checkpoint that loads but does not fit the run (another model, a
missing key, wrong shapes) is a :class:`~stoker.errors.CheckpointError` naming the file
and what to do, never a raw ``KeyError`` or ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker.errors import CheckpointError, StokerError
from stoker.train.engine.checkpoint import set_rng_state
from stoker.train.engine.history import History

__all__ = ["CHECKPOINT_FORMAT", "LAST_KEYS", "PARTIAL_KEYS", "check_last", "restore_last", "restore_loader", "restore_tally"]

CHECKPOINT_FORMAT = "stoker-checkpoint/1"
LAST_KEYS: tuple[str, ...] = ("model", "optimizer", "scaler", "scheduler", "epoch", "best_acc", "best_epoch", "history", "rng")
PARTIAL_KEYS: tuple[str, ...] = ("epoch", "phase", "loader", "train", "train_timer", "lr")
_TALLY_KEYS = ("batches", "samples", "hits", "loss_sum")

_WHAT_TO_DO = (
    "it was written by another model, optimizer or configuration; resume with the run's own settings "
    "(`stoker train --name RUN --resume` alone takes them from run.json), or start a new run under another name"
)
_MISFITS = (KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError, StokerError)


def check_last(state: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """Check that ``state`` is a stoker ``last.pt``; return its ``partial`` entry (or ``None``).

    Raises:
        CheckpointError: another format, or a key (also of ``partial``) is missing.
    """
    missing = [k for k in LAST_KEYS if k not in state]
    if state.get("format") != CHECKPOINT_FORMAT or missing:
        raise CheckpointError(
            f"{path}: not a stoker last.pt (format {state.get('format')!r}, missing {missing}); "
            "resume needs the last.pt a stoker run wrote"
        )
    partial = state.get("partial")
    if partial is None:
        return None
    bad = [k for k in PARTIAL_KEYS if not isinstance(partial, dict) or k not in partial]
    if not bad:
        bad = [f"train.{k}" for k in _TALLY_KEYS if not isinstance(partial["train"], dict) or k not in partial["train"]]
    if bad or partial["phase"] not in ("train", "valid"):
        raise CheckpointError(
            f"{path}: its mid-epoch entry is damaged (missing {bad or ['a phase of train or valid']}); "
            "delete the run folder's last.pt to start over, or restore it from a copy"
        )
    return partial


def _apply(path: Path, what: str, apply: Callable[[], Any]) -> None:
    try:
        apply()
    except _MISFITS as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: its {what} does not fit this run ({first}); {_WHAT_TO_DO}") from None


def restore_last(
    state: dict[str, Any],
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    scheduler: Any | None,
    history: History,
) -> None:
    """Put a checked ``last.pt`` back: weights, optimizer, scaler, scheduler, RNG states, history.

    Raises:
        CheckpointError: a part does not fit this run (names the part and the file).
    """
    _apply(path, "model", lambda: model.load_state_dict(state["model"]))
    _apply(path, "optimizer state", lambda: optimizer.load_state_dict(state["optimizer"]))
    _apply(path, "grad scaler state", lambda: scaler.load_state_dict(state["scaler"]))
    if (scheduler is None) != (state["scheduler"] is None):
        has = "a scheduler" if state["scheduler"] is not None else "no scheduler"
        raise CheckpointError(f"{path}: it holds {has} but this run has {'none' if scheduler is None else 'one'}; {_WHAT_TO_DO}")
    if scheduler is not None:
        _apply(path, "scheduler state", lambda: scheduler.load_state_dict(state["scheduler"]))
    _apply(path, "random generator state", lambda: set_rng_state(state["rng"]))
    saved = state["history"]
    if isinstance(saved, list):  # the layout before History.state_dict
        saved = {"epochs": saved, "best_acc": state["best_acc"], "best_epoch": state["best_epoch"]}
    _apply(path, "history", lambda: history.load_state_dict(saved))


def restore_loader(loader: Any, state: dict[str, Any], path: Path, epoch: int) -> None:
    """Give the train loader the position saved in the middle of ``epoch``.

    Raises:
        CheckpointError: the loader cannot take a state, or the state is another loader's.
    """
    if not hasattr(loader, "load_state_dict"):
        raise CheckpointError(
            f"{path}: it was saved in the middle of epoch {epoch}, and resuming there needs a train loader "
            f"with load_state_dict (stoker's make_loader); this one is a {type(loader).__name__}"
        )
    _apply(path, "train loader position", lambda: loader.load_state_dict(state))


def restore_tally(tally: Any, state: dict[str, Any], path: Path) -> None:
    """Give a phase's tally the running sums saved in the middle of its epoch.

    Raises:
        CheckpointError: the saved sums are not a tally state (the message names ``path``).
    """
    _apply(path, "mid-epoch tallies", lambda: tally.load_state_dict(state))
