"""Adapt while training: search the train loader's settings on the real model and data, keep the fastest.

In the first batches of a run :func:`~stoker.train.fit` reads the train loader with
settings in turn, times each on the steps it is really running, keeps another only when
each of its trials was at least :data:`MARGIN` faster, says so in one line (rank 0), and
records every trial in ``run.json`` (``"adapt"``). A round tries, in order (:data:`STAGES`):
the reader count, searched toward less waiting (:mod:`stoker.train.engine.search`); the
start and the fastest timed again; the other backend; the prefetch depth; off the CPU,
torch's host threads. The rounds of a run share one budget of batches and time; a search
it cut short goes on after an epoch that waited for data, and a rise in the data-wait
share starts a new round. ``Scenario(adapt=False)`` / ``stoker train --no-adapt`` keeps
the settings as given.

What it changes changes no result: a change is made between two batches through the
loader's own resume position (``state_dict``, :meth:`~stoker.Loader.reconfigure`,
``load_state_dict``), only for a stoker :class:`~stoker.Loader` whose batches no worker
count changes (:func:`~stoker.loading.workers.batches_follow_workers`), so the figures,
checkpoints and weights are a ``--no-adapt`` run's, to the bit; on the CPU torch's compute
threads are left alone (their count changes how float sums round). A data set whose
samples draw random numbers needs ``adapt=False``. The search, its budget and its limits:
``docs/guides/bench-and-tune.md`` ("Adaptation inside a run").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch

from stoker.cores import usable_cores
from stoker.loading import Loader
from stoker.loading.placement import local_ranks
from stoker.loading.workers import batches_follow_workers
from stoker.train.engine.search import ReaderSearch, Reading

if TYPE_CHECKING:
    from stoker.train.engine.run import Run

__all__ = ["Adapter", "Setting", "Trial", "make_adapter"]

SETTLE_BATCHES = 8  # the run's first batches are slow whatever the setting (starting workers, cold caches): not timed
WARM_BATCHES = 2  # after a pass's start (or a change, at least) the readers fill their queue: not timed
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
MAX_RECHECKS = 2
MAX_CONTINUES = 3  # rounds in later epochs that go on with a search its round's budget cut short...
CONTINUE_FACTOR = 3  # ...when the run has this many times the last round's batches left
WAIT_SPEND = 0.25  # a round's changes may cost this share of the run times the step's data-wait share, if more
STAGES = ("readers", "again", "backend", "prefetch", "threads")  # what a round tries, in order


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

    ``spent_s`` adds the ``warm`` batches (the change itself and the new readers' start):
    what the trial cost the run. A trial ``stopped`` early (much slower than the best
    before it) cannot win.
    """

    setting: Setting
    batches: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    spent_s: float = 0.0
    warm: int = 0
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
                "wait_share": round(self.wait_share, 4), "spent_s": round(self.spent_s, 4), "warm_batches": self.warm,
                "stopped_early": self.stopped}

    def start_cost_s(self) -> float:
        """What the change and the new readers' start cost beyond the trial's own pace: its warm batches' seconds less
        as many batches at its timed rate (0 for a trial that changed nothing or timed nothing)."""
        if not self.batches or not self.warm:
            return 0.0
        return max(0.0, self.spent_s - self.seconds - self.warm * self.seconds / self.batches)


class Adapter:
    """Tries settings of a run's train loader on its first batches and keeps the fastest (see the module docs).

    Args:
        loader: the train loader.
        device: where the model trains.
        batches: training batches left in the run (``None``: unknown, then one epoch's
            worth is not known either and nothing is tried).
        try_threads: also try torch's host threads; the Adapter tries them exactly when asked,
            and ``fit`` asks only for an accelerator run without ``cpu_threads`` (:func:`make_adapter`:
            on the CPU their count changes how the model's float sums round).
        say: prints one line (rank 0's console), or ``None``.
        cores: the host's usable cores (``None``: :func:`~stoker.cores.usable_cores`); the
            search goes up to this rank's share of them.
        loader_bound_share: an epoch that waits for data longer than this share is loader-bound.

    Example:
        >>> from stoker import make_loader, open_data
        >>> data = open_data("data/digiface", valid=0.1, image_size=16, seed=0)
        >>> loader = make_loader(data["train"], batch_size=2, num_workers=0, device="cpu")
        >>> adapter = Adapter(loader, torch.device("cpu"), batches=10 * len(loader))
        >>> for images, labels in adapter.batches():  # one pass: the loader's epoch, read as adapt chooses
        ...     pass
        >>> adapter.epoch_end(0.4)  # loader-bound with the search unfinished: it goes on next epoch
        >>> adapter.record()["given"]
        {'backend': 'process', 'workers': 0, 'prefetch': 2, 'threads': None}
    """

    def __init__(self, loader: Any, device: torch.device, *, batches: int | None, try_threads: bool = False,
                 say: Callable[[str], None] | None = None, cores: int | None = None,
                 loader_bound_share: float = 0.3) -> None:
        self.loader = loader
        self.say = say
        self.try_threads = try_threads
        self.cores = max(1, (usable_cores() if cores is None else cores) // local_ranks())
        self.loader_bound_share = loader_bound_share
        self.trials: list[Trial] = []
        self.rechecks = 0
        self.continues = 0  # rounds that went on with an unfinished search in a later epoch
        self.switches = 0
        self.search: ReaderSearch | None = None
        self._unfinished = False  # the last round ended on its budget with the search not over
        self._bound_said = False  # the loader-bound finding is said once
        self._by_readers: dict[int, Setting] = {}  # reader count -> the setting that reads with it
        self._base: Setting | None = None  # the setting the reader search changes the count of (its backend)
        self._backend_first: Setting | None = None  # the start's count on threads, timed before the search moves
        self._queue: list[Setting] = []
        self._stage = 0  # index in STAGES of the stage under way
        self._stage_trials = 0  # trials of the stage under way
        self._trial: Trial | None = None
        self._change: Setting | None = None
        self._recent: list[tuple[float, float]] = []  # (seconds, wait) of the batches since the choice
        self._round_start = 0  # the first trial of the round in progress
        self._baseline = 0.0  # the chosen setting's data-wait share
        self._budget = 0  # trials of the reader search in one round (a quarter of the run's batches at most)
        self._budget_batches = 0  # batches a round may spend on trials
        self._batches_total = 0  # training batches of the run
        self._settle = SETTLE_BATCHES
        self._warm_left = 0  # batches until the readers a change started have all delivered their first batches
        self._spent_total_s = 0.0  # what every round's changes cost the run (the way back to the keeper included)
        self._allowed_total_s = float("inf")  # what they may cost over the run (set by the first round)
        self._short_s: float | None = None  # the projected seconds of a run too short to adapt
        self._idle_wait: float | None = None  # the data-wait share of a round's first trial, when under MARGIN
        self._first_wait = 0.0  # the data-wait share of the round's first trial
        self._recheck = True  # whether a rising data-wait share may start another round
        self._seen = 0  # batches read so far
        self._round_batches = 0  # batches the last round took
        self.given = self._setting_now() if isinstance(loader, Loader) else None
        self.chosen = self.given
        if self.given is not None:  # the given readers start with the run: until they all delivered, nothing is timed
            self._settle = max(SETTLE_BATCHES, warm_batches(self.given))
        self.reason = self._refusal(loader, batches)
        self.active = not self.reason
        if self.active:
            self._start_round(fresh=True)

    # -- what is tried ---------------------------------------------------------------------------------

    def _refusal(self, loader: Any, batches: int | None) -> str:
        """Why nothing is tried ("" when it is)."""
        if not isinstance(loader, Loader):
            return f"the train loader is a {type(loader).__name__}, not a stoker Loader: its settings are kept"
        if batches_follow_workers(loader.dataset):  # a stream that says `elastic = True` is tried like map-style data
            return (f"the train data ({type(loader.dataset).__name__}) is a stream split by worker: another worker "
                    "count would change which samples a batch holds, so the settings are kept")
        per_trial = WARM_BATCHES + MIN_BATCHES
        if batches is None or batches * BUDGET_SHARE < 2 * per_trial + SETTLE_BATCHES:
            return (f"the run is too short to try settings ({batches if batches is not None else 'unknown'} training "
                    f"batches; two trials take {2 * per_trial + SETTLE_BATCHES}, a quarter of the run at most): the settings are kept")
        self._budget_batches = int(batches * BUDGET_SHARE)
        self._batches_total = batches
        self._budget = max(self._budget_batches // per_trial, 2)
        return ""

    def _setting_now(self) -> Setting:
        loader = self.loader
        threads = torch.get_num_threads() if self.try_threads else None
        return Setting(str(loader.backend), int(loader.num_workers), int(loader.prefetch_factor), threads)

    def _with_readers(self, readers: int) -> Setting:
        """The setting that reads with ``readers`` workers or threads (0: in the training process), the rest as in force."""
        if readers in self._by_readers:
            return self._by_readers[readers]
        now = self._base or self._setting_now()
        return replace(now, backend="process", workers=0) if readers == 0 else replace(now, workers=readers)

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

    def _candidates(self, stage: str, best: Setting) -> list[Setting]:
        """The settings of a stage after the reader search, the one to start from first (an empty or one-long list:
        the stage has nothing to try). "again": the start and the fastest that could replace it (the load on a
        machine drifts); "backend": the other backend at the best count; "prefetch": the depth of the best;
        "threads": the host's torch threads (off the CPU)."""
        if stage == "again":  # only when one could still replace the start: else timing them again changes nothing
            start = self.trials[self._round_start].setting
            contenders = [setting for _, setting in self._contenders()[:1]]
            top = [start, *contenders] if contenders else []
            return sorted(top, key=lambda setting: setting != self._setting_now())  # the one in force first
        if stage == "prefetch" and self._idle_wait is not None:  # hardly any wait: nothing to hide
            return []
        if stage == "backend":
            other = replace(best, backend="thread" if best.backend == "process" else "process")
            timed = any(t.setting == other for t in self.trials[self._round_start:])  # before the search moved
            return [best, other] if best.workers > 0 and not timed else []
        if stage == "prefetch":
            given = self.given.prefetch if self.given is not None else best.prefetch
            depths = sorted({given, 2 * given} - {best.prefetch})
            return [best] + [replace(best, prefetch=d) for d in depths] if best.workers > 0 or best.backend == "thread" else []
        if stage == "threads" and self.try_threads and best.threads is not None:
            counts = sorted({1, max(1, self.cores // 2), self.cores} - {best.threads})
            return [best] + [replace(best, threads=t) for t in counts]
        return []

    def _start_round(self, fresh: bool) -> None:
        """Time the setting in force first (the round's yardstick), then search the reader counts: a ``fresh`` search
        (the run's first round, a re-check) or the one an earlier round left unfinished."""
        now = self._setting_now()
        if fresh or self.search is None:
            # A wait under the margin cannot win it with more readers: there the search only tries fewer.
            self.search = ReaderSearch(start=_readers(now), most=self.cores, wait_floor=MARGIN)
            self._by_readers = {}
        self._by_readers.setdefault(_readers(now), now)
        self._stage, self._stage_trials, self._idle_wait, self._unfinished = 0, 0, None, False
        self._base = self._by_readers[_readers(now)]
        # Worker processes first get the same count on threads: a cheap change (threads start at once, processes take
        # seconds where cores are few), and the one that decides which backend the search steps the count of.
        self._backend_first = replace(now, backend="thread") if fresh and now.backend == "process" and now.workers else None
        self._queue = [now]
        self._next_trial()

    def _advance(self, best: Setting) -> None:
        """The next stage that has something to try, else the round's end."""
        while self._stage + 1 < len(STAGES):
            self._stage += 1
            candidates = self._candidates(STAGES[self._stage], best)
            if len(candidates) > 1:
                self._queue, self._stage_trials = candidates, 0
                self._next_trial()
                return
        self._finish()

    def _next_trial(self) -> None:
        setting = self._queue.pop(0)
        self._trial = Trial(setting)
        self._stage_trials += 1
        self.trials.append(self._trial)
        if setting != self._setting_now():
            self._change = setting

    def _trial_done(self) -> None:
        round_trials = self.trials[self._round_start:]
        trial = round_trials[-1]
        spent = sum(t.batches + t.warm for t in round_trials)
        # The round's first trial runs the setting in force: what the run would cost as it is, changes none.
        run_s = round_trials[0].seconds / max(round_trials[0].batches, 1) * self._batches_total
        # What the round's changes cost, and what going back to the setting it would keep would cost on top.
        keeper = self._keeper()
        changes_s = sum(t.spent_s for t in round_trials[1:]) + self._start_cost_s(keeper[1] if keeper else None)
        searching = STAGES[self._stage] == "readers"
        if searching and self.search is not None and trial.batches:
            readers = _readers(trial.setting)
            self._by_readers.setdefault(readers, trial.setting)
            self.search.add(readers, trial.seconds / trial.batches, trial.wait_share)  # a stopped one: its pace so far
            if trial.setting == self._backend_first and len(round_trials) == 2:  # the start's count on threads
                self._backend_first = None
                start = round_trials[0]
                faster = trial.s_per_batch <= (1 - MARGIN) * start.s_per_batch
                won = trial if faster else start  # the search goes on from the faster backend's reading
                self.search.readings[readers] = Reading(won.seconds / max(won.batches, 1), won.wait_share)
                self._by_readers[readers] = self._base = won.setting
        if len(round_trials) == 1:
            self._first_wait = trial.wait_share
            if trial.wait_share < MARGIN:  # hardly waits: the search tries fewer readers (and the backend stage, no prefetch)
                self._idle_wait = trial.wait_share
            if run_s < MIN_RUN_S:
                self._queue, self._stage, self._short_s = [], len(STAGES) - 1, run_s
                self._finish()
                return
        # What a round's changes may cost: a share of the run, more when the step waits longer (more to win); the
        # run's rounds together (later epochs' and re-checks' too) may cost what its first round was allowed.
        allowed_s = max(TIME_SHARE, WAIT_SPEND * self._first_wait) * run_s
        if self._round_start == 0:
            self._allowed_total_s = allowed_s
        allowed_s = min(allowed_s, self._allowed_total_s - self._spent_total_s)
        proposed = self.search.next() if searching and self.search is not None else None
        backend_first = self._backend_first if searching and len(round_trials) == 1 else None
        upcoming = backend_first or (self._with_readers(proposed) if proposed is not None else None)
        # The next trial: its batches at the fastest pace timed, and its readers' start.
        best_s = min((t.s_per_batch for t in round_trials if t.batches and not t.stopped), default=0.0)
        next_s = (upcoming is not None) * (best_s * (MIN_BATCHES + WARM_BATCHES) + self._start_cost_s(upcoming))
        if spent >= self._budget_batches or changes_s + next_s >= allowed_s:  # keep the best so far
            self._unfinished = self._unfinished or (searching and self.search is not None and not self.search.done())
            self._queue, self._stage = [], len(STAGES) - 1
            self._finish()
            return
        if searching and self.search is not None:
            if backend_first is not None:
                self._queue = [backend_first]
            elif proposed is not None and self._stage_trials < self._budget:
                self._queue = [self._with_readers(proposed)]
            else:
                self._unfinished = proposed is not None
                self._queue = []
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
        self._spent_total_s += sum(t.spent_s for t in self.trials[self._round_start + 1:])
        if self._change is not None:
            self._spent_total_s += self._start_cost_s(self._change)
        waits = [t for t in timed if t.setting == self.chosen]
        self._baseline = sum(t.wait_s for t in waits) / max(sum(t.seconds for t in waits), 1e-9)
        self._round_batches = sum(t.batches + t.warm for t in timed)
        self._recent = []
        if self._short_s is not None:
            self.reason = (f"the run takes about {self._short_s:.0f} s as it is (under {MIN_RUN_S:.0f} s): trying other "
                           "settings would cost about what they could save, so the settings are kept")
            if self.say is not None:
                self.say(f"adapt keeps {self.chosen.label()} ({self.reason})")
            self._recheck = False  # nothing to re-check in a run this short
            return
        start = timed[0].setting if timed else self.chosen
        start_s = next((sec for sec, setting in ranked if setting == start), None)
        if self._idle_wait is not None:
            first = (f"the step hardly waited for data ({self._idle_wait:.0%}) with {start.label()}, so only fewer "
                     "readers and the other backend were timed (they may leave the training process more CPU)")
        else:
            first = f"the step waited {self._first_wait:.0%} for data with {start.label()}"
        counts = f"; timed {self.search.tried()} readers" if self.search is not None and len(self.search.order) > 1 else ""
        others = len({t.setting for t in timed}) - 1
        if self.chosen != start and start_s is not None:
            found = (f": {self.chosen.label()} was fastest, {best_s * 1e3:.1f} ms a step against {start_s * 1e3:.1f}, "
                     f"waiting {self._baseline:.0%}")
        elif others:
            found = f": none was {MARGIN:.0%} faster than it ({best_s * 1e3:.1f} ms a step), so it is kept"
        else:
            found = ": nothing else could be faster, so it is kept"
        stopped = sum(t.stopped for t in timed)
        early = f" ({stopped} stopped early, at twice the best's time)" if stopped else ""
        later = ("; the search is not over: it goes on in a later epoch while the run waits for data and has batches "
                 "to spare" if self._unfinished else "")
        self.reason = f"{first}{counts}{early}{found}{later}"
        if self.say is not None:
            verb = "keeps" if self.chosen == self.given else "chose"
            self.say(f"adapt {verb} {self.chosen.label()} ({self.reason})")

    def epoch_end(self, wait_share: float) -> None:
        """After an epoch that waited ``wait_share`` of its time for data: when loader-bound (or cut short by its
        budget) with the reader search not over, the search goes on from the next batch; when loader-bound at the
        end of the search, say so once, in plain words."""
        if not self.active or self._trial is not None or self._short_s is not None:
            return  # a round under way goes on by itself
        left = self._batches_total - self._seen
        searching_pays = (left >= CONTINUE_FACTOR * max(self._round_batches, WARM_BATCHES + MIN_BATCHES)
                          and self._spent_total_s < self._allowed_total_s)
        bound = wait_share > self.loader_bound_share
        if (self.search is not None and not self.search.done() and (self._unfinished or bound) and searching_pays
                and self.continues < MAX_CONTINUES):
            self.continues += 1
            if self.say is not None:
                self.say(f"adapt: the epoch waited {wait_share:.0%} for data; the search for the reader count goes on "
                         f"(timed so far: {self.search.tried()})")
            self._round_start = len(self.trials)
            self._start_round(fresh=False)
        elif bound and not self._bound_said and self.chosen is not None:
            self._bound_said = True
            if self.say is not None:
                self.say(f"adapt: with the fastest setting it found ({self.chosen.label()}) the epoch still waited "
                         f"{wait_share:.0%} for data: reading is the limit here; data packed into shards (`stoker pack`) "
                         "reads faster")

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
        self._warm_left = warm_batches(setting)

    def _start_cost_s(self, setting: Setting | None) -> float:
        """What changing to ``setting`` would cost beyond its pace (0 when it is in force): its readers times the start
        cost a reader had in this round's changes so far (the one that started the most readers)."""
        if setting is None or setting == self._setting_now():
            return 0.0
        started = [t for t in self.trials[self._round_start:] if t.warm and t.batches and _readers(t.setting) > 0]
        if not started:
            return 0.0
        per_reader = max(t.start_cost_s() / _readers(t.setting) for t in started)
        return per_reader * _readers(setting)

    def _observe(self, seconds: float, wait_s: float, warm: bool = False) -> None:
        """One batch: its seconds from the batch before's arrival, of which ``wait_s`` waiting for it; a ``warm``
        one (just after a change or a pass's start) counts in what the trial cost, not in its rate."""
        self._seen += 1
        if self._settle > 0:  # the run's first batches: workers starting, caches cold, for every setting alike
            self._settle -= 1
            return
        if self._warm_left > 0:  # the readers a change started are still starting (and taking the CPU)
            self._warm_left -= 1
            warm = True
        trial = self._trial
        if trial is not None:
            trial.spent_s += seconds
            trial.warm += warm
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
        if (not self.active or not self._recheck or self.rechecks >= MAX_RECHECKS
                or self._batches_total - self._seen < 8 * self._round_batches or self._spent_total_s >= self._allowed_total_s):
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
                self._start_round(fresh=True)  # the load changed: the earlier readings no longer hold
            else:
                del self._recent[:-window]

    def record(self) -> dict[str, Any]:
        """What ``run.json`` keeps under ``"adapt"``: on or not and why, the setting given, chosen and in force
        (the chosen one, unless the run ended during a re-check), every trial, the reader counts the search timed
        in order, and how often it re-checked and went on in a later epoch."""
        return {
            "enabled": self.active,
            "reason": self.reason,
            "given": asdict(self.given) if self.given is not None else None,
            "chosen": asdict(self.chosen) if self.chosen is not None else None,
            "in_force": asdict(self._setting_now()) if self.given is not None else None,  # a re-check may be under way
            "trials": [t.as_dict() for t in self.trials],
            "rechecks": self.rechecks,
            "continues": self.continues,
            "readers_timed": list(self.search.order) if self.search is not None else [],
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


def warm_batches(setting: Setting) -> int:
    """Batches after a change to ``setting`` until its readers have all started and delivered a queue's worth: every
    reader's ``prefetch`` batches (worker processes take long to start where cores are few, and starting they take
    the training process's CPU), ``WARM_BATCHES`` at least."""
    return max(WARM_BATCHES, _readers(setting) * setting.prefetch)


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
                   try_threads=run.device.type != "cpu" and s.cpu_threads is None, say=say if notes else None,
                   loader_bound_share=s.loader_bound_share)
