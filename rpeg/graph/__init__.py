"""The RPEG graph IR: models, jobs, stages, fields, the graph, its verifier and file formats."""

from rpeg.graph.config import AlgoConfig
from rpeg.graph.graph import DataEdge, Graph, WeightEdge
from rpeg.graph.episode import Episode
from rpeg.graph.job import Job, LengthDistribution
from rpeg.graph.layout import DeviceGroup, ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.graph.nodes import Field, Kind, ModelRole, Stage, Stream
from rpeg.graph.catalogue import get_model
from rpeg.graph.presets import model_names
from rpeg.graph.verify import VerificationError, Violation, verify

__all__ = [
    "AlgoConfig", "DataEdge", "DeviceGroup", "Episode", "Field", "Graph", "Job", "Kind", "LengthDistribution",
    "ModelRole", "ModelSpec", "ParallelLayout", "Stage", "Stream", "VerificationError", "Violation",
    "WeightEdge", "get_model", "model_names", "verify",
]
