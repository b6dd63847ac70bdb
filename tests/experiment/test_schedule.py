"""The experiment schedule parser: valid files load sorted; bad files fail clearly."""

from __future__ import annotations

import pytest

from rayshard.errors import ConfigError
from rayshard_experiments.schedule import Event, load_schedule, parse_schedule


def test_valid_schedule_is_sorted_and_typed(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "rows: 1000\nepochs: 1\nevents:\n"
        "  - {at: 12, action: kill_node, node: 0}\n  - {at: 5, action: add_node}\n"
    )
    schedule = load_schedule(str(path))
    assert schedule.rows == 1000 and schedule.epochs == 1
    assert schedule.events == (Event(5.0, "add_node"), Event(12.0, "kill_node", 0))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"rowz": 10}, r"unknown keys \['rowz'\]"),
        ({"rows": 0}, r"^s.yaml: rows=0 is not in the range rows>=1$"),
        ({"rows": 1.5}, r"^s.yaml: rows=1.5 must be an integer >= 1$"),
        ({"step_time_s": -1}, r"step_time_s=-1 is not in the range step_time_s>=0 \(seconds\)"),
        ({"events": {"at": 1}}, r"events must be a list"),
        ({"events": [{"at": 1, "action": "explode"}]}, r"events\[0\]: action='explode'"),
        ({"events": [{"action": "add_node"}]}, r"events\[0\] needs both 'at'"),
        (
            {"events": [{"at": 1, "action": "kill_node", "node": -2}]},
            r"^s.yaml: events\[0\]: node=-2 is not in the range node>=0$",
        ),
        ({"events": [{"at": 1, "action": "add_node", "when": 3}]}, r"unknown keys \['when'\]"),
        (["add_node"], r"a schedule is a mapping"),
        ({1: 2, "foo": 3}, r"unknown keys \['1', 'foo'\]"),
        ({"seed": -1}, r"seed=-1 is not in the range seed>=0"),
        ({"duration_s": 0}, r"duration_s=0 is not in the range duration_s>0"),
        ({"events": ""}, r"events must be a list"),
        ({"data": 123}, r"data=123 must be a Parquet file or folder path"),
        ({"data": "/nowhere/x.parquet"}, r"data='/nowhere/x.parquet': no such file"),
        ({"data": "s3://b/x", "rows": 5}, r"rows and data"),
        # each removal takes a node alive then; one stays; all before duration_s
        (
            {"events": [{"at": 1, "action": "kill_node", "node": 7}]},
            r"events\[0\] \(kill_node at 1 s\): node 7 does not exist yet \(alive then: \[0, 1\]",
        ),
        (
            {
                "events": [
                    {"at": 9, "action": "remove_node", "node": 0},
                    {"at": 2, "action": "add_node"},
                    {"at": 4, "action": "kill_node"},  # the oldest: node 0
                ]
            },
            r"events\[0\] \(remove_node at 9 s\): node 0 was removed before \(alive then: \[1, 2\]",
        ),
        (
            {"initial_nodes": 1, "events": [{"at": 1, "action": "kill_node"}]},
            r"takes the last node \(0\): no rank would be left",
        ),
        (
            {"duration_s": 10, "events": [{"at": 500, "action": "add_node"}]},
            r"events\[0\] \(add_node at 500 s\) comes after duration_s=10",
        ),
        (
            {"autoscaler": True, "max_workers": 2, "events": [{"at": 1, "action": "add_node"}]},
            r"3 ranks at once, over max_workers=2",
        ),
        ({"autoscaler": True, "max_workers": 1}, r"initial_nodes=2 is over max_workers=1"),
    ],
)
def test_bad_schedules_name_the_problem(document, message):
    with pytest.raises(ConfigError, match=message):
        parse_schedule(document, source="s.yaml")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such schedule file"):
        load_schedule(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("events: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_schedule(str(bad))
