"""Whole-epoch plans over wide ranges (N up to 10^7): shards, balance, steps, files, options.

Big plans are checked with interval arithmetic only; nothing here enumerates samples.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayshard.config.env import PLAN_VARIABLES
from rayshard.plan import (
    DataLayout,
    LastBatch,
    PlanConfig,
    Rotation,
    Uneven,
    balanced_range,
    plan_epoch,
    shard_of,
)
from rayshard.plan import intervals as iv

N = st.one_of(st.integers(0, 64), st.integers(0, 10**7))
BATCH = st.one_of(st.integers(1, 16), st.integers(1, 10**5))
EPOCH = st.one_of(st.integers(0, 30), st.integers(0, 10**6))


@st.composite
def configs(draw, max_w=64, rotations=tuple(Rotation)):
    w = draw(st.integers(1, max_w))
    rotation = draw(st.sampled_from(rotations))
    if rotation is Rotation.NONE:
        s = w
    elif rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT):
        s = w * draw(st.integers(1, 6))
    else:
        s = draw(st.integers(w, 3 * w))
    config = PlanConfig(
        batch_size=draw(BATCH),
        total_shards=None if s == w and draw(st.booleans()) else s,
        rotation=rotation,
        last_batch=draw(st.sampled_from(list(LastBatch))),
        pad_last_batch=draw(st.booleans()),
        equal_steps=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32)),
    )
    return config, w


def expected_counts(sizes, config, w):
    """Batch counts per rank, from the real shard sizes."""
    b = config.batch_size
    if config.pad_last_batch:
        return [math.ceil(max(sizes) / b)] * len(sizes)
    if config.last_batch is LastBatch.DROP:
        own = [n // b for n in sizes]
        return [min(own)] * w if config.equal_steps and w > 1 else own
    own = [math.ceil(n / b) for n in sizes]
    return [max(own)] * w if config.equal_steps and w > 1 else own


@settings(max_examples=400, deadline=None)
@given(configs(), N, EPOCH)
@example((PlanConfig(batch_size=4), 3), 0, 0)  # no samples
@example((PlanConfig(batch_size=4), 8), 5, 2)  # fewer samples than ranks
@example((PlanConfig(batch_size=1, total_shards=12, rotation="stride"), 4), 10**7, 9)
@example((PlanConfig(batch_size=3, last_batch="drop"), 5), 2, 0)
def test_sample_plan_shards_are_balanced_disjoint_and_counted(case, n, epoch):
    config, w = case
    s = config.shards_for(w)
    plan = plan_epoch(config, DataLayout.of_samples(n), w, epoch)
    assert (plan.epoch, plan.world_size, plan.total_shards) == (epoch, w, s)
    assert [r.rank for r in plan.ranks] == list(range(w))
    shards = [r.shard for r in plan.ranks]
    assert shards == [shard_of(config.rotation, r, epoch, w, s) for r in range(w)]
    assert len(set(shards)) == w
    full_sizes = []
    for rank in plan.ranks:
        lo, hi = balanced_range(rank.shard, s, n)
        full_sizes.append(hi - lo)
        # Delivered samples are a prefix of the rank's balanced shard; the rest is dropped.
        assert rank.ranges == iv.take(((lo, hi),), 0, rank.samples)
        assert rank.samples == iv.total(rank.ranges)
        assert rank.samples + rank.dropped == hi - lo
    assert max(full_sizes) - min(full_sizes) <= 1  # sizes within one
    delivered = [rng for rank in plan.ranks for rng in rank.ranges]
    assert iv.total(iv.normalize(delivered)) == iv.total(delivered)  # disjoint
    if s == w and not any(r.dropped for r in plan.ranks):
        assert plan.delivered() == (((0, n),) if n else ())  # covering
    counts = [r.batches for r in plan.ranks]
    assert counts == expected_counts(full_sizes, config, w)
    if w > 1 and config.equal_steps:
        assert len(set(counts)) == 1
    assert plan.steps == max(counts)
    b = config.batch_size
    for rank in plan.ranks:
        assert math.ceil((rank.samples + rank.padded) / b) == rank.batches
        if config.last_batch is not LastBatch.DROP and not config.pad_last_batch:
            assert rank.dropped == 0


@settings(max_examples=150, deadline=None)
@given(configs(max_w=16), N, EPOCH)
def test_same_configuration_same_plan(case, n, epoch):
    config, w = case
    layout = DataLayout.of_samples(n)
    again = PlanConfig.resolve(explicit=config.to_dict(), environ={})
    assert plan_epoch(config, layout, w, epoch) == plan_epoch(again, layout, w, epoch)


@settings(max_examples=300, deadline=None)
@given(configs(max_w=16), st.integers(0, 3000), EPOCH, st.booleans())  # enumerates samples
@example((PlanConfig(batch_size=4, last_batch="drop"), 2), 30, 3, False)
def test_shuffled_plans_drop_a_window_of_each_share_and_change_nothing_else(case, n, epoch, files):
    config, w = case
    if files:  # file mode: a rank's share is its files' samples (in reading order)
        layout = DataLayout.of_files([n % 97, n % 13, 5, (n // 7) % 50] * config.shards_for(w))
    else:
        layout = DataLayout.of_samples(n)
    tail = plan_epoch(config, layout, w, epoch, by_files=files)
    moved = plan_epoch(config, layout, w, epoch, by_files=files, shuffled=True)
    for cut, window in zip(tail.ranks, moved.ranks, strict=True):
        # Counts, shards, files and padding are the unshuffled plan's; only which samples.
        same = ("shard", "samples", "padded", "dropped", "batches", "files", "file_order")
        assert [getattr(window, f) for f in same] == [getattr(cut, f) for f in same]
        order = list(iv.indices(_share(cut, layout, config, w, files)))
        assert list(iv.indices(cut.ranges)) == order[: cut.samples]  # unshuffled: the tail
        kept = set(iv.indices(window.ranges))
        assert len(kept) == window.samples
        left_out = [position for position, i in enumerate(order) if i not in kept]
        assert len(left_out) == cut.dropped
        if left_out:  # one window of the share's reading order, wrapping around its end
            size, d = len(order), cut.dropped
            windows = [sorted((a + k) % size for k in range(d)) for a in left_out]
            assert left_out in windows
        else:
            assert window.ranges == cut.ranges
        # Kept samples keep the share's reading order.
        assert list(iv.indices(window.ranges)) == [i for i in order if i in kept]


def _share(rank, layout, config, w, files):
    """The samples of a rank's shard (its files' samples in file mode), in reading order."""
    if files:
        offsets = layout.offsets
        return iv.concat((offsets[a], offsets[b]) for a, b in rank.files)
    return iv.concat([balanced_range(rank.shard, config.shards_for(w), layout.num_samples)])


def test_shuffled_drop_leaves_out_every_sample_in_some_epoch_and_none_in_all():
    config = PlanConfig(batch_size=8, last_batch="drop", rotation="none")
    layout = DataLayout.of_samples(100)  # 3 ranks: shards 33/33/34, 1-2 dropped each
    left_out_of = {i: 0 for i in range(100)}
    epochs = 400
    for epoch in range(epochs):
        plan = plan_epoch(config, layout, 3, epoch, shuffled=True)
        read = set(iv.indices(plan.delivered()))
        for i in set(range(100)) - read:
            left_out_of[i] += 1
    assert min(left_out_of.values()) > 0  # the tail cut never leaves out sample 0
    assert max(left_out_of.values()) < epochs  # nothing is left out of every epoch
    unshuffled = plan_epoch(config, layout, 3, 0).delivered()
    assert all(plan_epoch(config, layout, 3, e).delivered() == unshuffled for e in range(5))


# --- File-level modes and uneven files ----------------------------------------


@st.composite
def file_cases(draw, uneven=tuple(Uneven)):
    config, w = draw(configs(max_w=16))
    policy = draw(st.sampled_from(uneven))
    s = config.shards_for(w)
    f = draw(st.integers(0 if policy is Uneven.REPLICATE else s, s + 40))
    rows = draw(
        st.one_of(
            st.lists(st.integers(0, 10), min_size=f, max_size=f),
            st.lists(st.integers(0, 10**6), min_size=f, max_size=f),
        )
    )
    config = PlanConfig.resolve(explicit={**config.to_dict(), "uneven": policy.value}, environ={})
    return config, w, DataLayout.of_files(rows)


def file_set(files) -> set[int]:
    return set(iv.indices(files))


@settings(max_examples=300, deadline=None)
@given(file_cases(uneven=(Uneven.UNBALANCED,)), EPOCH)
@example((PlanConfig(uneven="unbalanced"), 3, DataLayout.of_files([1] * 3)), 0)  # F == W
def test_unbalanced_files_follow_the_balanced_formula(case, epoch):
    config, w, layout = case
    s, f = config.shards_for(w), layout.num_files
    plan = plan_epoch(config, layout, w, epoch, by_files=True)
    for rank in plan.ranks:
        lo, hi = balanced_range(rank.shard, s, f)
        assert rank.files == iv.concat([(lo, hi)])
        offsets = layout.offsets
        real = iv.concat([(offsets[lo], offsets[hi])])
        assert rank.ranges == iv.take(real, 0, rank.samples)
        assert rank.samples + rank.dropped == iv.total(real)
    counts = [iv.total(r.files) for r in plan.ranks]
    assert max(counts) - min(counts) <= 1
    if w > 1 and config.equal_steps:
        assert len({r.batches for r in plan.ranks}) == 1


@settings(max_examples=300, deadline=None)
@given(file_cases(uneven=(Uneven.DROP,)), EPOCH)
@example((PlanConfig(uneven="drop", rotation="none"), 3, DataLayout.of_files([1] * 7)), 4)
def test_drop_files_split_evenly_and_f_mod_s_sit_out(case, epoch):
    config, w, layout = case
    s, f = config.shards_for(w), layout.num_files
    plan = plan_epoch(config, layout, w, epoch, by_files=True)
    files = [file_set(r.files) for r in plan.ranks]
    assert all(len(fs) == f // s for fs in files)  # an even split
    union = set().union(*files)
    assert len(union) == sum(len(fs) for fs in files)  # disjoint
    if s == w:
        assert len(set(range(f)) - union) == f % s  # exactly F % S files sit out
    for rank in plan.ranks:
        real = iv.concat((layout.offsets[a], layout.offsets[b]) for a, b in rank.files)
        assert rank.ranges == iv.take(real, 0, rank.samples)


def files_read(config, layout, w, epochs) -> set[int]:
    read: set[int] = set()
    for e in epochs:
        for rank in plan_epoch(config, layout, w, e, by_files=True).ranks:
            read |= file_set(rank.files)
    return read


@settings(max_examples=200, deadline=None)
@given(file_cases(uneven=(Uneven.DROP,)), st.integers(0, 10**6))
@example((PlanConfig(uneven="drop"), 3, DataLayout.of_files([1] * 5)), 0)
@example(
    (PlanConfig(uneven="drop", total_shards=6, rotation="stride"), 2, DataLayout.of_files([1] * 9)),
    0,
)
@example(
    (
        PlanConfig(uneven="drop", total_shards=6, rotation="stride"),
        2,
        DataLayout.of_files([1] * 11),
    ),
    0,
)
def test_drop_reads_every_file_within_a_bounded_number_of_epochs(case, first):
    """With S == W every file is read in any 2 consecutive epochs; under the stride
    rotations (whose aligned blocks of S/W epochs read every shard once) within 3*S/W."""
    config, w, layout = case
    s, f = config.shards_for(w), layout.num_files
    if s == w:
        bound = 2
    elif config.rotation in (Rotation.STRIDE, Rotation.STRIDE_SHIFT):
        bound = 3 * (s // w)
    else:
        return  # shift with S > W: see the periodic check below
    assert files_read(config, layout, w, range(first, first + bound)) == set(range(f))


@st.composite
def small_drop_cases(draw):
    w = draw(st.integers(1, 4))
    rotation = draw(st.sampled_from(list(Rotation)))
    s = w if rotation is Rotation.NONE else w * draw(st.integers(1, 3))
    if rotation is Rotation.SHIFT:
        s = draw(st.integers(w, 3 * w if w > 1 else 12))  # (one rank: up to 12 shards)
    f = draw(st.integers(s, s + 20))
    config = PlanConfig(uneven="drop", total_shards=s, rotation=rotation)
    return config, w, DataLayout.of_files([1] * f)


@settings(max_examples=60, deadline=None)
@given(small_drop_cases(), st.integers(0, 10**4))
@example(
    (PlanConfig(uneven="drop", total_shards=6, rotation="stride"), 2, DataLayout.of_files([1] * 9)),
    0,
)
@example((PlanConfig(uneven="drop", total_shards=6), 1, DataLayout.of_files([1] * 9)), 0)
@example((PlanConfig(uneven="drop", total_shards=12), 1, DataLayout.of_files([1] * 16)), 0)
def test_drop_never_skips_a_file_forever(case, first):
    """The plan is periodic in the epoch: every file is read within one full period."""
    config, w, layout = case
    s, f = config.shards_for(w), layout.num_files
    block = s // w
    rotation_period = {
        Rotation.NONE: 1,
        Rotation.SHIFT: s,
        Rotation.STRIDE: block,
        Rotation.STRIDE_SHIFT: block * s,
    }[config.rotation]
    sit_out_period = f // math.gcd(f, f % s) * block  # generous: a multiple of the true one
    period = math.lcm(rotation_period, sit_out_period)
    assert files_read(config, layout, w, range(first, first + period)) == set(range(f))


def test_drop_rotates_which_files_sit_out():
    config = PlanConfig(uneven="drop")
    layout = DataLayout.of_files([1] * 7)  # 7 files, 3 ranks: one file sits out
    out = []
    for e in range(7):
        plan = plan_epoch(config, layout, 3, e, by_files=True)
        read = set().union(*(file_set(r.files) for r in plan.ranks))
        (missing,) = set(range(7)) - read
        out.append(missing)
    assert sorted(out) == list(range(7))  # a different file each epoch, all of them in turn


@settings(max_examples=200, deadline=None)
@given(file_cases(uneven=(Uneven.REPLICATE,)), EPOCH)
@example((PlanConfig(uneven="replicate"), 5, DataLayout.of_files([2, 3])), 0)  # F < W
@example((PlanConfig(uneven="replicate"), 2, DataLayout.of_files([])), 0)
def test_replicate_every_rank_reads_all_files_in_its_own_seeded_order(case, epoch):
    config, w, layout = case
    f = layout.num_files
    plan = plan_epoch(config, layout, w, epoch, by_files=True)
    again = plan_epoch(config, layout, w, epoch, by_files=True)
    assert plan == again  # deterministic by seed
    for rank in plan.ranks:
        assert rank.shard is None
        assert sorted(rank.file_order) == list(range(f))
        # the files, and their samples, in the rank's own order
        assert rank.files == iv.concat((i, i + 1) for i in rank.file_order)
        assert rank.samples + rank.dropped == layout.num_samples
        offsets = layout.offsets
        in_order = iv.concat((offsets[i], offsets[i + 1]) for i in rank.file_order)
        assert rank.ranges == iv.take(in_order, 0, rank.samples)


def test_replicate_orders_differ_by_rank_epoch_and_seed():
    layout = DataLayout.of_files([1] * 20)
    base = plan_epoch(PlanConfig(uneven="replicate", seed=7), layout, 4, 0, by_files=True)
    orders = [r.file_order for r in base.ranks]
    assert len(set(orders)) == 4  # each rank its own order
    other_seed = plan_epoch(PlanConfig(uneven="replicate", seed=8), layout, 4, 0, by_files=True)
    assert [r.file_order for r in other_seed.ranks] != orders
    next_epoch = plan_epoch(PlanConfig(uneven="replicate", seed=7), layout, 4, 1, by_files=True)
    assert [r.file_order for r in next_epoch.ranks] != orders
    same = plan_epoch(PlanConfig(uneven="replicate", seed=7), layout, 4, 0, by_files=True)
    assert [r.file_order for r in same.ranks] == orders


def test_fewer_files_than_ranks_replicates():
    plan = plan_epoch(
        PlanConfig(uneven="replicate"), DataLayout.of_files([3, 2]), 4, 0, by_files=True
    )
    assert [r.samples for r in plan.ranks] == [5, 5, 5, 5]


def test_everything_in_one_rank_when_world_is_one():
    plan = plan_epoch(PlanConfig(batch_size=3), DataLayout.of_samples(10), 1, 5)
    (rank,) = plan.ranks
    assert (rank.ranges, rank.batches, rank.padded) == (((0, 10),), 4, 0)


# --- Options: environment, file, explicit (rayshard.config.env) ------------------------

OPTION_VALUES = {
    "uneven": ["replicate", "unbalanced", "drop"],
    "rotation": ["none", "shift", "stride", "stride_shift"],
    "last_batch": ["partial", "drop", "fill"],
    "pad_last_batch": ["1", "0", "true", "false"],
    "equal_steps": ["1", "0", "true", "false"],
    "seed": [0, 7, 123],  # integers in a file or an argument, their text in the environment
}


def parsed(option: str, raw):
    if option in ("pad_last_batch", "equal_steps"):
        return str(raw).lower() in {"1", "true"}
    if option == "seed":
        return int(raw)
    return raw


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_explicit_beats_file_beats_environment_beats_default(data):
    environ, file, explicit = {}, {}, {}
    for option, variable in PLAN_VARIABLES.items():
        values = st.sampled_from(OPTION_VALUES[option])
        if data.draw(st.booleans(), label=f"env {option}"):
            environ[variable] = str(data.draw(values))
        if data.draw(st.booleans(), label=f"file {option}"):
            file[option] = data.draw(values)
        if data.draw(st.sampled_from(["absent", "none", "set"]), label=f"arg {option}") == "set":
            explicit[option] = data.draw(values)
        elif data.draw(st.booleans()):
            explicit[option] = None  # None counts as "not given"
    config = PlanConfig.resolve(explicit=explicit, file=file, environ=environ)
    default = PlanConfig()
    for option, variable in PLAN_VARIABLES.items():
        if explicit.get(option) is not None:
            want = parsed(option, explicit[option])
        elif option in file:
            want = parsed(option, file[option])
        elif variable in environ:
            want = parsed(option, environ[variable])
        else:
            want = getattr(default, option)
        got = getattr(config, option)
        assert (got.value if hasattr(got, "value") else got) == want, option


@pytest.mark.parametrize(
    ("variable", "raw", "option", "value"),
    [
        ("RAYSHARD_UNEVEN_FILES", "drop", "uneven", Uneven.DROP),
        ("RAYSHARD_UNEVEN_FILES", " Replicate ", "uneven", Uneven.REPLICATE),
        ("RAYSHARD_ROTATION", "stride_shift", "rotation", Rotation.STRIDE_SHIFT),
        ("RAYSHARD_LAST_BATCH", "FILL", "last_batch", LastBatch.FILL),
        ("RAYSHARD_PAD_LAST_BATCH", "1", "pad_last_batch", True),
        ("RAYSHARD_PAD_LAST_BATCH", "false", "pad_last_batch", False),
    ],
)
def test_environment_overrides_apply(variable, raw, option, value, monkeypatch):
    assert getattr(PlanConfig.resolve(environ={variable: raw}), option) == value
    for other in PLAN_VARIABLES.values():
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, raw)
    assert getattr(PlanConfig.resolve(), option) == value  # os.environ by default


def test_blank_environment_values_are_ignored():
    environ = {variable: "  " for variable in PLAN_VARIABLES.values()}
    assert PlanConfig.resolve(environ=environ) == PlanConfig()


def test_environment_override_changes_the_plan():
    layout = DataLayout.of_files([1] * 7)
    env = {"RAYSHARD_UNEVEN_FILES": "drop", "RAYSHARD_LAST_BATCH": "drop"}
    config = PlanConfig.resolve(explicit={"batch_size": 2}, environ=env)
    plan = plan_epoch(config, layout, 3, 0, by_files=True)
    assert [iv.total(r.files) for r in plan.ranks] == [2, 2, 2]
    explicit = PlanConfig.resolve(explicit={"batch_size": 2, "uneven": "unbalanced"}, environ=env)
    plan = plan_epoch(explicit, layout, 3, 0, by_files=True)
    assert sorted(iv.total(r.files) for r in plan.ranks) == [2, 2, 3]
    assert [r.dropped for r in plan.ranks] == [0, 0, 1]  # last_batch=drop still from the env
