"""Elastic autoscaling experiments: a training-shaped workload over a dynamic loader while
nodes join and leave on a schedule; throughput, stalls, membership and a coverage audit."""

from rayshard_experiments.schedule import Event, Schedule, load_schedule

__all__ = ["Event", "Schedule", "load_schedule"]
