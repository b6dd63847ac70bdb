"""Packing without Ray: configuration and input errors (raised before any actor starts),
the readers' packing stage over record batches, and the state's `partial` key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayshard.config.loader_config import LoaderConfig
from rayshard.core.packing import (
    PackSpec,
    count_rows,
    count_split_rows,
    plan_rows,
    resume_point,
    unpack,
)
from rayshard.core.state import LoaderState
from rayshard.data.batching import iter_rows
from rayshard.data.columns import Padding
from rayshard.data.packing import (
    Packing,
    check_packing_input,
    mix_token_lengths,
    token_lengths,
)
from rayshard.errors import ConfigError, DataError, RayshardError
from rayshard.loader import Loader
from rayshard.runtime.packing_stage import COMPLETED_KEY, PARTIAL_KEY, packed_batches
from rayshard.sources import TableSource
from rayshard.sources.mixed import MixedSource
from rayshard.sources.parquet import ParquetSource


def table(lengths):
    tokens = [list(range(100 * i, 100 * i + n)) for i, n in enumerate(lengths)]
    return pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32())), "id": range(len(lengths))})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"seq_len": 0}, r"seq_len=0 is not in the range seq_len>=1 \(Packing: give the"),
        ({"seq_len": "8"}, r"seq_len='8' must be an integer >= 1"),
        ({"seq_len": 8, "last_row": "cut"}, r"last_row='cut' is not a valid choice: use one of"),
        ({"seq_len": 8, "separator": 1.5}, r"separator=1.5 must be an integer token id"),
        (
            {"seq_len": 8, "split_documents": False, "last_row": "drop"},
            r"last_row='drop' needs split_documents=True",
        ),
    ],
)
def test_bad_packing_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        Packing(column="tokens", **options)


@pytest.mark.parametrize(
    "data, options, error, message",
    [
        (
            table([3]),
            {"packing": Packing(column="text", seq_len=8)},
            ConfigError,
            r"packing column 'text' is not in .*set Packing\(column=...\)",
        ),
        (
            table([3]),
            {"packing": Packing(column="id", seq_len=8)},
            ConfigError,
            r"packing column 'id' .* is int64, not a list of integers",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "columns": ["id"]},
            ConfigError,
            r"packing column 'tokens' is not among columns=\['id'\]",
        ),
        (
            table([3, 12, 5]),
            {"packing": Packing(column="tokens", seq_len=8, split_documents=False)},
            DataError,
            r"sample 1 .* has 12 tokens, more than seq_len=8 .* raise seq_len to at "
            r"least 12, set split_documents=True",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "policy": "dynamic"},
            ConfigError,
            r"packing with policy='dynamic' is not supported.*use policy='data'",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "shuffle_buffer": 8},
            ConfigError,
            r"packing with shuffle_buffer=8 is not supported",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "shuffle_blocks": 4},
            ConfigError,
            r"packing with shuffle_blocks=4 is not supported.*use shuffle=True",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "last_batch": "drop"},
            ConfigError,
            r"packing with last_batch='drop' would drop documents",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "last_batch": "fill"},
            ConfigError,
            r"packing with last_batch='fill': .* leave last_batch='partial'",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "pad_last_batch": True},
            ConfigError,
            r"packing with pad_last_batch: .* pad_last_batch=False",
        ),
        (
            table([3]),
            {
                "packing": Packing(column="tokens", seq_len=8),
                "padding": {"tokens": Padding(max_length=4)},
            },
            ConfigError,
            r"padding\['tokens'\] with packing on the same column",
        ),
        (
            table([3]),
            {"packing": Packing(column="tokens", seq_len=8), "transform": lambda b, c: b},
            ConfigError,
            r"transform= together with packing= is not supported",
        ),
        (
            pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.uint8()))}),
            {"packing": Packing(column="tokens", seq_len=8, separator=256)},
            ConfigError,
            r"packing separator=256 does not fit the token column 'tokens' .* \(uint8, "
            r"0\.\.255\): choose a token id in that range, or store the tokens as a wider",
        ),
        (
            pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.uint16()))}),
            {"packing": Packing(column="tokens", seq_len=8, pad_id=-1)},
            ConfigError,
            r"packing pad_id=-1 does not fit the token column 'tokens' .* \(uint16",
        ),
        (
            pa.table({"tokens": pa.array([[1, 2], [3, None, 5]], pa.list_(pa.int32()))}),
            {"packing": Packing(column="tokens", seq_len=8, split_documents=False)},
            DataError,
            r"sample 1 of .* has a null token in 'tokens': packing needs integer tokens only",
        ),
    ],
)
def test_bad_input_is_refused_on_the_driver(data, options, error, message):
    # Raised before Ray starts or any actor exists (no ray_session fixture here).
    with pytest.raises(error, match=message):
        Loader(TableSource(data), batch_size=2, **options)


def test_yaml_packing_mapping():
    config = LoaderConfig(packing={"column": "tokens", "seq_len": 16, "last_row": "drop"})
    assert config.packing == Packing(column="tokens", seq_len=16, last_row="drop")
    assert config.to_dict()["packing"]["last_row"] == "drop"
    with pytest.raises(ConfigError, match=r"unknown packing option\(s\) \['seq'\]"):
        LoaderConfig(packing={"column": "tokens", "seq": 16})


def rows_of(data, pieces):
    return iter_rows(TableSource(data), pieces, ["tokens"])


def test_packing_stage_pads_to_the_planned_batches_and_reports_progress():
    data = table([5, 7, 3])
    packing = Packing(column="tokens", seq_len=4)
    out = list(packed_batches(rows_of(data, [(0, 3)]), packing, 2, {}, batches=4))
    assert len(out) == 4  # 15 tokens: 4 rows = 2 batches, then 2 padding batches
    assert [b["_padded"].all() for b in out] == [False, False, True, True]
    assert out[0][COMPLETED_KEY].tolist() == [0] and out[0][PARTIAL_KEY].tolist() == [[1, 3]]
    assert out[1][COMPLETED_KEY].tolist() == [1, 2]
    tokens = np.concatenate([b["tokens"] for b in out])
    docs = np.concatenate([b["document_ids"] for b in out])
    back = unpack(tokens, docs, PackSpec(seq_len=4))
    for i, n in enumerate([5, 7, 3]):
        assert back[i].tolist() == list(range(100 * i, 100 * i + n))
    assert out[0]["tokens"].dtype == np.int32  # the column's own type


@pytest.mark.parametrize("fast", [True, False])
def test_a_batch_past_the_plan_is_an_error_before_it_is_yielded(fast):
    # 15 tokens make 2 batches of 2 rows; a plan of 1 (the column changed since planning):
    # no rank may take a step its peers do not
    stage = packed_batches(
        rows_of(table([5, 7, 3]), [(0, 3)]),
        Packing(column="tokens", seq_len=4),
        2,
        {},
        1,
        fast=fast,
    )
    assert next(stage)["tokens"].shape == (2, 4)
    with pytest.raises(RayshardError, match="more than the 1 batches the plan counted"):
        next(stage)


def test_packing_stage_resumes_inside_a_document_and_drops_the_last_row():
    data = table([5, 7, 3])
    packing = Packing(column="tokens", seq_len=4, last_row="drop")
    out = list(packed_batches(rows_of(data, [(1, 3)]), packing, 8, {1: 3}, batches=1))
    # 4 tokens of doc 1 and 3 of doc 2: one full row; doc 2's last 3 tokens dropped.
    assert len(out) == 1 and out[0]["tokens"].tolist() == [[103, 104, 105, 106]]
    assert out[0]["position_ids"].tolist() == [[3, 4, 5, 6]]
    assert sorted(out[0][COMPLETED_KEY].tolist()) == [1, 2]  # the dropped row's document too


def test_state_partial_round_trips_and_older_states_load():
    state = LoaderState("l", 0, 1, ((0, 4),), 2, 10, partial=((7, 13),))
    assert LoaderState.from_dict(state.to_json()) == state
    older = state.to_dict()
    del older["partial"]
    assert LoaderState.from_dict(older).partial == ()


def _readme_section() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return readme.split("## Packing (language models)", 1)[1].split("\n## ", 1)[0]


def test_readme_packing_snippet_and_yaml_line(tmp_path):
    section = _readme_section()
    (snippet,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec("\n".join(line for line in snippet.splitlines() if line.startswith("from ")), namespace)
    packing = re.search(r"packing=(Packing\(.*?\))", snippet).group(1)
    assert eval(packing, namespace) == Packing(column="tokens", seq_len=2048, separator=2)
    line = re.search(r"In YAML: `(packing: .*?)`", section).group(1)
    (tmp_path / "loader.yaml").write_text(line + "\n")
    config = LoaderConfig.from_yaml(tmp_path / "loader.yaml")
    assert config.packing == Packing(column="tokens", seq_len=2048, separator=2)


@st.composite
def split_cases(draw, split: bool = True):
    seq_len = draw(st.integers(1, 12) if split else st.integers(2, 24))
    separator = draw(st.sampled_from([None, 77777]))
    longest = 20 if split else seq_len - (separator is not None)  # no-split: every one fits
    lengths = draw(st.lists(st.integers(0, longest), min_size=0, max_size=25 if split else 60))
    if not split and draw(st.integers(0, 9)) == 0:  # now and then one that cannot fit
        lengths.insert(draw(st.integers(0, len(lengths))), longest + 1)
    packing = Packing(
        column="tokens",
        seq_len=seq_len,
        separator=separator,
        split_documents=split,
        last_row=draw(st.sampled_from(["pad", "drop"])) if split else "pad",
        pad_id=-5,
    )
    chunks = draw(st.lists(st.integers(1, 6), min_size=1, max_size=8))
    return lengths, packing, draw(st.integers(1, 4)), chunks, draw(st.integers(0, 40))


def _chunked(data, chunks):
    """The table's rows as tagged record batches of varying sizes (as readers get them)."""
    out, at, k = [], 0, 0
    while at < data.num_rows:
        size = chunks[k % len(chunks)]
        out += list(iter_rows(TableSource(data), [(at, min(at + size, data.num_rows))], None))
        at, k = at + size, k + 1
    return out


@settings(max_examples=200, deadline=None)
@given(split_cases())
def test_numpy_split_path_equals_the_per_document_path(case):
    _assert_numpy_path_equals_the_per_document_path(*case)


@settings(max_examples=200, deadline=None)
@given(split_cases(split=False))
def test_numpy_first_fit_path_equals_the_per_document_path(case):
    """No-split packing (first-fit over a window of open rows): the same batches, and a
    document too long for a row the same `DataError`."""
    lengths, packing, *rest = case
    spec = packing.spec
    if any(spec.size(n) > spec.seq_len for n in lengths):
        errors = []
        for fast in (True, False):
            with pytest.raises(DataError, match="without splitting it cannot be packed") as e:
                list(
                    packed_batches(
                        iter(_chunked(table(lengths), [3])), packing, 2, {}, 99, fast=fast
                    )
                )
            errors.append(str(e.value))
        assert errors[0] == errors[1]
        return
    _assert_numpy_path_equals_the_per_document_path(lengths, packing, *rest)


def test_first_fit_paths_agree_on_documents_resumed_part_way():
    """Offsets inside documents (a split document's rest) under first-fit: both paths
    start them at that token, positions included."""
    lengths = [5, 7, 3, 6]
    packing = Packing(column="tokens", seq_len=8, separator=9, split_documents=False)
    _assert_numpy_path_equals_the_per_document_path(lengths, packing, 2, [2], 0, {1: 4, 3: 6})


def _assert_numpy_path_equals_the_per_document_path(
    lengths, packing, batch_size, chunks, cut, offsets=None
):
    data = table(lengths)
    spec = packing.spec
    if offsets is None:
        rows = list(plan_rows(((i, n) for i, n in enumerate(lengths)), spec))
        _, offsets = resume_point(rows[: min(cut, len(rows))])  # resume inside documents
    order = [i for i in range(len(lengths))]
    count = count_rows(((i, lengths[i]) for i in order), spec, offsets)
    planned = -(-count // batch_size) + 1  # one padding batch too
    runs = [
        list(
            packed_batches(
                iter(_chunked(data, chunks)), packing, batch_size, offsets, planned, fast=fast
            )
        )
        for fast in (True, False)
    ]
    fast, slow = runs
    assert len(fast) == len(slow) == planned
    for a, b in zip(fast, slow):
        assert set(a) == set(b)
        for key in a:
            if key == COMPLETED_KEY:
                assert sorted(a[key].tolist()) == sorted(b[key].tolist())
            elif key == PARTIAL_KEY:
                most: dict = {}
                for i, t in b[key].tolist():
                    most[i] = max(most.get(i, 0), t)
                assert dict(a[key].tolist()) == most
            else:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
                assert a[key].dtype == b[key].dtype, key


def test_coordinator_core_counts_packed_steps_and_keeps_partial_through_a_journal():
    from rayshard.config.loader_config import LoaderConfig
    from rayshard.core import commands as cmd
    from rayshard.core.coordination import CoordinatorCore
    from rayshard.plan import PlanConfig

    lengths = [5, 7, 3, 9, 4, 6]  # 34 tokens
    packing = Packing(column="tokens", seq_len=4)
    settings = LoaderConfig(plan=PlanConfig(batch_size=2), packing=packing)
    core = CoordinatorCore("pack-core", TableSource(table(lengths)), settings)
    core.apply(cmd.Register(0, 2, 0, 2))
    core.apply(cmd.Register(1, 2, 1, 2))
    plan = core.apply(cmd.StartEpoch(0, 0))
    # ranks read samples [0, 3) (15 tokens: 4 rows) and [3, 6) (19 tokens: 5 rows)
    assert [r.batches for r in core.plan(0).ranks] == [3, 3] and plan.batches == 3
    journal = [
        cmd.Ack(0, 0, 1, ((0, 1),), partial=((1, 3),)),
        cmd.Ack(1, 0, 1, (), partial=((3, 8),)),
    ]
    for command in journal:
        replayed = cmd.command_from_entry(json.loads(json.dumps(command.to_entry())))
        assert replayed == command
        core.apply(replayed)
    state = core.state_at(0, 1)
    assert state["consumed"] == [[0, 1]] and state["partial"] == [[1, 3], [3, 8]]
    fresh = CoordinatorCore("pack-core", TableSource(table(lengths)), settings)
    fresh.load_dict(json.loads(json.dumps(core.to_dict())))
    assert fresh.state_at(0, 1) == state
    # Resumed on one rank: 34 - 1 - 3 - 8 = 22 tokens left, 6 rows, 3 batches.
    fresh.apply(cmd.Restore(state))
    # a state taken again before the resumed epoch's first batch keeps the split documents
    assert fresh.state_at(0, 0) == state
    fresh.apply(cmd.Register(0, 1, 0, 1))
    assert fresh.plan(0).ranks[0].batches == 3


def test_numpy_integer_token_ids_are_plain_ints_in_the_fingerprint():
    packing = Packing(column="tokens", seq_len=8, separator=np.int64(7), pad_id=np.int32(0))
    assert type(packing.separator) is int and type(packing.pad_id) is int
    assert LoaderConfig(packing=packing).fingerprint("tokens", 3)  # JSON: no TypeError


def test_a_null_token_is_named_also_in_a_sliced_batch():
    tokens = pa.array([[None], [1, 2], [3], [4, None]], pa.list_(pa.int32()))
    sliced = pa.table({"tokens": tokens}).slice(1)  # the first row's null is outside
    with pytest.raises(DataError, match=r"sample 2 of .* has a null token"):
        token_lengths(TableSource(sliced), Packing(column="tokens", seq_len=8))


def test_the_driver_check_leaves_out_a_source_the_mix_gives_no_samples():
    long = TableSource(table([50]))
    mixed = MixedSource([TableSource(table([3, 4, 5])), long], counts=[3, 0])
    packing = Packing(column="tokens", seq_len=8, split_documents=False)
    check_packing_input(mixed, packing, None, None)  # the 50-token document is never read
    with pytest.raises(DataError, match="has 50 tokens"):
        check_packing_input(MixedSource([long], counts=[1]), packing, None, None)


@pytest.mark.parametrize("epoch", [0, 1, 3])
def test_a_mix_epochs_token_lengths_are_gathered_from_each_sources_own(tmp_path, epoch):
    # Parquet files of two writers' shapes; the mix repeats one source and samples the other
    paths = []
    for name, lengths in (("a", [1, 5, 0, 7, 2]), ("b", [3, 9, 4, 6, 8, 2, 11])):
        pq.write_table(table(lengths), tmp_path / f"{name}.parquet", row_group_size=2)
        paths.append(ParquetSource([str(tmp_path / f"{name}.parquet")]))
    mixed = MixedSource(paths, counts=[12, 4])
    packing = Packing(column="tokens", seq_len=8)
    gathered = mix_token_lengths(
        mixed.mix(5), epoch, [token_lengths(part, packing) for part in paths]
    )
    assert gathered.tolist() == token_lengths(mixed.for_epoch(epoch, 5), packing).tolist()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("lengths", [[4, 0, 0], [4, 4, 0], [3, 1, 0, 0]])
def test_empty_documents_after_the_last_token_join_its_row(fast, lengths):
    # not a row of their own: no step without a real token, and `_padded` keeps its meaning
    spec = Packing(column="tokens", seq_len=4).spec
    planned = count_rows(enumerate(lengths), spec)
    assert planned == sum(lengths) // 4 == count_split_rows(np.array(lengths), spec)
    out = list(
        packed_batches(
            rows_of(table(lengths), [(0, len(lengths))]),
            Packing(column="tokens", seq_len=4),
            1,
            {},
            planned,
            fast=fast,
        )
    )
    assert len(out) == planned and all(b["mask"].all() for b in out)
    assert sorted(i for b in out for i in b[COMPLETED_KEY].tolist()) == list(range(len(lengths)))
