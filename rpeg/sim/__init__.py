"""Discrete-event simulation of a plan over several steps: `simulate(plan, cluster, steps)`."""

from rpeg.sim.executor import simulate
from rpeg.sim.timeline import GroupStats, Record, Timeline

__all__ = ["GroupStats", "Record", "Timeline", "simulate"]
