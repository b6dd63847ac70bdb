"""`rayshard state`: inspect a saved loader state and rewrite it safely.

PATH is a state JSON file or a checkpoint folder holding `rayshard_state.json` (or, as a
Hugging Face Trainer checkpoint, one `rayshard_state_<process>.json` per process: `show`
reads process 0's, a rewrite changes every one alike). Rewrites
go to a temporary file in the target's folder, then `os.replace`: a crash leaves the old
file or the new one, never half of one. Rewriting in place keeps the old file as `.bak`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import click

from rayshard.cli.state_view import other_data, parquet_splits, table
from rayshard.core import state_tools
from rayshard.core.state import STATE_VERSION, LoaderState
from rayshard.core.state_file import (
    NAMED_STATE_FILE,
    PROCESS_STATE_FILE,
    STATE_FILE,
    WHAT_TO_PASS,
    atomic_write,
    mode_of,
    read_state_json,
    state_file_name,
    state_name_of,
)
from rayshard.errors import ConfigError

_path_arg = click.argument("path", type=click.Path(exists=True, path_type=Path))
_expect_option = click.option(
    "--expect-loader", metavar="ID", help="Refuse a state saved by any other loader id."
)
_out_option = click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=True),
    help="Write here instead of in place: a .json file, or a folder for rayshard_state.json "
    "(or the named state's file; any other name; made if missing, parents too).",
)
_name_option = click.option(
    "--name",
    metavar="NAME",
    help="In a checkpoint folder, the state saved under NAME (rayshard_state.NAME.json, "
    "written by save_state(..., name=NAME)) instead of rayshard_state.json.",
)


@click.group("state")
def state_group() -> None:
    """Inspect a saved loader state, or rewrite it (skip an epoch, re-target a world size).

    PATH is the state JSON, a checkpoint folder holding rayshard_state.json (with --name
    NAME, rayshard_state.NAME.json), or a Hugging Face checkpoint folder with one
    rayshard_state_<process>.json per process.
    """


@state_group.command("show")
@_path_arg
@click.option(
    "--data",
    help="The Parquet files the loader reads (a file, folder or glob, local or a URI, as "
    "ParquetSource takes): adds progress per row group.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@_expect_option
@_name_option
def show_command(
    path: Path, data: str | None, fmt: str, expect_loader: str | None, name: str | None
) -> None:
    """Epoch, progress, what remains and for which world size."""
    file, state = _load_file(_resolve(path, name)[0], expect_loader)
    layout = splits = labels = None
    if data is not None:
        layout, splits, labels, described = parquet_splits(data)
        saved = other_data(state.made_by, described)
        if saved is not None:
            click.echo(
                f"warning: {file} was saved by a loader over {saved}, and --data is "
                f"{described}: the progress per row group assumes the same rows in the "
                "same order",
                err=True,
            )
    try:
        summary = state_tools.summarize(state, layout, splits, labels=labels)
    except ConfigError as error:
        raise click.ClickException(f"{file} and {data}: {error}") from error
    summary = {"path": str(file), **summary}
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(table(summary))


@state_group.command("skip-epoch")
@_path_arg
@_out_option
@_expect_option
@_name_option
def skip_epoch_command(
    path: Path, out: str | None, expect_loader: str | None, name: str | None
) -> None:
    """Start the next epoch; the rest of the current one is skipped."""
    _rewrite(_resolve(path, name), out, expect_loader, state_tools.skip_to_next_epoch)


@state_group.command("set-epoch")
@_path_arg
@click.option("--epoch", type=click.IntRange(min=0), required=True, help="Epoch to start.")
@_out_option
@_expect_option
@_name_option
def set_epoch_command(
    path: Path, epoch: int, out: str | None, expect_loader: str | None, name: str | None
) -> None:
    """Start EPOCH from its beginning (the same epoch restarts it)."""
    files = _resolve(path, name)
    _rewrite(files, out, expect_loader, lambda s: state_tools.set_epoch(s, epoch))


@state_group.command("retarget")
@_path_arg
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="New hint W.")
@_out_option
@_expect_option
@_name_option
def retarget_command(
    path: Path, world_size: int, out: str | None, expect_loader: str | None, name: str | None
) -> None:
    """Set the world size the consumed samples count as planned for.

    Resuming on exactly W continues each rank's own W-rank shard minus what was consumed;
    on any other size the rest of the epoch is re-balanced over the new ranks.
    """
    files = _resolve(path, name)
    _rewrite(files, out, expect_loader, lambda s: state_tools.retarget(s, world_size))


def _resolve(path: Path, name: str | None = None) -> list[Path]:
    """The state files PATH names: itself, its folder's `rayshard_state.json` (or the
    state named `name`), or its per-process files, process 0's first."""
    if not path.is_dir():
        if name is not None:
            raise click.UsageError(f"--name picks a state in a checkpoint folder; {path} is a file")
        return [path]
    try:
        wanted = path / state_file_name(name)
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="--name") from error
    if wanted.is_file():
        return [wanted]
    each = sorted(path.glob(PROCESS_STATE_FILE.format(rank="*")), key=_process)
    found = (state_name_of(f.name) for f in path.glob(NAMED_STATE_FILE.format(name="*")))
    named = sorted(name for name in found if name is not None)
    if not each or name is not None:
        held = (
            f"; it holds the named states {', '.join(named)}: pick one with --name" if named else ""
        )
        raise click.ClickException(
            f"{path} is a folder without {wanted.name}"
            + ("" if name is not None else f" or {PROCESS_STATE_FILE.format(rank='<process>')}")
            + f": pass a checkpoint folder written by rayshard.train.save_state or a prepared "
            f"Trainer, or the state JSON{held}"
        )
    return each


def _process(file: Path) -> int:
    number = file.stem.rsplit("_", 1)[-1]
    return int(number) if number.isdigit() else 1 << 30


def _load_file(file: Path, expect_loader: str | None) -> tuple[Path, LoaderState]:
    """The state file and its strictly loaded, consistent state (else exit 1)."""
    try:
        data = read_state_json(file)
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    version = data.get("version", STATE_VERSION) if "loader" in data else STATE_VERSION
    if type(version) is not int:  # ("1" would read as "version '1', but ... version 1")
        raise click.ClickException(
            f"{file}: version={version!r} must be the integer {STATE_VERSION}; {WHAT_TO_PASS}"
        )
    if version != STATE_VERSION:
        raise click.ClickException(
            f"{file} holds loader state version {version!r}, but this rayshard reads "
            f"version {STATE_VERSION}: use the rayshard release that saved it, or start fresh"
        )
    try:
        state = state_tools.check(LoaderState.from_dict(data, expect_loader=expect_loader))
    except ConfigError as error:
        hint = (
            f"; pass the state of loader {expect_loader!r}, or drop --expect-loader"
            if expect_loader is not None and data.get("loader") != expect_loader
            else f"; {WHAT_TO_PASS}"
        )
        raise click.ClickException(f"{file}: {error}{hint}") from error
    return file, state


def _rewrite(
    files: list[Path],
    out: str | None,
    expect_loader: str | None,
    change: Callable[[LoaderState], LoaderState],
) -> None:
    for file in files:  # each checked before any is written
        _load_file(file, expect_loader)
    for file in files:
        target = None if out is None else _out_file(out, _name_in_folder(file), len(files) > 1)
        _rewrite_file(file, target, expect_loader, change)


def _name_in_folder(file: Path) -> str:
    """The name a state keeps when written into a folder: its own if it is one of the
    names rayshard gives (a named or a process's state), else `rayshard_state.json`."""
    process = str(_process(file))
    own = state_name_of(file.name) is not None or file.name == PROCESS_STATE_FILE.format(
        rank=process
    )
    return file.name if own else STATE_FILE


def _rewrite_file(
    file: Path,
    out: Path | None,
    expect_loader: str | None,
    change: Callable[[LoaderState], LoaderState],
) -> None:
    file, state = _load_file(file, expect_loader)
    try:
        new = change(state)
    except (ConfigError, TypeError) as error:
        raise click.ClickException(f"{file}: {error}") from error
    if out is not None and out.resolve() == file.resolve():
        out = None  # (`-o` naming the file itself: in place, the old one kept)
    file = file.resolve()  # (through a link: the file it names is rewritten, not the link)
    target = file if out is None else out
    payload = new.to_json() + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if out is None:
            backup = file.with_name(file.name + ".bak")
            atomic_write(backup, file.read_bytes(), mode=mode_of(file))
        atomic_write(target, payload.encode("utf-8"))
    except OSError as error:
        hint = ""
        if isinstance(error, FileExistsError) or target.parent.is_file():
            hint = f" ({target.parent} is a file: give -o a .json file name or a folder)"
        raise click.ClickException(f"cannot write {target}: {error}{hint}") from error
    kept = f" (the old one is in {backup})" if out is None else ""
    click.echo(
        f"wrote {target}{kept}: epoch {state.epoch} -> {new.epoch}, consumed "
        f"{_count(state)} -> {_count(new)} of {new.num_samples}, "
        f"world_size {state.world_size} -> {new.world_size}"
    )


def _out_file(out: str, name: str = STATE_FILE, several: bool = False) -> Path:
    """Where `-o out` writes: `out` itself if it names a .json file, else `name` in the
    folder `out` (`new/`, `ckpt-retargeted`); one of `several` files (a process's)
    always in the folder `out`."""
    if not out.strip():
        raise click.BadParameter("an empty path: name a .json file or a folder", param_hint="-o")
    path = Path(out)
    folder = out.endswith(("/", os.sep)) or path.is_dir() or path.suffix.lower() != ".json"
    if several and not folder:
        raise click.ClickException(
            f"-o {out}: the checkpoint holds one state file per process; pass a folder"
        )
    return path / name if folder else path


def _count(state: LoaderState) -> int:
    return sum(end - start for start, end in state.consumed)
