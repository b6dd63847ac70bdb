"""Split-mode packing with numpy, without a loop over documents: the rank's documents
(with separators, from their resume offsets) are concatenated and cut every
`batch_size * seq_len` tokens. The rows are those `rayshard.core.packing.plan_rows` makes
in split mode (tested against it); this is the readers' fast path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.core.packing import PackSpec
from rayshard.data.batching import FLUSH
from rayshard.runtime._packed_arrays import COMPLETED_KEY, packed_batch, placed, token_lists


class _Buffer:
    """Tokens not yet emitted, flat: token, position in its document, document, last."""

    def __init__(self) -> None:
        self.joined: tuple[np.ndarray, ...] | None = None  # the buffered tokens' arrays
        self.cursor = 0  # tokens of `joined` already taken
        self.size = 0
        self.dtype: Any = np.int64  # the token column's type, once a batch was seen
        self.empties: list[tuple[int, int]] = []  # (stream position, sample) of empty documents

    def add(self, batch: pa.RecordBatch, column: str, spec: PackSpec, offsets: Mapping) -> None:
        index, bounds, values = token_lists(batch, column)
        flat = values[bounds[0] : bounds[-1]]
        self.dtype = flat.dtype
        lengths = np.diff(bounds)  # (docs,)
        sep = spec.separator is not None
        if sep:  # a separator after every document
            flat = np.insert(flat, np.cumsum(lengths), spec.separator)
        sizes = lengths + sep  # (docs,) tokens a document occupies
        firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # (docs,) its first in `flat`
        # (tokens,) the document of every token, its offset in it, whether it is the last
        docs = np.repeat(index, sizes)
        pos = np.arange(len(flat)) - np.repeat(firsts, sizes)
        last = pos == np.repeat(sizes - 1, sizes)
        start = np.zeros(len(index), np.int64)
        resumed = np.flatnonzero(np.isin(index, list(offsets))) if offsets else ()
        for j in resumed:  # resumed documents start at their next token
            start[j] = offsets[int(index[j])]
        if len(resumed):
            keep = pos >= np.repeat(start, sizes)
            flat, docs, pos, last = flat[keep], docs[keep], pos[keep], last[keep]
        left = sizes - start  # (docs,) tokens still to deliver
        at = self.size + np.concatenate([[0], np.cumsum(left)[:-1]])  # (docs,) stream offsets
        self.empties += [(int(at[j]), int(index[j])) for j in np.flatnonzero(left == 0)]
        new = (flat, pos, docs, last)
        if self.joined is None:
            self.joined = new
        else:  # copies only what was not taken yet
            self.joined = tuple(
                np.concatenate([a[self.cursor :], b]) for a, b in zip(self.joined, new)
            )
        self.cursor = 0
        self.size += len(flat)

    def take(self, count: int) -> tuple[np.ndarray, ...]:
        """The first `count` tokens' arrays (and keeps the rest)."""
        if self.joined is None:
            return (np.zeros(0, self.dtype), np.zeros(0, np.int64), np.zeros(0, np.int64)) + (
                np.zeros(0, bool),
            )
        head = tuple(a[self.cursor : self.cursor + count] for a in self.joined)
        self.cursor += len(head[0])
        self.size -= len(head[0])
        return head

    def empties_before(self, position: int) -> list[int]:
        """Empty documents before stream position `position` (taken out)."""
        out = [i for p, i in self.empties if p < position]
        self.empties = [(p - position, i) for p, i in self.empties if p >= position]
        return out


def _batch(spec: PackSpec, pad_id: int, column: str, rows: int, head, done_extra, dtype) -> dict:
    """A batch of `rows` rows from flat `head` arrays (padded to `rows * seq_len`)."""
    flat, pos, docs, last = head
    n = len(flat)
    done = np.concatenate([docs[last], np.asarray(done_extra, np.int64)]).astype(np.int64)
    partial = np.zeros((0, 2), np.int64)
    if n and not last[-1] and docs[-1] not in set(done.tolist()):
        partial = np.array([[docs[-1], pos[-1] + 1]], np.int64)
    arrays = placed(
        (rows, spec.seq_len), slice(0, n), pad_id, flat.astype(dtype, copy=False), pos, docs
    )
    return packed_batch(column, *arrays, done, partial)


def split_batches(
    record_batches: Iterator[pa.RecordBatch],
    column: str,
    spec: PackSpec,
    pad_id: int,
    batch_size: int,
    offsets: Mapping[int, int],
) -> Iterator[dict[str, Any]]:
    """The real batches; returns the documents of a dropped last row that no batch took,
    and the token type seen."""
    per_batch = batch_size * spec.seq_len
    buffer = _Buffer()
    held: dict | None = None  # a full batch, kept until the next token is known
    for batch in record_batches:
        if batch is FLUSH or batch.num_rows == 0:
            continue
        buffer.add(batch, column, spec, offsets)
        while buffer.size >= per_batch and buffer.size:
            if held is not None:
                yield held
            head = buffer.take(per_batch)
            done = buffer.empties_before(per_batch)
            held = _batch(spec, pad_id, column, batch_size, head, done, buffer.dtype)
    # The rest: rows of the remaining tokens; empty documents after the last token go in
    # the last row (a row of their own only if the stream has no token).
    size = buffer.size
    rows = -(-size // spec.seq_len)
    ends_a_row = size % spec.seq_len == 0 and (size > 0 or held is not None)
    inside = [p for p, _ in buffer.empties if not (ends_a_row and p >= size)]
    if inside:
        rows = max(rows, max(inside) // spec.seq_len + 1)
    dropped: list[int] = []
    if rows and spec.drop_last and rows * spec.seq_len > size:  # a partial last row
        keep = (rows - 1) * spec.seq_len
        head = buffer.take(size)
        dropped = [int(d) for d in dict.fromkeys(head[2][keep:].tolist())]
        dropped += [i for p, i in buffer.empties if p >= keep]
        buffer.empties = [(p, i) for p, i in buffer.empties if p < keep]
        head, rows = tuple(a[:keep] for a in head), rows - 1
    else:
        head = buffer.take(size)
    if rows:
        if held is not None:
            yield held
        done = buffer.empties_before(1 << 62) + dropped
        held = _batch(spec, pad_id, column, rows, head, done, buffer.dtype)
        dropped = []
    if not rows and held is not None:  # (after the last full batch: its last row's)
        dropped += buffer.empties_before(1 << 62)
    if held is not None and dropped:
        held[COMPLETED_KEY] = np.concatenate([held[COMPLETED_KEY], np.asarray(dropped, np.int64)])
        dropped = []
    if held is not None:
        yield held
    return dropped, buffer.dtype
