"""verl: real launch scripts read into RPEG; exports checked by verl's own config code; round trips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rpeg.cli.plan import _bare
from rpeg.errors import RpegError
from rpeg.interop import verl as rv
from rpeg.interop.common import graph_of, script_command, view_of
from rpeg.search.search import search
from rpeg.spec import spec_from_data
from peer_code import hf_folder, verl_check

DATA = Path(__file__).parent.parent / "data" / "peers" / "verl"
# the examples checked against the peer's own code; the rest of the folder is the import corpus
# (tests/interop/test_import_corpus.py)
EXAMPLES = [
    "dapo_7b_math_fsdp2_8_8.sh",
    "run_one_step_off_policy.sh",
    "run_qwen2-7b_math.sh",
    "run_qwen2-7b_math_megatron.sh",
    "run_qwen2-7b_rm.sh",
    "run_qwen3-8b.sh",
]


def read(name: str, **kw):
    return rv.read((DATA / name).read_text(), name, **kw)


def test_the_examples_are_the_six_noted_in_sources():
    listed = re.findall(r"`([\w.-]+\.sh)`", (DATA / "SOURCES.md").read_text())
    assert sorted(listed) == sorted(p.name for p in DATA.glob("*.sh")) and set(EXAMPLES) <= set(listed)


def test_grpo_fsdp_script():
    im = read("run_qwen2-7b_math.sh")
    v = im.view
    assert (im.mode, v.algorithm, v.actor, v.gpus, v.async_bound) == ("sync", "grpo", "qwen2.5-7B", 8, 0)
    assert (v.job.prompts, v.job.samples_per_prompt, v.job.mini_batches, v.job.prompt_len, v.job.response.max) == \
        (1024, 5, 4, 1024, 1024)
    # use_kl_loss with low_var_kl is RPEG's GRPO default (k3 in the loss); verl's loss_agg_mode default
    # token-mean is not (RPEG's GRPO averages per sequence, as the GRPO paper)
    assert dict(v.config) == {"kl_coef": 0.001, "loss_agg": "token-mean"}
    assert v.groups == (("all", 0, 8),) and {g for _, g in v.assign} == {"all"}
    lay = dict(v.layouts)
    assert (lay["generate"].tp, lay["generate"].dp) == (2, 4)
    assert lay["generate"].max_seqs == 256  # rollout.max_num_seqs unset: verl 0.9's rollout.yaml passes 256 to vLLM
    assert (lay["actor_update"].zero, lay["actor_update"].recompute, lay["actor_update"].micro_batch) == (3, "full", 16)
    assert lay["ref_logprobs"].micro_batch == 16 and v.reference_on_host  # ref.fsdp_config.param_offload=True
    assert v.refit_gather == "full"
    assert any(u.startswith("actor_rollout_ref.actor.optim.lr = 1e-6:") for u in im.unmapped)
    assert any("response lengths" in a for a in im.assumed)
    graph_of(v)  # a valid RPEG plan


def test_megatron_script():
    v = read("run_qwen2-7b_math_megatron.sh").view
    a = dict(v.layouts)["actor_update"]
    assert (a.dp, a.tp, a.pp, a.zero, a.sequence_parallel, a.micro_batch) == (2, 2, 2, 1, True, 4)
    assert dict(v.layouts)["ref_logprobs"].tp == 2 and v.refit_gather == "shard"
    graph_of(v)


def test_ppo_with_critic_and_reward_model():
    v = read("run_qwen2-7b_rm.sh").view
    assert (v.algorithm, v.critic, v.reward) == ("ppo", "qwen2.5-7B", "llama-3.1-8B")
    lay = dict(v.layouts)
    assert lay["critic_update"].micro_batch == 32 and lay["reward"].tp == 1
    assert dict(v.config)["value_clip"] == 0.5
    graph_of(v)


def test_one_step_off_and_fully_async():
    im = read("run_one_step_off_policy.sh")  # its FSDP2 branch: the first command of the script
    v = im.view
    assert (im.mode, v.async_bound, v.partial, v.groups) == ("one-step-off", 1, False,
                                                            (("rollout", 0, 2), ("train", 2, 6)))
    assert dict(v.layouts)["actor_update"].cp == 2 and dict(v.assign)["generate"] == "rollout"
    im = read("dapo_7b_math_fsdp2_8_8.sh")
    v = im.view
    assert (im.mode, v.async_bound, v.partial, v.gpus) == ("fully-async", 1, True, 16)
    # one step = one parameter sync: trigger_parameter_sync_step 4 x require_batches 4 x 32 prompts
    assert (v.job.prompts, v.job.mini_batches) == (512, 16)
    assert dict(v.layouts)["actor_update"].micro_batch == 2  # dynamic bsz: 20480 tokens / (2048 + 8192)
    assert any("staleness_threshold = 0.1 read as k = 1" in a for a in im.assumed)
    graph_of(v)


@pytest.mark.parametrize("name", EXAMPLES)
def test_round_trip_of_each_example(name):
    im = read(name)
    proj, _ = rv.project(im.view)
    out = rv.write(im.view)
    back = rv.read(out.text, "export")
    assert back.view == proj
    assert rv.write(back.view).text == out.text  # export -> import -> export: the same file
    assert not [u for u in back.unmapped]  # an export sets only keys the importer reads


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return lambda preset: hf_folder(root, preset)


def _checked(out, models, validate: bool = True):
    """The export's words with each model path pointed at a local folder of that architecture
    (verl opens the critic's and reward model's configs while it checks them), checked by verl."""
    words, entry = script_command(out.text, rv._ENTRY, "export")
    presets = {v: k for k, v in rv.HF_NAMES.items()}
    local = [re.sub(r"^((?:\w+\.)*(?:model\.path|model_path))=(.*)$",
                    lambda m: f"{m.group(1)}={models(presets[m.group(2)])}", w) for w in words]
    return verl_check(local, rv.ENTRIES[entry], validate)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_export_of_an_example_passes_verls_checks(name, models):
    im = read(name)
    cfg = _checked(rv.write(im.view), models)
    assert cfg.data.max_response_length == im.view.job.response.max
    assert cfg.actor_rollout_ref.rollout.n == im.view.job.samples_per_prompt


def _plan(data, max_staleness=1):
    spec = spec_from_data(data, "test")
    base, cluster, gpus = spec.cluster_and_gpus()
    best = search(_bare(spec), cluster, gpus, max_staleness=max_staleness).best
    return view_of(best.graph, actor=spec.models.actor.name,
                   critic=spec.models.critic.name if spec.models.critic else None, cluster=spec.cluster, gpus=gpus)


JOB = {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
       "response": {"kind": "lognormal", "mean": 1500, "max": 4096}, "mini_batches": 4}


@pytest.fixture(scope="module")
def plans():
    return {
        "grpo": _plan({"algorithm": "grpo", "model": "qwen2.5-7B", "cluster": "dgx-h100", "gpus": 16, "job": JOB}),
        "ppo": _plan({"algorithm": "ppo", "model": "qwen2.5-7B", "critic": "qwen2.5-7B", "cluster": "dgx-h100",
                      "gpus": 16, "job": JOB}),
    }


@pytest.mark.parametrize("which", ["grpo", "ppo"])
def test_rpeg_plans_export_to_what_verl_runs(which, plans, models):
    v = plans[which]
    out = rv.write(v)
    _checked(out, models)
    back = rv.read(out.text, "export", response_mean=v.job.response.mean, cluster=v.cluster)
    assert back.view == out.view == rv.project(v)[0]
    graph_of(out.view)


def test_what_verl_cannot_express_is_named():
    v = read("run_qwen2-7b_rm.sh").view
    shared = _plan({"algorithm": "ppo", "model": "qwen2.5-7B", "critic": "qwen2.5-7B", "cluster": "dgx-h100",
                    "gpus": 8, "job": {**JOB, "prompts": 32},
                    "passes": [{"share_actor_critic": {}}]})
    assert shared.share
    out = rv.write(shared)
    assert any(line.startswith("critic shared with the actor") for line in out.left_out)
    assert "# verl cannot express" in out.text and "critic shared with the actor" in out.text
    assert not out.view.share and out.view.critic == "qwen2.5-7B"
    graph_of(out.view)
    streamed = v.replace(streams=(("generate", "reward", 4),))
    assert any("streaming" in line for line in rv.project(streamed)[1])


@pytest.mark.parametrize("text, message", [
    ("echo hello\n", "no command in it runs"),
    ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=opo actor_rollout_ref.model.path=Qwen/Qwen3-8B\n",
     "adv_estimator = 'opo': RPEG has no such estimator"),
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=/data/my-model algorithm.adv_estimator=grpo\n",
     "not a model RPEG knows"),
    ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
     "data.train_batch_size=100 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2\n",
     "is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size = 256"),
    ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
     "data.train_batch_size=512 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 trainer.n_gpus_per_node=6 "
     "actor_rollout_ref.rollout.tensor_model_parallel_size=4\n", "does not divide the rollout's 6 GPUs"),
    ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo notanoverride\n", "is not a Hydra override"),
    ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
     "data.train_batch_size=512 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.max_num_seqs=0\n",
     "actor_rollout_ref.rollout.max_num_seqs = 0: expected a whole number >= 1"),
    ("foo: 1\nbar: 2\n", "not a verl config"),
])
def test_bad_jobs_give_one_line_errors(text, message):
    with pytest.raises(RpegError) as e:
        rv.read(text, "job.sh")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_yaml_recipe_config_reads_like_its_script():
    text = (DATA / "run_qwen3-8b.sh").read_text()
    words, _ = script_command(text, rv._ENTRY, "x")
    nested: dict = {}
    for w in words:
        if "=" not in w or w.startswith("-"):
            continue
        key, value = w.split("=", 1)
        node = nested
        parts = key.lstrip("+").split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = rv._value(value)
    import yaml

    as_yaml = yaml.safe_dump({"defaults": ["ppo_trainer", "_self_"], **nested})
    assert rv.read(as_yaml, "x.yaml").view == rv.read(text, "x.sh").view


@pytest.mark.parametrize("layers, pp", [(28, 5), (61, 16), (28, 2), (94, 12), (7, 7)])
def test_unequal_pipeline_stages_are_written_as_first_and_last_stage_counts(layers, pp):
    """Megatron's num_layers_in_first/last_pipeline_stage leave the middle stages equal shares."""
    from rpeg.interop.verl_write import _uneven_split

    first, last = _uneven_split(layers, pp)
    middle = layers - first - last
    assert first >= 1 and last >= 1 and (pp == 2 and middle == 0 or middle % (pp - 2) == 0 and middle > 0)
    assert max(first, last) - min(first, last, middle // max(1, pp - 2) if pp > 2 else last) <= 2


def test_the_rollout_engines_max_num_seqs_reads_and_writes():
    """verl passes rollout.max_num_seqs to each vLLM engine: a script's value is the plan's engine, and an
    export writes the engine the plan priced (vLLM's default on the plan's devices where the plan set none)."""
    text = (DATA / "run_qwen2-7b_math.sh").read_text().replace(
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.max_num_seqs=64")
    v = rv.read(text, "job.sh").view
    assert dict(v.layouts)["generate"].max_seqs == 64
    assert "actor_rollout_ref.rollout.max_num_seqs=64" in rv.write(v).text
    unset = dict(v.layouts)["generate"].replace(max_seqs=0)
    on_h100 = v.replace(cluster="dgx-h100",
                        layouts=tuple((s, unset if s == "generate" else lay) for s, lay in v.layouts))
    assert "actor_rollout_ref.rollout.max_num_seqs=1024" in rv.write(on_h100).text  # vLLM's LLM class on an H100
    on_a100 = on_h100.replace(cluster="dgx-a100-80gb")
    assert "actor_rollout_ref.rollout.max_num_seqs=256" in rv.write(on_a100).text


def test_a_lora_script_reads_its_adapters_and_writes_them_back():
    """verl's own LoRA example (model.lora_rank 64, lora_alpha 32, target_modules left at all-linear): the
    adapters on the actor, the reference its base; exported and read again, the same keys."""
    from rpeg.graph.lora import LoRA

    im = read("run_qwen2_5-3b_gsm8k_grpo_lora.sh")
    assert im.view.lora == LoRA(rank=64, alpha=32.0)
    assert not [u for u in im.unmapped if u.startswith("actor_rollout_ref.model.lora")]
    g = graph_of(im.view)
    assert g.model("actor").lora == im.view.lora and g.model("ref").base_of == "actor"
    out = rv.write(im.view)
    assert "actor_rollout_ref.model.lora_rank=64" in out.text and "actor_rollout_ref.model.lora_alpha=32" in out.text
    back = rv.read(out.text, "export")
    assert back.view.lora == im.view.lora and not back.unmapped
    narrow = rv.write(im.view.replace(lora=LoRA(rank=8, targets=("q", "v"))))
    assert "actor_rollout_ref.model.target_modules=[q_proj,v_proj]" in narrow.text
    assert rv.read(narrow.text, "export").view.lora == LoRA(rank=8, targets=("q", "v"))


def test_a_lora_export_passes_verls_checks(models):
    """A plan with adapters (Qwen3-8B's example given LoRA on q and v) exports keys verl's own config takes
    (composed by Hydra, which refuses a key verl does not have; its validate_config asks vLLM's version for
    LoRA, and the peers' environment has no vLLM)."""
    from rpeg.graph.lora import LoRA

    im = read("run_qwen3-8b.sh")
    out = rv.write(im.view.replace(lora=LoRA(rank=16, alpha=32.0, targets=("q", "v"))))
    cfg = _checked(out, models, validate=False)
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (16, 32, ["q_proj", "v_proj"])
