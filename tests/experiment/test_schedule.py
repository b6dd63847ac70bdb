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
