"""Passes: pure functions Graph -> Graph, each verified after it runs."""

from rpeg.passes.asynchrony import bound_asynchrony
from rpeg.passes.calls import serial_calls
from rpeg.passes.fusion import fuse
from rpeg.passes.parallelize import parallelize
from rpeg.passes.pipeline import PASSES, PassCall, PassPipeline
from rpeg.passes.placement import colocate, place
from rpeg.passes.reference import keep_reference_on_host, reference_on_host
from rpeg.passes.refit import refit
from rpeg.passes.rollout import partial_rollout
from rpeg.passes.sharing import share_actor_critic
from rpeg.passes.streaming import stream, unstreamable

__all__ = ["PASSES", "PassCall", "PassPipeline", "bound_asynchrony", "colocate", "fuse", "keep_reference_on_host",
           "parallelize", "partial_rollout", "place", "reference_on_host", "refit", "serial_calls",
           "share_actor_critic", "stream", "unstreamable"]
