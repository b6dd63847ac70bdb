"""The error family of rayshard.

Configuration mistakes found before any work starts are `ConfigError` (a `ValueError`), so
callers that already catch `ValueError` keep working. Failures at run time are
`RayshardError`s. Every message names the offending value, the rule and a way out.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or input that cannot work, found before any data moved."""


class RayshardError(RuntimeError):
    """A failure while a loader runs (reading, coordinating, resuming)."""


class DataError(RayshardError):
    """Data that turned out unreadable while reading; names the file and the part of it."""


class StaleClientError(RayshardError):
    """A client spoke for an epoch or generation the coordinator has already left."""
