"""AReaL: real experiment YAMLs read into RPEG; exports loaded by AReaL's own config machinery;
round trips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from peer_code import areal_check

from rpeg.cli.plan import _bare
from rpeg.errors import RpegError
from rpeg.interop import areal as ra
from rpeg.interop.areal_alloc import parse_engine
from rpeg.interop.common import graph_of, view_of
from rpeg.search.search import search
from rpeg.spec import spec_from_data

DATA = Path(__file__).parent.parent / "data" / "peers" / "areal"
# the examples checked against the peer's own code; the rest of the folder is the import corpus
# (tests/interop/test_import_corpus.py)
EXAMPLES = ["boba_grpo.yaml", "gsm8k_grpo.yaml", "gsm8k_grpo_megatron.yaml", "gsm8k_ppo.yaml"]


def read(name: str, **kw):
    return ra.read((DATA / name).read_text(), name, **kw)


def test_the_examples_are_those_noted_in_sources():
    listed = re.findall(r"`([\w.-]+\.yaml)`", (DATA / "SOURCES.md").read_text())
    assert sorted(listed) == sorted(p.name for p in DATA.glob("*.yaml")) and set(EXAMPLES) <= set(listed)


@pytest.mark.parametrize("spec, backend, sizes, note", [
    ("sglang:d4t2", "sglang", {"d": 4, "p": 1, "t": 2, "c": 1, "e": 1}, False),
    ("sglang.d4p1t1", "sglang", {"d": 4, "p": 1, "t": 1, "c": 1, "e": 1}, False),  # AReaL 0.3's dot
    ("d32p2m1", "megatron", {"d": 32, "p": 2, "t": 1, "c": 1, "e": 1}, False),  # ReaL's m; pipeline picks Megatron
    ("d8", None, {"d": 8, "p": 1, "t": 1, "c": 1, "e": 1}, False),
    # MoE folding: the attention layout with ffn's ep; ffn's own tensor size differs, and is said so
    ("megatron:(attn:d4p2t2c2|ffn:d2p2t4e2)", "megatron", {"d": 4, "p": 2, "t": 2, "c": 2, "e": 2}, True),
    ("megatron:(attn:d1p12t4|ffn:d1p12e4)", "megatron", {"d": 1, "p": 12, "t": 4, "c": 1, "e": 4}, True),
    ("(attn:d4p4t1|ffn:p4e4)", "megatron", {"d": 4, "p": 4, "t": 1, "c": 1, "e": 4}, False),  # ffn's d derived
])
def test_allocation_strings_of_every_form(spec, backend, sizes, note):
    engine = parse_engine(spec, "k")
    assert (engine.backend, engine.sizes, bool(engine.notes)) == (backend, sizes, note)


def test_grpo_example():
    im = read("gsm8k_grpo.yaml")
    v = im.view
    assert (im.mode, v.algorithm, v.actor, v.gpus, v.async_bound, v.partial) == \
        ("async k=2", "grpo", "qwen2.5-1.5B", 8, 2, True)
    assert v.groups == (("rollout", 0, 4), ("actor", 4, 4))
    assert (v.job.prompts, v.job.samples_per_prompt, v.job.mini_batches, v.job.response.max) == (256, 4, 1, 1024)
    opts = dict(v.config)
    assert (opts["off_policy"], opts["is_cap"], opts["clip_low"], opts["kl_coef"]) == ("decoupled", 5.0, 0.4, 0.0)
    a = dict(v.layouts)["actor_update"]
    assert (a.zero, a.recompute, a.micro_batch) == (3, "full", 5)  # 10240 tokens / (1024 + 1024)
    graph_of(v)


def test_ppo_and_megatron_examples():
    v = read("gsm8k_ppo.yaml").view
    assert v.algorithm == "ppo" and v.critic == "qwen2.5-1.5B" and dict(v.assign)["critic_update"] == "actor"
    m = read("gsm8k_grpo_megatron.yaml").view
    assert dict(m.layouts)["actor_update"].zero == 1 and m.refit_gather == "shard"
    graph_of(v)
    graph_of(m)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_load_with_areals_own_code(name, tmp_path):
    areal_check((DATA / name).read_text(), tmp_path)


@pytest.mark.parametrize("name", EXAMPLES)
def test_round_trip_and_areals_checks_of_each_export(name, tmp_path):
    im = read(name)
    proj, lines = ra.project(im.view)
    assert proj == im.view and not lines
    out = ra.write(im.view)
    areal_check(out.text, tmp_path)
    back = ra.read(out.text, "export", response_mean=im.view.job.response.mean)
    assert back.view == proj
    assert ra.write(back.view).text == out.text


JOB = {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
       "response": {"kind": "lognormal", "mean": 1500, "max": 4096}, "mini_batches": 4}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rpeg_plans_export_to_what_areal_loads(algorithm, tmp_path):
    data = {"algorithm": algorithm, "model": "qwen2.5-7B", "cluster": "dgx-h100", "gpus": 16, "job": JOB}
    if algorithm == "ppo":
        data["critic"] = "qwen2.5-7B"
    spec = spec_from_data(data, "test")
    _, cluster, gpus = spec.cluster_and_gpus()
    best = search(_bare(spec), cluster, gpus, max_staleness=2).best
    v = view_of(best.graph, actor="qwen2.5-7B", critic="qwen2.5-7B" if algorithm == "ppo" else None,
                cluster="dgx-h100", gpus=gpus)
    out = ra.write(v)
    cfg = areal_check(out.text, tmp_path)
    # AReaL's algorithm is its normalization, and an engine with no optimizer does not train
    assert cfg.actor.adv_norm.mean_level == "batch" and cfg.actor.optimizer is not None
    if algorithm == "grpo":
        assert (cfg.actor.reward_norm.mean_level, cfg.actor.reward_norm.std_level) == ("group", "group")
    else:
        assert cfg.critic.optimizer is not None
    back = ra.read(out.text, "export", response_mean=v.job.response.mean, cluster="dgx-h100")
    assert back.view == out.view == ra.project(v)[0]
    graph_of(out.view)


def test_colocated_generation_is_named():
    v = read("gsm8k_grpo.yaml").view
    colo = v.replace(groups=(("all", 0, 8),), assign=tuple((s, "all") for s, _ in v.assign),
                     layouts=tuple((s, lo.replace(dp=8 // (lo.tp * lo.pp * lo.cp))) for s, lo in v.layouts))
    proj, lines = ra.project(colo)
    assert any(line.startswith("generation colocated with training") for line in lines)
    assert proj.groups == (("rollout", 0, 4), ("actor", 4, 4))
    graph_of(proj)


@pytest.mark.parametrize("text, message", [
    ("foo: 1\n", "not an AReaL experiment config"),
    ("actor: {path: Qwen/Qwen3-8B, backend: 'fsdp:d4'}\nrollout: {backend: 'tensorrt:d4'}\n",
     "backend 'tensorrt' is none of AReaL's"),
    ("actor: {path: Qwen/Qwen3-8B}\nallocation_mode: 'sglang:d4|megatron:d4'\ngconfig: {}\n", "colocated with `|`"),
    ("actor: {path: Qwen/Qwen3-8B}\nallocation_mode: 'd8p1t1'\ngconfig: {}\n", "a training engine alone"),
    ("actor: {path: Qwen/Qwen3-8B}\nallocation_mode: 'sglang:d4+eval'\ngconfig: {}\n", "evaluation-only"),
    ("actor: {path: Qwen/Qwen3-8B}\nallocation_mode: 'sglang:d4+megatron:(attn:d2p2|ffn:d1p4e2)'\ngconfig: {}\n",
     "share the pipeline size"),
    ("actor: {path: Qwen/Qwen3-8B}\nallocation_mode: 'sglang:d4+fsdp:(attn:d2|ffn:e2)'\ngconfig: {}\n",
     "attn|ffn layouts are Megatron's"),
    ("actor: {path: Qwen/Qwen3-8B, backend: 'fsdp:d4p2'}\nrollout: {backend: 'sglang:d4'}\n"
     "train_dataset: {batch_size: 8}\n", "fsdp with pipeline or expert parallelism"),
    ("actor: {path: /my/model, backend: 'fsdp:d4', kl_ctl: 0.0}\nrollout: {backend: 'sglang:d4'}\n"
     "train_dataset: {batch_size: 8}\n", "not a model RPEG knows"),
    ("actor: {path: Qwen/Qwen3-8B, backend: 'fsdp:d4', kl_ctl: 0.0}\nrollout: {backend: 'sglang:d4'}\n"
     "train_dataset: {batch_size: 8}\ncluster: {n_nodes: 1, n_gpus_per_node: 4}\n", "the backends use 8 GPUs"),
])
def test_bad_configs_give_one_line_errors(text, message):
    with pytest.raises(RpegError) as e:
        ra.read(text, "exp.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lora_settings_are_read_written_and_load_with_areals_own_code(tmp_path):
    """TrainEngineConfig's use_lora, lora_rank, lora_alpha and target_modules: a view with adapters exports
    an actor section AReaL's own config loader takes, which reads back to the same adapters."""
    from rpeg.graph.lora import LoRA

    im = read("gsm8k_grpo.yaml")
    assert im.view.lora is None
    for lora in (LoRA(rank=32, alpha=16.0), LoRA(rank=8, alpha=16.0, targets=("q", "k", "v", "o"))):
        out = ra.write(im.view.replace(lora=lora))
        assert "use_lora: true" in out.text
        areal_check(out.text, tmp_path)
        back = ra.read(out.text, "export", response_mean=im.view.job.response.mean)
        assert back.view.lora == lora and not [u for u in back.unmapped if "lora" in u or "target_modules" in u]
    text = (DATA / "gsm8k_grpo.yaml").read_text().replace("actor:\n", "actor:\n  use_lora: true\n", 1)
    got = ra.read(text, "lora")
    assert got.view.lora == LoRA(rank=32, alpha=16.0)  # AReaL's defaults; target_modules empty read as all-linear
    assert any("actor.target_modules" in a for a in got.assumed)
