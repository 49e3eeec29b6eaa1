"""Training: the Scenario, the fit loop, loggers, checkpoints, configs and run comparison."""

from __future__ import annotations

from stoker.train.checkpoint import load_checkpoint, save_checkpoint
from stoker.train.fit import fit
from stoker.train.history import EpochStats, History
from stoker.train.loggers import ConsoleLogger, CsvLogger, Logger, RunInfo, TensorBoardLogger, read_csv
from stoker.train.models import SmallCNN, build_model
from stoker.train.plots import plot_compare, plot_curves
from stoker.train.scenario import Preprocess, Scenario

__all__ = [
    "ConsoleLogger",
    "CsvLogger",
    "EpochStats",
    "History",
    "Logger",
    "Preprocess",
    "RunInfo",
    "Scenario",
    "SmallCNN",
    "TensorBoardLogger",
    "build_model",
    "fit",
    "load_checkpoint",
    "plot_compare",
    "plot_curves",
    "read_csv",
    "save_checkpoint",
]
