"""What every packing path shares: a record batch's token lists as arrays, and a batch of
packed rows with the keys the iterator reads (`_completed`, `_partial` among them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.data.batching import INDEX_KEY, PADDED_KEY

COMPLETED_KEY = "_completed"  # int64 sample indices finished in this batch
PARTIAL_KEY = "_partial"  # int64 (k, 2): (sample index, tokens delivered) of split documents


def token_lists(batch: pa.RecordBatch, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample index of each row, (rows + 1,) int64 offsets into `values`, the list's whole
    child array) of the token column, without copying."""
    tokens = batch.column(batch.schema.get_field_index(column))
    index = batch.column(batch.schema.get_field_index(INDEX_KEY)).to_numpy()
    offsets = tokens.offsets.to_numpy().astype(np.int64)
    return index, offsets, tokens.values.to_numpy(zero_copy_only=False)


def placed(
    shape: tuple[int, int],
    where: Any,
    pad_id: int,
    tokens: np.ndarray,
    positions: np.ndarray,
    documents: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of `shape` with the flat real `tokens` (and their positions and documents) at
    the flat slots `where` (an index array or a slice), padding everywhere else."""
    token_rows = np.full(shape, pad_id, dtype=tokens.dtype)
    position_rows = np.zeros(shape, np.int64)
    document_rows = np.full(shape, -1, np.int64)
    token_rows.reshape(-1)[where] = tokens
    position_rows.reshape(-1)[where] = positions
    document_rows.reshape(-1)[where] = documents
    return token_rows, position_rows, document_rows


def packed_batch(
    column: str,
    tokens: np.ndarray,
    positions: np.ndarray,
    documents: np.ndarray,
    completed: Sequence[int] | np.ndarray,
    partial: Sequence[tuple[int, int]] | np.ndarray,
) -> dict[str, Any]:
    """A batch of packed rows (rows x seq_len arrays; -1 documents are padding): `mask`,
    `_index` (a row's first token's document) and `_padded` (False) are derived."""
    return {
        column: tokens,
        "position_ids": positions,
        "document_ids": documents,
        "mask": documents >= 0,
        INDEX_KEY: documents[:, 0].copy(),
        PADDED_KEY: np.zeros(len(documents), dtype=bool),
        COMPLETED_KEY: np.asarray(completed, dtype=np.int64).reshape(-1),
        PARTIAL_KEY: np.asarray(partial, dtype=np.int64).reshape(-1, 2),
    }
