"""One reading plan per machine: every stream reader's shard uses for the epoch, and where each reader is.

A stream's order depends only on the seed, the epoch, the rank count and the batch size
(:mod:`stoker.order`), so every reader of a machine (DataLoader workers, the ranks of a
host) computes, without talking, which shards every local reader reads at which *time*
(the place of the read's first row in its rank's order). That is the machine's plan
(:class:`MachinePlan`), the same in every reader; what they share is where each one is
(:class:`PlanReader`). From the plan and the positions:

- **admission**: a reader downloads a shard only once its first use is at most
  :attr:`MachinePlan.window` rows after the slowest reader's position
  (:meth:`PlanReader.wait_admitted`); a reader ahead waits on the others' progress, not on
  a timeout. With a limit of at least :meth:`MachinePlan.smallest_room` shards, each shard
  is then downloaded at most once per epoch per machine.
- **eviction**: each cached shard's next use (:func:`next_uses`) orders eviction
  (:func:`stoker.shards.cache.policy.eviction_order`).

A reader that has not come yet counts as being at the epoch's start until :data:`ARRIVAL_S`
after the plan (or its last epoch) began. The records live in a folder (``0o700``) in
``/dev/shm`` (else the temporary folder), outside the cache's limit; a folder that is not
the user's alone is not used (said once): the readers then plan alone. The object-store
guide (``docs/guides/remote.md``, "One reading plan per machine") shows the records.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stoker.lifetime import pid_alive
from stoker.shards.cache.policy import NEVER, next_use_of

__all__ = ["ARRIVAL_S", "MachinePlan", "PlanReader", "next_uses", "pass_tag", "registry_dir"]

log = logging.getLogger("stoker")
ARRIVAL_S = 10.0  # how long readers of a plan that have not come yet are waited for, after it (or their last epoch) began
SAY_WAIT_S = 5.0  # a wait for slower readers longer than this is said (once per process)
_warned = False
_said_wait = False
_plans: dict[str, tuple[tuple[int, int], MachinePlan]] = {}  # parsed plan files by path: ((mtime_ns, size), plan)


@dataclass(frozen=True)
class MachinePlan:
    """The shards every reader of a stream on this machine uses in one epoch, and when.

    Attributes:
        uses: per local reader, each shard's (SHA-256) use times, ascending: the rank-order
            place of the first row of each read that uses it.
        window: rows ahead of the slowest reader whose shards may be downloaded.
    """

    uses: tuple[dict[str, list[int]], ...]
    window: int

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first use, last use)`` of each shard of the plan on the machine (in one order)."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for plan in self.uses:
            for sha, times in plan.items():
                first[sha] = min(first.get(sha, times[0]), times[0])
                last[sha] = max(last.get(sha, times[-1]), times[-1])
        keys = sorted(first)
        return np.asarray([first[k] for k in keys], dtype=np.int64), np.asarray([last[k] for k in keys], dtype=np.int64)

    def first_use(self) -> dict[str, int]:
        """Each shard's first use on the machine."""
        found: dict[str, int] = {}
        for plan in self.uses:
            for sha, times in plan.items():
                found[sha] = min(found.get(sha, times[0]), times[0])
        return found

    def smallest_room(self, window: int = 0) -> int:
        """The most shards the cache holds at once under this plan with ``window``: the room that fetches each once.

        The shards admitted while the slowest reader is at time ``t`` and not yet used for
        the last time are those with ``first - window <= t <= last``; the most of them
        over ``t`` is what the limit must hold.
        """
        first, last = self.spans()
        return _most_overlapping(first - window, last)

    @staticmethod
    def window_for(uses: tuple[dict[str, list[int]], ...], room: int) -> tuple[MachinePlan, int]:
        """The plan with the widest window (up to one epoch) whose shards fit in ``room`` shards; and its smallest room.

        The smallest room (at window 0) above ``room`` means the limit cannot fetch each shard once.
        """
        plan = MachinePlan(uses, 0)
        first, last = plan.spans()
        need = _most_overlapping(first, last)
        if need >= room or not len(first):
            return plan, need
        lo, hi = 0, int(last.max() - first.min()) + 1  # the widest window that fits lies in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _most_overlapping(first - mid, last) <= room:
                lo = mid
            else:
                hi = mid
        return MachinePlan(uses, lo), need


def _most_overlapping(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most closed intervals ``[start, end]`` that share a point."""
    if not len(starts):
        return 0
    points = np.concatenate([starts, ends + 1])
    change = np.concatenate([np.ones(len(starts), dtype=np.int64), -np.ones(len(ends), dtype=np.int64)])
    order = np.lexsort((change, points))  # at one point, ends (-1) before starts (+1)
    return int(np.cumsum(change[order]).max())


def registry_dir(cache_root: Path) -> Path:
    """The folder of the reader records of the cache at ``cache_root`` (shared memory where the machine has it)."""
    key = hashlib.sha1(str(Path(cache_root).expanduser().absolute()).encode()).hexdigest()[:16]
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"stoker-readers-{os.getuid()}-{key}"


def _own_folder(folder: Path) -> None:
    """Make ``folder`` (``0o700``) if need be, and check it is this user's own, not a link or another's.

    The registry lives in a folder anyone may write in (``/dev/shm``): a folder of that name
    planted by another user could make this one write where they choose, or plan what
    they name.

    Raises:
        OSError: it is not a folder of this user's, closed to others.
    """
    folder.mkdir(mode=0o700, exist_ok=True)
    if not _is_own(folder):
        raise PermissionError(errno.EPERM, "not a folder of this user's alone", str(folder))


def _is_own(folder: Path) -> bool:
    """Whether ``folder`` is a folder (not a link) of this user's, closed to others (``os.lstat`` may raise OSError)."""
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def pass_tag(*parts: object) -> str:
    """A name for a stream that every reader of it computes alike (from what fixes its order, the epoch aside)."""
    return hashlib.sha1(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:24]


def _write(path: Path, value: object) -> None:
    """Write ``value`` as JSON to ``path`` whole (aside, then renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _say_unusable(folder: Path, exc: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s: the readers' records of the shard cache cannot be written (%s); the readers on this machine "
                    "plan alone, and may download a shard again", folder, exc.strerror or exc)


def _load_plan(path: Path) -> MachinePlan | None:
    """The plan in ``path`` (parsed once per version of the file), or None."""
    try:
        st = path.stat()
    except OSError:
        return None
    version = (st.st_mtime_ns, st.st_size)
    known = _plans.get(str(path))
    if known is not None and known[0] == version:
        return known[1]
    raw = _read(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("uses"), list) or not isinstance(raw.get("window"), int):
        return None
    plan = MachinePlan(tuple({str(k): [int(t) for t in v] for k, v in r.items()} for r in raw["uses"]), raw["window"])
    _plans[str(path)] = (version, plan)
    return plan


def _positions(folder: Path, readers: int, now: float) -> list[tuple[int, int] | None]:
    """Where each reader of the stream in ``folder`` is: ``(epoch, time)``, or None (gone, or not waited for).

    A reader that finished an epoch is taken to be at the next one's start for :data:`ARRIVAL_S`
    after; one with no record, at the start of the earliest plan, for :data:`ARRIVAL_S` after that plan began.
    """
    plans = sorted(_plan_files(folder))
    found: list[tuple[int, int] | None] = []
    for n in range(readers):
        path = folder / f"reader-{n}.json"
        record = _read(path)
        if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
            if plans and now - _mtime(plans[0][1], now) < ARRIVAL_S:
                found.append((plans[0][0], 0))
            else:
                found.append(None)
        elif record.get("done"):
            found.append((record["epoch"] + 1, 0) if now - _mtime(path, now) < ARRIVAL_S else None)
        elif isinstance(record.get("at"), int) and pid_alive(int(record.get("pid", 0))):
            found.append((record["epoch"], record["at"]))
        else:
            found.append(None)
    return found


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default


def _plan_files(folder: Path) -> list[tuple[int, Path]]:
    found = []
    for path in folder.glob("plan-*.json"):
        with contextlib.suppress(ValueError):
            found.append((int(path.stem.removeprefix("plan-")), path))
    return found


class PlanReader:
    """One reader's place in its machine's plan: it records where it is, and waits for its turn to download.

    Args:
        cache_root: the cache folder the reader reads through.
        tag: the stream (:func:`pass_tag`), the same for every reader of it on this machine.
        epoch: the epoch read.
        reader: this reader's number among the machine's readers of the plan.
        plan: the machine's plan for the epoch (the same in every reader).
    """

    def __init__(self, cache_root: Path, tag: str, epoch: int, reader: int, plan: MachinePlan) -> None:
        self.folder = registry_dir(cache_root) / tag
        self.path = self.folder / f"reader-{reader}.json"
        self.epoch, self.reader, self.plan = epoch, reader, plan
        self._first = plan.first_use()
        self._at = 0
        self._usable = True
        try:
            _own_folder(self.folder.parent)
            self.folder.mkdir(exist_ok=True)
            plan_path = self.folder / f"plan-{epoch}.json"
            if _load_plan(plan_path) != plan:
                _write(plan_path, {"uses": list(plan.uses), "window": plan.window})
            self.at(0)
        except OSError as exc:
            self._usable = False
            _say_unusable(self.folder, exc)

    def at(self, time_: int) -> None:
        """Record that this reader is at the read of time ``time_``."""
        self._at = int(time_)
        if not self._usable:
            return
        try:
            self.folder.mkdir(exist_ok=True)
            _write(self.path, {"pid": os.getpid(), "epoch": self.epoch, "at": self._at})
        except OSError as exc:
            self._usable = False
            _say_unusable(self.folder, exc)

    def admitted(self, *shas: str) -> bool:
        """Whether the shards ``shas`` may be downloaded now: each one's first use is within the window of the slowest reader."""
        if not self._usable:
            return True
        firsts = [f for f in (self._first.get(sha) for sha in shas) if f is not None]  # one not in the plan: no room kept
        if not firsts:
            return True
        slowest = min((p for p in _positions(self.folder, len(self.plan.uses), time.time()) if p is not None),
                      default=None)
        mine = (self.epoch, self._at)
        slowest = mine if slowest is None or mine < slowest else slowest
        return (self.epoch, max(firsts)) <= (slowest[0], slowest[1] + self.plan.window)

    def wait_admitted(self, shas: list[str]) -> float:
        """Wait until every shard of ``shas`` may be downloaded (the slower readers have moved on); seconds waited.

        The slowest reader never waits: its own reads are within the window.
        """
        start = time.monotonic()
        pause = 0.002
        while not self.admitted(*shas):
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        waited = time.monotonic() - start
        global _said_wait
        if waited > SAY_WAIT_S and not _said_wait:
            _said_wait = True
            log.warning("%s: waited %.0f s for other readers of this machine to move on (the cache keeps what they "
                        "still read; a reader that does not come is waited for %.0f s)", self.folder, waited, ARRIVAL_S)
        return waited

    def first_time(self, what: str) -> bool:
        """True the first time any reader of this stream on the machine asks about ``what`` (to say a thing once)."""
        if not self._usable:
            return True
        try:
            os.close(os.open(self.folder / f"said-{what}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return False
        except OSError:
            return True
        return True

    def close(self) -> None:
        """This reader is done with the epoch."""
        if not self._usable:
            return
        with contextlib.suppress(OSError):
            _write(self.path, {"pid": os.getpid(), "epoch": self.epoch, "done": True})


def next_uses(cache_root: Path) -> dict[str, tuple[int, int]] | None:
    """Each shard's next use by a stream reader of this machine, as ``(epoch, time)``; None when no plan is known.

    Shards missing from the answer are not used again by any plan. On the way, plans that
    no reader reads any more are removed.
    """
    root = registry_dir(cache_root)
    try:
        if not _is_own(root):
            return None  # not this user's own (see _own_folder): nothing in it is trusted
        streams = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return None
    now = time.time()
    found: dict[str, tuple[int, int]] = {}
    known = False
    for folder in streams:
        plans = _plan_files(folder)
        for epoch, path in plans:
            plan = _load_plan(path)
            if plan is None:
                continue
            at: list[int | None] = []
            for position in _positions(folder, len(plan.uses), now):
                if position is None or position[0] > epoch:
                    at.append(None)
                else:
                    at.append(position[1] if position[0] == epoch else 0)
            if all(p is None for p in at):
                if now - _mtime(path, now) > ARRIVAL_S:
                    path.unlink(missing_ok=True)
                continue
            known = True
            for sha, key in next_use_of(plan.uses, at, epoch, plan.window).items():
                if key < found.get(sha, NEVER):
                    found[sha] = key
    return found if known else None
