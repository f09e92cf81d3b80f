"""Pinned or pageable host copies (rpeg/perf/offload.py, efficiency.PAGEABLE_*): each rate's use against
worked numbers, the layout's `pageable` list, the NeMo-RL validation rows that copy through pageable
memory, and OpenRLHF's sleep flags read into what the trainer keeps on the GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.interop import openrlhf
from rpeg.perf import memory, offload
from rpeg.perf.efficiency import (HOST_LINK_BYTES_PER_S, HOST_LINK_C2C_BYTES_PER_S, PAGEABLE_D2H_BYTES_PER_S,
                                  PAGEABLE_H2D_BYTES_PER_S, host_copy_bytes_per_s)
from rpeg.perf.validation import NEMO_RL_PAGEABLE, rl_graph
from rpeg.perf.weightsync import OFFLOAD_TRAINER, RELOAD_TRAINER, context_switch_cost

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
H100 = load_cluster("dgx-h100").device
GB200 = load_cluster("gb200-nvl72").device
LLAMA8B = get_model("llama-3.1-8B")


def test_layout_pageable_names_copies_and_a_part_names_both_directions():
    assert Layout(pageable=["weights"]).pageable == ("weights-out", "weights-in")
    assert Layout(pageable=("optimizer-in", "weights-out")).pageable == ("weights-out", "optimizer-in")
    assert "pageable=weights-out+weights-in" in Layout(pageable=["weights"]).describe()
    with pytest.raises(RpegError, match="'activations' is not a host copy"):
        Layout(pageable=["activations"])
    with pytest.raises(RpegError, match="must be a list"):
        Layout(pageable="weights")


def test_rates_pinned_unless_listed_and_pageable_a_tenth_on_x86():
    assert host_copy_bytes_per_s(H100, "weights-out") == HOST_LINK_BYTES_PER_S.value == 25e9
    assert host_copy_bytes_per_s(None, "weights-out") == 25e9  # no device: an x86 host
    assert host_copy_bytes_per_s(H100, "weights-out", ("weights-out",)) == PAGEABLE_D2H_BYTES_PER_S["x86"].value
    assert host_copy_bytes_per_s(H100, "weights-in", ("weights-in",)) == PAGEABLE_H2D_BYTES_PER_S["x86"].value
    assert host_copy_bytes_per_s(H100, "weights-in", ("weights-out",)) == 25e9  # only the listed direction
    assert PAGEABLE_D2H_BYTES_PER_S["x86"].value == 2.5e9 == HOST_LINK_BYTES_PER_S.value / 10
    # Grace: no bounce buffer, pageable ~0.95 of pinned
    pinned, pageable = (host_copy_bytes_per_s(GB200, "optimizer-out", p) for p in ((), ("optimizer-out",)))
    assert pinned == HOST_LINK_C2C_BYTES_PER_S.value and 0.9 < pageable / pinned < 1.0


def test_a_pageable_optimizer_move_costs_its_copy_at_the_pageable_rate():
    """Llama-3.1-8B, ZeRO-1 over 8 GPUs (the nrl03-h100-llama8b-on-8 row): 12 B of Adam state a parameter
    over 8 ranks, ~12.0 GB a GPU; pinned 0.48 s each way, through pageable memory 4.8 s out and 2.4 s back."""
    train, gen = Layout(dp=8, zero=1), Layout(dp=8)
    p = memory.params_per_device(LLAMA8B, train)
    opt, weights = p * 12 / 8, p * 2
    assert opt == pytest.approx(12.0e9, rel=0.01)
    pinned = context_switch_cost("s", LLAMA8B, train, gen, H100)
    slow = context_switch_cost("s", LLAMA8B, train.replace(pageable=("optimizer",)), gen, H100)
    assert pinned.part(OFFLOAD_TRAINER) == pytest.approx((weights + opt) / 25e9, rel=1e-12)
    assert slow.part(OFFLOAD_TRAINER) == pytest.approx(weights / 25e9 + opt / 2.5e9, rel=1e-12)
    assert slow.part(RELOAD_TRAINER) == pytest.approx(weights / 25e9 + opt / 5e9, rel=1e-12)
    assert opt / 2.5e9 == pytest.approx(4.8, rel=0.01) and opt / 5e9 == pytest.approx(2.4, rel=0.01)
    assert slow.seconds - pinned.seconds == pytest.approx(opt / 2.5e9 + opt / 5e9 - 2 * opt / 25e9, rel=1e-12)


def test_a_pageable_gradient_copy_of_a_host_optimizer_is_marked_and_slower():
    """DeepSpeed's ZeRO-Offload with pin_memory false: the gradients go down through pageable memory."""
    owned = 1e9
    pinned = dict(offload.optimizer_offload_parts(owned, Layout(offload_optimizer=1.0), H100))
    slow = dict(offload.optimizer_offload_parts(owned, Layout(offload_optimizer=1.0,
                                                              pageable=("gradients-out", "weights-in")), H100))
    assert pinned[offload.GRADS_DOWN] == pytest.approx(1e9 * 4 / 25e9)  # 0.16 s
    assert slow[offload.GRADS_DOWN + " (pageable)"] == pytest.approx(1e9 * 4 / 2.5e9)  # 1.6 s
    assert slow[offload.WEIGHTS_UP + " (pageable)"] == pytest.approx(1e9 * 2 / 5e9)  # 0.4 s
    assert slow[offload.HOST_STEP] == pinned[offload.HOST_STEP]


def test_nemo_rl_rows_move_the_optimizer_through_pageable_memory():
    entry = {"id": "t", "system": "dgx-h100", "model": "llama-3.1-8B", "gpus": 8, "gpus_per_node": 8,
             "prompts": 64, "samples_per_prompt": 32, "train_global_batch": 512, "max_seq_len": 4096,
             "mean_seq_len": 945, "async_bound": 0, "colocated": True, "generation": {"tp": 1, "pp": 1},
             "training": {"tp": 1, "cp": 1, "pp": 1, "recompute": "none"}, "measured": {"step_s": 112}}
    graph, _ = rl_graph(entry, {}, "test")
    assert NEMO_RL_PAGEABLE == ("optimizer",)
    assert graph.stage("actor_update").layout.pageable == ("optimizer-out", "optimizer-in")


def _hybrid(edit=lambda t: t):
    text = edit((PEERS / "openrlhf" / "train_ppo_ray_hybrid_engine.sh").read_text())
    return openrlhf.read(text, "h.sh", model="llama-3.1-8B")


def test_openrlhf_sleep_keeps_the_bf16_weights_on_the_gpus():
    asleep = _hybrid()  # --train.colocate_all --vllm.enable_sleep --ds.enable_sleep, ZeRO-3
    awake = _hybrid(lambda t: t.replace("   --ds.enable_sleep \\\n", ""))
    for stage in ("actor_update", "critic_update"):
        assert asleep.view.layout(stage).resident == ("weights",)
        assert awake.view.layout(stage).resident == ("weights", "gradients", "optimizer")
    assert not any("enable_sleep" in line for line in asleep.unmapped + asleep.assumed)
    # written back: the sleep flag with the weights alone resident, none with the optimizer resident too
    assert "--ds.enable_sleep" in openrlhf.write(asleep.view).text
    back = openrlhf.write(awake.view)
    assert "--ds.enable_sleep" not in back.text and not back.left_out
    assert openrlhf.read(back.text, "b.sh", model="llama-3.1-8B").view.layout("actor_update").resident == \
        awake.view.layout("actor_update").resident


def test_openrlhf_engines_awake_is_said_and_no_sleep_apart_from_the_engines():
    awake = _hybrid(lambda t: t.replace("   --vllm.enable_sleep \\\n", ""))
    assert any("without --vllm.enable_sleep" in line for line in awake.assumed)
    text = (PEERS / "openrlhf" / "train_ppo_ray_slurm.sh").read_text()
    text = text.replace("--vllm.sync_backend nccl \\\n", "--vllm.sync_backend nccl \\\n    --ds.enable_sleep \\\n")
    assert "--ds.enable_sleep" in text
    apart = openrlhf.read(text, "s.sh", model="llama-3.1-8B")
    assert apart.view.layout("actor_update").resident == ()
    assert any(line.startswith("ds.enable_sleep") and "which they do not here" in line for line in apart.unmapped)
