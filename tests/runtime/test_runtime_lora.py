"""LoRA in the trainer (rpeg/runtime/adapters.py): adapters change and the base does not; the reference is
the base with adapters off; merged weights compute what the adapted model computes; a checkpoint holds the
adapters and restores them; FSDP2 and tensor parallelism with adapters match one process."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from rpeg.errors import RpegError
from rpeg.graph.lora import LoRA
from rpeg.runtime import adapters
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.trainer import Trainer
from tests.runtime.test_runtime_fsdp import CFG, OPT, _batch, _free_port, _join, _leave

LORA = LoRA(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny(str(tmp_path_factory.mktemp("lora") / "tiny"))


def _trainer(path: str, lora: LoRA | None = LORA, seed: int = 0, **kw) -> Trainer:
    return Trainer(load(path)[0], CFG, OPT, lora=lora, seed=seed, **kw)


def test_adapters_train_and_the_base_stays(tiny):
    tr, base = _trainer(tiny), _trainer(tiny, lora=None)
    b = _batch()
    assert torch.equal(tr.logprobs(b), base.logprobs(b))  # lora_B starts at zero: the model is unchanged
    trained = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trained and all(adapters.is_adapter(n) for n in trained)
    assert {g for grp in tr.opt.param_groups for g in grp["params"]} == \
        {p for p in tr.model.parameters() if p.requires_grad}  # the optimizer holds the adapters alone
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train(b, epochs=1, mini_batches=2, seed=0)
    after = tr.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if adapters.is_adapter(k)}  # every adapter moved, nothing else
    # the reference: the same model with adapters off computes the base model's logprobs, bit for bit
    assert torch.equal(tr.base_logprobs(b), base.logprobs(b))
    assert not torch.equal(tr.logprobs(b), base.logprobs(b))


def test_merged_weights_compute_the_adapted_model(tiny):
    tr = _trainer(tiny)
    b = _batch()
    tr.train(b, epochs=1, mini_batches=1, seed=0)
    merged = tr.engine_weights(merged=True)
    plain, _ = load(tiny)
    assert set(merged) == set(plain.state_dict())  # named as the model without adapters
    plain.load_state_dict(merged, strict=True)
    worst = float((_trainer(tiny, lora=None).logprobs(b) - tr.logprobs(b)).abs().max())
    assert worst > 1e-3  # the adapters moved the model
    got = Trainer(plain, CFG, OPT).logprobs(b)
    assert float((got - tr.logprobs(b)).abs().max()) < 1e-5
    sent = tr.engine_weights(merged=False)
    assert set(sent) == {k for k in tr.model.state_dict() if adapters.is_adapter(k)}
    assert sum(v.numel() for v in sent.values()) == LORA.params(_spec())  # the perf model counts what peft holds


def _spec():
    from rpeg.graph import get_model

    return get_model("tiny-qwen2")


def test_checkpoint_holds_the_adapters_and_restores_them(tiny):
    tr = _trainer(tiny)
    b = _batch()
    tr.train(b, epochs=1, mini_batches=2, seed=0)
    state = tr.checkpoint_state()
    assert set(state["model"]) == {k for k in tr.model.state_dict() if adapters.is_adapter(k)}
    again = _trainer(tiny, seed=7)  # other adapters drawn: the checkpoint's replace them
    again.load_checkpoint_state(state)
    assert torch.equal(again.logprobs(b), tr.logprobs(b))
    assert again.updates == tr.updates
    other = _trainer(tiny, lora=LoRA(rank=2, alpha=4.0))
    with pytest.raises(RpegError, match="not this job's LoRA adapters"):
        other.load_checkpoint_state(state)


def test_adapter_folder_loads_in_peft(tiny, tmp_path):
    from peft import PeftModel

    tr = _trainer(tiny)
    b = _batch()
    tr.train(b, epochs=1, mini_batches=1, seed=0)
    folder = adapters.save_adapter(tr.full_state_dict(), LORA, tiny, str(tmp_path / "adapter"))
    cfg = json.load(open(os.path.join(folder, "adapter_config.json")))
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and cfg["peft_type"] == "LORA"
    model = PeftModel.from_pretrained(load(tiny)[0], folder)
    with torch.no_grad():
        out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids()).logits
    logp = torch.log_softmax(out[:, :-1].float(), -1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1) * b.mask
    assert float((logp - tr.logprobs(b)).abs().max()) < 1e-5


def test_a_model_without_the_targets_is_refused(tiny):
    model, _ = load(tiny)
    for layer in model.model.layers:  # no q_proj linear layer: an architecture naming its projections otherwise
        layer.self_attn.q_proj = torch.nn.Identity()
    with pytest.raises(RpegError, match="no q_proj linear layers"):
        adapters.attach(model, LoRA(rank=2, alpha=2.0, targets=("q",)))


def _rank_lora(rank: int, world: int, port: int, path: str, out: str, tp: int) -> None:
    _join(rank, world, port)
    trainer = Trainer(load(path)[0], CFG, OPT, lora=LORA, seed=0, shard=world > tp, tp=tp)
    b = _batch()
    rows = torch.arange(b.size) if tp > 1 else torch.arange(rank * 4, rank * 4 + 4)  # tp ranks see every row
    logp, base = trainer.logprobs(b), trainer.base_logprobs(b)
    trainer.train(b.select(rows), epochs=1, mini_batches=1, seed=0)
    _leave(rank, out, {"weights": trainer.full_state_dict(), "logprobs": logp, "base": base})


@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp2", "tp"])
def test_two_ranks_with_adapters_match_one_process(tiny, tmp_path, tp):
    """FSDP2 over two ranks (each half the rows) or tensor parallelism over two (the adapters split with
    their projections): the step's weights match one process's, the frozen weights bit for bit."""
    single = _trainer(tiny)
    b = _batch()
    ref_logp = single.logprobs(b)
    single.train(b, epochs=1, mini_batches=1, seed=0)
    ref = single.full_state_dict()
    out = str(tmp_path / "lora.pt")
    mp.start_processes(_rank_lora, args=(2, _free_port(), tiny, out, tp), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out)
    assert set(got["weights"]) == set(ref)
    assert float((got["logprobs"] - ref_logp).abs().max()) < 1e-5
    assert float((got["base"] - ref_logp).abs().max()) < 1e-5  # adapters off at the start: the same model
    start = load(tiny)[0].state_dict()
    for k, v in got["weights"].items():
        if not adapters.is_adapter(k):
            assert torch.equal(v, start[k.replace(".base_layer.", ".")]), k
    worst = max(float((got["weights"][k] - ref[k]).abs().max()) for k in ref if adapters.is_adapter(k))
    assert worst < 0.02 * OPT.lr, worst
