"""`CoverageAudit.add` refuses sample ids outside 0..num_samples-1, naming them, and counts
nothing of such a batch (no Ray: the actor's class in this process)."""

from __future__ import annotations

import numpy as np
import pytest

from rayshard.runtime.audit import CoverageAudit


@pytest.mark.parametrize("bad", [[-1], [4], [0, 4, -2]])
def test_ids_outside_the_samples_are_refused_and_nothing_of_the_batch_counted(bad):
    audit = CoverageAudit(4)
    audit.add(0, [0, 1, 2])
    with pytest.raises(ValueError, match=r"sample ids \[.*\] of epoch 0 are outside 0\.\.3"):
        audit.add(0, bad)
    assert audit.report()[0] == {"seen": 3, "distinct": 3, "lost": 1, "duplicates": 0, "batches": 1}


def test_ids_in_range_of_any_integer_array_are_counted():
    audit = CoverageAudit(3)
    audit.add(1, np.array([[0, 2], [2, 2]], dtype=np.int32))
    assert audit.report()[1] == {"seen": 4, "distinct": 2, "lost": 1, "duplicates": 2, "batches": 1}
