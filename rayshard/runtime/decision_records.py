"""What the coordinator records of a decision besides its journal: the gauges of leases
and of rows a lost rank gave back (`rayshard.runtime.metrics`) and, while tracing, its
trace of leases and rank losses (`Coordinator.trace`)."""

from __future__ import annotations

import time
from typing import Any

from rayshard.core import commands as cmd
from rayshard.runtime import metrics


def record(loader_id: str, command: cmd.Command, decision: Any, trace: list | None) -> None:
    """Set the gauges of loader `loader_id` for `decision` (the core's answer to
    `command`), and append a lease or a rank's loss to `trace` (None: not traced)."""
    if isinstance(decision, cmd.Leased):
        metrics.set_leases_outstanding(loader_id, decision.outstanding)
    elif isinstance(decision, cmd.RankLost | cmd.Registered) and decision.requeued_rows:
        metrics.record_reserved(loader_id, decision.requeued_rows)  # (lost, or replaced)
    if trace is not None and isinstance(decision, cmd.Leased | cmd.RankLost):
        pieces = decision.pieces if isinstance(decision, cmd.Leased) else decision.requeued
        trace.append((time.time(), command.kind, command.dp_rank, list(pieces)))


__all__ = ["record"]
