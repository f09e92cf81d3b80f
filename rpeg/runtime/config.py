"""RuntimeConfig: what `rpeg train` needs beyond the plan — weights, task, steps, optimizer, outputs.

In a job file it is the `runtime:` section:

    runtime:
      model_path: tiny          # a local Hugging Face folder, or `tiny` to build the tiny model
      reward_model_path: tiny   # only for a job with a reward model: a sequence-classification folder
      task: {name: arithmetic, ops: [add], level: 2}
      steps: 40
      lr: 2.0e-5
      warmup_sft_steps: 300     # supervised warm-up on the task's answers, so rewards are not all zero
      warmup_target: 0.3        # ... that stops once sampled dev accuracy reaches 0.3 (300 steps: a bound)
      eval_every: 10
      checkpoint_every: 10
      out: runs/demo
      loggers: [tensorboard, wandb, mlflow]   # any subset: experiment trackers (rpeg/runtime/trackers.py)
      chat: false               # true: each prompt is the user's message in the tokenizer's chat template
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rpeg.errors import RpegError


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeConfig:
    model_path: str = "tiny"
    task: dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    steps: int = 20
    seed: int = 0
    lr: float = 2e-5
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch: int = 64  # rows a forward/backward call in the plan `rpeg train` makes (a given plan: its layouts')
    temperature: float = 1.0
    max_new_tokens: int = 8
    warmup_sft_steps: int = 0  # the warm-up's steps; with warmup_target, its upper bound
    warmup_target: float = 0.0  # stop the warm-up at this sampled accuracy on dev problems (0: run every step)
    warmup_check_every: int = 20  # warm-up steps between two dev checks
    sft_lr: float = 3e-3
    sft_batch: int = 64
    eval_every: int = 10
    eval_size: int = 200
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    out: str = "rpeg-out/run"
    engine: Literal["hf", "vllm"] = "hf"  # rollout engine: transformers sampling loop, or vLLM's offline engine
    engine_memory: float = 0.4  # vllm: fraction of device memory for its weights and KV cache
    engine_kv_cache_mib: int = 0  # vllm: KV cache size in MiB instead (0: sized by engine_memory)
    device: Literal["cpu", "cuda"] = "cpu"  # cuda: a GPU per rank (Ray num_gpus), NCCL, bf16 with fp32 master weights
    pp_schedule: Literal["1f1b", "gpipe"] = "1f1b"  # pipeline-parallel training's schedule (Megatron's is 1F1B)
    threads: int = 0  # torch threads per worker (0: the worker's CPU share)
    address: str = ""  # a Ray cluster to join ("" : RAY_ADDRESS, else a private local cluster)
    reward_model_path: str = ""  # a local sequence-classification folder, or `tiny`: for plans with a reward model
    deterministic: bool = True
    loggers: tuple[str, ...] = ()  # experiment trackers beside metrics.jsonl: tensorboard, wandb, mlflow
    chat: bool = False  # prompts as the user's turn of the tokenizer's chat template (an instruct model's format)
    partial_segment: int = 0  # partial rollout: tokens between two chances to take new weights (0: max_new_tokens / 4)

    def __post_init__(self) -> None:
        problems = [f"{f} = {getattr(self, f)} must be positive" for f in ("steps", "micro_batch", "max_new_tokens",
                                                                            "eval_size", "sft_batch",
                                                                            "warmup_check_every")
                    if getattr(self, f) <= 0]
        problems += [f"{f} = {getattr(self, f)} must be >= 0" for f in ("warmup_sft_steps", "eval_every",
                                                                        "checkpoint_every", "warmup_steps", "threads",
                                                                        "engine_kv_cache_mib", "partial_segment")
                     if getattr(self, f) < 0]
        if self.lr <= 0 or self.sft_lr <= 0:
            problems.append("lr and sft_lr must be positive")
        from rpeg.runtime.trackers import TRACKERS

        bad = [n for n in self.loggers if n not in TRACKERS]
        if bad or len(set(self.loggers)) != len(self.loggers):
            problems.append(f"loggers = {list(self.loggers)}: expected distinct names of {', '.join(TRACKERS)}")
        if not 0.0 <= self.warmup_target < 1.0:
            problems.append(f"warmup_target = {self.warmup_target} must be in [0, 1)")
        if self.warmup_target and not self.warmup_sft_steps:
            problems.append("warmup_target needs warmup_sft_steps > 0 (the warm-up's bound)")
        if self.device not in ("cpu", "cuda"):
            problems.append(f"device = {self.device!r}: expected cpu or cuda")
        if self.pp_schedule not in ("1f1b", "gpipe"):
            problems.append(f"pp_schedule = {self.pp_schedule!r}: expected 1f1b or gpipe")
        if self.engine not in ("hf", "vllm"):
            problems.append(f"engine = {self.engine!r}: expected hf or vllm")
        if not 0 < self.engine_memory <= 1:
            problems.append(f"engine_memory = {self.engine_memory} must be in (0, 1]")
        if not isinstance(self.task, dict) or "name" not in self.task:
            problems.append("task must be a mapping with a name, e.g. {name: arithmetic}")
        if problems:
            raise RpegError("runtime: " + "; ".join(problems))

    def replace(self, **changes) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)
