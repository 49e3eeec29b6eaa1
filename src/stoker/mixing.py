"""How well a loading method mixes the classes: the label stream, scored against chance.

Shards cut from ordered data, or a streaming shuffle buffer that is too small, give a
training step batches drawn from few classes, and convergence suffers. Three measures of
the label stream (the labels in the order the training loop sees them) show it: **label
autocorrelation** at lags ``1..max_lag``, the **batch histogram distance** from the data
set's class distribution, and **classes per batch** next to that of random permutations.
The first two are set between a random permutation of the same labels (the best) and the
class-sorted stream (the worst): a **score** from 1 (mixed as well as a random
permutation) to 0 (no better than sorted), the same for any class count and batch size.
The design notes (``docs/design.md``, "Shuffle quality") define each measure.

Example:
    >>> import numpy as np
    >>> labels = np.repeat(np.arange(10), 100)            # class-sorted
    >>> shuffle_quality(labels, batch_size=32).verdict
    'poor'
    >>> shuffle_quality(np.random.default_rng(0).permutation(labels), batch_size=32).verdict
    'good'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stoker.errors import ConfigError
from stoker.order import buffer_shuffle_array, epoch_rng

__all__ = [
    "GOOD_SCORE",
    "POOR_SCORE",
    "ShuffleQuality",
    "classes_per_batch",
    "shuffle_quality",
    "simulate_buffer_shuffle",
    "suggest_buffer_size",
]

GOOD_SCORE = 0.9  # at or above: as good as random for training purposes
POOR_SCORE = 0.6  # below: batches are visibly dominated by few classes
_RANDOM_TRIALS = 8  # random permutations averaged for the baseline (and its spread)
_MANY = 200_000  # longer streams are steady: fewer permutations suffice


@dataclass(frozen=True)
class ShuffleQuality:
    """How well a label stream is mixed, next to a random permutation of the same labels.

    Attributes:
        samples: labels in the stream.
        batch_size: the batch size the histograms are taken over.
        num_classes: classes counted (labels are ``0..num_classes-1``).
        autocorr: label autocorrelation at lags ``1..len(autocorr)`` (0 = random, 1 = sorted).
        autocorr_random: its mean for random permutations (about 0).
        hist_distance: mean total-variation distance of batch class histograms from the
            data set's class distribution (0..1).
        hist_distance_random: the same for random permutations.
        hist_distance_sorted: the same for the class-sorted stream.
        score: 1 = mixed as well as a random permutation, 0 = no better than class-sorted.
        verdict: ``"good"`` (score >= 0.9, or within the spread of random permutations
            for a short stream), ``"fair"`` (>= 0.6) or ``"poor"``.
        classes_per_batch: mean distinct labels per full batch (:func:`classes_per_batch`).
        classes_per_batch_random: the same for random permutations.
    """

    samples: int
    batch_size: int
    num_classes: int
    autocorr: tuple[float, ...]
    autocorr_random: float
    hist_distance: float
    hist_distance_random: float
    hist_distance_sorted: float
    score: float
    verdict: str
    classes_per_batch: float = 0.0
    classes_per_batch_random: float = 0.0

    @property
    def autocorr_mean(self) -> float:
        """Mean label autocorrelation over the lags measured."""
        return float(np.mean(self.autocorr)) if self.autocorr else 0.0

    @property
    def ok(self) -> bool:
        """True when the stream is mixed well enough (verdict ``"good"``)."""
        return self.verdict == "good"

    def summary(self) -> str:
        """One line for a report, e.g. ``score 0.98 (good): autocorr 0.00, batch TV 0.42 vs 0.41 random``."""
        return (
            f"score {self.score:.2f} ({self.verdict}): {self.classes_per_batch:.1f} classes per batch "
            f"(random {self.classes_per_batch_random:.1f}), label autocorrelation {self.autocorr_mean:.2f} "
            f"(random {self.autocorr_random:.2f}), batch histogram distance {self.hist_distance:.2f} "
            f"(random {self.hist_distance_random:.2f}, sorted {self.hist_distance_sorted:.2f})"
        )

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict of every field, plus ``autocorr_mean``."""
        out = asdict(self)
        out["autocorr"] = list(self.autocorr)
        out["autocorr_mean"] = self.autocorr_mean
        return out


def _as_labels(labels: np.ndarray, num_classes: int | None) -> tuple[np.ndarray, int]:
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ConfigError(f"shuffle_quality: labels must be a 1-D array, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(f"shuffle_quality: labels must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.size and array.min() < 0:
        raise ConfigError("shuffle_quality: labels must be >= 0")
    seen = int(array.max()) + 1 if array.size else 0
    if num_classes is None:
        num_classes = seen
    elif num_classes < seen:
        raise ConfigError(f"shuffle_quality: a label is {seen - 1} but num_classes is {num_classes}; pass the data set's class count")
    return array, max(int(num_classes), 1)


def _autocorr(labels: np.ndarray, lags: range, q: float) -> np.ndarray:
    """Excess same-label probability at each lag (0 = random permutation)."""
    out = np.zeros(len(lags))
    if q >= 1.0:  # one class: every order is the same
        return out
    for i, k in enumerate(lags):
        if k < len(labels):
            same = float(np.mean(labels[k:] == labels[:-k]))
            out[i] = (same - q) / (1.0 - q)
    return out


def _hist_distance(labels: np.ndarray, batch_size: int, p: np.ndarray) -> float:
    """Mean total-variation distance of each full batch's class histogram from ``p``.

    Works on the (batch, class) pairs present, so it costs O(n log n) whatever the
    number of classes: TV = 1/2 (sum over present |h/B - p| + sum over absent p).
    """
    batches = max(len(labels) // batch_size, 1)
    size = min(batch_size, len(labels))
    used = labels[: batches * size]
    batch_of = np.repeat(np.arange(batches), size)
    num_classes = len(p)
    pairs, counts = np.unique(batch_of * num_classes + used, return_counts=True)
    pair_batch, pair_class = np.divmod(pairs, num_classes)
    p_present = p[pair_class]
    terms = np.abs(counts / size - p_present) - p_present
    per_batch = 0.5 * (1.0 + np.bincount(pair_batch, weights=terms, minlength=batches))
    return float(per_batch.mean())


def classes_per_batch(labels: np.ndarray, batch_size: int) -> float:
    """Mean number of distinct labels in each full batch of ``batch_size`` (the whole stream if shorter).

    Example:
        >>> classes_per_batch(np.repeat(np.arange(4), 8), batch_size=8), classes_per_batch(np.tile(np.arange(4), 8), 8)
        (1.0, 4.0)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"classes_per_batch: batch_size must be a positive integer, got {batch_size!r}")
    stream = np.asarray(labels, dtype=np.int64)
    if len(stream) == 0:
        return 0.0
    size = min(int(batch_size), len(stream))
    batches = len(stream) // size
    grid = np.sort(stream[: batches * size].reshape(batches, size), axis=1)
    return float(((grid[:, 1:] != grid[:, :-1]).sum(axis=1) + 1).mean())


def _normalised(value: float, best: float, worst: float) -> float:
    """1 at ``best``, 0 at ``worst``, clipped; 1 when the two cannot be told apart."""
    if worst - best <= 1e-9:
        return 1.0
    return float(np.clip((worst - value) / (worst - best), 0.0, 1.0))


def shuffle_quality(
    labels: np.ndarray,
    batch_size: int,
    num_classes: int | None = None,
    seed: int = 0,
    max_lag: int = 8,
) -> ShuffleQuality:
    """Score how well ``labels`` (in the order a loader yields them) are mixed.

    Args:
        labels: integer labels, in stream order.
        batch_size: the training batch size; histograms are taken per batch.
        num_classes: the data set's class count (default: largest label + 1).
        seed: seed of the random permutations the stream is compared with.
        max_lag: autocorrelation lags ``1..max_lag`` are measured.

    Returns:
        A :class:`ShuffleQuality`; ``.score`` is 1 for random-like and 0 for sorted-like.

    Raises:
        ConfigError: labels not a 1-D integer array, ``batch_size`` or ``max_lag`` below 1.

    Example:
        >>> import numpy as np
        >>> q = shuffle_quality(np.repeat(np.arange(4), 50), batch_size=16, num_classes=4)
        >>> q.score < 0.1, q.verdict
        (True, 'poor')
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"shuffle_quality: batch_size must be a positive integer, got {batch_size!r}")
    if max_lag < 1:
        raise ConfigError(f"shuffle_quality: max_lag must be >= 1, got {max_lag}")
    stream, num_classes = _as_labels(labels, num_classes)
    n = len(stream)
    if n < 2:
        seen = float(n > 0)
        return ShuffleQuality(n, int(batch_size), num_classes, (), 0.0, 0.0, 0.0, 0.0, 1.0, "good", seen, seen)
    counts = np.bincount(stream, minlength=num_classes).astype(np.float64)
    p = counts / n
    q = float((counts * (counts - 1)).sum() / (n * (n - 1)))  # same label, drawn without replacement
    lags = range(1, int(max_lag) + 1)

    rng = np.random.default_rng(seed)
    randoms = [rng.permutation(stream) for _ in range(_RANDOM_TRIALS if n <= _MANY else 3)]
    ordered = np.sort(stream, kind="stable")

    autocorr = _autocorr(stream, lags, q)
    random_autocorrs = [float(_autocorr(r, lags, q).mean()) for r in randoms]
    autocorr_random = float(np.mean(random_autocorrs))
    autocorr_sorted = float(_autocorr(ordered, lags, q).mean())
    hist = _hist_distance(stream, int(batch_size), p)
    random_hists = [_hist_distance(r, int(batch_size), p) for r in randoms]
    hist_random = float(np.mean(random_hists))
    hist_sorted = _hist_distance(ordered, int(batch_size), p)

    def score_of(a: float, h: float) -> float:
        return min(_normalised(a, autocorr_random, autocorr_sorted), _normalised(h, hist_random, hist_sorted))

    score = score_of(float(autocorr.mean()), hist)
    # A short stream is noisy: a random permutation itself can score below 0.9. Count
    # as good whatever scores within three standard deviations of random permutations.
    shortfalls = [1.0 - score_of(a, h) for a, h in zip(random_autocorrs, random_hists, strict=True)]
    noise = float(np.sqrt(np.mean(np.square(shortfalls))))  # one-sided: scores are clipped at 1
    good_from = min(GOOD_SCORE, 1.0 - 3.0 * noise)
    verdict = "good" if score >= good_from else "fair" if score >= POOR_SCORE else "poor"
    return ShuffleQuality(
        samples=n,
        batch_size=int(batch_size),
        num_classes=num_classes,
        autocorr=tuple(float(a) for a in autocorr),
        autocorr_random=autocorr_random,
        hist_distance=hist,
        hist_distance_random=hist_random,
        hist_distance_sorted=hist_sorted,
        score=score,
        verdict=verdict,
        classes_per_batch=classes_per_batch(stream, int(batch_size)),
        classes_per_batch_random=float(np.mean([classes_per_batch(r, int(batch_size)) for r in randoms])),
    )


def simulate_buffer_shuffle(labels: np.ndarray, buffer_size: int, seed: int = 0) -> np.ndarray:
    """The label stream a shuffle buffer of ``buffer_size`` makes of ``labels`` (labels only, no images).

    Uses the buffer shuffle of every stoker reader (:func:`stoker.order.buffer_shuffle_array`, the order of
    :func:`~stoker.order.buffer_shuffle_stream`),
    drawn as ``Pipe.shuffle(buffer_size, seed=seed)`` draws in epoch 0, so
    ``shuffle_quality`` of the result tells, before any image is read, whether a buffer
    is large enough for a source order.

    Example:
        >>> import numpy as np
        >>> sorted_labels = np.repeat(np.arange(20), 50)
        >>> small = shuffle_quality(simulate_buffer_shuffle(sorted_labels, 16), batch_size=32)
        >>> large = shuffle_quality(simulate_buffer_shuffle(sorted_labels, 1000), batch_size=32)
        >>> small.verdict, large.verdict
        ('poor', 'good')
    """

    if isinstance(buffer_size, bool) or not isinstance(buffer_size, (int, np.integer)) or buffer_size < 1:
        raise ConfigError(f"simulate_buffer_shuffle: buffer_size must be a positive integer, got {buffer_size!r}")
    stream = np.asarray(labels, dtype=np.int64)
    return buffer_shuffle_array(stream, int(buffer_size), epoch_rng(seed, 0))


def suggest_buffer_size(
    source_labels: np.ndarray, batch_size: int, num_classes: int | None = None, seed: int = 0, max_samples: int = 200_000
) -> int:
    """The smallest shuffle buffer (a power of two, at most the stream) that mixes ``source_labels`` well.

    Simulates :func:`simulate_buffer_shuffle` with doubling buffers on the labels in the
    order the source lists them (the first ``max_samples`` of them, to stay quick).

    Example:
        >>> import numpy as np
        >>> suggest_buffer_size(np.repeat(np.arange(20), 50), batch_size=32)
        1024
    """
    stream = np.asarray(source_labels, dtype=np.int64)[:max_samples]
    buffer = max(int(batch_size), 16)
    while buffer < len(stream):
        mixed = simulate_buffer_shuffle(stream, buffer, seed)
        if shuffle_quality(mixed, batch_size, num_classes, seed).score >= GOOD_SCORE:
            return buffer
        buffer *= 2
    return 1 << max(len(stream) - 1, 1).bit_length()
