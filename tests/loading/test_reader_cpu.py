"""Readers leave the training thread its CPU: the placement is applied in real workers, and never starves them."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest
from torch.utils.data import Dataset

from stoker.cores import CORES_ENV
from stoker.loading import make_loader, reader_cpu
from stoker.loading.reader_cpu import AFFINITY_MIN_CORES, READER_NICE, ReaderPlacement, plan_readers

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reader placement is applied on Linux only"),
]


class WhereAmI(Dataset):
    """Each sample is where its reader runs: (niceness of the reading thread, its CPUs, whether it is the main thread)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[int, tuple[int, ...], bool]:
        me = threading.get_native_id()
        return (os.getpriority(os.PRIO_PROCESS, me), tuple(sorted(os.sched_getaffinity(me))),
                threading.current_thread() is threading.main_thread() and os.getpid() == MAIN_PID)


MAIN_PID = os.getpid()


def _as_list(samples: list[Any]) -> list[Any]:
    return samples


def _where(**kwargs: Any) -> set[tuple[int, tuple[int, ...], bool]]:
    loader = make_loader(WhereAmI(), batch_size=1, shuffle=False, device=None, collate_fn=_as_list,
                         persistent_workers=False, **kwargs)
    try:
        return {sample for batch in loader for sample in batch}
    finally:
        loader.close()


def _cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def _niced(extra: int) -> int:
    return min(19, os.getpriority(os.PRIO_PROCESS, 0) + extra)


def test_worker_processes_run_niced_and_off_the_training_core(monkeypatch: pytest.MonkeyPatch) -> None:
    if len(_cpus()) < 2 or len(_cpus()) < (os.cpu_count() or 0):
        pytest.skip("needs 2 CPUs or more, and a process whose CPU affinity is the whole machine")
    monkeypatch.setenv(CORES_ENV, str(AFFINITY_MIN_CORES))  # counted as a machine with cores to spare
    seen = _where(num_workers=2, place_readers=True)
    assert seen == {(_niced(READER_NICE), _cpus()[1:], False)}  # both workers: lower priority, the first CPU left
    assert os.getpriority(os.PRIO_PROCESS, 0) == _niced(0) and len(_cpus()) >= 2  # the training process untouched


@pytest.mark.parametrize("cores", ["1", "2", "3"])
def test_on_few_cores_workers_keep_every_cpu(monkeypatch: pytest.MonkeyPatch, cores: str) -> None:
    monkeypatch.setenv(CORES_ENV, cores)
    assert _where(num_workers=2, place_readers=True) == {(_niced(READER_NICE), _cpus(), False)}


def test_turned_off_workers_run_as_the_process_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    assert make_loader(WhereAmI(), num_workers=2, device=None, place_readers=False).placement.record()["nice"] == 0
    assert _where(num_workers=2, place_readers=False) == {(_niced(0), _cpus(), False)}


def test_by_default_only_a_run_on_an_accelerator_places_its_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    on_the_cpu = make_loader(WhereAmI(), num_workers=2, device="cpu").placement
    assert (on_the_cpu.nice, on_the_cpu.cpus) == (0, None) and "trains on the CPU" in on_the_cpu.reason
    assert _where(num_workers=2) == {(_niced(0), _cpus(), False)}  # device=None off CUDA: the CPU
    assert plan_readers(accelerator=True).nice == READER_NICE
    assert plan_readers(True, accelerator=False).nice == READER_NICE


def test_loader_threads_keep_their_priority_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    by_default = _where(num_workers=2, backend="thread", place_readers=True)
    assert {(nice, cpus) for nice, cpus, _ in by_default} == {(_niced(0), _cpus())}
    assert not any(main for _, _, main in by_default)  # read on the loader's threads, not the training thread
    asked = _where(num_workers=2, backend="thread", place_readers=ReaderPlacement(threads_nice=3))
    assert {(nice, cpus) for nice, cpus, _ in asked} == {(_niced(3), _cpus())}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == _niced(0)  # this thread untouched


def test_the_plan_follows_the_core_count_and_never_leaves_a_worker_no_cpu() -> None:
    for cpus in range(1, 33):
        machine = set(range(cpus))
        for count in range(1, 40):
            for ranks in (1, 2, 4, 8):
                plan = plan_readers(cores=count, ranks=ranks, affinity=machine, cpu_count=cpus)
                assert plan.nice == READER_NICE
                if count < AFFINITY_MIN_CORES:
                    assert plan.cpus is None, (cpus, count, ranks)
                if plan.cpus is not None:  # a non-empty part of the affinity, the first CPUs left to training
                    assert plan.cpus and set(plan.cpus) < machine and 0 not in plan.cpus, (cpus, count, ranks)
    plan = plan_readers(cores=16, ranks=1, affinity=set(range(16)), cpu_count=16)
    assert plan.cpus == tuple(range(2, 16))  # 16 cores of a rank: the training process keeps two
    # two ranks of 8 cores each keep two, as the worker count rule counts them: 4 CPUs for training, 12 for readers
    assert plan_readers(cores=16, ranks=2, affinity=set(range(16)), cpu_count=16).cpus == tuple(range(4, 16))
    assert plan_readers(cores=6, ranks=1, affinity=set(range(6)), cpu_count=6).cpus == tuple(range(1, 6))


def test_an_affinity_the_user_set_is_left_alone() -> None:
    plan = plan_readers(cores=8, ranks=1, affinity={2, 3, 4, 5, 6, 7, 8, 9}, cpu_count=16)
    assert plan.cpus is None and plan.nice == READER_NICE and "affinity was set" in plan.reason


def test_off_linux_nothing_is_planned_or_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_cpu, "_linux", lambda: False)
    plan = plan_readers(cores=16, ranks=1, affinity=set(range(16)), cpu_count=16)
    assert (plan.nice, plan.cpus, plan.threads_nice) == (0, None, 0) and "not Linux" in plan.reason
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    done = threading.Thread(target=ReaderPlacement(threads_nice=5).apply, kwargs={"thread": True})
    done.start()
    done.join(10)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_the_placement_survives_a_reconfigure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "2")
    loader = make_loader(WhereAmI(), batch_size=1, shuffle=False, device=None, collate_fn=_as_list, num_workers=0,
                         place_readers=True)
    loader.reconfigure(num_workers=2)
    try:
        assert {s for batch in loader for s in batch} == {(_niced(READER_NICE), _cpus(), False)}
    finally:
        loader.close()


class Threads(Dataset):
    """Each sample is the torch intra-op thread count of the process reading it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        import torch

        return torch.get_num_threads()


def test_worker_processes_compute_on_one_torch_thread() -> None:
    # torch's worker loop sets it; the placement relies on it (a reader's operators must not spread over the cores).
    loader = make_loader(Threads(), batch_size=1, shuffle=False, device=None, collate_fn=_as_list, num_workers=2,
                         persistent_workers=False, place_readers=True)
    try:
        assert {n for batch in loader for n in batch} == {1}
    finally:
        loader.close()
