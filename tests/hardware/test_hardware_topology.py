"""Where a group of ranks sits (`Cluster.span`) and sizing a cluster (`with_gpus`)."""

import pytest

from rpeg.errors import RpegError
from rpeg.hardware import Cluster, Level, load_cluster, load_device


def test_dgx_h100_tensor_parallel_group_stays_in_the_node():
    span = load_cluster("dgx-h100", gpus=64).span(size=8, stride=1)
    assert (span.level.name, span.level.link, span.inner, span.ranks_per_unit, span.units) == ("node", "nvlink", None, 8, 1)


def test_dgx_h100_data_parallel_group_strided_by_a_node_crosses_nodes_one_rank_each():
    span = load_cluster("dgx-h100", gpus=64).span(size=4, stride=8)
    assert (span.level.name, span.level.link, span.inner.name) == ("system", "infiniband", "node")
    assert (span.ranks_per_unit, span.units) == (1, 4)


def test_dgx_h100_group_of_16_spans_two_full_nodes():
    span = load_cluster("dgx-h100", gpus=64).span(size=16, stride=1)
    assert (span.level.name, span.ranks_per_unit, span.units) == ("system", 8, 2)


def test_strides_that_do_not_divide_a_node():
    c = load_cluster("dgx-h100", gpus=64)
    # ranks 0, 3, 6 | 9 : three in the first node, the extent touches two nodes
    assert (c.span(4, 3).ranks_per_unit, c.span(4, 3).units) == (3, 2)
    # stride 16: every rank in a node of its own, nodes 0, 2, 4, 6
    assert (c.span(4, 16).ranks_per_unit, c.span(4, 16).units) == (1, 4)
    assert (c.span(4, 2).level.name, c.span(4, 2).ranks_per_unit) == ("node", 4)
    assert c.span(1).level.name == "node" and c.span(1).units == 1
    with pytest.raises(RpegError, match="stride"):
        c.span(4, 0)


def test_gb200_group_of_64_stays_inside_the_nvlink_rack():
    span = load_cluster("gb200-nvl72", gpus=144).span(size=64, stride=1)
    assert (span.level.name, span.level.link, span.inner.name) == ("rack", "nvlink", "tray")
    assert (span.ranks_per_unit, span.units) == (4, 16)
    assert load_cluster("gb200-nvl72", gpus=144).span(size=128).level.link == "infiniband"


def test_alps_eight_ranks_cross_nodes_over_slingshot():
    span = load_cluster("alps-gh200", gpus=256).span(size=8, stride=1)
    assert (span.level.name, span.level.link, span.inner.name) == ("group", "slingshot", "node")
    assert (span.ranks_per_unit, span.units) == (4, 2)
    assert load_cluster("alps-gh200", gpus=256).span(4).level.link == "nvlink"


def test_alps_global_links_are_oversubscribed_beyond_a_group():
    c = load_cluster("alps-gh200", gpus=1024)
    span = c.span(size=1024)
    assert span.level.name == "system" and span.inner.name == "group"
    assert span.level.effective_bandwidth_bytes_per_s == span.level.bandwidth_bytes_per_s / 2


def test_with_gpus_grows_the_system_level_by_whole_units_below_it():
    c = load_cluster("dgx-h100")
    assert c.gpus == 0 and c.levels[-1].gpus == 8
    sized = c.with_gpus(20)
    assert sized.gpus == 20 and sized.levels[-1].gpus == 24 and sized.levels[0] == c.levels[0]
    assert sized.with_gpus(8).levels[-1].gpus == 8
    gb = load_cluster("gb200-nvl72").with_gpus(100)
    assert [lv.gpus for lv in gb.levels] == [4, 72, 144]
    assert load_cluster("dgx-h100", gpus=4).levels[-1].gpus == 8  # one node holds 4


def test_with_gpus_refuses_more_than_the_system_has_and_nonsense():
    alps = load_cluster("alps-gh200")
    assert alps.with_gpus(10752).gpus == 10752
    with pytest.raises(RpegError, match="10752"):
        alps.with_gpus(10753)
    with pytest.raises(RpegError, match="at least one"):
        alps.with_gpus(0)
    with pytest.raises(RpegError, match="alps-gh200"):
        load_cluster("alps-gh200", gpus=20000)


def test_cluster_validation_names_the_problem():
    dev = load_device("h100-sxm")
    node = Level(name="node", gpus=8, link="nvlink", bandwidth_bytes_per_s=4.5e11, latency_s=2e-6)
    with pytest.raises(RpegError, match="whole multiples"):
        Cluster(name="x", device=dev, levels=(node, Level(name="sys", gpus=12, link="infiniband",
                                                           bandwidth_bytes_per_s=5e10, latency_s=5e-6)))
    with pytest.raises(RpegError, match="differ"):
        Cluster(name="x", device=dev, levels=(node, node))
    with pytest.raises(RpegError, match="oversubscription"):
        Level(name="sys", gpus=8, link="infiniband", bandwidth_bytes_per_s=5e10, latency_s=5e-6, oversubscription=0.5)
