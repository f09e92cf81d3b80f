"""Work–depth analysis of a pipeline graph (no hardware: W, D and W/D of the algorithm as planned)."""

from rpeg.analysis.workdepth import StageWorkDepth, WorkDepth, async_depth_table, work_depth

__all__ = ["StageWorkDepth", "WorkDepth", "async_depth_table", "work_depth"]
