"""LoRA adapters on a Hugging Face model, through peft (the job's `lora:`, rpeg/graph/lora.py).

`attach` injects peft's LoRA layers into the model in place (`inject_adapter_in_model`): each targeted
projection becomes a peft `lora.Linear` holding the frozen `base_layer` and the trained `lora_A` and
`lora_B`, so the state dict names them `...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight`;
every other parameter is frozen. The model stays the model (no PeftModel wrapper): FSDP2, DTensor tensor
parallelism and the samplers see the same module tree as without adapters, one level deeper.

What crosses a process:
- `adapter_state`: the adapters' tensors alone (what a weight sync sends an engine that holds adapters
  too, and what a checkpoint keeps: the frozen base is the model folder's);
- `merged_state`: the weights with each adapter folded in, W + (alpha / r) B A, named as the model without
  adapters (what an engine that cannot load adapters takes, and model/'s merged folder);
- `save_adapter`: peft's adapter folder (adapter_config.json, adapter_model.safetensors), which
  `PeftModel.from_pretrained(base, folder)` and vLLM's LoRA requests load.

`disabled(model)`: the adapters off for the forwards inside it, so the model computes as its base: the
LoRA reference (logprobs of the base policy) on the trainer's own weights, with no second copy.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch

from rpeg.graph.lora import MODULES, LoRA
NAME = "default"  # peft's adapter name
TAG = ".lora_"  # in every adapter tensor's name


def config(lora: LoRA):
    """peft's LoraConfig of the job's adapters."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=[MODULES[t] for t in lora.targets],
                      lora_dropout=lora.dropout, bias="none", task_type="CAUSAL_LM")


def attach(model, lora: LoRA, seed: int = 0):
    """`model` with the job's adapters injected (in place; returned), the rest frozen. lora_A is drawn
    from a generator seeded by `seed` (peft's Kaiming-uniform init) and lora_B is zero, so the model with
    adapters computes exactly what it did without them; every rank draws the same adapters."""
    from peft import inject_adapter_in_model

    from rpeg.errors import RpegError

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [MODULES[t] for t in lora.targets if MODULES[t] not in names]
    if missing:
        raise RpegError(f"lora: the model has no {', '.join(missing)} linear layers to adapt (its architecture "
                        f"names its projections otherwise); targets: {', '.join(lora.targets)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config(lora), model, adapter_name=NAME)
    return model


def layers(model) -> list:
    """peft's LoRA layers in `model`."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def disabled(model):
    """The adapters off inside the block (the base model computes), on again after it."""
    held = layers(model)
    for m in held:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in held:
            m.enable_adapters(True)


def is_adapter(name: str) -> bool:
    return TAG in name


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' tensors of a full state dict (the model's names)."""
    return {k: v for k, v in state.items() if is_adapter(k)}


def merged_state(state: dict[str, torch.Tensor], lora: LoRA) -> dict[str, torch.Tensor]:
    """A full state dict with adapters (every tensor gathered) as the model without them: each adapted
    projection's weight W + (alpha / r) B A (peft's merge: its forward adds (alpha / r) B A x to W x),
    named without `base_layer`; the adapters' own tensors dropped."""
    scale = lora.alpha / lora.rank
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if is_adapter(k):
            continue
        if ".base_layer." not in k:
            out[k] = v
            continue
        stem, leaf = k.split(".base_layer.")
        if leaf == "weight":
            a, b = state[f"{stem}.lora_A.{NAME}.weight"], state[f"{stem}.lora_B.{NAME}.weight"]
            v = (v.float() + scale * (b.float() @ a.float())).to(v.dtype)
        out[f"{stem}.{leaf}"] = v
    return out


def with_base(adapters: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters and the base model's weights as one state dict of the model with adapters (each
    adapted projection's tensors under `base_layer`): what `merged_state` folds."""
    stems = {k.split(".lora_")[0] for k in adapters}
    out = dict(adapters)
    for k, v in base.items():
        stem, _, leaf = k.rpartition(".")
        out[f"{stem}.base_layer.{leaf}" if stem in stems else k] = v
    return out


def save_adapter(state: dict[str, torch.Tensor], lora: LoRA, base: str, out: str) -> str:
    """peft's adapter folder at `out`: adapter_config.json (`base` as its base model's path) and
    adapter_model.safetensors with peft's names (no adapter name: `...q_proj.lora_A.weight`, under
    `base_model.model.`, as PeftModel.save_pretrained writes them)."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    cfg = config(lora)
    cfg.base_model_name_or_path = base
    data = cfg.to_dict()
    data["target_modules"] = sorted(data["target_modules"])
    data["peft_type"] = str(cfg.peft_type.value if hasattr(cfg.peft_type, "value") else cfg.peft_type)
    data["task_type"] = str(cfg.task_type.value if hasattr(cfg.task_type, "value") else cfg.task_type)
    with open(os.path.join(out, "adapter_config.json"), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    tensors = {"base_model.model." + k.replace(f".{NAME}.", "."): v.detach().float().contiguous().cpu()
               for k, v in adapter_state(state).items()}
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


def tensor_parallel_plan(lora: LoRA | None) -> dict:
    """DTensor's plan for a decoder layer (Megatron's split: q/k/v and gate/up column-parallel, o and
    down row-parallel), with adapters: a column-parallel projection's lora_B is split by columns as its
    weight is (lora_A, r wide, replicated: its input is); a row-parallel one's lora_A is split by rows
    (it reads the sharded input; its r outputs are summed) and lora_B replicated. Each rank then adds its
    own slice of B A x to its slice of W x, as the base layer's own split has it."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col, row = ("q", "k", "v", "gate", "up"), ("o", "down")
    path = {"q": "self_attn", "k": "self_attn", "v": "self_attn", "o": "self_attn", "gate": "mlp", "up": "mlp",
            "down": "mlp"}
    plan = {}
    for t in col + row:
        stem = f"{path[t]}.{MODULES[t]}"
        style = ColwiseParallel if t in col else RowwiseParallel
        if lora is None or t not in lora.targets:
            plan[stem] = style()
            continue
        plan[f"{stem}.base_layer"] = style()
        plan[f"{stem}.lora_{'B' if t in col else 'A'}.{NAME}"] = style()
    return plan


__all__ = ["adapter_state", "attach", "disabled", "merged_state", "save_adapter",
           "tensor_parallel_plan"]
