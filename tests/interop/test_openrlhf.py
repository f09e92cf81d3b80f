"""OpenRLHF: real launch scripts read into RPEG; exports parsed and checked by train_ppo_ray's own
argument handling; round trips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from peer_code import openrlhf_check

from rpeg.cli.plan import _bare
from rpeg.errors import RpegError
from rpeg.interop import openrlhf as ro
from rpeg.interop.common import config_tuple, defaults_of, graph_of, script_command, view_of
from rpeg.search.search import search
from rpeg.spec import spec_from_data

DATA = Path(__file__).parent.parent / "data" / "peers" / "openrlhf"
# the examples checked against the peer's own code; the rest of the folder is the import corpus
# (tests/interop/test_import_corpus.py)
EXAMPLES = [
    "train_dapo_ray_hybrid_engine.sh",
    "train_ppo_ray_hybrid_engine.sh",
    "train_reinforce_baseline_hybrid_engine.sh",
    "train_reinforce_baseline_ray_agent_async.sh",
]


def read(name: str, **kw):
    return ro.read((DATA / name).read_text(), name, **kw)


def test_the_examples_are_those_noted_in_sources():
    listed = re.findall(r"`([\w.-]+\.sh)`", (DATA / "SOURCES.md").read_text())
    assert sorted(listed) == sorted(p.name for p in DATA.glob("*.sh")) and set(EXAMPLES) <= set(listed)


def test_ppo_colocated_with_a_reward_model():
    im = read("train_ppo_ray_hybrid_engine.sh")
    v = im.view
    assert (im.mode, v.algorithm, v.actor, v.critic, v.reward, v.gpus) == \
        ("sync", "ppo", "llama-3.1-8B", "llama-3.1-8B", "llama-3.1-8B", 8)
    assert v.groups == (("all", 0, 8),)
    # 1024 prompts x 1 sample in global training batches of 128: 8 mini-batches
    assert (v.job.prompts, v.job.samples_per_prompt, v.job.mini_batches) == (1024, 1, 8)
    lay = dict(v.layouts)
    assert (lay["generate"].dp, lay["generate"].tp) == (4, 2)
    a = lay["actor_update"]
    assert (a.zero, a.recompute, a.packing, a.micro_batch) == (3, "full", True, 8)  # 16384 tokens / 2048
    assert dict(v.config)["kl_coef"] == 0.01 and dict(v.config)["dual_clip"] == 0.0
    assert any("--rollout.max_new_tokens is not set" in x for x in im.assumed)
    graph_of(v)


def test_async_agent_script_keeps_the_engines_apart():
    im = read("train_reinforce_baseline_ray_agent_async.sh")
    v = im.view
    assert (im.mode, v.async_bound, v.algorithm, v.reward) == ("async", 1, "reinforce_pp_baseline", None)
    assert v.groups == (("vllm", 0, 4), ("actor", 4, 4))  # colocate_all in async mode: DeepSpeed models only
    assert dict(v.layouts)["actor_update"].cp == 2  # ring attention
    assert (v.job.prompt_len, v.job.response.max) == (74240 - 64000, 64000)
    assert any("k2 read as k1" in x for x in im.assumed)
    assert any(u.startswith("algo.dynamic_filtering_enable = True") for u in im.unmapped)
    graph_of(v)


@pytest.mark.parametrize("name", EXAMPLES)
def test_round_trip_of_each_example(name):
    im = read(name)
    proj, lines = ro.project(im.view)
    assert proj == im.view and not lines  # OpenRLHF's own plans need nothing left out
    out = ro.write(im.view)
    back = ro.read(out.text, "export", response_mean=im.view.job.response.mean)
    assert back.view == proj
    assert ro.write(back.view).text == out.text
    assert not back.unmapped


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_export_of_an_example_passes_openrlhfs_checks(name):
    im = read(name)
    words, _ = script_command(ro.write(im.view).text, ro._ENTRY, "export")
    args = openrlhf_check(words)
    assert args.rollout.batch_size == im.view.job.prompts
    assert args.vllm.num_engines == dict(im.view.layouts)["generate"].dp


JOB = {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
       "response": {"kind": "lognormal", "mean": 1500, "max": 4096}, "mini_batches": 4}


def _plan(data, max_staleness=1):
    spec = spec_from_data(data, "test")
    base, cluster, gpus = spec.cluster_and_gpus()
    best = search(_bare(spec), cluster, gpus, max_staleness=max_staleness).best
    return view_of(best.graph, actor=spec.models.actor.name,
                   critic=spec.models.critic.name if spec.models.critic else None,
                   reward=spec.models.reward.name if spec.models.reward else None, cluster=spec.cluster, gpus=gpus)


@pytest.fixture(scope="module")
def plans():
    return {
        "grpo": _plan({"algorithm": "grpo", "model": "qwen2.5-7B", "cluster": "dgx-h100", "gpus": 16, "job": JOB}),
        "ppo": _plan({"algorithm": "ppo", "model": "qwen2.5-7B", "critic": "qwen2.5-7B", "reward": "qwen2.5-7B",
                      "cluster": "dgx-h100", "gpus": 32, "job": JOB}),
    }


@pytest.mark.parametrize("which", ["grpo", "ppo"])
def test_rpeg_plans_export_to_what_openrlhf_runs(which, plans):
    v = plans[which]
    out = ro.write(v)
    words, _ = script_command(out.text, ro._ENTRY, "export")
    openrlhf_check(words)
    back = ro.read(out.text, "export", response_mean=v.job.response.mean, cluster=v.cluster)
    assert back.view == out.view == ro.project(v)[0]
    graph_of(out.view)
    if out.left_out:
        assert "# OpenRLHF cannot express" in out.text


def test_what_openrlhf_cannot_express_is_named(plans):
    v = plans["ppo"]
    shared = v.replace(share=True, critic=None)  # as if the search had shared the critic
    names = [s for s, _ in v.assign if s not in ("critic_values", "critic_update")]
    shared = shared.replace(assign=tuple((s, g) for s, g in v.assign if s in names),
                            layouts=tuple((s, lo) for s, lo in v.layouts if s in names))
    proj, lines = ro.project(shared)
    assert any(line.startswith("critic shared with the actor") for line in lines)
    assert not proj.share and proj.critic == "qwen2.5-7B"
    graph_of(proj)


@pytest.mark.parametrize("text, message", [
    ("echo hi\n", "not an OpenRLHF launch"),
    ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator flash_reinforce "
     "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines 1\n", "RPEG has no such estimator"),
    ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator group_norm --reward.remote_url x "
     "--actor.model_name_or_path Qwen/Qwen3-8B\n", "--vllm.num_engines is not set"),
    ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator group_norm --reward.remote_url x "
     "--actor.model_name_or_path /data/mine --vllm.num_engines 2\n", "not a model RPEG knows"),
    ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator group_norm --reward.remote_url x "
     "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines 2 --rollout.batch_size 10 "
     "--rollout.n_samples_per_prompt 3 --train.batch_size 16\n", "is not a multiple of --train.batch_size 16"),
    ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator group_norm --reward.remote_url x "
     "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines 2 --actor.num_gpus_per_node 6 "
     "--ds.ring_attn_size 4\n", "does not divide the actor's 6 GPUs"),
    ("python3 -m openrlhf.cli.train_ppo_ray stray\n", "is not a train_ppo_ray flag"),
])
def test_bad_launches_give_one_line_errors(text, message):
    with pytest.raises(RpegError) as e:
        ro.read(text, "job.sh")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_estimator_whose_default_kl_is_zero_keeps_the_reference_the_launch_asks_for():
    # OpenRLHF's --algo.kl.init_coef defaults to 0.01; RPEG's dr_grpo defaults to no KL: the reference must run
    text = ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator dr_grpo --reward.remote_url http://x "
            "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines 4 --vllm.tensor_parallel_size 2 "
            "--train.colocate_all --rollout.batch_size 64 --rollout.n_samples_per_prompt 8 --train.batch_size 128 "
            "--rollout.max_new_tokens 4096 --data.max_len 5120\n")
    v = ro.read(text, "dr.sh").view
    assert dict(v.config)["kl_coef"] == 0.01 and "ref_logprobs" in dict(v.layouts)
    assert "ref_logprobs" in [s.name for s in graph_of(v).stages]


# OpenRLHF 0.11.2's rollout correction (models/loss.py PolicyLoss, gating on rho = pi_old / pi_rollout): token clip
# weighs clamp(rho, low, high); token mask is IcePop, rho inside [low, high] and 0 outside with every token in the
# denominator (RPEG's decoupled when low is 0, never RPEG's mask-token, which weighs kept tokens 1 and drops the
# rest from the denominator); seq mask keeps rho on the kept sequences' tokens (mask-seq approximates it)
LAUNCH = ("python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator group_norm --reward.remote_url http://x "
          "--actor.model_name_or_path Qwen/Qwen3-8B --vllm.num_engines 4 --rollout.batch_size 64 "
          "--rollout.n_samples_per_prompt 8 --train.batch_size 128 --rollout.max_new_tokens 4096 "
          "--data.max_len 5120 ")
CORRECTION = "--algo.advantage.is_correction_level {} --algo.advantage.is_correction_mode {} "


@pytest.mark.parametrize("flags, off_policy, cap, note", [
    (CORRECTION.format("token", "mask") + "--algo.advantage.is_correction_threshold 0 3", "decoupled", 3.0, None),
    (CORRECTION.format("token", "mask"), "decoupled", 5.0,  # the parser's default threshold 0.5 5
     "read as decoupled with the lower bound 0.5 read as 0 (decoupled has none): a token with rho below 0.5 keeps "
     "its weight rho, which OpenRLHF zeroes"),
    (CORRECTION.format("token", "clip") + "--algo.advantage.is_correction_threshold 2", "tis", 2.0, None),
    (CORRECTION.format("token", "clip") + "--algo.advantage.is_correction_threshold 0.5 2", "tis", 2.0,
     "raises to 0.5"),
    (CORRECTION.format("seq", "mask") + "--algo.advantage.is_correction_threshold 0.5 2", "mask-seq", 2.0,
     "read as mask-seq, which approximates it"),
])
def test_openrlhfs_corrections_are_read_as_what_rpeg_computes(flags, off_policy, cap, note):
    im = ro.read(LAUNCH + flags + "\n", "job.sh")
    opts = {**defaults_of(im.view.algorithm), **dict(im.view.config)}
    assert (opts["off_policy"], opts["is_cap"]) == (off_policy, cap)
    said = [x for x in im.assumed if "is_correction" in x]
    assert (len(said) == 1 and note in said[0]) if note else not said
    with pytest.raises(RpegError, match="OpenRLHF's loss refuses it"):
        ro.read(LAUNCH + CORRECTION.format("seq", "clip") + "\n", "job.sh")


@pytest.mark.parametrize("off_policy, written", [
    ("tis", "token clip 0.0 3.0"), ("decoupled", "token mask 0.0 3.0"),
    ("tis-seq", None), ("mask-token", None), ("mask-seq", None),
])
def test_only_corrections_openrlhf_computes_are_exported(off_policy, written):
    v = ro.read(LAUNCH + "\n", "job.sh").view
    v = v.replace(config=config_tuple(v.algorithm, {**dict(v.config), "off_policy": off_policy, "is_cap": 3.0,
                                                    "is_low": 0.4}))
    out = ro.write(v)
    flags = re.findall(r"--algo\.advantage\.is_correction_\w+ ([\w. ]+?) \\", out.text)
    back = ro.read(out.text, "export", response_mean=v.job.response.mean)
    assert back.view == out.view
    if written:
        assert " ".join(flags) == written and not out.left_out
        assert (dict(back.view.config)["off_policy"], dict(back.view.config)["is_cap"]) == (off_policy, 3.0)
    else:
        assert not flags and "off_policy" not in dict(back.view.config)
        assert [x for x in out.left_out if x.startswith(f"off_policy {off_policy}: ")]


def test_lora_flags_are_read_written_and_pass_openrlhfs_checks():
    """--ds.lora.rank / alpha / target_modules (nargs="*") / dropout: a view with adapters exports the flags
    train_ppo_ray's own parser takes, and reads back to the same adapters; rank 0 (the default) is none."""
    from rpeg.graph.lora import LoRA

    im = read("train_ppo_ray_hybrid_engine.sh")
    assert im.view.lora is None
    for lora in (LoRA(rank=16, alpha=32.0), LoRA(rank=8, alpha=16.0, targets=("q", "v"), dropout=0.05)):
        out = ro.write(im.view.replace(lora=lora))
        words, _ = script_command(out.text, ro._ENTRY, "export")
        args = openrlhf_check(words)
        assert (args.ds.lora.rank, args.ds.lora.alpha) == (lora.rank, int(lora.alpha))
        back = ro.read(out.text, "export", response_mean=im.view.job.response.mean)
        assert back.view.lora == lora and not back.unmapped
