"""Fixtures for every test folder."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest


def _run_forked_ranks(target: Callable[..., None], *args: Any, world_size: int = 2, timeout_s: float = 120) -> None:
    """Run ``target(rank, *args)`` in ``world_size`` forked processes; fail on a timeout or a non-zero exit."""
    context = multiprocessing.get_context("fork")  # no re-import of torch: a few seconds, not tens
    ranks = [context.Process(target=target, args=(rank, *args)) for rank in range(world_size)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=timeout_s)
        if process.is_alive():
            process.kill()
            pytest.fail(f"a rank did not finish in {timeout_s:.0f} s")
        assert process.exitcode == 0


@pytest.fixture
def forked_ranks() -> Callable[..., None]:
    """``forked_ranks(target, *args)``: real ranks (e.g. a gloo group over a FileStore) without torchrun."""
    return _run_forked_ranks
