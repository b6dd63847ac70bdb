"""When a process's shared watch is unused (pure: `WatchUse`, no Ray)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rayshard.runtime.process_watch import WatchUse


def test_a_watch_expires_only_after_its_last_key_went_and_the_idle_time_passed():
    use = WatchUse("w", "node:worker")
    assert not use.expired(100.0, 5.0)  # never held a key: not idle yet
    use.hold("a")
    use.hold("b")
    assert not use.release("a", 1.0)  # "b" is still held
    assert not use.release("x", 1.5)  # a key it never held
    assert use.release("b", 2.0)  # the last one: idle from now
    assert not use.expired(6.9, 5.0) and use.expired(7.0, 5.0)
    use.hold("c")  # held again before it expired
    assert not use.expired(100.0, 5.0)
    assert use.release("c", 50.0) and not use.expired(54.0, 5.0) and use.expired(55.0, 5.0)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=30))
def test_a_watch_is_idle_exactly_when_it_holds_no_key(steps):
    use, held = WatchUse("w", "node:worker"), set()
    for now, (hold, key) in enumerate(steps):
        name = str(key)
        if hold:
            use.hold(name)
            held.add(name)
        else:
            became_idle = use.release(name, float(now))
            assert became_idle == (name in held and held == {name})
            held.discard(name)
        assert use.keys == held
        assert use.expired(now + 10.0, 10.0) == (not held and use.idle_since is not None)
