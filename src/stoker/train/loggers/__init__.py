"""Loggers: one small interface, with console, TensorBoard and CSV built in."""

from __future__ import annotations

from stoker.train.loggers.base import BatchProgress, Logger, RunInfo
from stoker.train.loggers.console import ConsoleLogger
from stoker.train.loggers.csv import CSV_COLUMNS, CsvLogger, read_csv
from stoker.train.loggers.tensorboard import TensorBoardLogger

__all__ = [
    "BatchProgress",
    "CSV_COLUMNS",
    "ConsoleLogger",
    "CsvLogger",
    "Logger",
    "RunInfo",
    "TensorBoardLogger",
    "read_csv",
]
