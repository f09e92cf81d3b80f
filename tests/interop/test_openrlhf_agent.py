"""OpenRLHF's agent RLHF (`--train.agent_func_path`) read into Job.episode, and written back.

The launches are OpenRLHF's own example scripts of the import corpus (tests/data/peers/openrlhf,
SOURCES.md): examples/scripts/train_reinforce_baseline_ray_agent_async.sh at 0.11.0 (dotted flags,
`--train.async_enable`), the same script at v0.9.10 (`--agent_func_path`, `--async_train`) and the
synchronous train_reinforce_baseline_hybrid_engine.sh. Each runs examples/python/agent_func.py, a
MultiTurnAgentExecutor whose loop ends when the agent says done or at --data.max_len (no turn flag).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from peer_code import openrlhf_check

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.graph import Episode
from rpeg.interop import openrlhf as ro
from rpeg.interop.common import graph_of, script_command
from rpeg.interop.openrlhf_write import AGENT

DATA = Path(__file__).parent.parent / "data" / "peers" / "openrlhf"
ASYNC = "train_reinforce_baseline_ray_agent_async.sh"
AGENT_SCRIPTS = {ASYNC: "async", "v0.9.10_train_reinforce_baseline_ray_agent_async.sh": "async",
                 "train_reinforce_baseline_hybrid_engine.sh": "sync"}
AGENT_LINE = "   --train.agent_func_path ${AGENT_FUNC_PATH}\n"


def script(name: str = ASYNC) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name", sorted(AGENT_SCRIPTS))
def test_an_agent_launch_imports_as_multi_turn_episodes(name):
    im = ro.read(script(name), name)
    ep = im.view.job.episode
    # no turn flag: the cap is the response's budget (--rollout.max_new_tokens 64000), the turns assumed
    assert (ep.turns, ep.max_turns, ep.observation_tokens, ep.tool_latency_s) == (2.0, 64000, 0.0, 0.0)
    assert im.mode == AGENT_SCRIPTS[name] and im.view.reward is None  # the agent gives the reward
    said = [a for a in im.assumed if "agent_func_path" in a]
    assert said[0].startswith("--train.agent_func_path examples/python/agent_func.py: the agent file is not read")
    assert "multi-turn episodes of at most 64000 replies" in said[1] and "assumes 2 replies" in said[1]
    assert not any("agent_func_path" in u for u in im.unmapped)
    graph_of(im.view)


def test_the_same_launch_without_the_agent_stays_single_turn():
    text = script().replace(AGENT_LINE, "   --reward.remote_url http://localhost:5000/get_reward\n")
    assert text != script()
    im = ro.read(text, ASYNC)
    assert im.view.job.episode is None
    assert not any("agent" in line for line in im.assumed + im.unmapped)
    with_agent = ro.read(script(), ASYNC).view
    assert im.view.replace(job=im.view.job.replace(episode=None)) == \
        with_agent.replace(job=with_agent.job.replace(episode=None))  # nothing else changes


def test_an_empty_agent_path_is_no_agent_and_a_missing_one_is_refused_in_one_line():
    # on the command line itself: an unquoted ${ARGS[@]} drops an empty word (then the flag has no value)
    text = script().replace(AGENT_LINE, "").replace("${LOG_ARGS[@]}", "${LOG_ARGS[@]} --train.agent_func_path '' "
                                                    "--reward.remote_url http://x")
    assert ro.read(text, ASYNC).view.job.episode is None
    with pytest.raises(RpegError) as e:
        ro.read(script().replace(AGENT_LINE, "   --train.agent_func_path\n"), ASYNC)
    assert str(e.value) == f"{ASYNC}: --train.agent_func_path needs a value: the agent's Python file"


def test_a_reward_beside_the_agent_is_named_as_replaced():
    text = script().replace(AGENT_LINE, AGENT_LINE + "   --reward.remote_url http://x\n")
    im = ro.read(text, ASYNC)
    assert im.view.job.episode is not None and im.view.reward is None
    assert any(u.startswith("reward.remote_url = http://x: the agent gives the reward") for u in im.unmapped)


def test_the_export_writes_an_agent_placeholder_and_reads_back_the_same_episode():
    im = ro.read(script(), ASYNC)
    out = ro.write(im.view)
    assert "    --train.agent_func_path ./agent_func.py \\" in out.text.splitlines()
    assert "--reward.remote_url" not in out.text
    assert any(line.startswith("# --train.agent_func_path below is a placeholder for your agent")
               for line in out.text.splitlines())
    back = ro.read(out.text, "export", response_mean=im.view.job.response.mean)
    assert back.view == out.view == im.view and not out.left_out


def test_the_agent_export_passes_openrlhfs_checks():
    words, _ = script_command(ro.write(ro.read(script(), ASYNC).view).text, ro._ENTRY, "export")
    args = openrlhf_check(words)
    assert args.train.agent_func_path == AGENT and args.reward.remote_url == ["agent"]  # the parser's rewrite


def test_a_turn_cap_openrlhf_cannot_write_is_left_out():
    v = ro.read(script(), ASYNC).view
    v = v.replace(job=v.job.replace(episode=Episode(turns=3, max_turns=8, observation_tokens=200)))
    out = ro.write(v)
    assert out.view.job.episode == Episode(turns=3, max_turns=64000, observation_tokens=200)
    assert any(line.startswith("episode.max_turns = 8: OpenRLHF has no turn cap") for line in out.left_out)
    assert "# OpenRLHF cannot express" in out.text
    back = ro.read(out.text, "export", response_mean=v.job.response.mean)
    assert back.view.job.episode.max_turns == out.view.job.episode.max_turns


def test_episodes_beside_a_reward_model_are_written_single_turn():
    name = "train_ppo_ray_hybrid_engine.sh"
    v = ro.read(script(name), name).view
    v = v.replace(job=v.job.replace(episode=Episode(turns=2, max_turns=4)))
    out = ro.write(v)
    assert out.view.job.episode is None and "--train.agent_func_path" not in " ".join(ro.arguments(out.view))
    assert any("beside a reward model" in line for line in out.left_out)


def test_rpeg_import_refuses_a_bare_agent_flag_in_one_line(tmp_path, capsys):
    bad = tmp_path / "agent.sh"
    bad.write_text(script().replace(AGENT_LINE, "   --train.agent_func_path\n"))
    rc = main(["import", str(bad), "--from", "openrlhf", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc != 0 and "--train.agent_func_path needs a value" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
