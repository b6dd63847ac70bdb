"""`rayshard.core.state_tools`: summaries add up, and every rewrite is a state the loader
accepts."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rayshard.core import state_tools
from rayshard.core.state import LoaderState
from rayshard.errors import ConfigError
from rayshard.plan import DataLayout
from rayshard.plan import intervals as iv


@st.composite
def states(draw) -> LoaderState:
    n = draw(st.integers(0, 500))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=12)))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    return LoaderState(
        loader=draw(st.sampled_from(["train:abc123", "eval:0", ""])),
        epoch=draw(st.integers(0, 10_000)),
        seed=draw(st.integers(0, 2**32)),
        consumed=iv.normalize(pairs),
        world_size=draw(st.integers(0, 64)),
        num_samples=n,
    )


def strict(state: LoaderState) -> LoaderState:
    return LoaderState.from_dict(state.to_json(), expect_loader=state.loader)


EMPTY = LoaderState("x", 0, 0, (), 0, 0)
ALL = LoaderState("x", 3, 1, ((0, 10),), 2, 10)


@given(states())
@example(EMPTY)
@example(ALL)
def test_consumed_plus_remaining_is_the_dataset(state):
    summary = state_tools.summarize(state)
    assert summary["consumed"] + summary["remaining"] == state.num_samples
    assert summary["consumed"] == len(list(iv.indices(state.consumed)))
    assert 0.0 <= summary["consumed_fraction"] <= 1.0
    assert summary["splits"] is None
    assert iv.normalize(summary["consumed_intervals"]) == state.consumed


@given(states(), st.lists(st.integers(0, 20), max_size=8))
def test_split_progress_adds_up(state, sizes):
    # Split boundaries cut [0, n) in order; a last split takes what the sizes leave.
    bounds, at = [], 0
    for size in sizes:
        end = min(at + size, state.num_samples)
        bounds.append((at, end))
        at = end
    bounds.append((at, state.num_samples))
    splits = state_tools.summarize(state, splits=bounds)["splits"]
    assert sum(s["total"] for s in splits) == state.num_samples
    assert sum(s["consumed"] for s in splits) == iv.total(state.consumed)
    for s in splits:
        assert 0 <= s["consumed"] <= s["total"]
        expected = {0: "untouched", s["total"]: "done"}.get(s["consumed"], "partial")
        assert s["status"] == ("done" if s["total"] == 0 else expected)


@given(states(), st.integers(0, 100), st.integers(1, 1024))
@example(EMPTY, 0, 1)
@example(ALL, 3, 2)
def test_rewrites_are_valid_states(state, epoch, world_size):
    skipped = state_tools.skip_to_next_epoch(state)
    assert strict(skipped) == skipped
    assert (skipped.epoch, skipped.consumed) == (state.epoch + 1, ())

    moved = state_tools.set_epoch(state, epoch)
    assert strict(moved) == moved
    assert (moved.epoch, moved.consumed) == (epoch, ())

    retargeted = state_tools.retarget(state, world_size)
    assert strict(retargeted) == retargeted
    assert retargeted.world_size == world_size
    assert retargeted.consumed == state.consumed and retargeted.epoch == state.epoch

    for new in (skipped, moved, retargeted):  # what identifies the loader is untouched
        assert (new.loader, new.seed, new.num_samples) == (
            state.loader,
            state.seed,
            state.num_samples,
        )
    assert state_tools.summarize(skipped)["remaining"] == state.num_samples


def test_file_layout_gives_per_file_progress():
    state = LoaderState("x", 0, 0, ((0, 5), (12, 14)), 2, 20)
    summary = state_tools.summarize(state, DataLayout.of_files([5, 0, 10, 5]))
    assert [(s["start"], s["end"], s["consumed"], s["status"]) for s in summary["splits"]] == [
        (0, 5, 5, "done"),
        (5, 15, 2, "partial"),
        (15, 20, 0, "untouched"),
    ]


@pytest.mark.parametrize("world_size", [0, -3])
def test_retarget_needs_a_positive_world_size(world_size):
    message = f"world_size={world_size} is not in the range world_size>=1$"
    with pytest.raises(ConfigError, match=message):
        state_tools.retarget(ALL, world_size)


@pytest.mark.parametrize("bad", [True, 2.0, "4"])
def test_retarget_needs_an_int(bad):
    with pytest.raises(TypeError, match=r"world_size=.* must be an integer >= 1"):
        state_tools.retarget(ALL, bad)


def test_set_epoch_refuses_a_negative_epoch():
    with pytest.raises(ConfigError, match="epoch=-1 is not in the range epoch>=0"):
        state_tools.set_epoch(ALL, -1)


def test_summary_refuses_data_of_another_size():
    with pytest.raises(ConfigError, match="the data has 11 samples but the state was saved for 10"):
        state_tools.summarize(ALL, DataLayout.of_samples(11))


def test_split_outside_the_dataset_is_refused():
    with pytest.raises(ConfigError, match=r"split 0 \[5, 12\) is outside"):
        state_tools.summarize(ALL, splits=[(5, 12)])


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            LoaderState("x", -1, 0, (), 1, 10),
            r"epoch=-1 is not in the range epoch>=0 \(epochs count from 0\)$",
        ),
        (LoaderState("x", 0, 0, ((5, 12),), 1, 10), r"span \[5, 12\), outside"),
        (
            LoaderState("x", 0, 0, (), -2, 10),
            r"world_size=-2 is not in the range world_size>=0 \(0 means unknown\)$",
        ),
    ],
)
def test_inconsistent_states_are_refused(state, message):
    with pytest.raises(ConfigError, match=message):
        state_tools.skip_to_next_epoch(state)


def test_a_state_of_another_loader_is_refused_naming_what_differs():
    saved = {"batch_size": 50, "policy": "data", "source": "ParquetSource(a.parquet)"}
    here = {"batch_size": 64, "policy": "data", "source": "ParquetSource(a.parquet)"}
    state = LoaderState("train:aa", 0, 0, ((0, 4),), 2, 10, made_by=json.dumps(saved))
    data = state.to_dict()
    assert data["made_by"] == saved
    assert LoaderState.from_dict(data) == state  # made_by round-trips, is not compared
    with pytest.raises(ConfigError) as refused:
        LoaderState.from_dict(data, expect_loader="train:bb", expect_made_by=here)
    assert str(refused.value).endswith("configuration; batch_size: 50 in the state, 64 here")
    with pytest.raises(ConfigError, match=r"name: 'train' in the state, 'eval' here$"):
        LoaderState.from_dict(data, expect_loader="eval:aa", expect_made_by=saved)
    older = dict(data)
    del older["made_by"]  # saved before `made_by` existed: loads, refused by id alone
    assert LoaderState.from_dict(older).made_by == ""
    with pytest.raises(ConfigError, match=r"or configuration$"):
        LoaderState.from_dict(older, expect_loader="train:bb", expect_made_by=here)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"epoch": True}, r"epoch=True is not an integer >= 0"),
        ({"epoch": 0.9}, r"epoch=0.9 is not an integer >= 0"),
        ({"epoch": -1}, r"epoch=-1 is not an integer >= 0"),
        ({"world_size": -3}, r"world_size=-3 is not an integer >= 0"),
        ({"seed": "1"}, r"seed='1' is not an integer >= 0"),
        ({"consumed": [[30, 0]]}, r"consumed interval \[30, 0\] is not within"),
        ({"consumed": [[0, 1000]]}, r"consumed interval \[0, 1000\] is not within"),
        ({"consumed": [[0, 2.5]]}, r"consumed bound=2.5 is not an integer"),
        ({"num_samples": 50}, r"this state counts 50 samples, the loader's source 100"),
        # ids and settings are compared as str and mapping: other types failed there
        ({"loader": 5}, r"malformed loader state: loader=5 is not a loader id 'name:fing"),
        ({"loader": ["x:1"]}, r"malformed loader state: loader=\['x:1'\] is not a loader id"),
        ({"made_by": [1]}, r"malformed loader state: made_by=\[1\] is not a mapping"),
        ({"made_by": "xx"}, r"malformed loader state: made_by='xx' is not a mapping"),
        ({"made_by": None}, r"malformed loader state: made_by=None is not a mapping"),
    ],
)
def test_a_state_edited_into_nonsense_is_refused_before_it_is_used(edit, message):
    """What `load_state_dict` sends the coordinator, which journals a state it accepts:
    a bad one must be refused here, or it would break the loader for every later run."""
    data = {**LoaderState("x:1", 0, 0, ((0, 30),), 1, 100).to_dict(), **edit}
    with pytest.raises(ConfigError, match=message):
        LoaderState.from_dict(data, expect_loader="x:1", expect_num_samples=100)
    good = LoaderState("x:1", 2, 0, ((0, 30), (40, 100)), 1, 100)
    assert LoaderState.from_dict(good.to_dict(), expect_num_samples=100) == good


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_a_state_of_unknown_world_size_resumes_its_epoch_on_any(dp_size):
    """`world_size: 0` (unknown, as `rayshard state` shows it) resumes the rest of its
    epoch as if saved on the new world size (a re-plan for 0 ranks raised)."""
    import pyarrow as pa

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core.planning import epoch_plan
    from rayshard.sources import TableSource

    source = TableSource(pa.table({"id": pa.array(range(40), pa.int64())}))
    state = LoaderState.from_dict(
        {
            "version": 1,
            "loader": "L",
            "epoch": 0,
            "seed": 0,
            "consumed": [[0, 8], [30, 33]],
            "world_size": 0,
            "num_samples": 40,
        }
    )
    plan = epoch_plan(LoaderConfig(batch_size=4), source, dp_size, 0, state)
    read = [i for rank in plan.ranks for a, b in rank.ranges for i in range(a, b)]
    assert sorted(read) == [i for i in range(40) if not (i < 8 or 30 <= i < 33)]


def _made_by(**plan) -> str:
    from rayshard.config.loader_config import LoaderConfig

    facts = LoaderConfig(**plan).identity_facts("TableSource(100 rows)", 100)
    return json.dumps(facts, sort_keys=True)


def test_retarget_refuses_a_hint_the_states_loader_cannot_plan():
    """A resume re-plans the epoch on the hint: a hint beyond `total_shards` (or not a
    divisor of it under a stride rotation) would fail every resume, so it is not written."""
    state = LoaderState("x", 1, 0, ((0, 20),), 4, 100, made_by=_made_by(total_shards=4))
    with pytest.raises(ConfigError, match=r"world_size=8 exceeds total_shards=4.*saved \(4\)"):
        state_tools.retarget(state, 8)
    assert state_tools.retarget(state, 2).world_size == 2
    strided = _made_by(total_shards=4, rotation="stride")
    with pytest.raises(ConfigError, match="total_shards=4 is not a multiple of world_size=3"):
        state_tools.retarget(dataclasses.replace(state, made_by=strided), 3)
    # nothing consumed (the hint is unused), a state without its loader, or `dynamic`: as asked
    assert state_tools.retarget(dataclasses.replace(state, consumed=()), 8).world_size == 8
    assert state_tools.retarget(dataclasses.replace(state, made_by=""), 8).world_size == 8
    dynamic = _made_by(total_shards=4, policy="dynamic")
    assert state_tools.retarget(dataclasses.replace(state, made_by=dynamic), 8).world_size == 8


@pytest.mark.parametrize("policy", ["file", "data"])
@pytest.mark.parametrize("saved_on", [1, 3, 4])
def test_a_state_at_an_epoch_start_plans_that_epoch_fresh_on_any_world_size(
    tmp_path, policy, saved_on
):
    """A state with nothing consumed (saved between epochs, or `skip-epoch`) resumed on 2
    ranks plans the epoch as a fresh one there: the file policy's whole files and the
    `drop` rule's batches, not a re-balance of the saving world's plan."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core.planning import epoch_plan
    from rayshard.sources.parquet import ParquetSource

    for index, rows in enumerate((30, 50, 20, 40)):
        pq.write_table(pa.table({"x": range(rows)}), tmp_path / f"part-{index}.parquet")
    source = ParquetSource(str(tmp_path))
    config = LoaderConfig(policy=policy, batch_size=4, last_batch="drop", shuffle=True)
    skipped = state_tools.skip_to_next_epoch(LoaderState("x", 2, 0, ((0, 10),), saved_on, 140))
    assert epoch_plan(config, source, 2, 3, skipped) == epoch_plan(config, source, 2, 3)
