"""Placement on Ray: each of the plan's device groups is a placement group with one bundle per
device, so a job given a Ray cluster's address runs its ranks on that cluster's nodes. Tested on a
two-node cluster on this machine (ray.cluster_utils.Cluster: a head and a second node, one CPU
each), where the generation engine and the trainer of a split plan must land on different nodes."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.passes import colocate
from rpeg.runtime.roles import Placement, Roles
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, rt, split_async_plan

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`


@pytest.fixture
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def test_a_split_plan_trains_on_a_two_node_cluster_given_by_its_address(two_nodes, tmp_path):
    import ray

    from rpeg.runtime.run import run

    assert not ray.is_initialized()  # the run connects to the cluster it is given
    result = run(split_async_plan(), rt(tmp_path, steps=2, address=two_nodes.address), progress=False)
    assert len(result.metrics) == 2 and result.metrics[-1]["staleness_max"] == 1
    assert not ray.is_initialized()  # and leaves the user's cluster running, its devices given back
    ray.init(address=two_nodes.address, log_to_driver=False)
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


def test_each_rank_is_placed_on_its_devices_bundle(two_nodes, tmp_path):
    """Where each rank ran: the engine (device 0) and the trainer (device 1) on different nodes."""
    import ray

    from rpeg.runtime.models import build_tiny

    ray.init(address=two_nodes.address, log_to_driver=False)
    roles = Roles.build(split_async_plan(), rt(tmp_path), build_tiny(str(tmp_path / "tiny")), ray)
    try:
        engine_node, _ = ray.get(roles.engines.ranks[0][0].where.remote())
        trainer_node, _ = ray.get(roles.actor.workers[0].where.remote())
        assert engine_node != trainer_node
        assert {engine_node, trainer_node} == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    finally:
        roles.close()


def test_a_colocated_plan_is_one_placement_group_and_too_many_devices_is_one_line(two_nodes, monkeypatch):
    import ray

    from rpeg.errors import RpegError
    from rpeg.runtime import roles as roles_module

    ray.init(address=two_nodes.address, log_to_driver=False)
    coloc = laid_out(colocate(build_graph("grpo", job(), Models(actor=TINY)), 1))
    p = Placement(ray, coloc)
    assert [(first, count) for first, count, _ in p.parts] == [(0, 1)]
    p.close()
    monkeypatch.setattr(roles_module, "PLACEMENT_TIMEOUT_S", 3.0)
    big = laid_out(colocate(build_graph("grpo", job(), Models(actor=TINY)), 1)).replace(
        groups=(coloc.groups[0].__class__(name="all", first=0, count=3),))
    with pytest.raises(RpegError, match=r"could not place the plan's 3 device\(s\).*it has 2 CPUs"):
        Placement(ray, big)
