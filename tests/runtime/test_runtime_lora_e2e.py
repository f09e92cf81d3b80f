"""LoRA GRPO runs of the tiny model end to end (the full fine-tune's are test_runtime_e2e.py's): the adapters
change and the base does not; the reference is the base (its KL to the policy is exactly zero before the
first update); the engines sample with the trainer's adapters (sent alone, or merged); model/ holds the
merged weights and peft's adapter folder; a resumed run ends bit for bit where an uninterrupted one does."""

from __future__ import annotations

import os

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.graph.lora import LoRA
from rpeg.passes import colocate, place, refit
from rpeg.runtime import adapters
from rpeg.runtime.models import load
from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, lay, rt, weights

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

LORA = LoRA(rank=8, alpha=16.0)


def colocated(lora: LoRA = LORA):
    return laid_out(colocate(build_graph("grpo", job(), Models(actor=TINY, lora=lora), kl_coef=0.04), 1))


def split(lora: LoRA, train_dp: int = 1):
    g = build_graph("grpo", job(), Models(actor=TINY, lora=lora), kl_coef=0.04)
    g = place(g, {"gen": 1, "train": train_dp}, {"generate": "gen"}, default="train")
    g = lay(g, "generate", dp=1)
    for s in g.stages:
        if s.model and s.kind.value not in ("sync", "generate"):
            g = lay(g, s.name, dp=train_dp, **({"zero": 3} if train_dp > 1 and s.model in ("actor", "ref") else {}))
    return refit(g, "full")


def _check_outputs(out: str, lora: LoRA) -> None:
    """Only adapters in the checkpoint, all moved; model/ = the base with B A folded in, the rest the base's
    bit for bit; model/adapter/ loads in peft and computes what model/ does."""
    from peft import PeftModel
    from safetensors.torch import load_file

    saved = weights(out)
    assert saved and all(adapters.is_adapter(k) for k in saved)
    assert all(float(v.abs().max()) > 0 for k, v in saved.items() if ".lora_B." in k)  # every B moved off zero
    base = load_file(os.path.join(out, "warm-model", "model.safetensors"))
    merged = load_file(os.path.join(out, "model", "model.safetensors"))
    assert set(merged) == set(base)
    adapted = {k.split(".lora_")[0] + ".weight" for k in saved}
    for k in base:
        if k in adapted:
            stem = k.removesuffix(".weight")
            delta = lora.alpha / lora.rank * (saved[f"{stem}.lora_B.default.weight"] @ saved[
                f"{stem}.lora_A.default.weight"])
            assert float((merged[k] - base[k] - delta).abs().max()) < 1e-6, k
        else:
            assert torch.equal(merged[k], base[k]), k  # embeddings, norms: frozen
    model = PeftModel.from_pretrained(load(os.path.join(out, "warm-model"))[0], os.path.join(out, "model", "adapter"))
    ids = torch.tensor([[5, 6, 14, 7, 9, 10]])
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = load(os.path.join(out, "model"))[0](input_ids=ids).logits
    assert float((a - b).abs().max()) < 1e-4


def test_lora_grpo_colocated_trains_adapters_against_the_base(tmp_path):
    result = run(colocated(), rt(tmp_path, steps=3), progress=False)
    m = result.metrics
    assert len(m) == 3 and any(x["grad_norm"] > 0 for x in m)
    assert m[0]["kl_ref"] == 0.0  # the adapters start at zero: the policy is the base, and the reference is it
    assert any(x["kl_ref"] != 0.0 for x in m[1:])  # ... then the policy moves and the reference does not
    assert all(x["logprob_gap_max"] < 1e-4 for x in m)  # the engine samples with the trained adapters
    _check_outputs(result.out, LORA)


@pytest.mark.parametrize("sync,dp", [("adapters", 1), ("merged", 2)])
def test_lora_grpo_split_sends_the_engine_adapters_or_merged_weights(tmp_path, sync, dp):
    """Generation on its own device: its engine holds adapters and takes them alone, or holds none and takes
    the merged weights; training on one device, or FSDP2 over two; the reference on the actor's ranks."""
    lora = LoRA(rank=8, alpha=16.0, sync=sync)
    result = run(split(lora, dp), rt(tmp_path, steps=3), progress=False)
    m = result.metrics
    assert m[0]["kl_ref"] == 0.0 and any(x["kl_ref"] != 0.0 for x in m[1:])
    # on-policy: after each sync the engine's logprobs of its samples are the trainer's
    assert all(x["logprob_gap_max"] < 1e-4 for x in m), [x["logprob_gap_max"] for x in m]
    refs = [r for r in result.timeline.records if r.unit == "ref_logprobs"]
    assert refs and all(r.devices == (1, dp) for r in refs)  # on the actor's devices: no copy of its own
    _check_outputs(result.out, lora)


def test_lora_resume_is_exact(tmp_path):
    plan = colocated()
    full = run(plan, rt(tmp_path / "a", steps=4), progress=False)
    run(plan, rt(tmp_path / "b", steps=2), progress=False)
    resumed = run(plan, rt(tmp_path / "b", steps=4), resume=True, progress=False)
    a, b = weights(full.out), weights(resumed.out)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [x["reward"] for x in full.metrics] == [x["reward"] for x in resumed.metrics]
