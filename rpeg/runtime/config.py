"""RuntimeConfig: what `rpeg train` needs beyond the plan — weights, task, steps, optimizer, outputs.

In a job file it is the `runtime:` section:

    runtime:
      model_path: tiny          # a local Hugging Face folder, or `tiny` to build the tiny model; left out,
                                # the job's `model:` when that is a local model folder (it wins when given)
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
      environment: {name: calculator, max_turns: 3}   # multi-turn episodes with tools (docs/agents.md)

Every number has a range (_COUNTS and _REALS below: steps up to 1,000,000, lr in [1e-12, 1],
temperature in [0.01, 100], seed in [0, 2^31 - 1], ...); one outside it, NaN or infinity is refused
in one line naming the field and the range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_TOKENS, problem
from rpeg.graph.bounds import problems as bounded

# The ranges of the section's numbers: (field, least, most, why the most). A count whose least is 1 must
# be positive; 0 where allowed means "off" or "the default". The upper bounds sit far above any run and
# are there so that a typo (`steps: 1000000000000`) is refused in one line instead of running for ever.
MAX_RUN_STEPS = 1_000_000  # RL, warm-up, evaluation and checkpoint steps: published RL runs take up to ~10^4
_COUNTS = (
    ("steps", 1, MAX_RUN_STEPS, "published RL runs take up to ~10^4 steps"),
    ("micro_batch", 1, 65_536, "rows of one forward/backward call"),
    ("max_new_tokens", 1, MAX_TOKENS, "above the longest contexts shipped"),
    ("eval_size", 1, MAX_RUN_STEPS, "held-out problems"),
    ("sft_batch", 1, 65_536, "rows of one warm-up step"),
    ("warmup_check_every", 1, MAX_RUN_STEPS, ""),
    ("warmup_sft_steps", 0, MAX_RUN_STEPS, ""), ("warmup_steps", 0, MAX_RUN_STEPS, ""),
    ("eval_every", 0, MAX_RUN_STEPS, ""), ("checkpoint_every", 0, MAX_RUN_STEPS, ""),
    ("keep_checkpoints", 0, MAX_RUN_STEPS, ""),
    ("threads", 0, 4_096, "threads per worker; the largest machines have ~10^3 cores"),
    ("engine_kv_cache_mib", 0, 16_777_216, "16 TiB of KV cache"),
    ("partial_segment", 0, MAX_TOKENS, ""),
    ("verify_sync_every", 0, MAX_RUN_STEPS, ""),
    ("max_restarts", 0, 10_000, "a run restarted more often has a fault that restarts do not mend"),
    ("seed", 0, 2**31 - 1, "a 31-bit seed: the seeds derived from it stay in every generator's range"),
)
# Numbers that must be usable positive numbers: below the least, float32 arithmetic loses them (a
# learning rate of 1e-300 is 0 in a float32 update, a temperature of 1e-300 divides logits into inf).
_REALS = (
    ("lr", 1e-12, 1.0, "an Adam step moves each weight by about lr"),
    ("sft_lr", 1e-12, 1.0, "an Adam step moves each weight by about lr"),
    ("grad_clip", 1e-6, 1e6, ""),
    ("temperature", 0.01, 100.0, "at 100 sampling is all but uniform"),  # vLLM raises one below 0.01 to 0.01
    ("engine_memory", 0.01, 1.0, "a fraction of device memory"),
    ("wait_timeout_s", 1.0, 1e7, "about four months"),
    ("wait_timeout_factor", 1.0, 1e4, ""),
    ("startup_timeout_s", 1.0, 1e7, "about four months"),
)  # warmup_target, an accuracy in [0, 1), has its own rule below


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
    verify_sync_every: int = 1  # check every N-th weight sync's tensors on the engines against the trainer's (0: never)
    # no wait on a worker lasts longer than wait_timeout_factor x the predicted step time x (k + 1), nor at
    # least wait_timeout_s (runtime/waits.py): a hung worker ends the run with one line, not a silent hang
    wait_timeout_s: float = 1800.0
    wait_timeout_factor: float = 10.0
    startup_timeout_s: float = 600.0  # ... and before the first step (models loading), or while a restart's do: this
    # a worker that dies, fails or times out is restarted and the run goes on (runtime.run's recovery), at
    # most this many times a run; past it the run stops with one line and its last checkpoint
    max_restarts: int = 3
    environment: dict[str, Any] | None = None  # multi-turn episodes: {name: calculator, max_turns: 3, ...}

    def __post_init__(self) -> None:
        problems = bounded([problem(f, getattr(self, f), positive=lo > 0, minimum=None if lo > 0 else lo, maximum=hi,
                                    why=why) for f, lo, hi, why in _COUNTS]
                           + [problem(f, getattr(self, f), minimum=lo, maximum=hi, why=why)
                              for f, lo, hi, why in _REALS])
        problems += [f"{f} = {getattr(self, f)!r} must be a whole number" for f, *_ in _COUNTS
                     if isinstance(getattr(self, f), float)]
        if problems:  # NaN, inf, a wrong sign or absurd: each named with its range, before the rules below
            raise RpegError("runtime: " + "; ".join(problems))
        problems += [f"{f} = '': an empty name; leave the key out for the default" for f in ("model_path", "out")
                     if not str(getattr(self, f)).strip()]
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
        if not isinstance(self.task, dict) or "name" not in self.task:
            problems.append("task must be a mapping with a name, e.g. {name: arithmetic}")
        if self.environment is not None:
            if not isinstance(self.environment, dict) or "name" not in self.environment:
                problems.append("environment must be a mapping with a name, e.g. {name: calculator, max_turns: 3}")
            else:
                from rpeg.tasks import environment_options

                try:
                    environment_options(self.environment["name"], dict(self.env_options))
                except RpegError as e:
                    problems.append(str(e))
        if problems:
            raise RpegError("runtime: " + "; ".join(problems))

    @property
    def env_options(self) -> tuple:
        """runtime.environment's options (all but its name), as sorted (key, value) pairs."""
        return tuple(sorted((k, v) for k, v in (self.environment or {}).items() if k != "name"))

    def env_spec(self, task):
        """The environment as the rollout workers build it (runtime.agent_engine.EnvSpec), or None."""
        if self.environment is None:
            return None
        from rpeg.runtime.agent_engine import EnvSpec

        return EnvSpec(self.environment["name"], task, self.env_options, chat=self.chat)

    def replace(self, **changes) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)
