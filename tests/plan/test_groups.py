"""Data-parallel groups: ranks of one model-parallel group get identical plans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.errors import ConfigError
from rayshard.plan import DataLayout, PlanConfig, data_parallel_rank, plan_epoch
from rayshard.plan import intervals as iv


@st.composite
def megatron_worlds(draw):
    m = draw(st.integers(1, 8))
    dp = draw(st.integers(1, 8))
    return m * dp, m


@settings(max_examples=200, deadline=None)
@given(megatron_worlds())
def test_consecutive_blocks_share_a_data_parallel_rank(case):
    world, m = case
    infos = [data_parallel_rank(w, world, m) for w in range(world)]
    assert all(info.dp_size == world // m for info in infos)
    assert all(info.world_size == world and info.world_rank == w for w, info in enumerate(infos))
    for info in infos:
        assert info.world_rank in info.group and len(info.group) == m
        assert all(infos[o].dp_rank == info.dp_rank for o in info.group)  # same group, same dp
        assert info.is_group_leader == (info.world_rank == min(info.group))
    # Each dp rank is one group, and the dp ranks are 0..dp_size-1.
    assert sorted({info.dp_rank for info in infos}) == list(range(world // m))
    assert sum(info.is_group_leader for info in infos) == world // m


@st.composite
def explicit_groups(draw):
    m = draw(st.integers(1, 6))
    dp = draw(st.integers(1, 6))
    ranks = draw(st.permutations(range(m * dp)))
    return m * dp, [list(ranks[i * m : (i + 1) * m]) for i in range(dp)]


@settings(max_examples=200, deadline=None)
@given(explicit_groups(), st.integers(0, 10**6), st.integers(0, 10))
def test_group_members_get_identical_plans(case, n, epoch):
    world, groups = case
    dp_size = len(groups)
    config = PlanConfig(batch_size=3, total_shards=2 * dp_size, rotation="stride_shift")
    layout = DataLayout.of_samples(n)
    plan = plan_epoch(config, layout, dp_size, epoch)  # planned once, on dp ranks
    per_world_rank = {}
    for w in range(world):
        info = data_parallel_rank(w, world, groups=groups)
        assert info.dp_size == dp_size
        assert tuple(groups[info.dp_rank]) == info.group and w in info.group
        per_world_rank[w] = plan.ranks[info.dp_rank]
    for group in groups:
        assert len({per_world_rank[w] for w in group}) == 1  # identical plans
    # Different groups read different data: the data is split over groups, not world ranks.
    pieces = [rng for r in plan.ranks for rng in r.ranges]
    assert iv.total(iv.normalize(pieces)) == iv.total(pieces)


def test_megatron_layout_example():
    # 8 world ranks, tensor parallel 2: groups (0,1) (2,3) (4,5) (6,7).
    infos = [data_parallel_rank(w, 8, 2) for w in range(8)]
    assert [i.dp_rank for i in infos] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert infos[5].group == (4, 5) and not infos[5].is_group_leader
    plan = plan_epoch(PlanConfig(batch_size=2), DataLayout.of_samples(8), 4, 0)
    assert plan.ranks[infos[2].dp_rank] == plan.ranks[infos[3].dp_rank]
    assert plan.ranks[infos[2].dp_rank].ranges == ((2, 4),)


def test_explicit_groups_example():
    groups = [[0, 2], [1, 3]]
    assert [data_parallel_rank(w, 4, groups=groups).dp_rank for w in range(4)] == [0, 1, 0, 1]
    assert data_parallel_rank(3, 4, groups=groups).group == (1, 3)


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"world_rank": 0, "world_size": 0}, ["world_size=0"]),
        ({"world_rank": 4, "world_size": 4}, ["world_rank=4", "world_size=4"]),
        ({"world_rank": -1, "world_size": 4}, ["world_rank=-1"]),
        (
            {"world_rank": 0, "world_size": 6, "model_parallel_size": 4},
            ["model_parallel_size=4", "world_size=6", "1, 2, 3, 6"],
        ),
        ({"world_rank": 0, "world_size": 4, "model_parallel_size": 0}, ["model_parallel_size=0"]),
        (
            {"world_rank": 0, "world_size": 4, "groups": [[0, 1], [1, 2, 3]]},
            ["world rank 1", "groups 0 and 1"],
        ),
        (
            {"world_rank": 0, "world_size": 4, "groups": [[0, 1], [2]]},
            ["missing ranks [3]", "world_size=4"],
        ),
        (
            {"world_rank": 0, "world_size": 4, "groups": [[0, 1], [2, 3], [4, 5]]},
            ["ranks out of range [4, 5]"],
        ),
        (
            {"world_rank": 0, "world_size": 4, "groups": [[0, 1, 2], [3]]},
            ["different sizes [1, 3]"],
        ),
        ({"world_rank": 0, "world_size": 2, "groups": []}, ["missing ranks [0, 1]"]),
    ],
)
def test_bad_groups_are_rejected_naming_the_values(kwargs, needles):
    with pytest.raises(ConfigError) as info:
        data_parallel_rank(**kwargs)
    for needle in needles:
        assert needle in str(info.value)


@settings(max_examples=100, deadline=None)
@given(explicit_groups(), st.data())
def test_any_broken_partition_is_rejected(case, data):
    world, groups = case
    broken = [list(g) for g in groups]
    how = data.draw(st.sampled_from(["duplicate", "drop", "extra"]))
    if how == "duplicate" and world > 1:
        broken[0].append(broken[-1][-1] if len(broken) > 1 else broken[0][0])
    elif how == "drop":
        broken[-1].pop()
    else:
        broken[-1].append(world)
    if how == "duplicate" and world == 1:
        return
    with pytest.raises(ConfigError):
        data_parallel_rank(0, world, groups=broken)
