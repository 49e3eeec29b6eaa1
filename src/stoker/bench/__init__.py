"""Measure loading on this machine: ``bench`` compares methods, ``tune`` picks settings.

* :func:`bench` times every loading method (files, a streaming Pipe, encoded shards,
  pixel shards) x workers x backend on the same data, checks every epoch, and measures
  the machine's limits in the same run; :func:`render_markdown` and
  :func:`save_report` show the result.
* :func:`tune` searches workers, backend, prefetch depth and storage within a time
  budget and returns :class:`LoaderSettings`, which :func:`save_settings` writes for
  ``stoker train --loader-config``.
* :func:`shuffle_quality` scores how well a label stream is mixed.

Example:
    >>> from stoker.bench import bench, render_markdown
    >>> print(render_markdown(bench("digiface/", workers=[0, 2], max_seconds=20)))  # doctest: +SKIP
"""

from __future__ import annotations

from stoker.bench.benchmark import BenchResult, bench, quick_bench
from stoker.bench.limits import Limits, measure_limits
from stoker.bench.methods import BenchData, Method
from stoker.bench.report import render_markdown, save_report
from stoker.bench.runner import RunResult
from stoker.bench.settings import LoaderSettings, load_settings, save_settings
from stoker.bench.tuner import Trial, TuneResult, search_settings, tune
from stoker.mixing import ShuffleQuality, shuffle_quality, simulate_buffer_shuffle, suggest_buffer_size

__all__ = [
    "BenchData",
    "BenchResult",
    "Limits",
    "LoaderSettings",
    "Method",
    "RunResult",
    "ShuffleQuality",
    "Trial",
    "TuneResult",
    "bench",
    "load_settings",
    "measure_limits",
    "quick_bench",
    "render_markdown",
    "save_report",
    "save_settings",
    "search_settings",
    "shuffle_quality",
    "simulate_buffer_shuffle",
    "suggest_buffer_size",
    "tune",
]
