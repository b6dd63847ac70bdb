"""Online packing of a token column into rows of exactly `seq_len` tokens.

`Loader(..., packing=Packing(column="tokens", seq_len=2048))` makes the readers pack the
documents (rows of a list<int> column) of their share into batches of `batch_size` packed
rows. Each batch holds `<column>` (rows x seq_len tokens), `position_ids` (restarting at
0 at every document, continuing inside a document split across rows), `document_ids`
(the dataset sample index of every token, -1 on padding: equal ids form the blocks of
block-diagonal attention) and `mask` (True on real tokens). The arithmetic is the pure
`rayshard.core.packing`; this module holds the configuration and the driver-side checks.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np
import pyarrow as pa

from rayshard.config.checks import check_int
from rayshard.core.packing import PackSpec
from rayshard.errors import ConfigError, DataError

PACKED_KEYS = ("position_ids", "document_ids", "mask")


class LastRow(str, enum.Enum):
    """What happens to a rank's last, partly filled row (split mode)."""

    PAD = "pad"  # padded and masked: every token delivered
    DROP = "drop"  # dropped: its tokens are skipped (and count as consumed)

    @classmethod
    def parse(cls, value: Any) -> LastRow:
        try:
            return cls(value.value if isinstance(value, enum.Enum) else str(value).lower())
        except ValueError:
            options = ", ".join(repr(m.value) for m in cls)
            raise ConfigError(
                f"last_row={value!r} is not a valid choice: use one of {options}"
            ) from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Packing:
    """How the readers pack `column` (list<int> tokens, one document per row).

    - `seq_len`: tokens per packed row (>= 1).
    - `separator`: a token appended after every document (part of it: it gets the
      document's id and the next position), or None.
    - `split_documents`: True (default) concatenates documents and splits them across
      rows; False never splits one: first-fit into open rows, the rest padded and masked
      (a document longer than `seq_len` is then a `DataError`).
    - `last_row`: `pad` (default) or `drop` the rank's last partial row (split mode only).
    - `pad_id`: the token written on padding (masked anyway).
    """

    column: str
    seq_len: int
    separator: int | None = None
    split_documents: bool = True
    last_row: LastRow = LastRow.PAD
    pad_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError(f"packing column={self.column!r} must name a list<int> column")
        check_int(
            self.seq_len,
            "seq_len",
            minimum=1,
            fix="Packing: give the tokens per packed row, e.g. seq_len=2048",
        )
        for name in ("separator", "pad_id"):
            value = getattr(self, name)
            ok = value is None if name == "separator" else False
            if not ok and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise ConfigError(f"packing {name}={value!r} must be an integer token id")
            if value is not None:  # a numpy integer as a plain one (the JSON fingerprint)
                object.__setattr__(self, name, int(value))
        if not isinstance(self.split_documents, bool):
            raise ConfigError(
                f"packing split_documents={self.split_documents!r} must be True or False"
            )
        object.__setattr__(self, "last_row", LastRow.parse(self.last_row))
        if not self.split_documents and self.last_row is LastRow.DROP:
            raise ConfigError(
                "packing last_row='drop' needs split_documents=True: without splitting, "
                "rows are padded, never cut; use last_row='pad'"
            )
        if self.separator is not None and self.seq_len < 2 and not self.split_documents:
            raise ConfigError(
                f"packing seq_len={self.seq_len} leaves no room for a document and its "
                f"separator={self.separator}: raise seq_len"
            )

    @property
    def spec(self) -> PackSpec:
        """The pure packing arithmetic's view of this configuration."""
        return PackSpec(
            seq_len=self.seq_len,
            separator=self.separator,
            split=self.split_documents,
            drop_last=self.last_row is LastRow.DROP,
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["last_row"] = self.last_row.value
        return out


def check_packing_input(source: Any, packing: Packing, columns: Any, transform: Any) -> None:
    """On the driver, before any actor starts: no transform, the token column, and without
    splitting every document's length (read from the column's Arrow offsets; each of a
    `MixedSource`'s sources whole)."""
    if transform is not None:
        raise ConfigError(
            "transform= together with packing= is not supported: packing reads the token "
            "column as stored; tokenize and filter beforehand, or drop packing"
        )
    check_token_column(source.schema(), packing, columns, source.describe())
    if not packing.split_documents:  # a DataError naming the longest document
        for part in mixed_parts(source):
            token_lengths(part, packing)


def mixed_parts(source: Any) -> list[Any]:
    """The sources a `MixedSource` draws samples from (one with count 0 left out), or
    `[source]`."""
    parts = getattr(source, "sources", None)
    if parts is None:
        return [source]
    return [part for part, count in zip(parts, source.counts) if count]


def check_token_column(schema: pa.Schema, packing: Packing, columns: Any, where: str) -> None:
    """The token column exists, is read, and is a list of integers; else a `ConfigError`."""
    name = packing.column
    if name not in schema.names:
        raise ConfigError(
            f"packing column {name!r} is not in {where}: its columns are "
            f"{', '.join(schema.names)}; set Packing(column=...) to the token column"
        )
    if columns is not None and name not in columns:
        raise ConfigError(
            f"packing column {name!r} is not among columns={list(columns)}: add it, or leave "
            f"columns unset"
        )
    kind = schema.field(name).type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not is_list or not pa.types.is_integer(kind.value_type):
        raise ConfigError(
            f"packing column {name!r} of {where} is {kind}, not a list of integers: pack a "
            f"tokenized column (list<int32> or list<int64>), e.g. tokenize in a preprocessing "
            f"step"
        )
    limits = np.iinfo(kind.value_type.to_pandas_dtype())
    for option in ("separator", "pad_id"):
        value = getattr(packing, option)
        if value is not None and not limits.min <= value <= limits.max:
            raise ConfigError(
                f"packing {option}={value} does not fit the token column {name!r} of {where}"
                f" ({kind.value_type}, {limits.min}..{limits.max}): choose a token id in "
                f"that range, or store the tokens as a wider integer type"
            )


def token_lengths(source: Any, packing: Packing) -> np.ndarray:
    """Tokens per sample (int64, one per dataset row), from the column's Arrow offsets;
    a `DataError` for a null document or, without splitting, one longer than a row."""
    out = np.empty(source.layout().num_samples, dtype=np.int64)
    at = 0
    for batch in source.read(0, len(out), [packing.column]):
        column = batch.column(0)
        if column.null_count:
            bad = at + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(
                f"sample {bad} of {source.describe()} has a null {packing.column!r}: packing "
                f"needs a token list in every row (an empty list is fine)"
            )
        offsets = column.offsets.to_numpy()
        tokens = column.flatten()  # (this batch's own tokens, also of a sliced list)
        if tokens.null_count:
            first = int(np.flatnonzero(tokens.is_null().to_numpy(zero_copy_only=False))[0])
            bad = at + int(np.searchsorted(offsets - offsets[0], first, side="right")) - 1
            raise DataError(
                f"sample {bad} of {source.describe()} has a null token in {packing.column!r}:"
                f" packing needs integer tokens only; drop or replace the nulls beforehand"
            )
        out[at : at + len(column)] = np.diff(offsets)
        at += len(column)
    check_lengths(out, packing, source.describe())
    return out


def mix_token_lengths(mix: Any, epoch: int, lengths: list[np.ndarray]) -> np.ndarray:
    """Tokens per position of a mix's `epoch` (`rayshard.core.mixing.Mix`), gathered from
    each source's `lengths` (empty for a source with count 0): no token is read again,
    and the positions are located a million at a time."""
    out = np.empty(mix.total, dtype=np.int64)
    for start in range(0, mix.total, 1 << 20):
        end = min(start + (1 << 20), mix.total)
        source, index = mix.locate(epoch, start, end)
        part = out[start:end]
        for s in np.unique(source):
            where = source == s
            part[where] = lengths[int(s)][index[where]]
    return out


def check_lengths(lengths: np.ndarray, packing: Packing, where: str) -> None:
    """Without splitting, every document (with its separator) must fit in one row."""
    if packing.split_documents or lengths.size == 0:
        return
    extra = 0 if packing.separator is None else 1
    longest = int(np.argmax(lengths))
    if int(lengths[longest]) + extra > packing.seq_len:
        count = int(np.sum(lengths + extra > packing.seq_len))
        raise DataError(
            f"sample {longest} of {where} has {int(lengths[longest])} tokens"
            f"{' plus a separator' if extra else ''}, more than seq_len={packing.seq_len} "
            f"({count} such documents): with split_documents=False a document must fit in "
            f"one row; raise seq_len to at least {int(lengths[longest]) + extra}, set "
            f"split_documents=True, or filter long documents out beforehand"
        )


__all__ = [
    "LastRow",
    "PACKED_KEYS",
    "Packing",
    "check_token_column",
    "mix_token_lengths",
    "mixed_parts",
    "token_lengths",
]
