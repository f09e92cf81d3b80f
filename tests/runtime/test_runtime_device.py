"""The trainer's and the hf engine's device path (what a GPU rank runs): batches moved to the
device, outputs back on the host, bf16 autocast over fp32 master weights. Exercised on the CPU:
with device="cpu" every result equals the default path's, bit for bit; bf16 stays close."""

from __future__ import annotations

import torch

from rpeg.graph.config import AlgoConfig
from rpeg.runtime.batch import build_batch
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.rollout import HFEngine, SamplingParams
from rpeg.runtime.trainer import OptimConfig, Trainer


def _setup(tmp_path):
    path = build_tiny(str(tmp_path / "tiny"))
    (m1, tok), (m2, _), (m3, _) = load(path), load(path), load(path)
    prompts = [tok("12+7=", add_special_tokens=False)["input_ids"]] * 4
    return tok, (m1, m2, m3), prompts


def test_the_device_path_on_the_cpu_equals_the_default_path_and_bf16_stays_close(tmp_path):
    tok, (m1, m2, m3), prompts = _setup(tmp_path)
    params = SamplingParams(max_new_tokens=5)
    r1, l1 = HFEngine(m1, tok.eos_token_id, tok.pad_token_id).generate(prompts, params, seed=3)
    r2, l2 = HFEngine(m2, tok.eos_token_id, tok.pad_token_id, device="cpu").generate(prompts, params, seed=3)
    assert r1 == r2 and l1 == l2
    batch = build_batch(prompts, r1, l1, [0, 0, 1, 1], [0] * 4, tok.pad_token_id)
    cfg, optim = AlgoConfig(adv_estimator="grpo"), OptimConfig(micro_batch=2)
    default = Trainer(m1, cfg, optim).logprobs(batch)
    on_device = Trainer(m2, cfg, optim, device="cpu").logprobs(batch)
    assert torch.equal(default, on_device) and on_device.device.type == "cpu"
    bf16 = Trainer(m3, cfg, optim, device="cpu", bf16=True)
    close = bf16.logprobs(batch)
    assert close.dtype == torch.float32 and torch.allclose(close, default, atol=0.2)
    assert not torch.equal(close, default)  # autocast did run the forward in bf16
    batch.extras["old_logprobs"] = default
    batch.extras["advantages"] = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand_as(batch.mask).clone()
    metrics = bf16.train(batch, 1, 1, seed=0)
    assert metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # the master weights stay fp32
