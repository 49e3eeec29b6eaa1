"""Adapt while training: try the loader settings that matter on the real model and data, keep the fastest.

In the first batches of a run :func:`~stoker.train.fit` reads the train loader with a
few candidate settings in turn — its backend (worker processes or threads), how many
workers, and how many batches each reads ahead — times each on the steps it is really
running, keeps the fastest, says so (rank 0), and records every trial in ``run.json``
(``"adapt"``). Afterwards it watches the share of each step spent waiting for data; when
that share rises well above what the chosen setting measured, it tries them again
(twice at most). ``Scenario(adapt=False)`` / ``stoker train --no-adapt`` keeps the
settings as given.

What it may change, and why that changes no result:

* **the train loader's workers, backend and prefetch depth**, for a stoker
  :class:`~stoker.Loader` over a map-style data set. Which samples a batch holds is the
  sampler's, a function of ``(seed, epoch)`` (:mod:`stoker.order`), not of who reads it:
  a change is made between two batches with the loader's own resume-from-position
  (``state_dict`` before, :meth:`~stoker.Loader.reconfigure`, ``load_state_dict``
  after), so the next batch is the one the old setting would have given. The figures,
  checkpoints and weights are the same, to the bit, as a ``--no-adapt`` run's.
  Not tried: an iterable data set (a ``Pipe``, a ``ShardStream``: its stream is split by
  worker, so the worker count decides what a batch holds), a loader that is not
  stoker's, and a data set whose samples draw random numbers (an augmentation draws from
  the reading worker's generator, so another worker count draws other numbers: pass
  ``adapt=False`` for those).
* **torch's compute threads: not on the CPU.** The thread count decides how torch
  splits its float sums: the weights of a small CNN, an MLP and a ResNet-18 differ in
  their last bits after three steps with one thread against two (deterministic for
  each count). So a CPU run keeps the threads :mod:`stoker.train.engine.threads` sets. Where
  the model runs on an accelerator the host's threads touch no figure, and they are
  tried too (unless ``cpu_threads`` is set).

How it keeps the cost down (the trials train on real batches; what they cost is the
time a slower setting and a change of workers take): the run's first batches are not
timed (every setting is slow there); a trial times a few batches after a short warm-up;
one that has already taken twice what the best one took stops; another setting replaces
the one in force only when each of its trials was at least 10 % faster (the margin), so
only the fastest that still could is timed once more, together with the one in force
(a shared machine's load drifts), and none is when none could; a round spends at most a
quarter of the run's batches and, after its first trial, a twentieth of the run's time.
More readers or a deeper prefetch can shorten a step by at most the time the step waits
for data: when that wait is under the margin in the first trial, they are not tried. Off
the CPU no loader setting is then tried at all; on the CPU fewer readers still are, since
they leave the model more of the cores (``benchmarks/bench_adapt.py --width 64``: with a
step waiting 6 %, loading in the training process was the fastest fixed setting). A run
too short for two trials tries none, nor does one the first trial projects under 20 s,
and ``run.json`` says why.

Where it does not help: on a machine whose load swings by more than the settings
differ, a handful of batches cannot tell them apart; the margin then keeps the given
setting, and the run pays for the trials (``benchmarks/bench_adapt.py`` measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils.data import IterableDataset

from stoker.loading import Loader
from stoker.loading.placement import local_ranks
from stoker.train.engine.threads import usable_cores

if TYPE_CHECKING:
    from stoker.train.engine.run import Run

__all__ = ["Adapter", "Setting", "Trial", "make_adapter"]

SETTLE_BATCHES = 8  # the run's first batches are slow whatever the setting (starting workers, cold caches): not timed
WARM_BATCHES = 2  # after a change (or a pass's start) the workers start and fill their queue: not timed
MIN_BATCHES = 6  # timed batches of a trial, at least...
MIN_SECONDS = 0.1  # ...and at least this long, so a fast step is not timed on a few milliseconds
MAX_BATCHES = 24  # ...but never more
BUDGET_SHARE = 0.25  # of the run's training batches, at most, go into a round of trials...
TIME_SHARE = 0.05  # ...and its trials after the first (changes included) take at most this share of the run's time
MIN_RUN_S = 20.0  # a run shorter than this (as the first trial projects it) keeps its settings: little to win
ABORT_FACTOR = 2.0  # a trial stops early once it has taken this many times what the best one so far took
MARGIN = 0.1  # another setting replaces the one in force only when each of its trials was this much faster (noise)
RECHECK_RISE = 0.2  # a re-check when the recent data-wait share is this much above the chosen setting's...
RECHECK_FLOOR = 0.1  # ...and above this...
RECHECK_BATCHES = 96  # ...over this many batches, with at least 8 times the last round's batches still to come
RECHECK_KEEP = 1.5  # a re-check tries again the settings within this factor of the best one
MAX_RECHECKS = 2


@dataclass(frozen=True)
class Setting:
    """One way of reading the train loader (and, on an accelerator, the host's torch threads)."""

    backend: str
    workers: int
    prefetch: int
    threads: int | None = None

    def label(self) -> str:
        """e.g. ``2 worker processes, prefetch 2``."""
        if self.backend == "thread":
            n = max(self.workers, 1)
            who = f"{n} loader thread{'s' if n != 1 else ''}"
        elif self.workers:
            who = f"{self.workers} worker process{'es' if self.workers != 1 else ''}"
        else:
            who = "in the training process"
        threads = f", torch threads {self.threads}" if self.threads is not None else ""
        return f"{who}, prefetch {self.prefetch}{threads}"


@dataclass
class Trial:
    """What one setting measured: timed batches, their seconds (arrival to arrival) and the wait inside.

    ``spent_s`` adds the warm-up batches (and the change itself): what the trial cost the
    run. A trial ``stopped`` early (much slower than the best before it) cannot win.
    """

    setting: Setting
    batches: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    spent_s: float = 0.0
    stopped: bool = False

    @property
    def s_per_batch(self) -> float:
        return self.seconds / self.batches if self.batches and not self.stopped else float("inf")

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    def done(self) -> bool:
        return self.batches >= MAX_BATCHES or (self.batches >= MIN_BATCHES and self.seconds >= MIN_SECONDS)

    def as_dict(self) -> dict[str, Any]:
        rate = self.seconds / self.batches if self.batches else None
        return {**asdict(self.setting), "label": self.setting.label(), "batches": self.batches,
                "ms_per_batch": round(rate * 1e3, 3) if rate is not None else None,
                "wait_share": round(self.wait_share, 4), "spent_s": round(self.spent_s, 4), "stopped_early": self.stopped}


class Adapter:
    """Tries settings of a run's train loader on its first batches and keeps the fastest (see the module docs).

    Args:
        loader: the train loader.
        device: where the model trains (threads are tried only off the CPU).
        batches: training batches left in the run (``None``: unknown, then one epoch's
            worth is not known either and nothing is tried).
        try_threads: also try torch's host threads (an accelerator run without
            ``cpu_threads``).
        say: prints one line (rank 0's console), or ``None``.

    Example:
        >>> adapter = Adapter(loader, torch.device("cpu"), batches=10 * len(loader))  # doctest: +SKIP
        >>> for images, labels in adapter.batches():  # one pass: the loader's epoch, read as adapt chooses  # doctest: +SKIP
        ...     ...
        >>> adapter.record()["chosen"]  # doctest: +SKIP
    """

    def __init__(self, loader: Any, device: torch.device, *, batches: int | None, try_threads: bool = False,
                 say: Callable[[str], None] | None = None) -> None:
        self.loader = loader
        self.say = say
        self.try_threads = try_threads
        self.cores = max(1, usable_cores() // local_ranks())
        self.trials: list[Trial] = []
        self.rechecks = 0
        self.switches = 0
        self._queue: list[Setting] = []
        self._stage = 0
        self._trial: Trial | None = None
        self._change: Setting | None = None
        self._recent: list[tuple[float, float]] = []  # (seconds, wait) of the batches since the choice
        self._round_start = 0  # the first trial of the round in progress
        self._baseline = 0.0  # the chosen setting's data-wait share
        self._budget = 0  # trials of a first stage (a quarter of the run's batches at most)
        self._budget_batches = 0  # batches a round may spend on trials
        self._batches_total = 0  # training batches of the run
        self._settle = SETTLE_BATCHES
        self._short_s: float | None = None  # the projected seconds of a run too short to adapt
        self._idle_wait: float | None = None  # the data-wait share of a round's first trial, when under MARGIN
        self._on_cpu = device.type == "cpu"  # there the loader's readers share the cores with the model
        self._recheck = True  # whether a rising data-wait share may start another round
        self._seen = 0  # batches read so far
        self._round_batches = 0  # batches the last round took
        self._close: set[tuple[str, int]] = set()  # (backend, workers) within RECHECK_KEEP of the last round's best
        self.given = self._setting_now() if isinstance(loader, Loader) else None
        self.chosen = self.given
        self.reason = self._refusal(loader, batches)
        self.active = not self.reason
        if self.active:
            self._start_round()

    # -- what is tried ---------------------------------------------------------------------------------

    def _refusal(self, loader: Any, batches: int | None) -> str:
        """Why nothing is tried ("" when it is)."""
        if not isinstance(loader, Loader):
            return f"the train loader is a {type(loader).__name__}, not a stoker Loader: its settings are kept"
        if isinstance(loader.dataset, IterableDataset):
            return (f"the train data ({type(loader.dataset).__name__}) is a stream split by worker: another worker "
                    "count would change which samples a batch holds, so the settings are kept")
        per_trial = WARM_BATCHES + MIN_BATCHES
        if batches is None or batches * BUDGET_SHARE < 2 * per_trial + SETTLE_BATCHES:
            return (f"the run is too short to try settings ({batches if batches is not None else 'unknown'} training "
                    f"batches; two trials take {2 * per_trial + SETTLE_BATCHES}, a quarter of the run at most): the settings are kept")
        self._budget_batches = int(batches * BUDGET_SHARE)
        self._batches_total = batches
        self._budget = self._budget_batches // per_trial
        return ""

    def _setting_now(self) -> Setting:
        loader = self.loader
        threads = torch.get_num_threads() if self.try_threads else None
        return Setting(str(loader.backend), int(loader.num_workers), int(loader.prefetch_factor), threads)

    def _ranked(self) -> list[tuple[float, Setting]]:
        """This round's settings, fastest first: each one's timed seconds over its timed batches, all its trials together."""
        totals: dict[Setting, list[float]] = {}
        for t in self.trials[self._round_start:]:
            if t.batches and not t.stopped:
                seconds_batches = totals.setdefault(t.setting, [0.0, 0.0])
                seconds_batches[0] += t.seconds
                seconds_batches[1] += t.batches
        return sorted(((sec / n, setting) for setting, (sec, n) in totals.items()), key=lambda pair: pair[0])

    def _contenders(self) -> list[tuple[float, Setting]]:
        """This round's settings that would replace the one in force when it began, fastest first: each of their
        trials at least ``MARGIN`` faster than it (all its trials together)."""
        ranked = self._ranked()
        start = self.trials[self._round_start].setting
        start_s = next((sec for sec, setting in ranked if setting == start), None)
        if start_s is None:  # the start was not timed (stopped): the fastest is the only reading there is
            return ranked[:1]
        slowest: dict[Setting, float] = {}
        for t in self.trials[self._round_start:]:
            slowest[t.setting] = max(slowest.get(t.setting, 0.0), t.s_per_batch)
        return [(sec, setting) for sec, setting in ranked
                if setting != start and slowest[setting] <= (1 - MARGIN) * start_s]

    def _keeper(self) -> tuple[float, Setting] | None:
        """What the round would keep if it ended now: the fastest contender, else the setting it began with."""
        contenders = self._contenders()
        if contenders:
            return contenders[0]
        start = self.trials[self._round_start].setting
        return next(((sec, setting) for sec, setting in self._ranked() if setting == start), None)

    def _candidates(self, stage: int, best: Setting) -> list[Setting]:
        """Stage 0: backends and worker counts; 1: the start and the fastest that could replace it, again (the
        load on a machine drifts);
        2: prefetch depth of the best; 3: host threads (off the CPU)."""
        if stage == 0:
            counts = sorted({0, 1, max(1, self.cores // 2), self.cores, best.workers})
            options = [replace(best, backend="process", workers=w) for w in counts]
            options += [replace(best, backend="thread", workers=w) for w in counts if w > 0]
            options = [best] + [o for o in options if o != best]  # the setting in force first: no change to time it
            if self.rechecks:  # again: only what was close to the best last time
                options = [o for o in options if o == best or (o.backend, o.workers) in self._close]
            return options[: max(self._budget, 2)]
        if stage == 1:  # only when one could still replace the start: else timing them again changes nothing
            start = self.trials[self._round_start].setting
            contenders = [setting for _, setting in self._contenders()[:1]]
            top = [start, *contenders] if contenders else []
            return sorted(top, key=lambda setting: setting != self._setting_now())  # the one in force first
        if stage == 2 and self._idle_wait is not None:  # hardly any wait: a deeper prefetch has nothing to hide
            return []
        if stage == 2:
            given = self.given.prefetch if self.given is not None else best.prefetch
            depths = sorted({given, 2 * given} - {best.prefetch})
            return [best] + [replace(best, prefetch=d) for d in depths] if best.workers > 0 or best.backend == "thread" else []
        if stage == 3 and self.try_threads and best.threads is not None:
            counts = sorted({1, max(1, self.cores // 2), self.cores} - {best.threads})
            return [best] + [replace(best, threads=t) for t in counts]
        return []

    def _start_round(self) -> None:
        """Queue the settings of the first stage that has more than one."""
        self._stage = 0
        self._queue = []
        self._idle_wait = None
        self._advance(self._setting_now())

    def _advance(self, best: Setting) -> None:
        while self._stage <= 3:
            candidates = self._candidates(self._stage, best)
            self._stage += 1
            if len(candidates) > 1:
                self._queue = candidates
                self._next_trial()
                return
        self._finish()

    def _next_trial(self) -> None:
        setting = self._queue.pop(0)
        self._trial = Trial(setting)
        self.trials.append(self._trial)
        if setting != self._setting_now():
            self._change = setting

    def _trial_done(self) -> None:
        round_trials = self.trials[self._round_start:]
        spent = sum(t.batches + WARM_BATCHES for t in round_trials)
        # The round's first trial runs the setting in force: what the run would cost as it is, changes none.
        run_s = round_trials[0].seconds / max(round_trials[0].batches, 1) * self._batches_total
        changes_s = sum(t.spent_s for t in round_trials[1:])
        if len(round_trials) == 1 and run_s < MIN_RUN_S:
            self._queue, self._stage = [], 4
            self._short_s = run_s
        elif len(round_trials) == 1 and self._stage == 1 and round_trials[0].wait_share < MARGIN:
            # Less waiting for data than the margin: more readers or a deeper prefetch cannot win it. Off the CPU
            # no loader setting can (only the host threads are left to try); on the CPU fewer readers may, since
            # they leave the model more of the cores (measured: bench_adapt.py --width 64).
            self._idle_wait = round_trials[0].wait_share
            if self._on_cpu:
                fewer = _readers(round_trials[0].setting)
                self._queue = [setting for setting in self._queue if _readers(setting) < fewer]
            else:
                self._queue, self._stage = [], 3
        if spent >= self._budget_batches or changes_s >= TIME_SHARE * run_s:  # keep the best so far
            self._queue, self._stage = [], 4
        if self._queue:
            self._next_trial()
            return
        keeper = self._keeper()
        self._advance(keeper[1] if keeper else self._setting_now())

    def _finish(self) -> None:
        """The round is over: keep the fastest setting of all its trials."""
        self._trial = None
        ranked = self._ranked()
        keeper = self._keeper()
        if keeper is None:
            return
        best_s, self.chosen = keeper  # another setting only when every trial of it was clearly faster
        if self.chosen != self._setting_now():
            self._change = self.chosen
        timed = [t for t in self.trials[self._round_start:] if t.batches]
        waits = [t for t in timed if t.setting == self.chosen]
        self._baseline = sum(t.wait_s for t in waits) / max(sum(t.seconds for t in waits), 1e-9)
        given = next((sec for sec, setting in ranked if setting == self.given), None)
        why = (f"{best_s * 1e3:.1f} ms a step, wait {self._baseline:.0%}"
               + (f"; as given ({self.given.label() if self.given else '?'}): {given * 1e3:.1f} ms"
                  if given is not None and self.chosen != self.given else ""))
        stopped = sum(t.stopped for t in timed)
        early = f", {stopped} stopped early at 2x the best" if stopped else ""
        if self._short_s is not None:
            self.reason = (f"the run takes about {self._short_s:.0f} s as it is (under {MIN_RUN_S:.0f} s): trying other "
                           "settings would cost about what they could save, so the settings are kept")
            if self.say is not None:
                self.say(f"adapt keeps {self.chosen.label()} ({self.reason})")
            self._round_batches, self._close, self._recent = sum(t.batches + WARM_BATCHES for t in timed), set(), []
            self._recheck = False  # nothing to re-check in a run this short
            return
        tried = len({t.setting for t in timed})
        self.reason = (f"tried {tried} settings in {len(timed)} trials{early} over "
                       f"{sum(t.batches for t in timed)} timed batches; fastest: {why}")
        if self._idle_wait is not None:
            bound = (f"a step waits {self._idle_wait:.0%} for data, under the {MARGIN:.0%} a change must win: "
                     + ("only fewer readers were tried (they leave the model more cores)" if self._on_cpu else
                        "no loader setting can save more than that wait, so the loader's settings are kept"))
            self.reason = bound + (f"; {self.reason}" if tried > 1 else "")
        self._round_batches = sum(t.batches + WARM_BATCHES for t in timed)
        self._close = {(setting.backend, setting.workers) for sec, setting in ranked if sec <= RECHECK_KEEP * best_s}
        self._recent = []
        if self.say is not None:
            verb = "keeps" if self.chosen == self.given else "chose"
            self.say(f"adapt {verb} {self.chosen.label()} ({self.reason})")

    # -- reading -------------------------------------------------------------------------------------

    def batches(self) -> Iterable[Any]:
        """One pass over the train loader (its epoch), read with the setting adapt has in force (off: the loader)."""
        return _AdaptedPass(self) if self.active else self.loader

    def _apply(self, setting: Setting) -> None:
        loader = self.loader
        if setting.threads is not None and setting.threads != torch.get_num_threads():
            torch.set_num_threads(setting.threads)  # off the CPU only (see the module docs); fit restores it after
        if (setting.backend, setting.workers, setting.prefetch) != (loader.backend, loader.num_workers, loader.prefetch_factor):
            loader.reconfigure(num_workers=setting.workers, backend=setting.backend, prefetch_factor=setting.prefetch)  # type: ignore[arg-type]
        self.switches += 1

    def _observe(self, seconds: float, wait_s: float, warm: bool = False) -> None:
        """One batch: its seconds from the batch before's arrival, of which ``wait_s`` waiting for it; a ``warm``
        one (just after a change or a pass's start) counts in what the trial cost, not in its rate."""
        self._seen += 1
        if self._settle > 0:  # the run's first batches: workers starting, caches cold, for every setting alike
            self._settle -= 1
            return
        trial = self._trial
        if trial is not None:
            trial.spent_s += seconds
            if not warm:
                trial.batches += 1
                trial.seconds += seconds
                trial.wait_s += wait_s
            earlier = [t.s_per_batch for t in self.trials[self._round_start:] if t is not trial and t.batches and not t.stopped]
            if earlier and trial.seconds > ABORT_FACTOR * min(earlier) * MIN_BATCHES:
                trial.stopped = True
            if trial.stopped or trial.done():
                self._trial_done()
            return
        if warm:
            return
        if not self.active or not self._recheck or self.rechecks >= MAX_RECHECKS or self._batches_total - self._seen < 8 * self._round_batches:
            return
        self._recent.append((seconds, wait_s))
        window = RECHECK_BATCHES
        if len(self._recent) >= window:
            total = sum(s for s, _ in self._recent[-window:])
            share = sum(w for _, w in self._recent[-window:]) / total if total > 0 else 0.0
            if share > max(self._baseline + RECHECK_RISE, RECHECK_FLOOR):
                self.rechecks += 1
                if self.say is not None:
                    self.say(f"adapt: the data-wait share rose to {share:.0%} (was {self._baseline:.0%}); trying the "
                             "settings again")
                self._round_start = len(self.trials)
                self._start_round()
            else:
                del self._recent[:-window]

    def record(self) -> dict[str, Any]:
        """What ``run.json`` keeps under ``"adapt"``: on or not and why, the setting given, chosen and in force
        (the chosen one, unless the run ended during a re-check), every trial."""
        return {
            "enabled": self.active,
            "reason": self.reason,
            "given": asdict(self.given) if self.given is not None else None,
            "chosen": asdict(self.chosen) if self.chosen is not None else None,
            "in_force": asdict(self._setting_now()) if self.given is not None else None,  # a re-check may be under way
            "trials": [t.as_dict() for t in self.trials],
            "rechecks": self.rechecks,
            "switches": self.switches,
        }


class _AdaptedPass:
    """One pass over the train loader that makes adapt's changes between batches, at the same position.

    It keeps the ranks in step as the loader does (:class:`~stoker.loading.KeepsStepsEqual`:
    ``equal_steps`` and ``trimmed`` are the loader's), so wrapping it agrees once.
    """

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter

    @property
    def equal_steps(self) -> bool:
        return bool(getattr(self.adapter.loader, "equal_steps", False))

    @property
    def trimmed(self) -> int:
        return int(getattr(self.adapter.loader, "trimmed", 0))

    def __len__(self) -> int:
        return len(self.adapter.loader)

    def __iter__(self) -> Iterator[Any]:
        adapter, loader = self.adapter, self.adapter.loader
        stream = iter(loader)
        since_start, arrived = 0, 0.0  # batches since the pass or the last change began; the last one's arrival
        try:
            while True:
                change, adapter._change = adapter._change, None
                if change is not None:  # between two batches: the same position under the new setting
                    position = loader.state_dict()
                    cast(Any, stream).close()
                    adapter._apply(change)
                    loader.load_state_dict(position)
                    stream = iter(loader)
                    since_start = 0
                asked = time.perf_counter()
                try:
                    batch = next(stream)
                except StopIteration:
                    return
                now = time.perf_counter()
                since_start += 1
                # From the batch before's arrival (the step and a change between); a pass's first from the asking.
                adapter._observe(now - (arrived if arrived else asked), now - asked, warm=since_start <= WARM_BATCHES)
                arrived = now
                yield batch
        finally:
            cast(Any, stream).close()  # the Loader's pass is a generator


def _readers(setting: Setting) -> int:
    """How many workers or threads read the data besides the training process (the thread backend has at least one)."""
    return max(setting.workers, 1) if setting.backend == "thread" else setting.workers


def make_adapter(run: Run) -> Adapter | None:
    """The :class:`Adapter` of ``fit``'s run (``None`` with ``Scenario.adapt`` off); it speaks through the loggers' ``note``."""
    s = run.scenario
    if not s.adapt:
        return None
    try:
        batches: int | None = len(s.train_loader) * max(s.epochs - len(run.history.epochs), 0)  # type: ignore[arg-type]
    except TypeError:
        batches = None
    notes = [note for logger in run.loggers if (note := getattr(logger, "note", None)) is not None]

    def say(line: str) -> None:
        for note in notes:
            note(line)

    return Adapter(s.train_loader, run.device, batches=batches,
                   try_threads=run.device.type != "cpu" and s.cpu_threads is None, say=say if notes else None)
