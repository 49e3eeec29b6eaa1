"""Training: the Scenario, the fit loop, loggers, checkpoints, configs and run comparison.

Example:
    >>> from stoker.train import load_config, train_from_config
    >>> config = load_config(None, ["data.path=data/digiface", "data.image_size=16", "data.workers=0",
    ...                             "run.epochs=1", "run.progress=false", "run.adapt=false", "run.name=first"])
    >>> train_from_config(config, echo=None).history.best_epoch  # the console logger reports each epoch
    run first in runs/first ...
    ...
    1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker._lazy import lazy_names

if TYPE_CHECKING:
    from stoker.train.engine.checkpoint import load_checkpoint, save_checkpoint
    from stoker.train.engine.history import EpochStats, History
    from stoker.train.engine.loop import fit
    from stoker.train.engine.plots import plot_compare, plot_curves
    from stoker.train.engine.scenario import Preprocess, Scenario
    from stoker.train.engine.threads import ComputeThreads
    from stoker.train.loggers import (
        BatchProgress,
        ConsoleLogger,
        CsvLogger,
        Logger,
        RunInfo,
        TensorBoardLogger,
        read_csv,
    )
    from stoker.train.runner.compare import RunSummary, compare_runs, format_table
    from stoker.train.runner.config import TrainConfig, load_config
    from stoker.train.runner.from_config import TrainingResult, demo_run, train_from_config
    from stoker.train.runner.models import SmallCNN, build_model

__all__ = [
    "BatchProgress",
    "ComputeThreads",
    "ConsoleLogger",
    "CsvLogger",
    "EpochStats",
    "History",
    "Logger",
    "Preprocess",
    "RunInfo",
    "RunSummary",
    "Scenario",
    "SmallCNN",
    "TensorBoardLogger",
    "TrainConfig",
    "TrainingResult",
    "build_model",
    "compare_runs",
    "demo_run",
    "fit",
    "format_table",
    "load_checkpoint",
    "load_config",
    "plot_compare",
    "plot_curves",
    "read_csv",
    "save_checkpoint",
    "train_from_config",
]

# Public name -> the module it lives in (imported on first use, so that the torch-free
# parts, such as the config keys stoker train's flags are made from, import without torch).
_HOMES: dict[str, str] = {
    "BatchProgress": "stoker.train.loggers",
    "ComputeThreads": "stoker.train.engine.threads",
    "ConsoleLogger": "stoker.train.loggers",
    "CsvLogger": "stoker.train.loggers",
    "EpochStats": "stoker.train.engine.history",
    "History": "stoker.train.engine.history",
    "Logger": "stoker.train.loggers",
    "Preprocess": "stoker.train.engine.scenario",
    "RunInfo": "stoker.train.loggers",
    "RunSummary": "stoker.train.runner.compare",
    "Scenario": "stoker.train.engine.scenario",
    "SmallCNN": "stoker.train.runner.models",
    "TensorBoardLogger": "stoker.train.loggers",
    "TrainConfig": "stoker.train.runner.config",
    "TrainingResult": "stoker.train.runner.from_config",
    "build_model": "stoker.train.runner.models",
    "compare_runs": "stoker.train.runner.compare",
    "demo_run": "stoker.train.runner.from_config",
    "fit": "stoker.train.engine.loop",
    "format_table": "stoker.train.runner.compare",
    "load_checkpoint": "stoker.train.engine.checkpoint",
    "load_config": "stoker.train.runner.config",
    "plot_compare": "stoker.train.engine.plots",
    "plot_curves": "stoker.train.engine.plots",
    "read_csv": "stoker.train.loggers",
    "save_checkpoint": "stoker.train.engine.checkpoint",
    "train_from_config": "stoker.train.runner.from_config",
}

# Old public names, still importable with a DeprecationWarning.
_RENAMED = {"RunResult": "TrainingResult"}

__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__, renamed=_RENAMED)
