"""Data sources the planner can split."""

from rayshard.sources.base import Source, TableSource

__all__ = ["Source", "TableSource"]
