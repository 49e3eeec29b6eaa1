"""Checkpoints: plain dicts of ``state_dict``s, written atomically, loaded without pickle.

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(..., weights_only=True)``: opening a checkpoint from a stranger never runs
code. It is written to a temporary file in the same folder, flushed to disk and renamed
over the old one, so a crash mid-write leaves the previous checkpoint whole.
"""

from __future__ import annotations

import errno
import io
import os
import random
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stoker.errors import CheckpointError
from stoker.lifetime import pid_alive

__all__ = ["get_rng_state", "load_checkpoint", "save_checkpoint", "save_checkpoint_bytes", "set_rng_state"]


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename).

    Args:
        state: a dict of ``state_dict``s, tensors, numbers, strings, lists and dicts.
        path: where to write; its folder must exist.

    Returns:
        ``path`` as a Path.

    Raises:
        CheckpointError: the folder is missing or not writable, or the disk is full.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> save_checkpoint({"model": model.state_dict(), "epoch": 3}, "last.pt")
        PosixPath('last.pt')
    """
    path = Path(path)
    _remove_stale_temporaries(path)
    needed = _tensor_bytes(state)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None  # the folder is missing: mkstemp below says so
    if free is not None and free < needed:
        raise CheckpointError(_disk_full(path, needed, free))
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot write checkpoint ({exc.strerror}); check the folder exists and is writable") from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(_disk_full(path, needed, shutil.disk_usage(path.parent).free)) from None
        if isinstance(exc, OSError):
            raise CheckpointError(f"{path}: cannot write checkpoint ({exc.strerror}); the previous one is intact") from None
        if isinstance(exc, RuntimeError) and ("write" in str(exc).lower() or "unexpected pos" in str(exc)):
            # torch's zip writer reports a failed write (a full disk) as a RuntimeError
            raise CheckpointError(
                f"{path}: cannot write checkpoint ({str(exc).splitlines()[0]}); it needs about "
                f"{needed / 2**20:,.1f} MiB and {shutil.disk_usage(path.parent).free / 2**20:,.1f} MiB are free; "
                "the previous one is intact"
            ) from None
        raise
    return path


def save_checkpoint_bytes(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write a checkpoint's bytes, read elsewhere (another machine's ``last.pt``), to ``path`` atomically.

    Raises:
        CheckpointError: the folder cannot be written, or the disk is full (the previous file is intact).
    """
    path = Path(path)
    _remove_stale_temporaries(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot write checkpoint ({exc.strerror}); check the folder is writable and has "
                              f"{len(data) / 2**20:,.1f} MiB free; the previous one is intact") from None
    return path


def _tensor_bytes(state: Any) -> int:
    """About how many bytes ``torch.save(state)`` writes (its tensors; the rest is small)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    return 0


def _disk_full(path: Path, needed: int, free: int) -> str:
    return (
        f"{path}: the disk is full: the checkpoint needs about {needed / 2**20:,.1f} MiB and "
        f"{free / 2**20:,.1f} MiB are free; free some space or pass another log folder. The previous checkpoint is intact"
    )


def _remove_stale_temporaries(path: Path) -> None:
    """Delete what an earlier, killed save of ``path`` left (``.last.pt.<pid>.*.tmp`` of a dead pid)."""
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid_text = name[len(prefix) :].split(".", 1)[0]
        if pid_text.isdigit() and pid_alive(int(pid_text)) and int(pid_text) != os.getpid():
            continue  # another live process is writing it
        (path.parent / name).unlink(missing_ok=True)


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device = "cpu", *, data: bytes | None = None
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``.

    ``data``: the file's bytes, read elsewhere (rank 0 reads ``last.pt`` and sends it to
    the other ranks, which need not see the run folder); ``path`` then only names it.

    Raises:
        CheckpointError: the file is missing, truncated, not a checkpoint, or holds
            objects other than tensors and plain containers.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> _ = save_checkpoint({"model": model.state_dict(), "epoch": 3}, "best.pt")
        >>> state = load_checkpoint("best.pt")
        >>> model.load_state_dict(state["model"]), state["epoch"]
        (<All keys matched successfully>, 3)
    """
    path = Path(path)
    if data is None and not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; check the run folder (last.pt is written after every epoch)")
    try:
        state = torch.load(io.BytesIO(data) if data is not None else path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc}); the file is damaged or truncated") from None
    except Exception as exc:  # torch's weights-only unpickler refuses anything but tensors and plain containers
        if "Weights only load failed" not in str(exc):
            raise
        raise CheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain containers "
            f"({str(exc).splitlines()[0]}); stoker loads checkpoints with weights_only=True"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of state_dicts, found {type(state).__name__}")
    return state


def get_rng_state() -> dict[str, Any]:
    """Every random generator's state (torch CPU and CUDA, numpy, Python), in plain types."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"], np_state["has_gauss"], np_state["gauss"])
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
