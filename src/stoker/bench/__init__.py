"""Measure loading on this machine: ``bench`` compares methods, ``tune`` picks settings.

* :func:`bench` times every loading method (files, a streaming Pipe, encoded shards,
  pixel shards) x workers x backend on the same data, checks every epoch, and measures
  the machine's limits in the same run; :func:`render_markdown` and
  :func:`save_report` show the result. A :class:`BenchPlan` holds what to run
  (:func:`run_bench` runs it), and :func:`register_method` adds a loading method that
  every part of stoker then offers by name.
* :func:`tune` searches workers, backend, prefetch depth and storage within a time
  budget and returns :class:`LoaderSettings`, which :func:`save_settings` writes for
  ``stoker train --loader-config``.
* :func:`shuffle_quality` scores how well a label stream is mixed.

The names are imported on first use (PEP 562), so ``stoker --help`` can read the
method names of :mod:`stoker.bench.methods` without importing torch.

Example:
    >>> from stoker.bench import bench, render_markdown
    >>> print(render_markdown(bench("data/digiface", methods=["files"], workers=[0], batch_size=8, max_seconds=2, progress=False)))
    **digiface** — 40 images, 4 classes, batch 8, mode load, at most 2 s per run
    ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker._lazy import lazy_names

if TYPE_CHECKING:
    from stoker.bench.benchmark import bench, quick_bench, run_bench
    from stoker.bench.limits import Limits, measure_limits
    from stoker.bench.methods import METHODS, BenchData, Method, register_method
    from stoker.bench.plan import BenchPlan
    from stoker.bench.report import recommendation, render_markdown, save_report
    from stoker.bench.results import BenchResult
    from stoker.bench.runner import MethodResult
    from stoker.bench.settings import LoaderSettings, load_settings, save_settings
    from stoker.bench.tuner import Trial, TuneResult, search_settings, tune
    from stoker.mixing import ShuffleQuality, shuffle_quality, simulate_buffer_shuffle, suggest_buffer_size

__all__ = [
    "BenchData",
    "BenchPlan",
    "BenchResult",
    "Limits",
    "LoaderSettings",
    "METHODS",
    "Method",
    "MethodResult",
    "ShuffleQuality",
    "Trial",
    "TuneResult",
    "bench",
    "load_settings",
    "measure_limits",
    "quick_bench",
    "recommendation",
    "register_method",
    "render_markdown",
    "run_bench",
    "save_report",
    "save_settings",
    "search_settings",
    "shuffle_quality",
    "simulate_buffer_shuffle",
    "suggest_buffer_size",
    "tune",
]

# Public name -> the module it lives in (imported on first use).
_HOMES: dict[str, str] = {
    "METHODS": "stoker.bench.methods",
    "BenchData": "stoker.bench.methods",
    "BenchPlan": "stoker.bench.plan",
    "BenchResult": "stoker.bench.results",
    "Limits": "stoker.bench.limits",
    "LoaderSettings": "stoker.bench.settings",
    "Method": "stoker.bench.methods",
    "MethodResult": "stoker.bench.runner",
    "ShuffleQuality": "stoker.mixing",
    "Trial": "stoker.bench.tuner",
    "TuneResult": "stoker.bench.tuner",
    "bench": "stoker.bench.benchmark",
    "load_settings": "stoker.bench.settings",
    "measure_limits": "stoker.bench.limits",
    "quick_bench": "stoker.bench.benchmark",
    "recommendation": "stoker.bench.report",
    "register_method": "stoker.bench.methods",
    "render_markdown": "stoker.bench.report",
    "run_bench": "stoker.bench.benchmark",
    "save_report": "stoker.bench.report",
    "save_settings": "stoker.bench.settings",
    "search_settings": "stoker.bench.tuner",
    "shuffle_quality": "stoker.mixing",
    "simulate_buffer_shuffle": "stoker.mixing",
    "suggest_buffer_size": "stoker.mixing",
    "tune": "stoker.bench.tuner",
}

# Old public names, still importable with a DeprecationWarning.
_RENAMED = {"RunResult": "MethodResult"}

__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__, renamed=_RENAMED)
