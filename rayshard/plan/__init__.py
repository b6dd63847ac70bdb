"""The pure planning core: who reads which samples, in which epoch, in how many batches.

Importable without Ray or torch.
"""

from rayshard.plan.batches import BatchLayout, batch_layouts, batch_sizes
from rayshard.plan.groups import DataParallelRank, data_parallel_rank
from rayshard.plan.layout import DataLayout
from rayshard.plan.options import LastBatch, PlanConfig, Rotation, Uneven, parse_choice
from rayshard.plan.planner import (
    EpochPlan,
    RankPlan,
    iter_batches,
    padding_indices,
    plan_epoch,
    plan_remaining,
    rank_plan_for,
)
from rayshard.plan.shards import balanced_range, balanced_ranges, shard_of
from rayshard.plan.validate import check_coverage, check_not_empty, validate

__all__ = [
    "BatchLayout",
    "DataLayout",
    "DataParallelRank",
    "EpochPlan",
    "LastBatch",
    "PlanConfig",
    "RankPlan",
    "Rotation",
    "Uneven",
    "balanced_range",
    "balanced_ranges",
    "batch_layouts",
    "batch_sizes",
    "check_coverage",
    "check_not_empty",
    "data_parallel_rank",
    "iter_batches",
    "padding_indices",
    "parse_choice",
    "plan_epoch",
    "plan_remaining",
    "rank_plan_for",
    "shard_of",
    "validate",
]
