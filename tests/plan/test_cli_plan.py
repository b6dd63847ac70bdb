"""`rayshard plan`: readable table, documented JSON shape that agrees with the planner,
click-style usage errors (exit 2) naming the flag or value."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayshard.cli import main
from rayshard.config.env import PLAN_VARIABLES
from rayshard.plan import DataLayout, PlanConfig, plan_epoch

CLEAN_ENV = {variable: None for variable in PLAN_VARIABLES.values()}  # None: unset


def invoke(*args: str, env: dict | None = None):
    runner = CliRunner()
    return runner.invoke(main, ["plan", *args], env={**CLEAN_ENV, **(env or {})})


def plan_json(*args: str, env: dict | None = None) -> dict:
    result = invoke(*args, "--format", "json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_has_the_documented_shape():
    doc = plan_json("--samples", "8", "--world-size", "2", "--batch-size", "2")
    assert_documented_types(doc)
    keys = ("rank", "shard", "ranges", "samples", "padded", "batches")
    documented = [  # extra keys are allowed: keep only the documented ones
        {"epoch": e["epoch"], "ranks": [{k: r[k] for k in keys} for r in e["ranks"]]}
        for e in doc["epochs"]
    ]
    assert documented == [
        {
            "epoch": 0,
            "ranks": [
                {
                    "rank": 0,
                    "shard": 0,
                    "ranges": [[0, 4]],
                    "samples": 4,
                    "padded": 0,
                    "batches": 2,
                },
                {
                    "rank": 1,
                    "shard": 1,
                    "ranges": [[4, 8]],
                    "samples": 4,
                    "padded": 0,
                    "batches": 2,
                },
            ],
        }
    ]


def assert_documented_types(doc: dict) -> None:
    assert isinstance(doc["epochs"], list) and isinstance(doc["shuffled"], bool)
    for epoch in doc["epochs"]:
        assert isinstance(epoch["epoch"], int)
        for rank in epoch["ranks"]:
            assert isinstance(rank["rank"], int)
            assert rank["shard"] is None or isinstance(rank["shard"], int)
            assert all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r)
                for r in rank["ranges"]
            )
            for key in ("samples", "padded", "batches"):
                assert isinstance(rank[key], int) and rank[key] >= 0


@st.composite
def cli_cases(draw):
    w = draw(st.integers(1, 6))
    rotation = draw(st.sampled_from(["none", "shift", "stride", "stride_shift"]))
    if rotation == "none":
        s = w
    elif rotation.startswith("stride"):
        s = w * draw(st.integers(1, 3))
    else:
        s = draw(st.integers(w, 2 * w))
    options = {
        "batch_size": draw(st.integers(1, 8)),
        "total_shards": s,
        "rotation": rotation,
        "last_batch": draw(st.sampled_from(["partial", "drop", "fill"])),
        "pad_last_batch": draw(st.booleans()),
        "equal_steps": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)),
    }
    by_files = draw(st.booleans())
    if by_files:
        options["uneven"] = draw(st.sampled_from(["replicate", "unbalanced", "drop"]))
        files = draw(st.integers(1 if options["uneven"] == "replicate" else s, s + 10))
        rows = draw(st.integers(0, 5))
    else:
        files, rows = None, None
    samples = draw(st.one_of(st.integers(0, 100), st.integers(0, 10**7)))
    return options, w, samples, files, rows, draw(st.integers(1, 4))


def cli_args(options, w, samples, files, rows, epochs):
    args = ["--world-size", str(w), "--epochs", str(epochs)]
    if files is None:
        args += ["--samples", str(samples)]
    else:
        args += ["--files", str(files), "--rows-per-file", str(rows), "--uneven", options["uneven"]]
    args += [
        "--batch-size",
        str(options["batch_size"]),
        "--total-shards",
        str(options["total_shards"]),
    ]
    args += ["--rotation", options["rotation"], "--last-batch", options["last_batch"]]
    args += ["--pad-last-batch" if options["pad_last_batch"] else "--no-pad-last-batch"]
    args += ["--equal-steps" if options["equal_steps"] else "--no-equal-steps"]
    args += ["--seed", str(options["seed"])]
    return args


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cli_cases(), st.booleans())
def test_json_agrees_with_the_python_planner(case, shuffled):
    options, w, samples, files, rows, epochs = case
    doc = plan_json(*cli_args(*case), *(["--shuffle"] if shuffled else []))
    assert_documented_types(doc)
    assert doc["shuffled"] is shuffled
    config = PlanConfig(**options)
    by_files = files is not None
    layout = DataLayout.of_files([rows] * files) if by_files else DataLayout.of_samples(samples)
    assert [e["epoch"] for e in doc["epochs"]] == list(range(epochs))
    for e, epoch_doc in enumerate(doc["epochs"]):
        plan = plan_epoch(config, layout, w, e, by_files=by_files, shuffled=shuffled)
        assert len(epoch_doc["ranks"]) == w
        for rank_doc, rank in zip(epoch_doc["ranks"], plan.ranks):
            assert rank_doc["rank"] == rank.rank
            assert rank_doc["shard"] == rank.shard
            assert (rank_doc["samples"], rank_doc["padded"], rank_doc["batches"]) == (
                rank.samples,
                rank.padded,
                rank.batches,
            )
            if by_files:  # ranges are file ranges, sample_ranges the samples
                assert rank_doc["ranges"] == [list(r) for r in rank.files]
                assert rank_doc["sample_ranges"] == [list(r) for r in rank.ranges]
            else:
                assert rank_doc["ranges"] == [list(r) for r in rank.ranges]


def test_table_is_readable():
    result = invoke("--samples", "10", "--world-size", "3", "--batch-size", "2", "--epochs", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "10 samples" in lines[0] and "rotation=shift" in lines[0] and "batch_size=2" in lines[0]
    header = lines[1].split()
    assert header[:3] == ["epoch", "rank", "shard"]
    assert {"samples", "padded", "dropped", "batches"} <= set(header)
    assert set(lines[2]) <= {"-", " "}
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == 6  # 2 epochs x 3 ranks
    assert rows[0] == ["0", "0", "0", "[0,3)", "3", "0", "0", "2"]
    assert rows[3] == ["1", "0", "1", "[3,6)", "3", "0", "0", "2"]  # shift rotation
    # Columns line up: every row starts its shard column where the header does.
    column = lines[1].index("shard")
    assert all(line[column - 2 : column] == "  " for line in lines[3:])


def test_table_in_file_mode_names_files_and_replicate_shows_all():
    result = invoke("--files", "3", "--world-size", "2", "--uneven", "replicate")
    assert result.exit_code == 0, result.output
    assert "3 samples in 3 files" in result.output
    assert "file ranges" in result.output
    rows = [line.split() for line in result.output.splitlines()[3:]]
    assert [row[2] for row in rows] == ["all", "all"]
    # every file, each rank in its own seeded order
    orders = [row[3:6] for row in rows]
    assert all(sorted(order) == ["[0,1)", "[1,2)", "[2,3)"] for order in orders), orders
    assert orders[0] != orders[1]


def test_table_with_no_samples_shows_a_dash():
    result = invoke("--samples", "0", "--world-size", "2")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[3:]]
    assert rows == [
        ["0", "0", "0", "-", "0", "0", "0", "0"],
        ["0", "1", "1", "-", "0", "0", "0", "0"],
    ]


def test_environment_applies_and_flags_win():
    env = {"RAYSHARD_ROTATION": "stride", "RAYSHARD_LAST_BATCH": "drop"}
    base = ("--samples", "8", "--world-size", "2", "--total-shards", "4", "--epochs", "2")
    doc = plan_json(*base, "--batch-size", "3", env=env)
    assert doc["config"]["rotation"] == "stride" and doc["config"]["last_batch"] == "drop"
    assert [r["shard"] for r in doc["epochs"][1]["ranks"]] == [2, 3]
    assert [r["batches"] for r in doc["epochs"][0]["ranks"]] == [0, 0]  # shards of 2 < B=3
    doc = plan_json(*base, "--rotation", "shift", "--batch-size", "3", env=env)
    assert doc["config"]["rotation"] == "shift"
    assert [r["shard"] for r in doc["epochs"][1]["ranks"]] == [1, 2]


def test_every_planning_variable_applies_unless_a_flag_is_given():
    env = {"RAYSHARD_EQUAL_STEPS": "0", "RAYSHARD_SEED": "5", "RAYSHARD_PAD_LAST_BATCH": "0"}
    base = ("--samples", "10", "--world-size", "3", "--batch-size", "1")
    config = plan_json(*base, env=env)["config"]
    assert (config["equal_steps"], config["seed"]) == (False, 5)
    assert [r["batches"] for r in plan_json(*base, env=env)["epochs"][0]["ranks"]] == [3, 3, 4]
    flags = plan_json(*base, "--equal-steps", "--seed", "7", env=env)["config"]
    assert (flags["equal_steps"], flags["seed"]) == (True, 7)
    assert plan_json(*base)["config"]["equal_steps"] is True  # the default without either


def test_case_insensitive_choices():
    doc = plan_json("--samples", "4", "--world-size", "2", "--rotation", "SHIFT")
    assert doc["config"]["rotation"] == "shift"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--samples", "10", "--world-size", "0"], ["'--world-size'", "0"]),
        (["--samples", "10"], ["'--world-size'"]),
        (["--samples", "-1", "--world-size", "2"], ["'--samples'", "-1"]),
        (["--samples", "10", "--world-size", "2", "--batch-size", "0"], ["'--batch-size'", "0"]),
        (["--samples", "10", "--world-size", "2", "--epochs", "0"], ["'--epochs'", "0"]),
        (["--samples", "10", "--world-size", "2", "--total-shards", "0"], ["'--total-shards'"]),
        (["--samples", "10", "--world-size", "2", "--rotation", "spin"], ["'--rotation'", "spin"]),
        (["--samples", "10", "--world-size", "2", "--format", "xml"], ["'--format'", "xml"]),
        (["--samples", "3", "--files", "3", "--world-size", "2"], ["--samples", "--files"]),
        (["--world-size", "2"], ["--samples", "--files"]),
        (["--samples", "10", "--world-size", "3", "--uneven", "drop"], ["--uneven", "file mode"]),
        (
            ["--samples", "10", "--world-size", "2", "--rows-per-file", "3"],
            ["--rows-per-file", "file mode"],
        ),
        (
            ["--samples", "10", "--world-size", "4", "--total-shards", "6", "--rotation", "stride"],
            ["total_shards=6", "world_size=4", "stride"],
        ),
        (
            ["--samples", "10", "--world-size", "4", "--total-shards", "2"],
            ["world_size=4", "total_shards=2"],
        ),
        (
            ["--files", "2", "--world-size", "4"],
            ["2 files", "4 shards", "replicate"],
        ),
        (
            ["--samples", "10", "--world-size", "3", "--total-shards", "6", "--rotation", "none"],
            ["rotation='none'", "total_shards=6", "world_size=3"],
        ),
    ],
)
def test_bad_flags_exit_2_with_a_click_style_message(args, needles):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Usage: " in result.output and "Error: " in result.output
    error = result.output[result.output.index("Error: ") :]
    for needle in needles:
        assert needle in error, error
    assert "Traceback" not in result.output


def test_bad_environment_value_is_a_usage_error():
    result = invoke("--samples", "4", "--world-size", "2", env={"RAYSHARD_ROTATION": "spin"})
    assert result.exit_code == 2, result.output
    assert "rotation='spin'" in result.output


def test_help_lists_the_flags():
    result = invoke("--help")
    assert result.exit_code == 0
    for flag in (
        "--samples",
        "--files",
        "--world-size",
        "--total-shards",
        "--rotation",
        "--format",
    ):
        assert flag in result.output


def test_every_planning_option_is_a_plan_config_field_with_its_default():
    import dataclasses

    from rayshard.cli.plan_cmd import NOT_PLANNING, plan_command

    fields = {f.name: f.default for f in dataclasses.fields(PlanConfig)}
    given = plan_command.make_context("plan", ["--samples", "1", "--world-size", "1"]).params
    options = {name: value for name, value in given.items() if name not in NOT_PLANNING}
    assert set(options) == set(fields) - {"expected_world_size"}  # the plan is for W
    for name, default in options.items():
        assert default is None or default == fields[name], name  # None: env, else default
    doc = plan_json("--samples", "8", "--world-size", "2")
    assert doc["config"] == PlanConfig().to_dict()
