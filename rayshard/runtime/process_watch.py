"""One `RankWatch` per process, shared by every rank the process reads for.

Starting an actor is a new process (about 1 s of CPU, Ray does not reuse task workers
for actors); a process that makes several iterators (a train and a validation loader, a
second loader on a warm Ray, a test suite) pays it once. The watch is named after the
process's Ray worker id, so `get_if_exists` finds this process's own watch (and makes a
new one after Ray restarts, or if the watch died), and this module holds its handle:
Ray ends a named actor once no handle to it is left.
"""

from __future__ import annotations

import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayshard.runtime.remote import remote_class
from rayshard.runtime.watch import RankWatch

_held: dict[tuple[str, str], Any] = {}  # (namespace, name) -> handle, kept while we live
_lock = threading.Lock()


def process_watch(namespace: str) -> tuple[str, Any]:
    """The name and handle of this process's watch in `namespace` (made on first use, on
    this node: it must share the process's fate)."""
    context = ray.get_runtime_context()
    name = f"rayshard-watch-{context.get_worker_id()}"
    options = {
        "name": name,
        "namespace": namespace,
        "get_if_exists": True,
        "num_cpus": 0,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False),
    }
    with _lock:
        handle = remote_class(RankWatch).options(**options).remote()
        held = _held.get((namespace, name))
        # Keep the handle that made the actor: a handle `get_if_exists` found is not
        # counted as the owner's, and dropping the first one would end the watch.
        if held is not None and held._actor_id == handle._actor_id:
            return name, held
        _held[(namespace, name)] = handle
    return name, handle


__all__ = ["process_watch"]
