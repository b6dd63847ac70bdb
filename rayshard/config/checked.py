"""Everything the driver checks before any actor starts: the configuration against the
source (columns, packing, workers) and the transform. `checked_config` returns the
`LoaderConfig` the actors receive, with the column rules derived from the schema."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from rayshard.config.loader_config import LoaderConfig, loader_config
from rayshard.core.sharding import ShardingPolicy
from rayshard.data.columns import check_loader_columns
from rayshard.data.packing import check_packing_input
from rayshard.data.transforms import check_transform
from rayshard.errors import ConfigError
from rayshard.plan import check_not_empty
from rayshard.sources._files import ChunkedFileSource
from rayshard.sources.base import Source

log = logging.getLogger(__name__)


def checked_config(source: Source, config: Any, options: dict, transform: Any) -> LoaderConfig:
    """The resolved configuration for `source`; a `ConfigError` (or the source's
    `DataError`) for anything that cannot work, before Ray is touched."""
    settings = loader_config(config, options)
    rules = check_loader_columns(
        source.schema(),
        settings.columns,
        _mapping(settings.padding),
        _mapping(settings.fill_null),
        source.describe(),
    )
    check_transform(transform)
    if settings.packing is not None:
        check_packing_input(source, settings.packing, settings.columns, transform)
    _check_workers(settings, transform)
    _check_source_options(settings, source)
    _warn_scattered_parts(settings, source)
    check_not_empty(source.layout(), source.describe())
    return dataclasses.replace(settings, column_rules=rules)


def _check_workers(settings: LoaderConfig, transform: Any) -> None:
    """Transform workers need a transform; so do `transform_resources` unless reader
    workers (which read, transform or not) are what they place."""
    if transform is not None:
        return
    if settings.transform_workers > 1:
        raise ConfigError(
            f"transform_workers={settings.transform_workers} needs a transform: pass "
            f"transform=fn, or leave transform_workers at 1 (reader_workers=k reads in k "
            f"processes without one)"
        )
    if settings.transform_resources is not None and settings.reader_workers == 1:
        raise ConfigError(
            f"transform_resources={dict(settings.transform_resources)!r} places worker "
            f"processes, and there are none: pass transform=fn with transform_workers, or set "
            f"reader_workers > 1, or leave transform_resources unset"
        )


def _check_source_options(settings: LoaderConfig, source: Source) -> None:
    """`paths`, `source_format` and `split_rows` say which files `make_source` opens and
    how: given with a source made otherwise, they must be the source's own, or they would
    be ignored without a word."""
    wanted = settings.split_rows
    if wanted is not None and getattr(source, "split_rows", None) != wanted:
        raise ConfigError(
            f"split_rows={wanted} applies to the source the loader makes from paths; "
            f"{source.describe()} was made without it: pass it to the source "
            f"(e.g. ParquetSource(paths, split_rows={wanted})), or leave it out here"
        )
    fmt = settings.source_format
    if fmt != "auto" and not isinstance(source, _format_class(fmt)):
        raise ConfigError(
            f"source_format={fmt!r} applies to the source the loader makes from paths; "
            f"{source.describe()} is given: leave source_format out, or pass a "
            f"{_format_class(fmt).__name__}"
        )
    if settings.paths is not None:
        _check_paths(list(settings.paths), source)


def _format_class(fmt: str) -> type:
    """The source class `make_source` opens for `source_format` `fmt`."""
    from rayshard.sources.arrow_files import ArrowFileSource
    from rayshard.sources.parquet import ParquetSource

    return ArrowFileSource if fmt == "arrow" else ParquetSource


def _check_paths(paths: list[str], source: Source) -> None:
    """`paths` given with `source` must be the paths it was made from (as `make_source`
    makes it from them): else the source is read, and `paths` ignored. Compared as given,
    not listed again (a store's URI options, a filter, empty files skipped: all the same)."""
    made_from = getattr(source, "given_paths", None)
    if made_from == tuple(paths):
        return
    made = f"made from {list(made_from)}" if made_from else "which reads no paths"
    raise ConfigError(
        f"paths={paths} with {source.describe()}, {made}: the source would be read, paths "
        "ignored; leave paths out (the source names its files), or leave the source out"
    )


def _warn_scattered_parts(settings: LoaderConfig, source: Source) -> None:
    """A warning when `shuffle` or `shuffle_blocks` scatters the parts of a row group: each
    part is read far from the others, long after the row group's decoded copy was let go,
    so each decodes the whole row group again (`rayshard.sources._decoded` keeps the last)."""
    if not isinstance(source, ChunkedFileSource) or source.split_rows is None:
        return
    limit = source.split_rows
    if settings.shuffle:
        scattering = "shuffle=True"
    elif settings.shuffle_blocks:
        scattering = f"shuffle_blocks={settings.shuffle_blocks}"
    else:
        return
    whole = source.read_units()  # the row groups themselves, uncut
    longest = int((whole[:, 1] - whole[:, 0]).max()) if whole is not None and len(whole) else 0
    if longest > limit:
        finer = "" if settings.policy is ShardingPolicy.DYNAMIC else ", and shuffle_buffer=N"
        log.warning(
            "%s with split_rows=%d and row groups of up to %d rows in %s: the "
            "shuffled pieces of a row group are read apart, so each decodes the whole row "
            "group (up to %d times the decoding). Read whole row groups instead "
            "(split_rows=None, or at least %d)%s",
            scattering,
            limit,
            longest,
            source.describe(),
            -(-longest // limit),
            longest,
            finer,
        )


def _mapping(pairs: Any) -> Any:
    """`padding`/`fill_null` pairs as the {column: option} mapping `rayshard.data.columns` takes."""
    return dict(pairs) if isinstance(pairs, tuple) else pairs
