"""Multi-turn episodes in a real run: the rollout engines run calculator episodes, the batch keeps the
observation tokens out of the loss, the environment's reward is trained on, and combinations the runtime
does not run yet are refused before anything starts."""

from __future__ import annotations

import json
import os

import pytest

from rpeg.errors import RpegError
from rpeg.runtime.batch import build_batch
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import colocated_plan, rt, split_async_plan


def test_observation_tokens_stay_out_of_the_mask():
    b = build_batch([[1, 2], [3]], [[5, 6, 7, 8], [9]], [[-1.0, -2.0, 0.0, -3.0], [-1.0]], [0, 1], [0, 0], 0,
                    loss_masks=[[1, 1, 0, 1], [1]])
    # prompt length 2: response token j is predicted at position 1 + j
    assert b.mask.tolist() == [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]


def test_environment_options_are_checked_in_one_line():
    with pytest.raises(RpegError, match="environment 'calculator' has no option 'turns'"):
        RuntimeConfig(environment={"name": "calculator", "turns": 3})
    with pytest.raises(RpegError, match="unknown environment 'web'"):
        RuntimeConfig(environment={"name": "web"})


def test_chat_episodes_need_a_chat_template_and_say_so_in_one_line(tmp_path):
    cfg = rt(tmp_path, task={"name": "arithmetic", "ops": ["mul"], "level": 3}, environment={"name": "calculator"},
             chat=True, warmup_sft_steps=1)
    with pytest.raises(RpegError, match="no chat template .* runtime.chat: false"):
        run(colocated_plan(), cfg, progress=False)


def test_chat_episodes_render_the_template_and_its_tool_calls():
    from rpeg.runtime.agent_engine import EnvSpec
    from rpeg.tasks import Problem
    from rpeg.tasks.arithmetic import Arithmetic
    from rpeg.tasks.chat import PlainFormat, TemplateFormat
    from tests.tasks.test_tools import _SmolTok

    spec = EnvSpec("calculator", Arithmetic(level=3, ops=("mul",)), (("warmup_tool_share", 1.0),), chat=True)
    env = spec.factory(_SmolTok())()
    assert isinstance(env.format, TemplateFormat) and isinstance(spec.factory()().format, PlainFormat)
    opening = env.format.opening(env.reset(Problem("347*58=", "20126")), env.tools)
    assert "You may call these tools" in opening and opening.endswith("347*58=<|im_end|>\n<|im_start|>assistant\n")
    import random

    call, end, observation, answer, _ = env.demonstration(Problem("347*58=", "20126"), random.Random(0))
    assert call == ('<tool_call>{"name": "calc", "arguments": {"expression": "347*58"}}</tool_call>', True)
    assert observation == ("<|im_start|>user\n<tool_response>20126</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n", False) and answer == ("20126", True)


@pytest.mark.long
@pytest.mark.parametrize("plan", [colocated_plan, split_async_plan])
def test_a_run_trains_on_calculator_episodes(tmp_path, plan):
    cfg = rt(tmp_path, task={"name": "arithmetic", "ops": ["mul"], "level": 3}, steps=2, max_new_tokens=12,
             environment={"name": "calculator", "max_turns": 2}, eval_every=1, eval_size=8)
    result = run(plan(), cfg, progress=False)
    m = result.metrics
    assert len(m) == 2 and all(1.0 <= x["turns_mean"] <= 2.0 for x in m)
    assert all("tool_calls_mean" in x and "test_tool_calls" in x for x in m)
    assert all(0.0 <= x["reward"] <= 1.0 for x in m)
    trace = json.load(open(os.path.join(cfg.out, "timeline.json")))
    names = {str(e.get("name")).split(" ")[0] for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)}
    assert {"generate", "reward", "actor_update"} <= names


@pytest.mark.long
def test_unsupported_combinations_are_refused_before_starting(tmp_path):
    cfg = rt(tmp_path, environment={"name": "calculator"}, engine="hf")
    with pytest.raises(RpegError, match="runs the arithmetic task, not 'countdown'"):
        run(colocated_plan(), cfg.replace(task={"name": "countdown"}), progress=False)


@pytest.mark.long
def test_partial_rollout_runs_episodes_in_the_engines_pool_within_the_bound(tmp_path):
    """Partial rollout with episodes (agent_engine.EpisodePool): each step's episodes join the engine's pool,
    a weight update enters between two calls, and every sampled token's version lies within k of the step."""
    from rpeg.passes import partial_rollout

    cfg = rt(tmp_path, task={"name": "arithmetic", "ops": ["mul"], "level": 3}, steps=3, max_new_tokens=16,
             environment={"name": "calculator", "max_turns": 2, "warmup_tool_share": 1.0}, warmup_sft_steps=150,
             sft_lr=1e-3)
    plan = partial_rollout(split_async_plan())
    result = run(plan, cfg, progress=False)
    m = result.metrics
    assert len(m) == 3 and all(x["staleness_max"] <= plan.async_bound for x in m)
    assert all("versions_per_response_max" in x and "engine_calls" in x for x in m)
    assert sum(x["tool_calls_mean"] for x in m) > 0
    events = [e for e in json.load(open(os.path.join(cfg.out, "timeline.json")))["traceEvents"] if e["ph"] == "X"]
    assert any(e["cat"] == "engine" for e in events) and any(e["cat"] == "turn" for e in events)


@pytest.mark.long
def test_a_slow_tool_overlaps_other_episodes_turns_in_the_measured_timeline(tmp_path):
    """A remote calculator (0.1 s mean round trip) after a warm-up that calls it: the engine runs other
    episodes' turns while a call waits, the trace shows every episode's turns and tool calls, and the
    one-step-off plan's staleness contract holds with episodes (counted from each first sampled token)."""
    cfg = rt(tmp_path, task={"name": "arithmetic", "ops": ["mul"], "level": 3}, steps=2, max_new_tokens=16,
             environment={"name": "calculator", "max_turns": 2, "warmup_tool_share": 1.0, "latency_s": 0.1},
             warmup_sft_steps=150, sft_lr=1e-3)
    plan = split_async_plan()
    result = run(plan, cfg, progress=False)
    assert all(m["staleness_max"] <= plan.async_bound for m in result.metrics)
    assert max(m["staleness_max"] for m in result.metrics) == plan.async_bound == 1
    assert sum(m["tool_calls_mean"] for m in result.metrics) > 0
    events = [e for e in json.load(open(os.path.join(cfg.out, "timeline.json")))["traceEvents"] if e["ph"] == "X"]
    lanes = {e["tid"] for e in events if e["cat"] in ("turn", "tool")}
    assert len(lanes) == plan.job.sequences  # a lane per episode of a step
    tools = [e for e in events if e["cat"] == "tool"]
    calls = [e for e in events if e["cat"] == "engine"]
    overlapping = [(t, c) for t in tools for c in calls
                   if c["ts"] < t["ts"] + t["dur"] and t["ts"] < c["ts"] + c["dur"]]
    assert overlapping, "no engine call ran while a tool call waited"
    assert os.path.exists(os.path.join(cfg.out, "episodes.png"))
