"""Multi-turn episodes in the generation cost: sampled tokens decoded, observations prefilled, the last
episode's tool calls on the critical path. Hand-computed cases."""

from __future__ import annotations

import pytest

from rpeg.errors import RpegError
from rpeg.graph import Episode, Job
from rpeg.graph import LengthDistribution as Dist
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf import generation, static_engine
from rpeg.perf.generation import GenWorkload, episode_parts, generation_cost, sampled_response

SMALL = get_model("qwen3-0.6B")
H100 = load_cluster("dgx-h100", 8)


def work(response, episode=None, prompt=100, n=512):
    return GenWorkload(sequences=n, prompt_len=prompt, response=response, episode=episode)


def test_sampled_tokens_are_the_response_less_its_observations():
    # 2 tool turns x 10 observation tokens of a 31-token response: 21 sampled
    assert sampled_response(work(Dist.fixed(31), Episode(turns=3, max_turns=3, observation_tokens=5))) == Dist.fixed(21)
    # 2 x 100 of a 1,000-token mean: every length x 0.8 (the cap 4,000 -> 3,200)
    ep = Episode(turns=3, max_turns=4, observation_tokens=100)
    d = sampled_response(work(Dist(kind="lognormal", mean=1000, max=4000), ep))
    assert (d.kind, d.mean, d.max) == ("lognormal", pytest.approx(800.0), 3200)
    assert sampled_response(work(Dist.fixed(31))) == Dist.fixed(31)  # single-turn: untouched


def test_observation_prefill_with_and_without_the_prefix_cache(monkeypatch):
    seen = []
    monkeypatch.setattr(generation, "_prefill_s", lambda spec, lay, cl, tokens, context, dtype, seqs:
                        seen.append((tokens, context, seqs)) or 1.0)
    ep = Episode(turns=3, max_turns=3, observation_tokens=50, tool_latency_s=5.0)
    # 1,000 tokens: 900 sampled (300 a turn), 2 observations of 50
    parts = episode_parts(SMALL, Layout(), H100, work(Dist.fixed(1000), ep), n=4)
    assert parts == {"observation prefill": 1.0, "tool waits (critical path)": 10.0}  # 2 calls x 5 s
    # with the cache: 2 x 50 tokens an episode, 4 episodes, 8 prefills; context prompt + 3 x 350 / 2
    assert seen[-1] == (400.0, 100 + 3 * 350 / 2, 8)
    episode_parts(SMALL, Layout(), H100, work(Dist.fixed(1000), ep.replace(prefix_cache=False)), n=4)
    # without: turn 1 prefills 100 + 350, turn 2 100 + 700: 1,250 an episode
    assert seen[-1] == (4 * 1250.0, 625.0, 8)
    assert episode_parts(SMALL, Layout(), H100, work(Dist.fixed(1000), Episode()), n=4) == {}


def test_tool_latency_adds_its_calls_to_the_generation_stage_and_nothing_else():
    ep = Episode(turns=4, max_turns=8, observation_tokens=64, tool_latency_s=0.1)
    fast = generation_cost("g", SMALL, Layout(dp=8), H100, work(Dist.fixed(1024), ep))
    slow = generation_cost("g", SMALL, Layout(dp=8), H100, work(Dist.fixed(1024), ep.replace(tool_latency_s=5.0)))
    assert slow.seconds - fast.seconds == pytest.approx(3 * (5.0 - 0.1))
    assert dict(slow.parts)["tool waits (critical path)"] == pytest.approx(15.0)
    single = generation_cost("g", SMALL, Layout(dp=8), H100, work(Dist.fixed(1024)))
    assert "observation prefill" not in dict(single.parts)
    # the episode's sampled tokens are fewer than the single-turn response's: less decoding
    assert dict(fast.parts)["decode"] < dict(single.parts)["decode"]


def test_bad_episodes_are_one_line_errors():
    with pytest.raises(RpegError, match="episode.turns = 5 exceeds episode.max_turns = 4"):
        Episode(turns=5, max_turns=4)
    with pytest.raises(RpegError, match="episode.tool_latency_s = -1 must be >= 0"):
        Episode(tool_latency_s=-1)
    with pytest.raises(RpegError, match="leave nothing of the 50-token response to sample"):
        Job(response=Dist.fixed(50), episode=Episode(turns=3, max_turns=3, observation_tokens=25))


def test_an_engine_that_never_drains_spreads_the_waits_over_the_steps_an_episode_may_span():
    ep = Episode(turns=4, max_turns=8, observation_tokens=64, tool_latency_s=5.0)
    partial = GenWorkload(sequences=512, prompt_len=100, response=Dist.fixed(1024), episode=ep, partial=True,
                          async_bound=1)
    parts = dict(generation_cost("g", SMALL, Layout(dp=8), H100, partial).parts)
    assert parts["tool waits (critical path)"] == pytest.approx(3 * 5.0 / 2) and parts["observation prefill"] > 0


def test_a_static_batch_decodes_every_call_until_its_longest_reply_ends(monkeypatch):
    """RPEG's hf engine (ParallelLayout.static_batch): a wave keeps every row until its longest sequence
    ends, so a long tail costs the whole batch; continuous batching (vLLM) lets the finished rows go."""
    monkeypatch.setattr(static_engine, "prefill_s", lambda *a: 0.0)
    lengths = [10.0] * 63 + [100.0]
    static = generation.simulate_static(SMALL, Layout(), H100, n=64, prompt=100, lengths=lengths, max_seqs=256)
    assert static["decode_steps"] == 99  # the prefill samples the first token
    cont = generation.simulate_instance(SMALL, Layout(), H100, n=64, prompt=100, lengths=lengths,
                                        capacity_tokens=1e9, max_seqs=256)
    assert cont["decode_steps"] == 99 and static["decode"] > cont["decode"]  # the same steps, at full width
    two = generation.simulate_static(SMALL, Layout(), H100, n=64, prompt=100, lengths=lengths, max_seqs=32)
    assert two["decode_steps"] == 9 + 99  # two waves: the first one's longest is 10


def test_static_episodes_pay_a_tail_and_a_full_prefill_every_round():
    ep = Episode(turns=2, max_turns=2, observation_tokens=10, prefix_cache=False)
    tailed = work(Dist(kind="lognormal", mean=31, max=42), ep, prompt=8, n=128)
    static = generation_cost("g", SMALL, Layout(static_batch=True), H100, tailed)
    cont = generation_cost("g", SMALL, Layout(), H100, tailed)
    s, c = dict(static.parts), dict(cont.parts)
    # each of the 2 calls decodes until the step's longest reply (the runaways' cap: 42 x 21 / 31 / 2 tokens);
    # continuous batching pays one tail, the longest episode's
    assert s["decode"] > c["decode"] and set(s) == set(c)
    rounds = generation.static_episode_rounds(SMALL, Layout(static_batch=True), H100, tailed, 128, 256)
    assert rounds["decode_steps"] == pytest.approx(2 * (14 - 1), abs=1)
    assert rounds["observation prefill"] > rounds["prefill"] > 0  # round 2 prefills 8 + 10.5 + 10 tokens again
    # a fixed length has no tail to pay: the rounds decode what one continuous response would, less a step a call
    fixed = generation_cost("g", SMALL, Layout(static_batch=True), H100, work(Dist.fixed(31), ep, prompt=8, n=128))
    assert dict(fixed.parts)["decode"] < s["decode"]


def test_the_runtime_plans_its_hf_engine_as_a_static_batch():
    from rpeg.runtime.plan_check import runnable_plan
    from rpeg.spec import load_spec

    spec = load_spec("examples/agent-calculator-tiny.yaml")
    cluster = load_cluster("dgx-h100", 1)
    layouts = {e: runnable_plan(spec.graph(), cluster, 1, engine=e).graph.stage("generate").layout
               for e in ("hf", "vllm")}
    assert layouts["hf"].static_batch and not layouts["vllm"].static_batch
    assert "static-batch" in layouts["hf"].describe()
    with pytest.raises(RpegError, match="static_batch = 'yes' must be true or false"):
        Layout(static_batch="yes")


def test_waiting_contexts_that_overflow_the_kv_cache_are_prefilled_again(monkeypatch):
    """A waiting episode's context stays in vLLM's prefix cache only while the KV cache has room: what the
    episodes hold at mid-episode beyond the capacity is evicted, and its next turn prefills the whole context."""
    seen = []
    monkeypatch.setattr(generation, "_prefill_s", lambda spec, lay, cl, tokens, context, dtype, seqs:
                        seen.append((tokens, seqs)) or tokens / 1000)
    ep = Episode(turns=3, max_turns=3, observation_tokens=50)
    w = work(Dist.fixed(1000), ep)  # 300 sampled a turn + 50: 350; mid-episode 100 + 3 x 350 / 2 = 625
    roomy = episode_parts(SMALL, Layout(), H100, w, n=4, capacity=4 * 625)
    assert "prefix cache evictions" not in roomy  # every waiting context fits
    tight = episode_parts(SMALL, Layout(), H100, w, n=4, capacity=625)  # a quarter of what they hold
    # three quarters of the 4 episodes re-prefill the whole context (1,250 a turn pair) instead of 2 x 50
    assert seen[-1] == (pytest.approx(0.75 * 4 * (1250 - 100)), pytest.approx(0.75 * 4 * 2))
    assert tight["prefix cache evictions"] == pytest.approx(0.75 * 4 * 1150 / 1000)
    assert tight["observation prefill"] == roomy["observation prefill"]
    without = episode_parts(SMALL, Layout(), H100, work(Dist.fixed(1000), ep.replace(prefix_cache=False)), n=4,
                            capacity=625)
    assert "prefix cache evictions" not in without  # it prefills everything every turn already


def test_long_agent_episodes_overflow_the_prefix_cache_of_a_colocated_engine():
    # Qwen2.5-7B, 4 engines of TP 2 colocated on 8 H100s (docs/perf.md); 512 episodes of 4,096-token prompts
    qwen, lay = get_model("qwen2.5-7B"), Layout(tp=2, dp=4)
    long = GenWorkload(sequences=512, prompt_len=4096, response=Dist(kind="lognormal", mean=24000, max=96000),
                       episode=Episode(turns=30, max_turns=60, observation_tokens=512, tool_latency_s=1.0))
    parts = dict(generation_cost("g", qwen, lay, H100, long, colocated=True).parts)
    assert parts["prefix cache evictions"] > 0.3 * sum(parts.values())
    short = GenWorkload(sequences=512, prompt_len=4096, response=Dist(kind="lognormal", mean=4096, max=16384),
                        episode=Episode(turns=6, max_turns=16, observation_tokens=256, tool_latency_s=1.0))
    assert "prefix cache evictions" not in dict(generation_cost("g", qwen, lay, H100, short, colocated=True).parts)
