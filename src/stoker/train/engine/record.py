"""The run folder and its ``run.json``: who ran what, where, with which versions.

``run.json`` sits beside ``metrics.csv`` so runs can be grouped later (``stoker
compare --group-by category``) by what the run itself recorded, not by folder names.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from stoker.errors import ConfigError, DataError
from stoker.fs import local_path
from stoker.lifetime import pid_alive
from stoker.loading.placement import local_ranks
from stoker.train.engine import staging
from stoker.train.engine.history import History

__all__ = [
    "BEST_FILE",
    "LAST_FILE",
    "RUN_FILE",
    "describe_status",
    "device_name",
    "prepare_run_dir",
    "read_run_json",
    "resume_command",
    "run_dir_of",
    "run_status",
    "versions",
    "write_run_json",
]

RUN_FILE = "run.json"
LAST_FILE = "last.pt"
BEST_FILE = "best.pt"


def versions() -> dict[str, str]:
    """Versions of Python, stoker, torch, torchvision and CUDA (when built with it)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("stoker", "torch", "torchvision"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    if torch.version.cuda:
        found["cuda"] = str(torch.version.cuda)
    return found


def device_name(device: torch.device) -> str:
    """A readable name of the hardware behind ``device``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def prepare_run_dir(
    log_dir: str | os.PathLike[str], name: str | None, resume: bool, *, elsewhere: bool = False
) -> tuple[str, Path]:
    """Create (or, to resume, find) the run folder ``log_dir/name``.

    Without a name, the run is named after the time it starts (``20250101-120000``,
    with ``-2``, ``-3``... when that folder exists).

    A folder that holds only the ``run.json`` of a run that ended (or was killed)
    before its first ``last.pt`` holds no run: it is started again. It still counts
    as a run while that run is alive (``run.json`` records its pid and host).

    ``log_dir`` may be a URL (``s3://bucket/runs``): the run folder returned is then this
    machine's copy of it (:mod:`stoker.train.engine.staging`), filled from the URL to resume
    (``run.json``, ``best.pt``, ``last.pt``) and empty to start; the run uploads into it.

    Args:
        elsewhere: resuming over several machines, each with its own folder: ``last.pt``
            may be in another machine's (:mod:`stoker.train.engine.handover` finds the newest),
            so none is required here.

    Raises:
        ConfigError: resuming without a name or without ``last.pt``; or starting a new
            run in a folder that already holds one, or where a run is going on now.
        NetworkError: ``log_dir`` is a URL that cannot be reached.
    """
    remote = local_path(log_dir) is None
    if name is not None and (not name or name in (".", "..") or "/" in name or os.sep in name):
        raise ConfigError(f"run name {name!r} must be a plain folder name (no '/'), e.g. 'resnet18-shards'")
    if resume:
        if name is None:
            raise ConfigError("resume needs the run's name: set run.name (or --name) to the folder to continue")
        run_dir, shown = _place(log_dir, name, (RUN_FILE, BEST_FILE, LAST_FILE) if remote else None)
        if not elsewhere and not (run_dir / LAST_FILE).is_file():
            raise ConfigError(f"{shown}: no {LAST_FILE} to resume from; start the run without resume")
        return name, run_dir
    if name is None:
        base = time.strftime("%Y%m%d-%H%M%S")
        name, suffix = base, 1
        while staging.exists(os.fspath(log_dir), name) if remote else (Path(log_dir) / name).exists():
            suffix += 1
            name = f"{base}-{suffix}"
    run_dir, shown = _place(log_dir, name, (RUN_FILE, LAST_FILE) if remote else None)
    if (run_dir / LAST_FILE).exists() or (run_dir / RUN_FILE).exists() and _holds_a_run(run_dir):
        raise ConfigError(
            f"{shown}: already holds a run; resume it (resume=True, --resume) or choose another name"
        )
    if remote:  # start afresh: an empty copy, no stale events at the URL
        url = shown
        staging.fetch(url, run_dir, ())
        staging.remove_stale_events(url)
        return name, run_dir
    for stale in run_dir.glob("events.out.tfevents.*"):  # a run that never finished an epoch: start afresh
        stale.unlink()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{run_dir}: cannot create the run folder ({exc.strerror}); check log_dir") from None
    return name, run_dir


def _place(log_dir: str | os.PathLike[str], name: str, fetched: tuple[str, ...] | None) -> tuple[Path, str]:
    """``(the run folder on this machine, how messages name it)``; at a URL, a local copy holding ``fetched``."""
    url = staging.run_url(log_dir, name)
    if url is None:
        return Path(log_dir) / name, str(Path(log_dir) / name)
    local = staging.local_copy(url)
    staging.fetch(url, local, fetched or ())
    return local, url


def run_dir_of(log_dir: str | os.PathLike[str], name: str) -> Path:
    """The run folder ``log_dir/name`` on this machine: the folder itself, or at a URL this machine's copy."""
    url = staging.run_url(log_dir, name)
    return staging.local_copy(url) if url is not None else Path(log_dir) / name


def _holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir``'s ``run.json`` (there is no ``last.pt``) belongs to a run worth keeping:
    one that finished an epoch, or one that is running now."""
    try:
        record = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # unreadable: leave it to a person
    if not isinstance(record, dict) or (record.get("summary") or {}).get("epochs_done", 0):
        return True
    return record.get("status") == "running" and _alive(record.get("pid"), record.get("host"))


def _alive(pid: object, host: object) -> bool:
    """Whether process ``pid`` runs on this machine now (a record from another host counts as alive)."""
    if not isinstance(pid, int) or not isinstance(host, str):
        return False  # a record from before pids were kept
    if host != socket.gethostname():
        return True  # cannot tell from here
    return pid_alive(pid)


def run_status(record: Mapping[str, Any]) -> str:
    """How the run of ``record`` (a ``run.json``) stands now: its recorded ``status``
    (``"finished"``, ``"patience"``, ``"interrupted"``, ``"non-finite loss"``, ``"error"``...),
    except that a run recorded as ``"running"`` whose process is gone is ``"interrupted"``.

    A ``kill -9`` (or a lost machine) gives the run no chance to record how it ended, so
    ``run.json`` keeps saying ``"running"``; the record's ``pid`` and ``host`` (rank 0's,
    under torchrun) tell whether it still runs. A run on another host, or a record without
    a pid, cannot be checked from here and stays ``"running"``.
    """
    status = str(record.get("status") or "unknown")
    pid, host = record.get("pid"), record.get("host")
    if status == "running" and isinstance(pid, int) and isinstance(host, str) and not _alive(pid, host):
        return "interrupted"
    return status


def describe_status(record: Mapping[str, Any]) -> str:
    """One line on how the run of ``record`` stands (:func:`run_status`), with the epochs it finished.

    Example:
        >>> describe_status({"status": "finished", "summary": {"epochs_done": 3}})
        'finished after 3 epoch(s)'
    """
    status = run_status(record)
    epochs = (record.get("summary") or {}).get("epochs_done", 0)
    done = f" after {epochs} epoch(s)" if isinstance(epochs, int) else ""
    if status == "interrupted" and record.get("status") == "running":
        return f"interrupted (process {record.get('pid')} on {record.get('host')} is gone, killed or lost){done}"
    if status == "running":
        where = f" as process {record.get('pid')} on {record.get('host')}" if isinstance(record.get("pid"), int) else ""
        return f"recorded as running{where}, which cannot be checked from here or still runs{done}"
    return f"{status}{done}"


def resume_command(log_dir: str | os.PathLike[str], name: str) -> str:
    """The command that continues the run ``log_dir/name`` from its ``last.pt``, as this process was launched.

    One process: ``stoker train --log-dir LOG --name NAME --resume``. Under ``torchrun``
    on one machine, the same through ``torchrun --standalone --nproc-per-node N -m stoker``
    (a checkpoint saved mid-epoch resumes on its own number of ranks only); over several
    machines, the ``-m stoker train ...`` part of the launch, to run with its own flags.
    """
    args = f"train --log-dir {shlex.quote(str(log_dir))} --name {shlex.quote(name)} --resume"
    world = int(os.environ.get("WORLD_SIZE") or 1)
    local = local_ranks(unknown=world)
    if world <= 1:
        return f"stoker {args}"
    if local == world:
        return f"torchrun --standalone --nproc-per-node {world} -m stoker {args}"
    return f"-m stoker {args} under the same torchrun launch as this one ({world} ranks, {local} on each machine)"


def write_run_json(run_dir: Path, record: Mapping[str, Any], history: History | None = None) -> Path:
    """Write ``run.json`` (atomically): ``record`` plus a summary of ``history``."""
    data = dict(record)
    if history is not None:
        epochs = history.epochs
        data["status"] = history.stopped
        data["summary"] = {
            "epochs_done": len(epochs),
            "best_valid_acc": history.best_acc if history.best_epoch else None,
            "best_epoch": history.best_epoch or None,
            "time_s": sum(e.time_s for e in epochs),
            "img_per_s": (sum(e.train_samples for e in epochs) / t) if (t := sum(e.train_time_s for e in epochs)) else None,
            "data_wait_share": (sum(e.data_wait_s for e in epochs) / t) if (t := sum(e.time_s for e in epochs)) else None,
        }
        # Per epoch, over all ranks: what was counted, what was trimmed to keep the ranks in step.
        data["epochs"] = [
            {"epoch": e.epoch, "train_samples": e.train_samples, "valid_samples": e.valid_samples, "trimmed": e.trimmed,
             "data_wait_share": e.data_wait_share, "slowest_data_wait_share": e.slowest_data_wait_share}
            for e in epochs
        ]
    data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = run_dir / RUN_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_run_json(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a run's ``run.json``.

    Raises:
        DataError: the file is missing or not valid JSON.
    """
    path = Path(run_dir) / RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: not found; is {run_dir} a stoker run folder?") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object")
    return data
