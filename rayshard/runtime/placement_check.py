"""A warning, at `Loader(...)`, for actor resources no node of the cluster offers.

Ray keeps an actor whose resources no node has pending, silently, until a node that has
them joins (an autoscaler may start one), so a loader asking for such resources would
wait at its first batch with no word. It is a warning, not an error: on an autoscaling
cluster the node may come later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)


def unplaceable(request: Mapping[str, float], nodes: Iterable[Mapping[str, float]]) -> bool:
    """Whether no node offers every resource of `request` in the amount asked."""
    wanted = {name: amount for name, amount in request.items() if amount > 0}
    return bool(wanted) and not any(
        all(node.get(name, 0.0) >= amount for name, amount in wanted.items()) for node in nodes
    )


def warn_if_unplaceable(option: str, request: Mapping[str, float]) -> bool:
    """Log a warning naming `option` when no alive node could run an actor asking for
    `request`; True if it warned."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if not unplaceable(request, nodes):
        return False
    offered = sorted({name for node in nodes for name in node if not name.startswith("node:")})
    log.warning(
        "%s asks for %s, which no node of this Ray cluster offers now (its nodes offer %s): "
        "the loader's first batch waits until a node that has them joins (an autoscaler may "
        "start one); otherwise ask for resources a node has",
        option,
        dict(request),
        ", ".join(offered),
    )
    return True


def warn_about_actor_resources(settings: Any) -> None:
    """The loader's own actor requests: reader actors (`reader_num_cpus`) and, with worker
    processes, their `transform_resources`."""
    if settings.transform_resources is not None and settings.worker_count > 1:
        warn_if_unplaceable("transform_resources", dict(settings.transform_resources))
    if settings.reader_num_cpus:
        warn_if_unplaceable("reader_num_cpus", {"CPU": settings.reader_num_cpus})


__all__ = ["unplaceable", "warn_about_actor_resources", "warn_if_unplaceable"]
