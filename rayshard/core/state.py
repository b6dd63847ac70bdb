"""The loader's checkpoint state: flat, JSON-safe, world-size free, versioned.

It records what the consumers *received*: the epoch and the real samples of that epoch
already delivered, as merged intervals, and under packing `partial`: documents split across
rows whose first tokens were delivered, as `[sample index, tokens delivered]` pairs.
`world_size` is kept only as a hint: resuming on the same size continues every rank's own
shard; on another size the rest is re-planned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from rayshard.core.older_ids import older_facts_agree
from rayshard.errors import ConfigError
from rayshard.plan import intervals as iv

log = logging.getLogger(__name__)
_WARNED: set[tuple[str, str]] = set()  # (older id, this loader's id) warned of

STATE_VERSION = 1
_KEYS = {
    "version",
    "loader",
    "epoch",
    "seed",
    "consumed",
    "partial",
    "world_size",
    "num_samples",
    "made_by",
}
# states saved before packing existed lack `partial`, before `made_by` existed that
_OPTIONAL = {"partial", "made_by"}


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """Where a loader stands: `consumed` real samples of `epoch` have reached the model."""

    loader: str
    epoch: int
    seed: int
    consumed: iv.Intervals
    world_size: int
    num_samples: int
    partial: tuple[tuple[int, int], ...] = ()  # (sample index, tokens delivered), sorted
    # the configuration facts behind `loader`'s id, as JSON (sorted keys); not compared
    made_by: str = dataclasses.field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "loader": self.loader,
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed": [list(r) for r in self.consumed],
            "partial": [list(p) for p in self.partial],
            "world_size": self.world_size,
            "num_samples": self.num_samples,
            **({"made_by": json.loads(self.made_by)} if self.made_by else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        expect_loader: str | None = None,
        expect_made_by: Mapping[str, Any] | None = None,
        expect_num_samples: int | None = None,
    ) -> LoaderState:
        """Strict load: every key present, no unknown key, this loader, this version,
        integers >= 0, consumed intervals within the dataset (of `expect_num_samples`
        samples when given). A state of another loader is refused naming what differs,
        when both sides know (`made_by`, `expect_made_by`)."""
        if isinstance(data, (str, bytes)):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise ConfigError(f"a loader state must be a JSON object, got {type(data).__name__}")
        missing = sorted(_KEYS - _OPTIONAL - data.keys())
        unknown = sorted(data.keys() - _KEYS)
        if missing or unknown:
            raise ConfigError(
                f"not a rayshard loader state: missing keys {missing}, unknown keys {unknown}"
            )
        if data["version"] != STATE_VERSION:
            raise ConfigError(
                f"loader state version {data['version']!r} is not supported: this rayshard "
                f"reads version {STATE_VERSION}; resume with the rayshard release that saved "
                "it, or start the epoch afresh"
            )
        _check_identity(data["loader"], data.get("made_by", {}))
        if expect_loader is not None and _saved_by_older_id(data, expect_loader, expect_made_by):
            data = {**data, "loader": expect_loader, "made_by": dict(expect_made_by)}
        if expect_loader is not None and data["loader"] != expect_loader:
            raise ConfigError(
                f"this state belongs to loader {data['loader']!r}, not to {expect_loader!r}: "
                "it was saved by a loader with another name, source or configuration"
                + _differences(data.get("made_by"), expect_loader, data["loader"], expect_made_by)
            )
        try:
            num_samples = _count(data["num_samples"], "num_samples")
            if expect_num_samples is not None and num_samples != expect_num_samples:
                raise ConfigError(
                    f"this state counts {num_samples} samples, the loader's source "
                    f"{expect_num_samples}: it was saved for another dataset or edited by hand"
                )
            return cls(
                loader=str(data["loader"]),
                epoch=_count(data["epoch"], "epoch"),
                seed=_count(data["seed"], "seed"),
                consumed=_intervals(data["consumed"], num_samples),
                world_size=_count(data["world_size"], "world_size"),
                num_samples=num_samples,
                partial=tuple(
                    sorted(
                        (_count(i, "partial index"), _count(t, "partial tokens"))
                        for i, t in data.get("partial", [])
                    )
                ),
                made_by=json.dumps(data["made_by"], sort_keys=True) if "made_by" in data else "",
            )
        except (TypeError, ValueError) as error:
            if isinstance(error, ConfigError):
                raise
            raise ConfigError(f"malformed loader state: {error}") from error


def _check_identity(loader: Any, made_by: Any) -> None:
    """`loader` must be a loader id (a string, `name:fingerprint` as a loader saves it),
    `made_by` the mapping of its settings: states are compared by them, and other types
    failed there with a traceback."""
    if not isinstance(loader, str):
        raise ConfigError(
            f"malformed loader state: loader={loader!r} is not a loader id 'name:fingerprint' "
            "(the state was edited by hand or damaged): resume from the state as saved"
        )
    if not isinstance(made_by, dict):
        raise ConfigError(
            f"malformed loader state: made_by={made_by!r} is not a mapping of the saving "
            "loader's settings (the state was edited by hand or damaged): resume from the "
            "state as saved, or remove made_by"
        )


def _saved_by_older_id(data: dict, expect_loader: str, here: Any) -> bool:
    """Whether a state of another id is this loader's, saved by an older rayshard whose id
    of a file source knew less (`rayshard.core.older_ids`): then it loads, as this
    loader's, with a warning that those facts were all it could check."""
    saved = data["loader"]
    if saved == expect_loader or loader_name(saved) != loader_name(expect_loader):
        return False
    if not isinstance(here, Mapping) or not older_facts_agree(data.get("made_by"), here):
        return False
    if (saved, expect_loader) in _WARNED:  # (every rank loads it: warned once a process)
        return True
    _WARNED.add((saved, expect_loader))
    log.warning(
        "rayshard: the state of loader %r was saved by an older rayshard, whose loader id "
        "knew a file source's first file, file count and row count only; they agree with "
        "this loader's (%s), so it resumes as %r. Resume it only over the files it was "
        "saved over: states saved from now on know every file and its rows",
        saved,
        here.get("source"),
        expect_loader,
    )
    return True


def _count(value: Any, name: str) -> int:
    """A state's integer, as JSON holds it: an int >= 0 (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"malformed loader state: {name}={value!r} is not an integer >= 0 (the state was "
            "edited by hand or damaged): resume from the state as saved"
        )
    return value


def _intervals(pairs: Any, num_samples: int) -> iv.Intervals:
    """`consumed` as normalized intervals, each `[start, end]` with 0 <= start <= end <=
    `num_samples`."""
    out = []
    for pair in pairs:
        start, end = (_count(v, "consumed bound") for v in pair)
        if not start <= end <= num_samples:
            raise ConfigError(
                f"malformed loader state: consumed interval {list(pair)} is not within "
                f"[0, num_samples={num_samples}] in order (the state was edited by hand or "
                "saved for another dataset): resume from the state as saved"
            )
        out.append((start, end))
    return iv.normalize(out)


def loader_name(loader_id: str) -> str:
    """The name part of a loader id (`name:fingerprint`)."""
    return loader_id.rsplit(":", 1)[0]


def _differences(saved: Any, expect_loader: str, saved_loader: str, here: Any) -> str:
    """What differs between the loader that saved a state and this one, as a clause."""
    saved_name, name = loader_name(saved_loader), loader_name(expect_loader)
    changes = [] if saved_name == name else [f"name: {saved_name!r} in the state, {name!r} here"]
    if isinstance(saved, Mapping) and isinstance(here, Mapping):
        for key in sorted(set(saved) | set(here)):
            if saved.get(key) != here.get(key):
                changes.append(f"{key}: {saved.get(key)!r} in the state, {here.get(key)!r} here")
    return "; " + "; ".join(changes) if changes else ""
