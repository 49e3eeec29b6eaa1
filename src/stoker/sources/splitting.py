"""One seeded, class-stratified train/validation split, for every kind of data set."""

from __future__ import annotations

import numpy as np

from stoker.errors import ConfigError

__all__ = ["stratified_split"]


def stratified_split(labels: np.ndarray, valid: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a train and a validation side: each class gives ``valid`` of its samples.

    The same labels, share and seed always give the same rows, whatever reads them (a
    file data set, a shard set), so a split is reproducible across readers.

    Args:
        labels: every sample's label, in order.
        valid: share of each class held out (``0 < valid < 1``), rounded per class.
        seed: the seed of the draw.

    Returns:
        ``(train_rows, valid_rows)``, each sorted, together every row once.

    Raises:
        ConfigError: ``valid`` is not a share, or it leaves one side empty.

    Example:
        >>> train, valid = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1]), valid=0.25, seed=0)
        >>> len(train), len(valid)
        (6, 2)
    """
    if isinstance(valid, bool) or not isinstance(valid, (int, float)) or not 0.0 < valid < 1.0:
        raise ConfigError(f"valid must be a share between 0 and 1 (e.g. 0.1), got {valid!r}")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    is_valid = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        rows = rows[rng.permutation(len(rows))]
        is_valid[rows[: int(round(len(rows) * valid))]] = True
    if is_valid.all() or not is_valid.any():
        raise ConfigError(f"valid={valid} leaves one side of the split empty for {len(labels)} samples; change the share")
    return np.flatnonzero(~is_valid), np.flatnonzero(is_valid)
