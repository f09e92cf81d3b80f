"""Each peer's logits path (rpeg/perf/logits.py), read from its example scripts and written back: verl's
use_fused_kernels and backend, its entropy term, OpenRLHF's and AReaL's fixed paths; and the path's
bytes reach the step's memory verdict (verl's run_qwen2-7b_math.sh: 16 x 2,048 packed tokens)."""

from __future__ import annotations

from pathlib import Path

from rpeg.hardware import load_cluster
from rpeg.interop import system, verl
from rpeg.interop.common import graph_of
from rpeg.perf.step import predict_step

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
H100 = load_cluster("dgx-h100", 8)
STAGES = ("actor_update", "actor_logprobs", "ref_logprobs")


def _paths(view) -> tuple[str | None, ...]:
    return tuple(view.layout(s).logits if view.layout(s) else None for s in STAGES)


def _verl(name: str, *extra: str):
    text = (PEERS / "verl" / name).read_text()
    if extra:
        text = text.rstrip().rstrip("$@").rstrip() + "".join(f" \\\n    {x}" for x in extra) + " $@\n"
    return verl.read(text, name).view


def test_verl_fsdp_keeps_bf16_logits_and_the_entropy_adds_its_gradient():
    assert _paths(_verl("run_qwen2-7b_math.sh")) == ("bf16-ce",) * 3  # the script's KL loss runs a reference
    assert _paths(_verl("run_qwen2-7b_math.sh", "actor_rollout_ref.actor.entropy_coeff=0.001"))[:2] == (
        "bf16-ce-entropy", "bf16-ce")
    assert _verl("run_qwen2-7b_math.sh", "actor_rollout_ref.actor.calculate_entropy=True").layout(
        "actor_update").logits == "bf16-ce-entropy"


def test_verl_fused_kernels_and_the_megatron_backend():
    fused = _verl("run_qwen2-7b_math.sh", "actor_rollout_ref.model.use_fused_kernels=True")
    assert _paths(fused)[:2] == ("fused-linear", "fused-linear")
    # the megatron example sets use_fused_kernels=$USE_FUSED_KERNELS (True in the script)
    assert _paths(_verl("run_qwen2-7b_math_megatron.sh"))[:2] == ("fused-linear", "fused-linear")
    off = (PEERS / "verl" / "run_qwen2-7b_math_megatron.sh").read_text().replace("USE_FUSED_KERNELS=True",
                                                                                 "USE_FUSED_KERNELS=False")
    assert _paths(verl.read(off, "m.sh").view)[:2] == ("fused-ce", "fused-ce")


def test_verl_writes_use_fused_kernels_back_and_projects_rpegs_path():
    fused = _verl("run_qwen2-7b_math.sh", "actor_rollout_ref.model.use_fused_kernels=True")
    assert "actor_rollout_ref.model.use_fused_kernels=True" in verl.write(fused).text
    plain = _verl("run_qwen2-7b_math.sh")
    assert "use_fused_kernels" not in verl.write(plain).text
    entropy = _verl("run_qwen2-7b_math.sh", "actor_rollout_ref.actor.calculate_entropy=True")
    assert "actor_rollout_ref.actor.calculate_entropy=True" in verl.write(entropy).text
    # RPEG's own path is not verl's: the projection says so and takes verl's
    rpegs = plain.replace(layouts=tuple((s, lay.replace(logits="fp32-logsoftmax")) for s, lay in plain.layouts))
    projected, lines = verl.project(rpegs)
    assert projected.layout("actor_update").logits == "bf16-ce"
    assert any(x.startswith("logits path fp32-logsoftmax: verl's FSDP actor") for x in lines)


def test_openrlhf_and_areal_read_their_fixed_paths():
    name = "train_ppo_ray_hybrid_engine.sh"
    o = system("openrlhf").read((PEERS / "openrlhf" / name).read_text(), name).view
    assert _paths(o) == ("fp32-ce",) * 3
    assert o.layout("critic_update").logits == "fp32-logsoftmax"  # a value head: no vocabulary logits
    a = system("areal").read((PEERS / "areal" / "gsm8k_grpo.yaml").read_text(), "gsm8k_grpo.yaml").view
    assert _paths(a)[:2] == ("chunked-logsoftmax", "chunked-logsoftmax")


def test_the_path_sets_the_logits_line_of_the_step():
    """Up to 16 x 2,048 tokens of Qwen2.5-7B (152,064 entries each) per packed micro-batch: verl's 2 bytes
    are at most 10.0 GB; NeMo-RL's path on the same layout holds 6x that and does not fit an 80 GB H100."""
    view = _verl("run_qwen2-7b_math.sh")
    step = predict_step(graph_of(view), H100)
    light = dict(step.stages["actor_update"].memory_parts)["logits"]
    tokens = light / (152_064 * 2)
    assert tokens == int(tokens) and 0.9 * 16 * 2048 <= tokens <= 16 * 2048  # the packed micro-batch's tokens
    heavy_view = view.replace(layouts=tuple((s, lay.replace(logits="distributed-logprob") if s in STAGES else lay)
                                            for s, lay in view.layouts))
    heavy = predict_step(graph_of(heavy_view), H100)
    assert dict(heavy.stages["actor_update"].memory_parts)["logits"] == 6 * light  # 12 bytes where verl holds 2
    assert step.fits and not heavy.fits
