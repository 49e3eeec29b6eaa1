"""The fluent stages: map, filter, batch, concat, shuffle, compose; length, pickling, epochs."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import torch

from stoker.errors import ConfigError
from stoker.pipes import Pipe


def double(x: int) -> int:
    return 2 * x


def is_even(x: int) -> bool:
    return x % 2 == 0


def test_map_and_filter() -> None:
    pipe = Pipe.from_iterable(range(6)).filter(is_even).map(double)
    assert list(pipe) == [0, 4, 8]


def test_methods_return_new_pipes_and_leave_the_old_one_alone() -> None:
    base = Pipe.from_iterable(range(4))
    mapped = base.map(double)
    assert mapped is not base
    assert list(base) == [0, 1, 2, 3]
    assert list(mapped) == list(mapped) == [0, 2, 4, 6]
    assert repr(mapped.shuffle(2, seed=0)) == "Pipe(from_iterable -> map -> shuffle)"


def test_batch_with_and_without_drop_last_and_collate() -> None:
    pipe = Pipe.from_iterable(range(7))
    assert list(pipe.batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(pipe.batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(pipe.batch(3)) == 3 and len(pipe.batch(3, drop_last=True)) == 2
    stacked = list(pipe.map(torch.tensor).batch(4, collate_fn=torch.stack))
    assert [batch.tolist() for batch in stacked] == [[0, 1, 2, 3], [4, 5, 6]]


def test_concat_chains_pipes_and_adds_lengths() -> None:
    pipe = Pipe.from_iterable([1, 2]).concat(Pipe.from_iterable([3]), Pipe.from_iterable(range(4, 6)).map(double))
    assert list(pipe) == [1, 2, 3, 8, 10]
    assert len(pipe) == 5
    with pytest.raises(ConfigError, match="Pipe.from_iterable"):
        Pipe.from_iterable([1]).concat([2])  # type: ignore[arg-type]


def test_shuffle_is_a_permutation_and_seeded() -> None:
    items = list(range(50))
    a = Pipe.from_iterable(items).shuffle(buffer_size=16, seed=1)
    b = Pipe.from_iterable(items).shuffle(buffer_size=16, seed=1)
    first = list(a)
    assert sorted(first) == items and first != items
    assert first == list(b)  # same seed, same iteration count: same order
    assert list(a) != first  # the second iteration is a new epoch


def test_set_epoch_repeats_an_epoch() -> None:
    pipe = Pipe.from_iterable(range(50)).shuffle(buffer_size=50, seed=1)
    pipe.set_epoch(3)
    third = list(pipe)
    list(pipe)
    pipe.set_epoch(3)
    assert list(pipe) == third
    pipe.set_epoch(4)
    assert list(pipe) != third
    with pytest.raises(ConfigError):
        pipe.set_epoch("4")  # type: ignore[arg-type]


def test_seedless_shuffle_follows_torch_manual_seed() -> None:
    torch.manual_seed(0)
    a = Pipe.from_iterable(range(50)).shuffle(buffer_size=50)
    torch.manual_seed(0)
    b = Pipe.from_iterable(range(50)).shuffle(buffer_size=50)
    assert list(a) == list(b)


def test_a_pickled_pipe_gives_the_same_epoch() -> None:
    pipe = Pipe.from_iterable(range(30)).shuffle(buffer_size=8).shard(worker=1, num_workers=2).map(double)
    copy = pickle.loads(pickle.dumps(pipe))
    assert list(copy) == list(pipe)


def test_compose_adds_a_generator_stage() -> None:
    def repeat(items: Iterator[int], times: int) -> Iterator[int]:
        for item in items:
            yield from [item] * times

    assert list(Pipe.from_iterable([1, 2]).compose(repeat, times=2)) == [1, 1, 2, 2]


def test_length_is_known_only_where_cheap() -> None:
    base = Pipe.from_iterable(range(10))
    assert len(base.map(double).shuffle(4, seed=0).shard()) == 10
    for unknown in [base.filter(is_even), base.shard().batch(3), Pipe.from_iterable(iter_forever())]:
        with pytest.raises(TypeError, match="no length"):
            len(unknown)


class iter_forever:  # a re-iterable without a length
    def __iter__(self) -> Iterator[int]:
        yield 1


def test_stage_exceptions_pass_through_unchanged() -> None:
    def explode(x: int) -> int:
        raise KeyError(x)

    with pytest.raises(KeyError):
        list(Pipe.from_iterable([1]).map(explode))


@pytest.mark.parametrize(
    "build",
    [
        lambda p: p.shuffle(0),
        lambda p: p.shuffle(4, seed=1.5),
        lambda p: p.batch(0),
        lambda p: p.batch(True),
        lambda p: p.map(3),
        lambda p: p.filter(None),
    ],
)
def test_bad_arguments_raise_config_error_at_once(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        build(Pipe.from_iterable(range(3)))


def test_a_pipe_cannot_be_built_from_raw_items() -> None:
    with pytest.raises(ConfigError, match="from_iterable"):
        Pipe(range(3))  # type: ignore[arg-type]
