"""Each peer's offload flag, read from a real example script, changes RPEG's memory verdict and its
predicted time (issue 24, Build item 2): verl's FSDP param_offload / optimizer_offload (state moved
to the host while the colocated engine generates), verl's Megatron optimizer_cpu_offload (the
optimizer step on the host), OpenRLHF's --ds.adam_offload (tests/perf/test_perf_offload.py) and
Megatron's param/grad/optimizer_offload (the same file)."""

from __future__ import annotations

from pathlib import Path

from rpeg.hardware import load_cluster
from rpeg.interop import verl
from rpeg.interop.common import graph_of
from rpeg.perf.residency import device_memory, sleeping_engine
from rpeg.perf.step import SWITCH, predict_step

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
H100 = load_cluster("dgx-h100", 8)
FSDP = "actor_rollout_ref.actor.fsdp_config."


def _fsdp(model: str, param: bool, optimizer: bool):
    text = (PEERS / "verl" / "run_qwen2-7b_math.sh").read_text()
    text = text.replace(f"{FSDP}param_offload=False", f"{FSDP}param_offload={param}")
    text = text.replace(f"{FSDP}optimizer_offload=False", f"{FSDP}optimizer_offload={optimizer}")
    view = verl.read(text, "run.sh", model=model).view
    return view, predict_step(graph_of(view), H100)


def _while_generating(view, pred):
    """What the colocated devices hold while the engine generates, every model there summed."""
    graph = graph_of(view)
    (held,) = device_memory(graph, pred.stages, sleeping_engine=sleeping_engine(graph), while_running="generate")
    return held


def test_verl_fsdp_offload_frees_the_engines_memory_and_costs_the_switch():
    """Qwen2.5-32B on verl's 8 GPUs: with the trainer's weights and optimizer kept on the GPUs through
    generation (verl's defaults) the engine does not fit; offloaded between phases it does, and the
    step pays for moving them out and back."""
    kept_view, kept = _fsdp("qwen2.5-32B", False, False)
    moved_view, moved = _fsdp("qwen2.5-32B", True, True)
    assert kept_view.layout("actor_update").resident == ("weights", "optimizer")
    assert moved_view.layout("actor_update").resident == ()
    # the engine alone fits either way; beside the state kept on the GPUs it does not
    gen_kept, gen_moved = _while_generating(kept_view, kept), _while_generating(moved_view, moved)
    assert kept.stages["generate"].fits and not gen_kept.fits and gen_moved.fits
    assert gen_kept.peak_bytes > gen_moved.peak_bytes
    assert moved.stages[SWITCH].part("offload trainer state") > kept.stages[SWITCH].part("offload trainer state")


def test_verl_fsdp_offload_on_a_job_that_fits_either_way_costs_time_only():
    kept_view, kept = _fsdp("qwen2.5-7B", False, False)
    moved_view, moved = _fsdp("qwen2.5-7B", True, True)
    assert kept.fits and moved.fits
    assert moved.step_s > kept.step_s  # the copies out and back are paid every step
    assert _while_generating(kept_view, kept).peak_bytes > _while_generating(moved_view, moved).peak_bytes


def test_verl_megatron_optimizer_cpu_offload_moves_the_optimizer_step_to_the_host():
    text = (PEERS / "verl" / "run_qwen2-7b_math_megatron.sh").read_text()
    opt = "actor_rollout_ref.actor.optim.override_optimizer_config."
    on = text.rstrip().rstrip("$@").rstrip() + (f" \\\n    +{opt}optimizer_cpu_offload=True \\\n"
                                                  f"    +{opt}optimizer_offload_fraction=1.0 $@\n")
    base = verl.read(text, "a.sh", model="qwen2.5-32B").view
    host = verl.read(on, "b.sh", model="qwen2.5-32B").view
    assert base.layout("actor_update").offload_optimizer == 0 and host.layout("actor_update").offload_optimizer == 1
    pb, ph = predict_step(graph_of(base), H100), predict_step(graph_of(host), H100)
    tb, th = pb.stages["actor_update"], ph.stages["actor_update"]
    assert th.peak_memory_bytes < tb.peak_memory_bytes
    assert th.seconds > tb.seconds
