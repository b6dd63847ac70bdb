"""The experiment schedule: a YAML file, validated before any node starts.

```yaml
rows: 20000            # samples in the generated dataset (or `data:` a Parquet path)
batch_size: 128
epochs: 2
step_time_s: 0.02      # simulated model time per batch
initial_nodes: 2       # worker nodes (one consumer rank each) at the start
node_cpus: 1
duration_s: 120        # give up after this long
events:
  - {at: 5, action: add_node}
  - {at: 12, action: kill_node}               # hard loss: the node's processes die
  - {at: 20, action: remove_node, node: 1}    # graceful: the rank leaves, then the node goes
```
`node` is the index of a worker node in order of creation (default: the oldest alive).
The events are checked in time order before anything starts: each takes a node that is
alive then, at least one node stays, and each comes before `duration_s`.
`at` is the earliest time: a `kill_node` or `remove_node` waits, past it, until that node's
rank has delivered a batch, so a loss always takes a rank that holds work; later events
wait behind it.

With `autoscaler: true` (optional `max_workers`, default 4, and `idle_timeout_s`, default
5) Ray's fake-multinode autoscaler owns the nodes (`rayshard_experiments.autoscaling`):
`initial_nodes` and `add_node` demand consumer ranks that need a worker-only resource,
so the autoscaler adds a node for each; `remove_node` makes a rank (`node`: its index in
order of demand) leave, once it has started, and its node is scaled down once idle: the run
holds its other ranks until that node is gone (or `duration_s` ran out, reported as
`not_scaled_down_in_run`). `kill_node` is refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from rayshard.config.checks import check_int, check_number, load_yaml_file
from rayshard.errors import ConfigError

ACTIONS = ("add_node", "kill_node", "remove_node")


@dataclasses.dataclass(frozen=True)
class Event:
    """One scheduled change of the cluster."""

    at: float
    action: str
    node: int | None = None


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A validated experiment schedule (see module docstring)."""

    rows: int = 20_000
    data: str | None = None
    batch_size: int = 128
    epochs: int = 2
    step_time_s: float = 0.02
    initial_nodes: int = 2
    node_cpus: int = 1
    duration_s: float = 120.0
    seed: int = 0
    events: tuple[Event, ...] = ()
    # Fake-multinode autoscaler mode (see the module docstring).
    autoscaler: bool = False
    max_workers: int = 4
    idle_timeout_s: float = 5.0


def load_schedule(path: str) -> Schedule:
    """Read and validate a schedule file; errors name the file, the key and the fix."""
    document = load_yaml_file(path, "schedule file")
    return parse_schedule(document if document is not None else {}, source=path)


def parse_schedule(document: Any, source: str = "schedule") -> Schedule:
    """Validate a schedule given as a mapping."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{source}: a schedule is a mapping of settings, got {document!r}")
    known = {f.name for f in dataclasses.fields(Schedule)}
    unknown = sorted(map(str, set(document) - known))
    if unknown:
        raise ConfigError(
            f"{source}: unknown keys {unknown}; known keys are {', '.join(sorted(known))}"
        )
    values = dict(document)
    for key, minimum in (("rows", 1), ("batch_size", 1), ("epochs", 1), ("node_cpus", 1)):
        if key in values:
            _int(values[key], key, minimum, source)
    for key, minimum in (("initial_nodes", 1), ("seed", 0)):
        if key in values:
            _int(values[key], key, minimum, source)
    if "step_time_s" in values:
        _number(values["step_time_s"], "step_time_s", source)
    if "duration_s" in values:
        _located(source, check_number, values["duration_s"], "duration_s", fix="seconds")
    if "data" in values:
        _check_data(values, source)
    events = values.pop("events", None)
    if not isinstance(events, list | None):
        raise ConfigError(f"{source}: events must be a list of {{at, action}} entries")
    parsed = [(i, _event(entry, i, source)) for i, entry in enumerate(events or [])]
    indexed = sorted(parsed, key=lambda pair: pair[1].at)  # (stable: equal times keep order)
    values["events"] = tuple(event for _, event in indexed)
    _check_autoscaler(values, source)
    _check_nodes(Schedule(**values), [i for i, _ in indexed], source)
    return Schedule(**values)


def _check_data(values: dict, source: str) -> None:
    data = values["data"]
    if not isinstance(data, str) or not data:
        raise ConfigError(f"{source}: data={data!r} must be a Parquet file or folder path")
    if "://" not in data and not os.path.exists(data):
        raise ConfigError(f"{source}: data={data!r}: no such file or folder")
    if "rows" in values:
        raise ConfigError(f"{source}: rows and data: rows sizes generated data; give one")


def _check_nodes(schedule: Schedule, indices: list[int], source: str) -> None:
    """Walk the events in time order: each removal takes a node (with the autoscaler, a
    rank) alive then, one stays alive throughout, the autoscaler is never asked for more
    than `max_workers` at once, and every event comes before `duration_s`."""
    what = "rank" if schedule.autoscaler else "node"
    alive, created = list(range(schedule.initial_nodes)), schedule.initial_nodes
    limit = schedule.max_workers if schedule.autoscaler else None
    if limit is not None and created > limit:
        raise ConfigError(f"{source}: initial_nodes={created} is over max_workers={limit}")
    for index, event in zip(indices, schedule.events):
        where = f"{source}: events[{index}] ({event.action} at {event.at:g} s)"
        if event.at >= schedule.duration_s:
            raise ConfigError(
                f"{where} comes after duration_s={schedule.duration_s:g}, so it would never "
                "run: raise duration_s or drop the event"
            )
        if event.action == "add_node":
            alive, created = [*alive, created], created + 1
            if limit is not None and len(alive) > limit:
                raise ConfigError(f"{where}: {len(alive)} ranks at once, over max_workers={limit}")
            continue
        node = alive[0] if event.node is None else event.node
        if node not in alive:
            gone = "was removed before" if node < created else "does not exist yet"
            raise ConfigError(
                f"{where}: {what} {node} {gone} (alive then: {alive}; {what}s are numbered "
                "from 0 in order of creation)"
            )
        if len(alive) == 1:
            raise ConfigError(
                f"{where} takes the last {what} ({node}): no rank would be left to finish; "
                "add a node before it"
            )
        alive.remove(node)


def _check_autoscaler(values: dict, source: str) -> None:
    """The autoscaler mode's keys; it cannot kill nodes (the autoscaler owns them)."""
    mode = values.get("autoscaler", False)
    if not isinstance(mode, bool):
        raise ConfigError(f"{source}: autoscaler={mode!r} must be true or false")
    if "max_workers" in values:
        _int(values["max_workers"], "max_workers", 1, source)
    if "idle_timeout_s" in values:
        _number(values["idle_timeout_s"], "idle_timeout_s", source)
    if not mode:
        for key in ("max_workers", "idle_timeout_s"):
            if key in values:
                raise ConfigError(f"{source}: {key} needs autoscaler: true")
        return
    for event in values["events"]:
        if event.action == "kill_node":
            raise ConfigError(
                f"{source}: the kill_node event at {event.at:g} s is not supported with "
                "autoscaler: true (the autoscaler owns the nodes); use remove_node"
            )


def _event(entry: Any, index: int, source: str) -> Event:
    where = f"{source}: events[{index}]"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where} must be a mapping like {{at: 5, action: add_node}}")
    unknown = sorted(set(entry) - {"at", "action", "node"})
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; use at, action and node")
    if "at" not in entry or "action" not in entry:
        raise ConfigError(f"{where} needs both 'at' (seconds) and 'action'")
    at = _number(entry["at"], "at", where)
    action = entry["action"]
    if action not in ACTIONS:
        raise ConfigError(f"{where}: action={action!r} is not one of {', '.join(ACTIONS)}")
    node = entry.get("node")
    if node is not None:
        _int(node, "node", 0, where)
    return Event(at=at, action=action, node=node)


def _int(value: Any, key: str, minimum: int, where: str) -> int:
    return _located(where, check_int, value, key, minimum=minimum)


def _number(value: Any, key: str, where: str) -> float:
    return _located(where, check_number, value, key, positive=False, fix="seconds")


def _located(where: str, check: Any, *args: Any, **kwargs: Any) -> Any:
    """`check(*args, **kwargs)`, its `ConfigError` prefixed with `where` in the file."""
    try:
        return check(*args, **kwargs)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
