"""The journal writes a batch of commands (a relay's groups, answered together) once, at
the batch's end, and each command outside a batch at once; a closed journal writes
nothing more (real files, no Ray)."""

from __future__ import annotations

import json

from rayshard.runtime.journal import Journal


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_is_written_at_its_end_and_single_entries_at_once(tmp_path):
    path = tmp_path / "loader.jsonl"
    journal = Journal(str(path), "loader-1")
    journal.start_fresh()
    journal.append({"op": "ack", "n": 0})
    assert [e.get("n") for e in _lines(path)] == [None, 0]  # the header, then the entry
    with journal.batched():
        journal.append({"op": "ack", "n": 1})
        journal.append({"op": "ack", "n": 2})
        assert len(_lines(path)) == 2  # not written yet: the batch is answered together
    assert [e.get("n") for e in _lines(path)] == [None, 0, 1, 2]
    journal.append({"op": "ack", "n": 3})  # after a batch: at once again
    assert _lines(path)[-1] == {"op": "ack", "n": 3}
    assert [e["n"] for e in journal.replay()] == [0, 1, 2, 3]


def test_a_closed_journal_writes_nothing_more_and_a_removed_one_stays_gone(tmp_path):
    """`close(remove=...)` (`Loader.shutdown`, before the coordinator is killed): no entry,
    batch or compaction after it writes the file, so a removed default journal is not made
    again by a last call the coordinator still handles; a kept one keeps what it held."""
    kept, removed = tmp_path / "user.jsonl", tmp_path / "default.jsonl"
    for path in (kept, removed):
        journal = Journal(str(path), "loader-1")
        journal.start_fresh()
        journal.append({"op": "ack", "n": 0})
        journal.close(remove=path == removed)
        journal.append({"op": "ack", "n": 1})
        with journal.batched():
            journal.append({"op": "ack", "n": 2})
        journal.compact({"epoch": 3})
    assert not removed.exists() and not (tmp_path / "default.jsonl.compact").exists()
    assert [e.get("n") for e in _lines(kept)] == [None, 0]
