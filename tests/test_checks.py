"""`check_int`, the package's one integer check: what it accepts, what it refuses, with which
message and error type; that it stays a leaf; and that no other module writes its own
integer message (they all route through it)."""

from __future__ import annotations

import ast
import decimal
import fractions
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rayshard
import rayshard_experiments
from rayshard.config import checks
from rayshard.config.checks import check_int
from rayshard.errors import ConfigError

MINIMUMS = st.integers(-(10**6), 10**6)
NAMES = st.sampled_from(["batch_size", "counts[3]", "Dataset.total_shards", "x"])
NOT_INTEGERS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.integers().map(str),
    st.integers(-5, 5).map(float),  # 2.0 is still not an integer
    st.integers(-5, 5).map(decimal.Decimal),
    st.integers(-5, 5).map(fractions.Fraction),
    st.integers(-5, 5).map(np.int64),  # only with integral=True
    st.booleans().map(np.bool_),
)


@given(st.integers(-(10**9), 10**9), MINIMUMS, NAMES)
def test_an_int_passes_exactly_when_it_reaches_the_minimum(value, minimum, name):
    if value >= minimum:
        assert check_int(value, name, minimum=minimum) == value
        return
    with pytest.raises(ConfigError) as info:
        check_int(value, name, minimum=minimum, fix="the way out")
    assert type(info.value) is ConfigError
    assert str(info.value) == f"{name}={value} is not in the range {name}>={minimum} (the way out)"


@given(NOT_INTEGERS, MINIMUMS, NAMES)
def test_anything_but_an_int_is_refused_naming_the_option_and_value(value, minimum, name):
    with pytest.raises(ConfigError) as info:
        check_int(value, name, minimum=minimum)
    assert str(info.value) == f"{name}={value!r} must be an integer >= {minimum}"


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_refused_even_where_its_int_value_would_pass(value):
    with pytest.raises(ConfigError, match=rf"^flag={value} must be an integer >= 0$"):
        check_int(value, "flag", minimum=0)


def test_the_fix_is_appended_in_parentheses_and_left_out_when_empty():
    with pytest.raises(ConfigError, match=r"^n=0 is not in the range n>=1 \(the default is 2\)$"):
        check_int(0, "n", minimum=1, fix="the default is 2")
    with pytest.raises(ConfigError, match=r"^n=0 is not in the range n>=1$"):
        check_int(0, "n", minimum=1)
    with pytest.raises(ConfigError, match=r"^n='0' must be an integer >= 1 \(or None\)$"):
        check_int("0", "n", minimum=1, fix="or None")


@pytest.mark.parametrize("value", [np.int8(3), np.int64(3), np.uint32(3)])
def test_numpy_integers_pass_only_when_integral(value):
    with pytest.raises(ConfigError, match="must be an integer >= 0"):
        check_int(value, "count", minimum=0)
    assert check_int(value, "count", minimum=0, integral=True) == 3
    with pytest.raises(ConfigError, match=r"count=3 is not in the range count>=4"):
        check_int(value, "count", minimum=4, integral=True)


def test_integral_still_refuses_bools_and_floats():
    for value in (True, np.bool_(True), 1.0, np.float64(1.0)):
        with pytest.raises(ConfigError, match="must be an integer >= 0"):
            check_int(value, "count", minimum=0, integral=True)


@pytest.mark.parametrize("error", [ValueError, TypeError, ConfigError, KeyError])
@pytest.mark.parametrize("value", [-1, "1", 1.5, None])
def test_the_error_type_is_honoured_for_both_failures(error, value):
    with pytest.raises(error) as info:
        check_int(value, "epoch", minimum=0, error=error)
    assert type(info.value) is error  # ValueError stays a plain ValueError, not ConfigError
    assert "epoch=" in str(info.value)


@pytest.mark.parametrize(("value", "expected"), [(-1, ConfigError), ("1", TypeError)])
def test_type_error_is_raised_only_for_a_value_that_is_no_integer(value, expected):
    with pytest.raises(expected) as info:
        check_int(value, "world_size", minimum=1, type_error=TypeError)
    assert type(info.value) is expected


def test_checks_stays_a_leaf():
    """The planner and every layer import it, so it imports nothing of rayshard but errors."""
    tree = ast.parse(pathlib.Path(checks.__file__).read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert {name for name in imported if name and name.startswith("rayshard")} == {
        "rayshard.errors"
    }


# An integer rule spelled out by hand: "must be (or: set it to) an int(eger)", "a positive/
# non-negative integer", "is not >= 1", "must be >= 0", or check_int's "is not in the range
# x>=1". Best effort: a message worded otherwise ("is negative") is not caught.
HAND_WRITTEN = re.compile(
    r"(?:must be|to) an? (?:(?:positive|non-?negative) )?int(?:eger)?\b(?! token)"
    r"|is not >= ?(?:\d|\{\})"
    r"|must be >= ?(?:\d|\{\})"
    r"|is not in the range \S*>="
)


def _strings(tree: ast.AST) -> list[str]:
    """Every string literal of `tree`; an f-string whole, with `{}` where its values go."""
    out, pieces = [], set()
    for node in ast.walk(tree):  # breadth first: an f-string comes before its pieces
        if isinstance(node, ast.JoinedStr):
            pieces.update(id(v) for v in node.values)
            out.append(
                "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in pieces
        ):
            out.append(node.value)
    return out


def test_the_pattern_catches_the_old_hand_written_messages():
    tree = ast.parse(
        'f"epoch={epoch!r} must be an integer >= 0"\n'
        'f"{name} must be an int, got {value!r}"\n'
        'f"{name}={value} is not >= {minimum}"\n'
        'f"capacity={capacity} must be >= 1"\n'
        'f"world_size={n} is not in the range world_size>=1"\n'
        '"workers must be a positive integer"\n'
        '"a ShardedDataset must set total_shards to an integer >= 1"\n'
    )
    strings = _strings(tree)
    assert len(strings) == 7
    assert all(HAND_WRITTEN.search(s) for s in strings)
    assert not HAND_WRITTEN.search("separator=1.5 must be an integer token id")
    assert not HAND_WRITTEN.search("index=3 is not in the range 0 <= index < num_shards=3")


def test_no_module_but_checks_writes_its_own_integer_message():
    roots = [pathlib.Path(m.__file__).parent for m in (rayshard, rayshard_experiments)]
    own = pathlib.Path(checks.__file__).resolve()
    paths = sorted(path for root in roots for path in root.rglob("*.py"))
    assert len(paths) > 50
    found = [
        f"{path.parent.name}/{path.name}: {text!r}"
        for path in paths
        if path.resolve() != own
        for text in _strings(ast.parse(path.read_text(), str(path)))
        if HAND_WRITTEN.search(text)
    ]
    assert found == [], "route these through rayshard.config.checks.check_int"


def _set_epoch(epoch):
    from rayshard.runtime.iterator import ShardIterator

    ShardIterator.set_epoch(object.__new__(ShardIterator), epoch)  # checks before any state


def _channel(capacity):
    from rayshard.device._channel import Channel

    Channel(capacity)


def _thread_cpus(index):
    from rayshard.device.affinity import cpus_for_thread

    cpus_for_thread(index, (0,))


def _retarget(world_size):
    from rayshard.core import state_tools
    from rayshard.core.state import LoaderState

    state_tools.retarget(LoaderState("x", 0, 0, (), 1, 10), world_size)


@pytest.mark.parametrize(
    ("call", "value", "error", "message"),
    [
        (_set_epoch, -1, ValueError, r"^epoch=-1 is not in the range epoch>=0$"),
        (_set_epoch, 1.0, ValueError, r"^epoch=1.0 must be an integer >= 0$"),
        (_channel, 0, ValueError, r"^capacity=0 is not in the range capacity>=1$"),
        (_thread_cpus, -1, ValueError, r"^index=-1 is not in the range index>=0 \(a reader"),
        (_retarget, "4", TypeError, r"^world_size='4' must be an integer >= 1$"),
        (_retarget, 0, ConfigError, r"^world_size=0 is not in the range world_size>=1$"),
    ],
)
def test_sites_outside_configuration_keep_their_error_types(call, value, error, message):
    """Lower-level APIs raised a plain `ValueError` (or a `TypeError` for a non-integer)
    before they routed through `check_int`; they still do, in its message format."""
    with pytest.raises(error, match=message) as info:
        call(value)
    assert type(info.value) is error
