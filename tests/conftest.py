"""Fixtures for every test folder, and the test tiers (markers) given in one place.

Markers (registered in pyproject.toml), applied here so that no test file carries them:

- ``remote``: everything under ``tests/remote`` (moto's S3 server on 127.0.0.1, a local Ray);
- ``multiprocess``: tests that start processes (worker processes, ranks, torchrun, the CLI in
  a child), listed by file in ``MULTIPROCESS_FILES``, and every test using ``forked_ranks``;
- ``gpu``: tests skipped without CUDA (their skip reason names CUDA);
- ``slow``: the test files and tests listed in ``SLOW``, picked from ``--durations`` of a whole run
  (a test named with its parameters, ``test[x]``, marks that case alone).

The fast tier a contributor runs on every edit is ``python -m pytest -m "not slow"``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_TESTS = Path(__file__).resolve().parent

# Files whose tests start processes (relative to tests/).
MULTIPROCESS_FILES = frozenset({
    "bench/test_report.py",
    "bench/test_tune.py",
    "benchmarks/test_scripts.py",
    "cli/test_demo.py",
    "cli/test_hints.py",
    "loading/test_backends.py",
    "loading/test_elastic.py",
    "loading/test_equal_steps.py",
    "loading/test_loader.py",
    "loading/test_loader_threads.py",
    "loading/test_reader_cpu.py",
    "loading/test_samplers.py",
    "loading/test_state_contract.py",
    "pipes/test_pipe_loader.py",
    "pipes/test_pipe_sharding.py",
    "reliability/test_only_regular_files.py",
    "reliability/test_pack_kill.py",
    "shards/test_fast_paths.py",
    "shards/test_pack.py",
    "shards/test_pack_resize_note.py",
    "shards/test_stream.py",
    "shards/test_stream_batches.py",
    "shards/test_stream_mixing.py",
    "sources/test_synthetic.py",
    "train/test_adapt.py",
    "train/test_adapt_rounds.py",
    "train/test_cli_resume.py",
    "train/test_cli_train.py",
    "train/test_ddp.py",
    "train/test_distributed.py",
    "train/test_handover.py",
    "train/test_lost_rank.py",
    "train/test_machines.py",
    "train/test_reader_placement.py",
    "train/test_run_status.py",
    "train/test_threads.py",
    "test_decode_device.py",
})

# The slow tier, relative to tests/: a folder ("remote/") or a file marks all its tests, a node id
# ("file::test") one test. Picked with `--durations` so that `-m "not slow"` stays under 2 minutes on 2 cores.
SLOW = frozenset({
    "remote/",
    "benchmarks/test_scripts.py",
    "bench/test_bench.py",
    "bench/test_cli.py",
    "bench/test_tune.py",
    "cli/test_demo.py",
    "cli/test_progress_off_terminal.py",  # every long command run once under a pipe and once on a terminal
    "cli/test_hints.py",
    "loading/test_elastic.py::test_batches_are_the_same_for_every_worker_count_and_backend_under_two_ranks",
    "loading/test_equal_steps.py",
    "loading/test_loader.py::test_a_worker_error_comes_back_as_the_same_one_line_error",
    "loading/test_state_contract.py",
    "reliability/test_decode_crafted.py",
    "reliability/test_decode_crafted_jpeg.py",
    "reliability/test_only_regular_files.py",
    "reliability/test_pack_kill.py",
    "shards/test_cli.py",
    "shards/test_corruption.py::test_fuzzed_manifest_fields_with_a_valid_checksum_only_raise_stoker_error",
    "shards/test_fast_paths.py::test_the_row_span_keeps_the_memory_maps_alive_after_close",
    "shards/test_pack.py::test_a_killed_pack_resumes_to_the_same_bytes",
    "shards/test_pack_resize_note.py::test_the_cli_prints_the_note_once_on_stderr",
    "sources/test_progress.py::test_a_slow_index_shows_a_counter_of_the_files_found_on_stderr",
    "sources/test_synthetic.py::test_celeba_layout",
    "sources/test_synthetic.py::test_digiface_layout",
    "test_decode_device.py::test_crafted_jpegs_through_the_batched_path_decode_or_go_to_the_cpu_without_crashing",
    "test_docs_build.py::test_docs_build_strict",
    "test_docstrings.py::test_docstring_examples_run[stoker.bench.benchmark]",  # bench, run_bench, quick_bench
    "test_docstrings.py::test_docstring_examples_run[stoker.bench.tuner]",  # a tiny tune
    "test_readme.py::test_page_code_blocks_run",
    "train/test_adapt.py",
    "train/test_adapt_rounds.py",
    "train/test_cli_resume.py",
    "train/test_cli_train.py",
    "train/test_ddp.py",
    "train/test_distributed.py",
    "train/test_fit.py",
    "train/test_fit_golden.py",
    "train/test_handover.py",
    "train/test_lost_rank.py::test_after_kill_9_of_a_rank_the_other_ends_with_one_stoker_line",
    "train/test_lost_rank.py::test_under_torchrun_the_survivor_says_one_stoker_line_too",
    "train/test_machines.py",
    "train/test_reader_placement.py",
    "train/test_rank_steps.py",
    "train/test_resume_mid_epoch.py",
    "train/test_run_status.py",
    "train/test_threads.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every collected test with its tiers (see the module docstring)."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if not path.is_relative_to(_TESTS):
            continue
        relative = path.relative_to(_TESTS).as_posix()
        node = f"{relative}::{item.name.split('[')[0]}"
        if relative.startswith("remote/"):
            item.add_marker(pytest.mark.remote)
        if relative in MULTIPROCESS_FILES or "forked_ranks" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multiprocess)
        if any("CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)
        if (relative in SLOW or node in SLOW or f"{relative}::{item.name}" in SLOW
                or any(relative.startswith(f) for f in SLOW if f.endswith("/"))):
            item.add_marker(pytest.mark.slow)


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
