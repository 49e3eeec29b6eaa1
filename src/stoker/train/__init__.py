"""Training: the Scenario, the fit loop, loggers, checkpoints, configs and run comparison.

Example:
    >>> from stoker.train import Scenario, fit
    >>> history = fit(Scenario(model, optimizer, nn.CrossEntropyLoss(), train_loader, valid_loader,
    ...                        epochs=10, tags={"category": "shards"}))  # doctest: +SKIP
"""

from __future__ import annotations

from stoker.train.checkpoint import load_checkpoint, save_checkpoint
from stoker.train.compare import RunSummary, compare_runs, format_table
from stoker.train.config import TrainConfig, load_config
from stoker.train.history import EpochStats, History
from stoker.train.loggers import BatchProgress, ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger, read_csv
from stoker.train.loop import fit
from stoker.train.models import SmallCNN, build_model
from stoker.train.plots import plot_compare, plot_curves
from stoker.train.runner import RunResult, demo_run, train_from_config
from stoker.train.scenario import Preprocess, Scenario

__all__ = [
    "BatchProgress",
    "ConsoleLogger",
    "CsvLogger",
    "EpochStats",
    "History",
    "Logger",
    "Preprocess",
    "RunInfo",
    "RunResult",
    "RunSummary",
    "Scenario",
    "SmallCNN",
    "TensorBoardLogger",
    "TrainConfig",
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
