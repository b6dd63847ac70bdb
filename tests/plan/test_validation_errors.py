"""Every start-up error of the planner names the offending values (and a way out)."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.errors import ConfigError
from rayshard.plan import (
    DataLayout,
    LastBatch,
    PlanConfig,
    Rotation,
    Uneven,
    check_coverage,
    check_not_empty,
    parse_choice,
    plan_epoch,
    plan_remaining,
    validate,
)


@contextlib.contextmanager
def raises(*needles: str):
    """`pytest.raises(ConfigError)` whose message must contain every needle."""
    with pytest.raises(ConfigError) as info:
        yield info
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --- Options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "enum_cls"),
    [("rotation", Rotation), ("uneven", Uneven), ("last_batch", LastBatch)],
)
def test_unknown_choice_names_option_value_and_choices(option, enum_cls):
    with raises(f"{option}='sideways'", *(m.value for m in enum_cls)):
        PlanConfig(**{option: "sideways"})
    with raises(f"{option}='bogus'"):
        PlanConfig.resolve(file={option: "bogus"}, environ={})
    with raises("x='nope'", *(m.value for m in enum_cls)):
        parse_choice(enum_cls, "nope", "x")


@pytest.mark.parametrize(
    ("variable", "option"),
    [
        ("RAYSHARD_ROTATION", "rotation"),
        ("RAYSHARD_UNEVEN_FILES", "uneven"),
        ("RAYSHARD_LAST_BATCH", "last_batch"),
    ],
)
def test_bad_environment_choice_names_the_value(variable, option):
    with raises(f"{option}='wobble'"):
        PlanConfig.resolve(environ={variable: "wobble"})


def test_bad_yes_no_names_the_setting_and_value():
    with raises("pad_last_batch='maybe'", "1, 0, true, false"):
        PlanConfig.resolve(environ={"RAYSHARD_PAD_LAST_BATCH": "maybe"})
    with raises("pad_last_batch='sometimes'"):
        PlanConfig(pad_last_batch="sometimes")


def test_bad_equal_steps_names_the_value():
    with raises("equal_steps='perhaps'"):
        PlanConfig(equal_steps="perhaps")


def test_equal_steps_from_a_file_is_parsed_like_other_yes_no_settings():
    assert PlanConfig.resolve(file={"equal_steps": "false"}, environ={}).equal_steps is False
    assert PlanConfig.resolve(file={"equal_steps": "1"}, environ={}).equal_steps is True


@pytest.mark.parametrize(
    ("option", "value", "needles"),
    [
        ("batch_size", 0, ["batch_size=0", "batch_size>=1"]),
        ("batch_size", -3, ["batch_size=-3"]),
        ("batch_size", 2.5, ["batch_size=2.5", "integer"]),
        ("batch_size", "4", ["batch_size='4'", "integer"]),
        ("batch_size", True, ["batch_size=True", "integer"]),
        ("total_shards", 0, ["total_shards=0", "total_shards>=1"]),
        ("expected_world_size", 0, ["expected_world_size=0", "expected_world_size>=1"]),
        ("seed", -1, ["seed=-1", "seed>=0"]),
        ("seed", None, ["seed=None", "integer"]),
    ],
)
def test_bad_integer_option_names_option_and_value(option, value, needles):
    with raises(*needles):
        PlanConfig(**{option: value})


@settings(max_examples=50, deadline=None)
@given(st.integers(max_value=0))
def test_any_non_positive_batch_size_is_named(value):
    with raises(f"batch_size={value}"):
        PlanConfig(batch_size=value)


def test_unknown_option_names_it_and_where_it_came_from():
    with raises("'batchsize'", "arguments", "batch_size"):
        PlanConfig.resolve(explicit={"batchsize": 4}, environ={})
    with raises("'shards'", "configuration file", "total_shards"):
        PlanConfig.resolve(file={"shards": 4}, environ={})


# --- Layout ----------------------------------------------------------------------------


def test_negative_sample_count_is_named():
    with raises("num_samples=-5"):
        DataLayout.of_samples(-5)


def test_negative_file_rows_are_named():
    with raises("(3, -1, 2)", "negative"):
        DataLayout.of_files([3, -1, 2])


def test_file_rows_that_do_not_add_up_are_named():
    with raises("add up to 5", "num_samples=6"):
        DataLayout(num_samples=6, file_rows=(2, 3))


# --- World and rotation ----------------------------------------------------------------


@pytest.mark.parametrize("world_size", [0, -2, 1.5, True])
def test_bad_world_size_is_named(world_size):
    with raises(f"world_size={world_size!r}"):
        validate(PlanConfig(), DataLayout.of_samples(10), world_size)
    with raises(f"world_size={world_size!r}"):
        plan_epoch(PlanConfig(), DataLayout.of_samples(10), world_size, 0)


def test_world_size_mismatch_names_both_sizes_and_the_fix():
    config = PlanConfig(expected_world_size=8)
    with raises("expects world_size=8", "world_size=4", "expected_world_size=4"):
        plan_epoch(config, DataLayout.of_samples(100), 4, 0)


def test_more_ranks_than_shards_names_both():
    with raises("world_size=5", "total_shards=3", "at least 5"):
        plan_epoch(PlanConfig(total_shards=3), DataLayout.of_samples(100), 5, 0)


def test_rotation_none_with_more_shards_than_ranks_names_both():
    with raises("rotation='none'", "total_shards=6", "world_size=3"):
        plan_epoch(PlanConfig(total_shards=6, rotation="none"), DataLayout.of_samples(10), 3, 0)


@pytest.mark.parametrize("rotation", ["stride", "stride_shift"])
@pytest.mark.parametrize(("shards", "world", "suggestion"), [(6, 4, "4 or 8"), (10, 3, "9 or 12")])
def test_stride_needs_a_multiple_of_the_world_size(rotation, shards, world, suggestion):
    config = PlanConfig(total_shards=shards, rotation=rotation)
    with raises(f"total_shards={shards}", f"world_size={world}", rotation, suggestion):
        plan_epoch(config, DataLayout.of_samples(100), world, 0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 50), st.integers(1, 200))
def test_stride_error_for_any_non_multiple(w, s):
    config = PlanConfig(total_shards=s, rotation="stride")
    if s < w or s % w == 0:
        return
    with raises(f"total_shards={s}", f"world_size={w}") as info:
        validate(config, DataLayout.of_samples(10), w)
    # The suggested shard counts are multiples of the world size.
    suggested = re.search(r"\(try ([0-9]+)(?: or ([0-9]+))?\)", str(info.value))
    assert suggested is not None
    assert all(int(x) % w == 0 for x in suggested.groups() if x)


@pytest.mark.parametrize("uneven", ["unbalanced", "drop"])
def test_fewer_files_than_ranks_without_replicate_names_counts_and_fix(uneven):
    config = PlanConfig(uneven=uneven)
    with raises("3 files", "4 shards", "world_size=4", "replicate"):
        plan_epoch(config, DataLayout.of_files([5, 5, 5]), 4, 0, by_files=True)


def test_fewer_files_than_shards_names_the_shards():
    config = PlanConfig(total_shards=8, rotation="stride")
    with raises("6 files", "8 shards", "world_size=4", "at least 8 files"):
        plan_epoch(config, DataLayout.of_files([1] * 6), 4, 0, by_files=True)


@pytest.mark.parametrize("epoch", [-1, 1.0, "3", True])
def test_bad_epoch_is_named(epoch):
    with raises(f"epoch={epoch!r}"):
        plan_epoch(PlanConfig(), DataLayout.of_samples(10), 2, epoch)
    with raises(f"epoch={epoch!r}"):
        plan_remaining(PlanConfig(), DataLayout.of_samples(10), 2, epoch, [])


def test_resume_onto_an_impossible_world_names_it():
    config = PlanConfig(total_shards=4, rotation="stride")
    with raises("total_shards=4", "world_size=3"):
        plan_remaining(config, DataLayout.of_samples(40), 3, 0, [], previous_world_size=2)


# --- Empty data and coverage -----------------------------------------------------------


def test_empty_data_is_an_error_naming_what_is_empty():
    with raises("the dataset", "no samples"):
        check_not_empty(DataLayout.of_samples(0))
    with raises("train.parquet"):
        check_not_empty(DataLayout.of_files([0, 0]), "train.parquet")
    check_not_empty(DataLayout.of_samples(1))


def test_coverage_accepts_a_proper_split():
    check_coverage([[(0, 3)], [(3, 5), (8, 10)], [(5, 8)]], 10)
    check_coverage([[], []], 0)


@pytest.mark.parametrize(
    ("shards", "needles"),
    [
        ([[(0, 6)], [(4, 10)]], ["shards 0 and 1", "[4, 6)"]),
        ([[(0, 10)], [(2, 3)]], ["shards 0 and 1", "[2, 3)"]),  # one inside the other
        ([[(0, 5)], [(5, 8)], [(7, 10)]], ["shards 1 and 2", "[7, 8)"]),
        ([[(0, 4), (6, 10)], [(3, 6)]], ["shards 0 and 1", "[3, 4)"]),
    ],
)
def test_coverage_rejects_overlapping_shards_naming_them(shards, needles):
    with raises(*needles, "exactly one shard"):
        check_coverage(shards, 10)


@pytest.mark.parametrize(
    ("shards", "needles"),
    [
        ([[(0, 4)], [(6, 10)]], ["[4, 4]", "add up to 8", "10 samples", "(4, 6)"]),
        ([[(0, 5)], []], ["[5, 0]", "add up to 5", "(5, 10)"]),
        ([[], []], ["[0, 0]", "(0, 10)"]),
        ([[(0, 5)], [(6, 11)]], ["(5, 6)", "(10, 11)"]),  # sizes add up, one sample outside
    ],
)
def test_coverage_rejects_missing_samples_naming_them(shards, needles):
    with raises(*needles):
        check_coverage(shards, 10)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**7), st.integers(1, 50), st.data())
def test_coverage_names_a_removed_sample_range(n, s, data):
    from rayshard.plan import balanced_ranges

    shards = [[r] for r in balanced_ranges(s, n)]
    victim = data.draw(st.integers(0, s - 1))
    lo, hi = shards[victim][0]
    if hi == lo:
        check_coverage(shards, n)
        return
    cut = data.draw(st.integers(lo, hi - 1))
    shards[victim] = [(lo, cut)] if cut > lo else []
    with raises(f"({cut}, {hi})", f"not to the {n} samples"):
        check_coverage(shards, n)
    # And a shard that grows into its neighbour is named as an overlap.
    if victim + 1 < s and shards[victim + 1][0][1] > shards[victim + 1][0][0]:
        grown = [list(x) for x in shards]
        grown[victim] = [(lo, hi + 1)]
        with raises(f"shards {victim} and {victim + 1}", f"[{hi}, {hi + 1})"):
            check_coverage(grown, n)
