"""The trained policy as a Hugging Face folder: written at the end of a run (`out/model`) and inside
every checkpoint (`checkpoints/step-N/model`), loaded by `from_pretrained` as it is, with the
logits of the trainer's own weights; and prompts through a tokenizer's chat template."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.passes import colocate, parallelize
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.run import run

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

TINY = get_model("tiny-qwen2")
IDS = torch.tensor([[5, 17, 9, 30, 2], [40, 41, 42, 43, 44]])


def plan(devices: int = 1, dp: int = 1):
    job = Job(prompts=8, samples_per_prompt=4, prompt_len=6, response=LengthDistribution.fixed(4), mini_batches=2)
    g = colocate(build_graph("grpo", job, Models(actor=TINY), kl_coef=0.0), devices)
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = parallelize(g, s.name, dp=dp, micro_batch=64, packing=False,
                            **({"zero": 3} if dp > 1 and s.name in ("actor_update", "actor_logprobs") else {}))
    return g


def rt(tmp_path, **kw):
    base = dict(model_path="tiny", task={"name": "arithmetic", "ops": ["add"], "level": 1}, steps=2, lr=1e-2,
                max_new_tokens=3, eval_every=0, eval_size=8, checkpoint_every=1, keep_checkpoints=2,
                out=str(tmp_path / "run"), threads=1)
    return RuntimeConfig(**(base | kw))


def trainer_logits(weights: dict, like: str) -> torch.Tensor:
    """Logits of the trainer's weights (a checkpoint's state.pt) in a model built from `like`'s config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(like), dtype=torch.float32)
    model.load_state_dict(weights, strict=True)
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def folder_logits(path: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)  # as a user loads it: no options
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def state(out: str, step: int) -> dict:
    return torch.load(os.path.join(out, "checkpoints", f"step-{step:06d}", "state.pt"), weights_only=False)


def test_the_run_writes_its_policy_as_a_model_folder_with_the_trainers_logits(tmp_path):
    from transformers import AutoTokenizer

    result = run(plan(), rt(tmp_path), progress=False)
    out = result.out
    final = os.path.join(out, "model")
    assert final in result.files
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(final))
    warm = os.path.join(out, "warm-model")
    last = state(out, 2)["actor"]["model"]
    # the folder's logits are the trainer's, exactly: same float32 weights, same forward
    assert torch.equal(folder_logits(final), trainer_logits(last, warm))
    # ... and it is the trained policy, not the one the run started from
    assert not torch.allclose(folder_logits(final), folder_logits(warm))
    # every checkpoint holds its own step's policy
    for step in (1, 2):
        inside = os.path.join(out, "checkpoints", f"step-{step:06d}", "model")
        assert torch.equal(folder_logits(inside), trainer_logits(state(out, step)["actor"]["model"], warm))
    assert not torch.equal(folder_logits(os.path.join(out, "checkpoints", "step-000001", "model")),
                           folder_logits(final))
    tok, run_tok = AutoTokenizer.from_pretrained(final), AutoTokenizer.from_pretrained(warm)
    assert tok("12+7=")["input_ids"] == run_tok("12+7=")["input_ids"]
    assert tok.eos_token_id == run_tok.eos_token_id and tok.pad_token_id == run_tok.pad_token_id
    with open(os.path.join(final, "config.json")) as fh:
        assert json.load(fh)["tie_word_embeddings"] is True  # tied as the model was: one matrix, stored once


def test_a_sharded_run_without_checkpoints_still_writes_the_gathered_policy(tmp_path):
    """FSDP2 over two ranks (ZeRO-3 shards of every weight), no checkpoints: the folder at the end
    holds the full weights gathered from the shards (a model that loads and differs from the start)."""
    result = run(plan(devices=2, dp=2), rt(tmp_path, checkpoint_every=0), progress=False)
    final = os.path.join(result.out, "model")
    assert not os.path.exists(os.path.join(result.out, "checkpoints"))
    logits = folder_logits(final)
    assert logits.shape[:2] == (2, 5) and torch.isfinite(logits).all()
    assert not torch.allclose(logits, folder_logits(os.path.join(result.out, "warm-model")))


def test_prompts_go_through_the_chat_template_when_asked(tmp_path):
    from rpeg.runtime.models import build_tiny, load, prompt_ids

    _, tok = load(build_tiny(str(tmp_path / "tiny")))
    assert prompt_ids(tok, ["1+2="]) == [tok("1+2=", add_special_tokens=False)["input_ids"]]
    with pytest.raises(RpegError, match="no chat template"):
        prompt_ids(tok, ["1+2="], chat=True)
    tok.chat_template = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: " \
                        "{% endif %}"
    assert prompt_ids(tok, ["1+2="], chat=True) == [tok("Q: 1+2=\nA: ", add_special_tokens=False)["input_ids"]]
