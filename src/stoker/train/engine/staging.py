"""A run folder at a URL (``--log-dir s3://bucket/runs``): written in a local copy, uploaded as the run goes.

TensorBoard's writer, the CSV logger and ``torch.save`` write local files, so a run whose
log folder is a URL writes into a local copy of its run folder
(:func:`local_copy`: ``$STOKER_CACHE/runs/<hash of the URL>/NAME``), and rank 0 uploads what
changed (:func:`push`) after every epoch, every mid-epoch ``last.pt`` and at the end:
every other file first, then ``run.json``, ``last.pt`` last, each object whole (an object
store never shows half an upload). To resume, the copy is filled from the URL first
(:func:`fetch`: ``run.json``, ``best.pt``, ``last.pt``), so any machine that can reach the
bucket continues the run: no folder shared between machines is needed. The copy is a
cache: deleting it loses nothing that was uploaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from stoker.errors import ConfigError, MissingFileError, NetworkError, StokerError
from stoker.fs import Location, local_path, where

__all__ = ["exists", "fetch", "local_copy", "push", "read_text", "remove_stale_events", "run_url"]

_STAMPS = ".stoker-uploaded.json"  # name -> [size, mtime_ns] of each file as last uploaded
_LAST_NAMES = ("run.json", "last.pt")  # uploaded after everything else, last.pt last: it names what the others hold


def run_url(log_dir: str | os.PathLike[str], name: str) -> str | None:
    """The URL of the run folder ``log_dir/name`` when ``log_dir`` is a URL, else ``None``."""
    text = os.fspath(log_dir)
    return f"{text.rstrip('/')}/{name}" if local_path(text) is None else None


def local_copy(url: str) -> Path:
    """Where this machine keeps its copy of the run folder at ``url`` (under the cache folder; named as the run)."""
    from stoker.shards.cache.store import default_cache_dir

    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return default_cache_dir() / "runs" / digest / url.rstrip("/").rsplit("/", 1)[-1]


def _network_error(url: str, what: str, exc: BaseException) -> NetworkError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return NetworkError(f"{url}: cannot {what} ({type(exc).__name__}: {first}); check the URL, the credentials and the network")


def fetch(url: str, local: Path, names: Iterable[str]) -> list[str]:
    """Make ``local`` a fresh copy of the run folder at ``url`` holding ``names`` (those there); returns those found.

    Raises:
        ConfigError: ``local`` cannot be made.
        NetworkError: the URL cannot be read.
    """
    try:
        if local.exists():
            shutil.rmtree(local)
        local.mkdir(parents=True)
    except OSError as exc:
        raise ConfigError(f"{local}: cannot make the local copy of {url} ({exc.strerror}); set STOKER_CACHE to a writable folder") from None
    folder = where(url)
    found = []
    for name in names:
        try:
            data = folder.read_bytes(name)
        except MissingFileError:
            continue
        except StokerError:
            raise
        except Exception as exc:  # noqa: BLE001 - botocore, aiohttp...: one line naming the URL
            raise _network_error(folder.url_of(name), "read it", exc) from None
        (local / name).write_bytes(data)
        found.append(name)
    _write_stamps(local, {name: _stamp(local / name) for name in found})  # what is there already needs no upload
    return found


def exists(url: str, name: str | None = None) -> bool:
    """Whether ``url`` (or ``name`` in that folder) exists.

    Raises:
        NetworkError: the URL cannot be reached.
    """
    folder: Location = where(url)
    try:
        return folder.exists(name)
    except StokerError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _network_error(folder.url_of(name), "reach it", exc) from None


def push(local: Path, url: str) -> list[str]:
    """Upload the files of ``local`` that changed since the last push to ``url``; returns their names.

    Temporary files (a leading ``.``) stay local; ``run.json`` and then ``last.pt`` go
    last, so the folder at ``url`` never names a checkpoint it does not hold yet.

    Raises:
        NetworkError: an upload failed (the local copy is intact; the next push retries it).
    """
    stamps = _read_stamps(local)
    try:
        names = sorted(n for n in os.listdir(local) if not n.startswith(".") and (local / n).is_file())
    except OSError:
        return []
    names.sort(key=lambda n: _LAST_NAMES.index(n) + 1 if n in _LAST_NAMES else 0)
    folder = where(url)
    sent = []
    for name in names:
        stamp = _stamp(local / name)
        if stamps.get(name) == stamp:
            continue
        try:
            folder.upload(local / name, name)
        except StokerError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _network_error(folder.url_of(name), f"upload {local / name}", exc) from None
        stamps[name] = stamp
        sent.append(name)
        _write_stamps(local, stamps)
    return sent


def _stamp(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def _read_stamps(local: Path) -> dict[str, list[int]]:
    try:
        data = json.loads((local / _STAMPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_stamps(local: Path, stamps: dict[str, list[int]]) -> None:
    tmp = local / (_STAMPS + ".tmp")
    tmp.write_text(json.dumps(stamps), encoding="utf-8")
    os.replace(tmp, local / _STAMPS)


def remove_stale_events(url: str) -> None:
    """Delete the TensorBoard events a run that never finished an epoch left at ``url`` (a new run starts afresh).

    Raises:
        NetworkError: the URL cannot be reached.
    """
    folder = where(url)
    try:
        for stale in folder.glob("events.out.tfevents.*"):
            folder.remove(stale.name)
    except StokerError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _network_error(url, "list it", exc) from None


def read_text(url: str, name: str) -> str | None:
    """The text of ``name`` in the folder at ``url``; ``None`` if it is not there.

    Raises:
        NetworkError: the URL cannot be reached.
    """
    folder = where(url)
    try:
        return folder.read_bytes(name).decode("utf-8", errors="replace")
    except MissingFileError:
        return None
    except StokerError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _network_error(folder.url_of(name), "read it", exc) from None
