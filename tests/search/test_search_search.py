"""search(graph, cluster, gpus): determinism, monotonicity in devices and options, the peers'
plans as a floor, the cost objective, and what happens when nothing fits.

Jobs: GRPO on Qwen3-0.6B and on Llama-3.1-8B, PPO on Qwen3-0.6B (critic, reference and reward
model); DGX H100 nodes (8 GPUs, priced per GPU-hour) and Alps GH200 nodes (4 GPUs), 4 to 32 GPUs."""

import math

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, get_model, verify
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, colocate, partial_rollout, place
from rpeg.perf.step import predict_step
from rpeg.search import LayoutCache, NoFeasiblePlan, SearchResult, SpaceOptions, nearest_feasible, search
from rpeg.search.baselines import BASELINES
from rpeg.search.layouts import RPEG_OPTIONS, LayoutOptions, best_layout, candidates

SMALL, LLAMA = get_model("qwen3-0.6B"), get_model("llama-3.1-8B")
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=Dist.fixed(512))
GRPO = build_graph("grpo", JOB, Models(actor=SMALL))
GRPO_LLAMA = build_graph("grpo", JOB, Models(actor=LLAMA))
PPO = build_graph("ppo", JOB, Models(actor=SMALL, critic=SMALL, reference=SMALL, reward=SMALL))
MAX_K = 4  # the largest async bound of a peer's plan (AReaL): the search gets as much room


@pytest.fixture(scope="module")
def dgx8():
    return load_cluster("dgx-h100", 8)


@pytest.fixture(scope="module")
def cache8():
    return LayoutCache()


@pytest.fixture(scope="module")
def ppo8(dgx8, cache8):
    """The PPO search on one DGX node, done once."""
    return search(PPO, dgx8, 8, keep=8, cache=cache8)


def summary(result):
    return [(c.name, c.gpus, c.step_s) for c in result.ranked]


@pytest.mark.parametrize("cluster, gpus", [("dgx-h100", 16), ("alps-gh200", 8)])
def test_search_is_deterministic(cluster, gpus):
    c = load_cluster(cluster, gpus)
    a = search(PPO, c, gpus, cache=LayoutCache())
    b = search(PPO, c, gpus, cache=LayoutCache())
    assert summary(a) == summary(b)
    assert [x.graph for x in a.ranked] == [x.graph for x in b.ranked]
    assert (a.evaluated, a.pruned, a.layouts_costed) == (b.evaluated, b.pruned, b.layouts_costed)


def test_the_ranking_is_sorted_and_every_plan_verifies_and_fits(ppo8, dgx8):
    c, res = dgx8, ppo8
    assert isinstance(res, SearchResult) and len(res.ranked) == 8 and res.best is res.ranked[0]
    times = [x.step_s for x in res.ranked]
    assert times == sorted(times)
    assert len({x.name for x in res.ranked}) == len(res.ranked)
    for cand in res.ranked:
        assert verify(cand.graph) is cand.graph
        pred = predict_step(cand.graph, c)
        assert pred.fits and pred.step_s == pytest.approx(cand.step_s, rel=1e-12)
        assert cand.graph.async_bound == cand.structure.async_bound
    assert res.evaluated > 0 and res.layouts_costed > 0 and res.seconds > 0


@pytest.mark.parametrize("cluster", ["dgx-h100", "alps-gh200"])
@pytest.mark.parametrize("graph", [GRPO, GRPO_LLAMA], ids=["grpo-0.6B", "grpo-8B"])
def test_more_devices_never_make_the_best_plan_slower(cluster, graph):
    times = [search(graph, load_cluster(cluster, n), n).best.step_s for n in (8, 16, 32)]
    assert times[0] >= times[1] >= times[2], times


def test_max_staleness_zero_gives_synchronous_plans_only(ppo8, dgx8, cache8):
    res = search(PPO, dgx8, 8, max_staleness=0, keep=20, cache=cache8)
    assert len(res.ranked) == 20
    assert all(c.structure.async_bound == 0 and c.graph.async_bound == 0 for c in res.ranked)
    assert res.best.step_s >= ppo8.best.step_s
    assert ppo8.best.graph.async_bound == 1  # here asynchrony pays


@pytest.mark.parametrize("graph, cluster, gpus", [
    (GRPO_LLAMA, "dgx-h100", 4),  # the per-stage layout choice alone loses to NeMo-RL's here (weight sync)
    (GRPO_LLAMA, "dgx-h100", 16),
    (PPO, "dgx-h100", 8),
    (PPO, "alps-gh200", 16),
], ids=["grpo-8B-4", "grpo-8B-16", "ppo-0.6B-8", "ppo-0.6B-16-gh200"])
def test_the_best_plan_is_no_slower_than_any_peer_s(graph, cluster, gpus):
    c = load_cluster(cluster, gpus)
    cache = LayoutCache()
    best = search(graph, c, gpus, max_staleness=MAX_K, cache=cache).best
    built = 0
    for name, b in BASELINES.items():
        plan = b.build(graph, c, gpus, cache)
        if plan is None:
            continue
        pred = predict_step(plan, c)
        if not pred.fits:
            continue
        built += 1
        assert best.step_s <= pred.step_s * (1 + 1e-9), (name, pred.step_s, best.name, best.step_s)
    assert built >= 5


@pytest.mark.parametrize("space", [SpaceOptions(share=False), SpaceOptions(fuse=False), SpaceOptions(stream=False),
                                   SpaceOptions(placements=("colocated", "split")),
                                   SpaceOptions(share=False, fuse=False, stream=False, placements=("colocated",))],
                         ids=["no-share", "no-fuse", "no-stream", "no-per-model", "colocated-only"])
def test_switching_part_of_the_space_off_never_finds_a_faster_plan(space, ppo8, dgx8, cache8):
    ablated = search(PPO, dgx8, 8, cache=cache8, space=space)
    assert ablated.best.step_s >= ppo8.best.step_s * (1 - 1e-12)
    for cand in ablated.ranked:  # and it stays inside what it allows
        st, pl = cand.structure, cand.placement
        assert space.share or not st.share
        assert space.fuse or not (st.fuse_logprobs or st.fuse_train)
        assert space.stream or not st.stream
        kind = "colocated" if pl.name == "colocated" else "split" if pl.name.startswith("split") else "per-model"
        assert kind in space.placements


def test_the_cost_objective_pays_no_more_per_step_than_the_time_objective():
    c = load_cluster("dgx-h100", 16)
    assert c.gpu_hour_usd > 0
    fast = search(GRPO, c, 16)
    cheap = search(GRPO, c, 16, objective="cost")
    assert fast.best.gpus == 16 and cheap.best.gpus in (16, 8, 4)
    assert cheap.best.cost_usd(c) <= fast.best.cost_usd(c) * (1 + 1e-12)
    assert cheap.best.step_s >= fast.best.step_s * (1 - 1e-12)
    # generation of a 0.6B model barely speeds up past a few GPUs: the cheapest plan uses fewer
    assert cheap.best.gpus < 16 and cheap.best.cost_usd(c) < fast.best.cost_usd(c)
    assert cheap.best.cost_usd(c) == pytest.approx(c.gpu_hour_usd * cheap.best.gpus * cheap.best.step_s / 3600)
    costs = [x.cost_usd(c) for x in cheap.ranked]
    assert costs == sorted(costs)


def test_the_throughput_objective_ranks_like_time(dgx8, cache8):
    assert summary(search(GRPO, dgx8, 8, objective="throughput", cache=cache8)) == summary(
        search(GRPO, dgx8, 8, cache=cache8))


def test_an_impossible_job_raises_no_feasible_plan():
    huge = build_graph("grpo", JOB, Models(actor=get_model("llama-3.1-405B")))
    one = load_cluster("dgx-h100", 1)
    with pytest.raises(NoFeasiblePlan, match=r"llama-3\.1-405B fits 1 x h100") as info:
        search(huge, one, 1)
    assert isinstance(info.value, RpegError) and info.value.gpus == 1
    assert nearest_feasible(huge, one, 1) is None  # no more GPUs in this cluster, and a smaller batch won't do


def test_nearest_feasible_suggests_more_gpus_when_the_cluster_has_them():
    big = build_graph("grpo", JOB, Models(actor=get_model("qwen3-32B")))
    with pytest.raises(NoFeasiblePlan):
        search(big, load_cluster("dgx-h100", 1), 1)
    found = nearest_feasible(big, load_cluster("dgx-h100"), 1)  # the preset: as many nodes as needed
    assert found is not None
    what, res = found
    assert what == "8 GPUs instead of 1" and res.best.gpus == 8 and math.isfinite(res.best.step_s)


@pytest.mark.parametrize("kwargs, needle", [
    ({"objective": "speed"}, "unknown objective 'speed'"),
    ({"max_staleness": -1}, "max staleness must be >= 0"),
])
def test_bad_arguments_are_refused(kwargs, needle):
    with pytest.raises(RpegError, match=needle):
        search(GRPO, load_cluster("dgx-h100", 8), 8, **kwargs)


def test_a_placed_graph_is_refused():
    with pytest.raises(RpegError, match="starts from the algorithm's graph"):
        search(colocate(GRPO, 8), load_cluster("dgx-h100", 8), 8)


def test_only_rpeg_s_own_search_tries_a_smaller_engine_for_partial_rollout(dgx8):
    """A partial-rollout plan recomputes the responses in flight at each weight update, as many as an
    engine runs at once: RPEG's search (whose runtime passes max_num_seqs to vLLM) tries 256 besides
    vLLM's default of 1,024 on an H100; a system's options keep its engines (verl: 256, always)."""
    g = partial_rollout(bound_asynchrony(GRPO, 1))
    gen = g.stage("generate")

    def seqs(opts):
        return sorted({lay.max_seqs for lay in candidates(g, gen, 8, 8, opts, dgx8.device)})

    assert seqs(RPEG_OPTIONS) == [0, 256]
    assert seqs(LayoutOptions()) == [0]
    assert seqs(LayoutOptions(gen_max_seqs=256, partial_max_seqs=(256,))) == [256]  # nothing smaller to try
    assert seqs(LayoutOptions(partial_max_seqs=(256,))) == [0, 256]
    assert seqs(LayoutOptions(partial_max_seqs=(256,))) != seqs(LayoutOptions(partial_max_seqs=(2048,)))


def test_each_engine_size_is_costed_and_the_faster_kept(dgx8):
    """The two engine sizes of a partial-rollout plan share every other layout field: both are costed
    (not the first that fits, as with ZeRO stages or recomputation) and the faster one is kept."""
    g = place(partial_rollout(bound_asynchrony(GRPO_LLAMA, 1)), {"gen": 4, "train": 4}, {"generate": "gen"},
              default="train")
    cache = LayoutCache()
    lay, cost = best_layout(g, g.stage("generate"), dgx8, RPEG_OPTIONS, cache)
    costed = {}
    for (candidate, c) in next(v for v in cache.shapes.values() if v):
        costed.setdefault((candidate.tp, candidate.max_seqs), c.seconds)
    assert {m for _, m in costed} == {0, 256}
    assert cost.seconds == min(costed.values()) and costed[(lay.tp, lay.max_seqs)] == cost.seconds
