"""Every peer config of the import corpus (tests/data/peers/{verl,openrlhf,areal}, sources in each
folder's SOURCES.md) imports with the facts pinned here, or is refused with its true reason.

`ok`: the algorithm, the actor's preset, the GPUs, the peer's mode and the layouts of generation and
the actor's update (ParallelLayout.describe()); the view must also build into RPEG's planned graph.
`refused`: a substring of the one-line reason. scripts/import_corpus.py prints
the same outcomes for a person.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.errors import RpegError
from rpeg.interop import system
from rpeg.interop.common import graph_of

DATA = Path(__file__).parent.parent / "data" / "peers"


def ok(algorithm, actor, gpus, mode, generate, actor_update, model=None):
    return {"kind": "ok", "facts": (algorithm, actor, gpus, mode, generate, actor_update), "model": model}


def refused(reason):
    return {"kind": "refused", "reason": reason}


CORPUS = {
    ("verl", "dapo_7b_math_fsdp2_8_8.sh"): ok("grpo", "qwen2.5-7B", 16, "fully-async", "dp8 max-seqs=256",
        "dp8 zero3 recompute=full mb2 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "dapo_run_dapo_qwen2.5_32b.sh"): ok("dapo", "qwen2.5-32B", 128, "sync", "dp32 tp4 max-seqs=256",
        "dp16 cp8 zero3 recompute=full logits=bf16-ce"),
    ("verl", "dapo_test_dapo_qwen3_30b_math.sh"): ok("grpo", "qwen3-30B-A3B", 64, "sync", "dp16 tp4 max-seqs=256",
        "dp16 cp4 zero3 recompute=full mb2 logits=bf16-ce"),
    ("verl", "gmpo_run_qwen2_5-7b_math.sh"): refused(
        "policy_loss.loss_mode = 'geo_mean': RPEG's policy losses are vanilla (ppo) and gspo"),
    ("verl", "gspo_test_gspo_3b_math_slurm.sh"): ok("grpo", "Qwen/Qwen2.5-3B-Instruct", 8, "sync", "dp8 max-seqs=256",
        "dp8 zero3 recompute=full mb2 logits=bf16-ce"),
    ("verl", "qwen2-70b_grpo_32_h20_fsdp_vllm.sh"): refused(
        "actor_rollout_ref.model.path = 'model_path': not a model RPEG knows"),
    ("verl", "run_dapo.sh"): ok("dapo", "qwen2.5-0.5B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb2 resident=weights+optimizer logits=fused-linear"),
    ("verl", "run_deepseek671b_math_megatron_80gb.sh"): ok("grpo", "deepseek-v3", 256, "sync", "dp8 tp32 max-seqs=256",
        "dp16 pp16 ep16 zero1 recompute=full uneven-pp pageable=weights-out logits=fused-linear", model="deepseek-v3"),
    ("verl", "run_deepseek671b_math_megatron_96gb.sh"): ok("grpo", "deepseek-v3", 96, "sync", "dp3 tp32 max-seqs=256",
        "tp8 pp12 ep8 zero1 recompute=full sp uneven-pp optimizer-on-host pageable=weights-out logits=fused-linear"),
    ("verl", "run_gptoss_20b.sh"): ok("grpo", "openai/gpt-oss-20b", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb32 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_one_step_off_policy.sh"): ok("grpo", "qwen2.5-0.5B", 8, "one-step-off", "tp2 max-seqs=256",
        "dp3 cp2 zero3 recompute=full mb5 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh"): ok("ppo", "Qwen/Qwen1.5-MoE-A2.7B-Chat", 32, "sync",
        "dp8 tp4 max-seqs=256",
        "dp4 tp4 pp2 zero1 sp mb4 resident=weights+gradients+optimizer logits=fused-ce"),
    ("verl", "run_qwen2-7b_math.sh"): ok("grpo", "qwen2.5-7B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb16 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen2-7b_math_megatron.sh"): ok("grpo", "qwen2.5-7B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp2 tp2 pp2 zero1 sp mb4 resident=weights+gradients+optimizer logits=fused-linear"),
    ("verl", "run_qwen2-7b_math_rf_baseline.sh"): ok("reinforce_pp_baseline", "qwen2.5-7B", 16, "sync",
        "dp8 tp2 max-seqs=256",
        "dp16 zero3 recompute=full mb16 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen2-7b_rm.sh"): ok("ppo", "qwen2.5-7B", 8, "sync", "dp8 max-seqs=256",
        "dp8 zero3 recompute=full mb16 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen2.5-3b_seq_balance.sh"): ok("remax", "Qwen/Qwen2.5-3B-Instruct", 8, "sync",
        "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb19 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen2_5_vl-7b.sh"): ok("grpo", "Qwen/Qwen2.5-VL-7B-Instruct", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb10 resident=weights+optimizer logits=fused-linear"),
    ("verl", "run_qwen3-235b_megatron_96gb.sh"): ok("grpo", "qwen3-235B-A22B", 32, "sync", "dp4 tp8 max-seqs=256",
        "tp4 pp8 ep4 zero1 sp uneven-pp optimizer-on-host pageable=weights-out logits=fused-linear"),
    ("verl", "run_qwen3-4b_gsm8k_multiturn.sh"): ok("grpo", "qwen3-4B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb32 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen3-8b.sh"): ok("grpo", "qwen3-8B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb32 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen30b_sapo.sh"): refused(
        "policy_loss.loss_mode = 'sapo': RPEG's policy losses are vanilla (ppo) and gspo"),
    ("verl", "run_rloo_qwen2-7b.sh"): ok("rloo", "qwen2.5-7B", 8, "sync", "dp4 tp2 max-seqs=256",
        "dp8 zero3 recompute=full mb80 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_qwen2_5-3b_gsm8k_grpo_lora.sh"): ok("grpo", "Qwen/Qwen2.5-3B-Instruct", 2, "sync",
        "tp2 max-seqs=256", "dp2 zero3 recompute=full mb40 resident=weights+optimizer logits=bf16-ce"),
    ("verl", "run_with_rollout_corr.sh"): refused('rloo needs samples_per_prompt >= 2'),
    ("verl", "split_placement_run_deepseek7b_llm.sh"): refused('no command in it runs verl.trainer.main_ppo'),
    ("verl", "test_gspo_qwen30b_a3b_ep.sh"): ok("grpo", "qwen3-30B-A3B", 16, "sync", "dp16 ep4 max-seqs=256",
        "dp4 tp4 ep4 zero1 recompute=full sp pageable=weights-out logits=fused-ce"),
    ("openrlhf", "train_dapo_ray_hybrid_engine.sh"): ok("grpo", "llama-3.1-8B", 8, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full mb8 resident=weights logits=fp32-ce"),
    ("openrlhf", "train_ppo_ray_hybrid_engine.sh"): ok("ppo", "llama-3.1-8B", 8, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full mb8 resident=weights logits=fp32-ce"),
    ("openrlhf", "train_ppo_ray_slurm.sh"): ok("ppo", "llama-3.1-8B", 16, "sync", "dp4 tp2",
        "dp4 zero3 recompute=full mb8 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "train_ppo_with_reward_fn.sh"): ok("ppo", "llama-3.1-8B", 8, "sync", "dp2 tp2",
        "dp2 zero3 recompute=full mb8 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "train_prorlv2_math_hybrid_engine.sh"): ok("reinforce_pp_baseline",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 8, "sync", "dp8",
        "dp8 zero3 recompute=full mb3 resident=weights logits=fp32-ce"),
    ("openrlhf", "train_reinforce_baseline_hybrid_engine.sh"): ok("reinforce_pp_baseline", "qwen3-4B", 4,
        "sync", "dp2 tp2",
        "dp2 cp2 zero3 recompute=full resident=weights logits=fp32-ce"),
    ("openrlhf", "train_reinforce_baseline_ray_agent_async.sh"): ok("reinforce_pp_baseline", "qwen3-4B", 8,
        "async", "dp2 tp2",
        "dp2 cp2 zero3 recompute=full logits=fp32-ce"),
    ("openrlhf", "train_vlm_math_hybrid_engine.sh"): refused(
        "--actor.model_name_or_path = 'Qwen/Qwen3.5-2B': not a model RPEG knows"),
    ("openrlhf", "v0.6.0_train_ppo_llama_ray.sh"): ok("ppo", "llama-3.1-8B", 8, "sync", "dp2 tp2",
        "dp2 zero3 recompute=full mb16 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "v0.8.0_train_grpo_ray_hybrid_engine.sh"): ok("grpo", "llama-3.1-8B", 8, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full mb8 resident=weights logits=fp32-ce"),
    ("openrlhf", "v0.8.0_train_ppo_llama_ray_70b.sh"): ok("ppo", "llama-3.1-70B", 32, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "v0.8.0_train_ppo_llama_ray_ring.sh"): ok("ppo", "llama-3.1-8B", 8, "sync", "dp2 tp2",
        "cp2 zero3 recompute=full mb16 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "v0.8.0_train_ppo_llama_ray_slurm.sh"): ok("ppo", "llama-3.1-8B", 16, "sync", "dp4 tp2",
        "dp4 zero3 recompute=full mb8 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "v0.8.0_train_reinforce_baseline_llama_ray_async.sh"): ok("reinforce_pp_baseline", "llama-3.1-8B",
        8, "async", "dp2",
        "dp4 zero3 recompute=full mb16 optimizer-on-host logits=fp32-ce"),
    ("openrlhf", "v0.9.10_train_dapo_ray_hybrid_engine.sh"): ok("grpo", "llama-3.1-8B", 8, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full mb8 resident=weights logits=fp32-ce"),
    ("openrlhf", "v0.9.10_train_ppo_ray_hybrid_engine.sh"): ok("ppo", "llama-3.1-8B", 8, "sync", "dp4 tp2",
        "dp8 zero3 recompute=full mb8 resident=weights logits=fp32-ce"),
    ("openrlhf", "v0.9.10_train_reinforce_baseline_ray_agent_async.sh"): ok("reinforce_pp_baseline", "qwen3-4B", 8,
        "async", "dp2 tp2",
        "dp2 cp2 zero3 recompute=full logits=fp32-ce"),
    ("areal", "boba_grpo.yaml"): ok("grpo", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 8, "async k=4", "dp4",
        "dp4 zero3 recompute=full logits=chunked-logsoftmax"),
    ("areal", "gsm8k_dapo_dynamic_bs.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb2 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_grpo.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_grpo_megatron.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero1 mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_grpo_mt.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_gspo.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_ppo.yaml"): ok("ppo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_ppo_megatron.yaml"): ok("ppo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero1 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "gsm8k_rloo.yaml"): ok("rloo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 recompute=full mb5 logits=chunked-logsoftmax"),
    ("areal", "tau2_config_235b_moe_airline.yaml"): ok("grpo", "qwen3-235B-A22B", 80, "async k=2", "dp4 tp8",
        "tp4 pp12 ep4 zero1 recompute=full sp uneven-pp mb3 logits=chunked-logsoftmax"),
    ("areal", "tau2_config_30b_moe_airline.yaml"): ok("grpo", "qwen3-30B-A3B", 64, "async k=2", "dp8 tp4",
        "dp4 tp2 pp4 ep4 zero1 recompute=full sp mb3 logits=chunked-logsoftmax"),
    ("areal", "tongyi_deepresearch_config.yaml"): ok("grpo", "qwen3-1.7B", 8, "async k=4", "dp4",
        "dp2 pp2 zero1 recompute=full mb3 logits=chunked-logsoftmax"),
    ("areal", "v0.3.4_gsm8k_grpo.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "dp4 zero3 mb5 logits=chunked-logsoftmax"),
    ("areal", "v0.3.4_gsm8k_grpo_megatron.yaml"): ok("grpo", "qwen2.5-1.5B", 8, "async k=2", "dp4",
        "tp2 pp2 zero1 sp mb5 logits=chunked-logsoftmax"),
    ("areal", "v0.3.4_ppo-7B-distill-gpus-128.yaml"): refused('a ReaL (realhf) experiment config'),
    ("areal", "v0.4.1_boba_grpo_vllm.yaml"): ok("grpo", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        16, "async k=4", "dp4 tp2",
        "dp8 zero3 recompute=full logits=chunked-logsoftmax"),
}


def test_every_file_of_the_corpus_is_pinned():
    files = {(s, p.name) for s in ("verl", "openrlhf", "areal") for p in (DATA / s).iterdir() if p.name != "SOURCES.md"}
    assert files == set(CORPUS)
    assert len(files) >= 40


@pytest.mark.parametrize("key", sorted(CORPUS), ids=lambda k: f"{k[0]}/{k[1]}")
def test_a_corpus_file_imports_or_is_refused_for_its_reason(key):
    name, filename = key
    want = CORPUS[key]
    text = (DATA / name / filename).read_text()
    if want["kind"] == "ok":
        imported = system(name).read(text, filename, model=want["model"])
        v = imported.view
        lay = dict(v.layouts)
        got = (v.algorithm, v.actor, v.gpus, imported.mode, lay["generate"].describe(), lay["actor_update"].describe())
        assert got == want["facts"]
        graph_of(v)  # the plan builds: every layout fits its group and its model
        return
    with pytest.raises(RpegError) as e:
        graph_of(system(name).read(text, filename).view)
    message = str(e.value)
    assert "\n" not in message
    assert want["reason"] in message
