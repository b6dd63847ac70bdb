"""Coverage audit: an actor that collects the sample ids every consumer received, per
epoch, and reports what was lost or seen twice. Used by the demo, the tests and the
elastic experiments; it works across nodes because it is a Ray actor."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from rayshard.runtime.remote import remote_class


class CoverageAudit:
    """Counts of received sample ids per epoch (kept as numpy counters)."""

    def __init__(self, num_samples: int) -> None:
        self._num_samples = num_samples
        self._counts: dict[int, np.ndarray] = {}
        self._batches: Counter = Counter()

    def add(self, epoch: int, ids: Any) -> None:
        """Count the sample ids of one batch of `epoch`; ids outside 0..num_samples-1 are a
        `ValueError` naming them, and nothing of that batch is counted (a negative id
        would otherwise count the sample that many from the end)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self._num_samples)]
        if bad.size:
            raise ValueError(
                f"sample ids {sorted(set(bad.tolist()))[:10]} of epoch {epoch} are outside "
                f"0..{self._num_samples - 1} (num_samples={self._num_samples}): give the "
                "audit the dataset's sample count and the batches' `_index` ids"
            )
        counts = self._counts.setdefault(epoch, np.zeros(self._num_samples, dtype=np.int32))
        np.add.at(counts, ids, 1)
        self._batches[epoch] += 1

    def seen(self) -> dict[int, int]:
        """Samples received so far per epoch (duplicates included)."""
        return {e: int(c.sum()) for e, c in self._counts.items()}

    def report(self) -> dict[int, dict[str, int]]:
        """Per epoch: samples seen, distinct, lost (never seen) and duplicates."""
        return {
            epoch: {
                "seen": int(counts.sum()),
                "distinct": int((counts > 0).sum()),
                "lost": int((counts == 0).sum()),
                "duplicates": int(np.clip(counts - 1, 0, None).sum()),
                "batches": self._batches[epoch],
            }
            for epoch, counts in sorted(self._counts.items())
        }


def start_audit(num_samples: int, name: str | None = None) -> Any:
    """Start a `CoverageAudit` actor (no CPU reserved)."""
    options: dict[str, Any] = {"num_cpus": 0}
    if name:
        options["name"] = name
    return remote_class(CoverageAudit).options(**options).remote(num_samples)


def format_report(report: dict[int, dict[str, int]]) -> str:
    """`CoverageAudit.report()` as a table: epoch, seen, lost, duplicates."""
    lines = [f"{'epoch':>5} {'seen':>8} {'lost':>6} {'duplicates':>10}"]
    for epoch, row in report.items():
        lines.append(f"{epoch:>5} {row['seen']:>8} {row['lost']:>6} {row['duplicates']:>10}")
    return "\n".join(lines)
