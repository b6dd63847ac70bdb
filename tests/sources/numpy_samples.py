"""A map-style dataset of numpy samples that imports no torch (importable by Ray's
workers): a process reading it has torch only if something else imported it."""

from __future__ import annotations

import numpy as np


class NumpySamples:
    """`n` samples {"id": int64, "x": float32[4]}."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"id": np.int64(i), "x": np.full(4, i, dtype=np.float32)}


class GatedSamples(NumpySamples):
    """`NumpySamples` whose samples from `gate_from` on wait for `GATE` while it is armed
    (set to an Event in the reading process; `ENTERED` is set as a read starts waiting):
    a read that blocks in the user's code, for as long as a test wants."""

    GATE = None
    ENTERED = None

    def __init__(self, n: int, gate_from: int) -> None:
        super().__init__(n)
        self.gate_from = gate_from

    def __getitem__(self, i: int) -> dict:
        gate = type(self).GATE
        if gate is not None and i >= self.gate_from:
            type(self).ENTERED.set()
            gate.wait()
        return super().__getitem__(i)
