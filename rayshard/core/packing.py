"""The arithmetic of packing documents into rows of `seq_len` tokens; pure, no Ray.

A document of `n` tokens occupies `n + 1` tokens with a separator (appended), `n`
without. `plan_rows` decides, from token counts alone, which token span of which document
goes into which row, so the readers (which pack) and the coordinator (which counts the
rows of every rank before the epoch) run the same function. `materialize` fills the
rows' arrays from the tokens; `unpack` joins them back into documents.

- split mode: documents are concatenated in reading order and cut at every `seq_len`
  tokens; only the stream's last row can be partly filled (padded, or dropped).
- no-split mode: first-fit into the open rows (at most `window`; the oldest is closed
  when one more would open), every row padded.

Both are sequential in the documents, so after delivering `r` rows the rest of the
stream is `plan_rows` over the documents not finished, each from the offset its
delivered spans reached (`resume_point`): exactly the tail of the uninterrupted stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from rayshard.errors import DataError


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """`seq_len` tokens per row; `separator` token after each document (or None); `split`
    documents across rows or not; `drop_last` partial row (split mode); `window` open rows
    for first-fit."""

    seq_len: int
    separator: int | None = None
    split: bool = True
    drop_last: bool = False
    window: int = 8

    def size(self, tokens: int) -> int:
        """Tokens a document of `tokens` occupies (its separator included)."""
        return tokens + (self.separator is not None)


@dataclasses.dataclass(frozen=True)
class Span:
    """Tokens `[start, end)` of document `index` (separator counted); `done`: its last."""

    index: int
    start: int
    end: int
    done: bool


@dataclasses.dataclass(frozen=True)
class Row:
    """One packed row; `dropped`: the stream's last partial row under `drop_last`."""

    spans: tuple[Span, ...]
    dropped: bool = False

    @property
    def tokens(self) -> int:
        return sum(s.end - s.start for s in self.spans)


def plan_rows(
    docs: Iterable[tuple[int, int]], spec: PackSpec, offsets: Mapping[int, int] | None = None
) -> Iterator[Row]:
    """The rows of a stream of `(sample index, token count)` in reading order; a document
    in `offsets` starts at that token (the part delivered before a resume)."""
    offsets = offsets or {}
    return (_split if spec.split else _first_fit)(docs, spec, offsets)


def _split(docs: Iterable[tuple[int, int]], spec: PackSpec, offsets: Mapping) -> Iterator[Row]:
    row: list[Span] = []
    fill = 0
    full: Row | None = None  # the last full row, kept: empty documents after it join it
    for index, tokens in docs:
        size, at = spec.size(tokens), offsets.get(index, 0)
        if size == 0:  # an empty document: finished in the current row
            row.append(Span(index, 0, 0, True))
            continue
        while at < size:
            take = min(size - at, spec.seq_len - fill)
            row.append(Span(index, at, at + take, at + take == size))
            at, fill = at + take, fill + take
            if fill == spec.seq_len:
                if full is not None:
                    yield full
                full, row, fill = Row(tuple(row)), [], 0
    if full is not None and row and not fill:  # only empty documents after the last token
        full, row = Row(full.spans + tuple(row)), []
    if full is not None:
        yield full
    if row:
        yield Row(tuple(row), dropped=spec.drop_last)


def _first_fit(docs: Iterable[tuple[int, int]], spec: PackSpec, offsets: Mapping) -> Iterator[Row]:
    bins: list[tuple[list[Span], list[int]]] = []  # open rows: (spans, [fill])
    for index, tokens in docs:
        at = offsets.get(index, 0)
        size = spec.size(tokens) - at
        if size > spec.seq_len:
            raise too_long(index, tokens, spec)
        span = Span(index, at, at + size, True)
        for spans, fill in bins:
            if fill[0] + size <= spec.seq_len:
                spans.append(span)
                fill[0] += size
                break
        else:
            bins.append(([span], [size]))
            if len(bins) > spec.window:
                yield Row(tuple(bins.pop(0)[0]))
    for spans, _ in bins:
        yield Row(tuple(spans))


def too_long(index: int, tokens: int, spec: PackSpec) -> DataError:
    """The error for a document that no row can hold without splitting it."""
    return DataError(
        f"sample {index} has {tokens} tokens, more than seq_len={spec.seq_len} "
        f"with its separator: without splitting it cannot be packed; raise seq_len "
        f"or split documents"
    )


def count_rows(docs: Iterable[tuple[int, int]], spec: PackSpec, offsets: Mapping | None = None):
    """Rows the stream delivers (a dropped last row not counted)."""
    return sum(1 for row in plan_rows(docs, spec, offsets) if not row.dropped)


def count_split_rows(remaining: np.ndarray, spec: PackSpec) -> int:
    """`count_rows` in split mode from the tokens left of every document, in reading
    order (separators counted), without a loop over documents."""
    total = int(remaining.sum())
    full, rest = divmod(total, spec.seq_len)
    # empty documents after the last token join its row; with no token they make one
    only_empty = total == 0 and len(remaining) > 0
    return full + int((rest > 0 or only_empty) and not spec.drop_last)


def resume_point(delivered: Iterable[Row]) -> tuple[set[int], dict[int, int]]:
    """What delivered rows leave behind: the finished documents, and for each document
    started but not finished the token offset reached."""
    done: set[int] = set()
    partial: dict[int, int] = {}
    for row in delivered:
        for span in row.spans:
            if span.done:
                done.add(span.index)
                partial.pop(span.index, None)
            else:
                partial[span.index] = max(partial.get(span.index, 0), span.end)
    return done, partial


def materialize(
    rows: Sequence[Row],
    tokens: Mapping[int, np.ndarray],
    spec: PackSpec,
    *,
    pad_id: int = 0,
    dtype: np.dtype | type = np.int64,
) -> dict[str, np.ndarray]:
    """The arrays of `rows` (rows x seq_len): tokens, `position_ids` (the token's offset
    in its document), `document_ids` (its sample index, -1 on padding), `mask`."""
    shape = (len(rows), spec.seq_len)
    out_tokens = np.full(shape, pad_id, dtype=dtype)
    positions = np.zeros(shape, dtype=np.int64)
    documents = np.full(shape, -1, dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for span in row.spans:
            n = span.end - span.start
            if n == 0:
                continue
            doc = tokens[span.index]
            body_end = min(span.end, len(doc))
            if span.start < body_end:
                out_tokens[r, at : at + body_end - span.start] = doc[span.start : body_end]
            if span.end > len(doc):  # the separator is the document's last token
                out_tokens[r, at + n - 1] = spec.separator
            positions[r, at : at + n] = np.arange(span.start, span.end)
            documents[r, at : at + n] = span.index
            at += n
    mask = documents >= 0
    return {
        "tokens": out_tokens,
        "position_ids": positions,
        "document_ids": documents,
        "mask": mask,
    }


def unpack(
    token_rows: np.ndarray, document_ids: np.ndarray, spec: PackSpec
) -> dict[int, np.ndarray]:
    """Documents back from the packed rows of a whole stream (in delivery order),
    separators removed: every document's last piece must be among the rows (a single
    batch's documents cut at its end lose their last token to the separator rule), and
    an empty document has no token to be found by."""
    pieces: dict[int, list[np.ndarray]] = {}
    flat_docs, flat_tokens = document_ids.reshape(-1), token_rows.reshape(-1)
    real = flat_docs >= 0
    for index in dict.fromkeys(flat_docs[real].tolist()):
        pieces.setdefault(index, []).append(flat_tokens[flat_docs == index])
    out = {i: np.concatenate(p) for i, p in pieces.items()}
    if spec.separator is not None:
        out = {i: t[:-1] for i, t in out.items()}  # every document ends with its separator
    return out


__all__ = [
    "PackSpec",
    "Row",
    "Span",
    "count_rows",
    "count_split_rows",
    "materialize",
    "plan_rows",
    "resume_point",
    "too_long",
    "unpack",
]
