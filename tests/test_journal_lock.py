"""One live coordinator per journal: a second one given the same path is refused at its
start (and by the driver's check), naming the path, while a restart takes the journal of
its dead predecessor over. Real processes and files, no Ray: the holder is a child
process (record locks belong to a process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rayshard.errors import ConfigError
from rayshard.runtime.journal import Journal

HOLDER = """
import sys, time
from rayshard.runtime.journal import Journal
journal = Journal(sys.argv[1], "loader-1")
journal.replay() if sys.argv[2] == "restart" else journal.start_fresh()
journal.append({"op": "ack", "n": 1})
print("ready", flush=True)
if sys.argv[3] == "close":
    journal.close(remove=False)
    print("closed", flush=True)
time.sleep(3600)
"""


def _holder(path, how: str = "fresh", then: str = "") -> subprocess.Popen:
    """A child process journaling to `path` (a coordinator), until it is killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how, then], stdout=subprocess.PIPE
    )
    assert child.stdout.readline().strip() == b"ready"
    if then == "close":
        assert child.stdout.readline().strip() == b"closed"
    return child


def _end(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()


def test_a_journal_a_live_coordinator_holds_is_refused_naming_it(tmp_path):
    path = tmp_path / "shared.jsonl"
    child = _holder(path)
    try:
        message = rf"journal_path='{path}' is in use: .*give each loader its own journal_path"
        with pytest.raises(ConfigError, match=message):
            Journal(str(path), "loader-1").check_reusable()  # the driver's check
        with pytest.raises(ConfigError, match=message):
            Journal(str(path), "loader-1").start_fresh()  # a second coordinator
        with pytest.raises(ConfigError, match=message):
            Journal(str(path), "loader-1").start_fresh(replace_any=True)  # a default path
    finally:
        _end(child)
    assert [e["n"] for e in Journal(str(path), "loader-1").replay()] == [1]  # left whole


def test_a_restart_takes_the_journal_of_its_dead_predecessor_over(tmp_path):
    path = tmp_path / "journal.jsonl"
    _end(_holder(path))  # the coordinator's process died: Ray starts it again
    restarted = _holder(path, "restart")  # it replays and appends, holding the lock
    try:
        with pytest.raises(ConfigError, match="is in use"):
            Journal(str(path), "loader-1").start_fresh()
    finally:
        _end(restarted)
    assert [e["n"] for e in Journal(str(path), "loader-1").replay()] == [1, 1]


def test_a_closed_journal_is_free_for_a_new_loader_before_its_process_ends(tmp_path):
    path = tmp_path / "journal.jsonl"
    child = _holder(path, then="close")  # `Loader.shutdown`: closed, not killed yet
    try:
        journal = Journal(str(path), "loader-1")
        journal.check_reusable()
        journal.start_fresh()
        journal.close(remove=True)
        assert not path.exists() and not (tmp_path / "journal.jsonl.lock").exists()
    finally:
        _end(child)
