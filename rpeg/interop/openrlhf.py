"""OpenRLHF: its `train_ppo_ray` command line, read into RPEG and written from RPEG's plans.

What is read (OpenRLHF 0.11.2, openrlhf/cli/train_ppo_ray.py, whose flags are dotted since 0.10:
`--actor.num_nodes`, `--vllm.num_engines`, ...): a launch script running
`python3 -m openrlhf.cli.train_ppo_ray` (after `ray job submit ... --` or not), or an args file of
the flags alone. Only the flags given are read; the parser's defaults fill the rest.

The mapping (sources: train_ppo_ray.py's parser and the checks after it; trainer/ray/*):
- `--algo.advantage.estimator`: gae -> ppo, group_norm -> grpo (dapo with
  `--algo.dynamic_filtering_enable`), rloo, reinforce -> reinforce_pp, reinforce_baseline ->
  reinforce_pp_baseline, dr_grpo. `--algo.kl.init_coef` (0.01 by default: a reference runs unless
  it is 0), in the loss with `--algo.kl.use_loss`, else in the reward; `--algo.kl.estimator` k1 or
  k3. `--actor.eps_clip` / `--actor.eps_clip_low_high`, `--actor.dual_clip` (off by default),
  `--actor.loss_agg_mode`, `--actor.policy_loss_type`, `--actor.entropy_coef`,
  `--algo.advantage.gamma` / `lambd` / `no_std_norm`, `--critic.value_clip`, and the rollout
  correction `--algo.advantage.is_correction_level` / `_mode` / `_threshold` gating on the ratio
  rho (models/loss.py PolicyLoss): token clip, weight clamp(rho, low, high), is tis; token mask,
  IcePop's weight rho inside [low, high] and 0 outside with every token in the denominator, is
  decoupled; both exactly when low is 0, and a lower bound above 0 is read as 0 and said so. seq
  mask (a sequence whose geometric-mean rho leaves [low, high] weighs 0, the others' tokens keep
  rho) has no RPEG equal: it is read as mask-seq, which approximates it, and said so.
- The job: `--rollout.batch_size` prompts of `--rollout.n_samples_per_prompt` samples; mini-batches
  of `--train.batch_size` samples (its global training batch); `--train.max_epochs`; the response
  cap `--rollout.max_new_tokens`, the prompt `--data.max_len` less it.
- The plan: one device group per model, laid end to end in the order vLLM engines
  (`--vllm.num_engines` x `--vllm.tensor_parallel_size`), actor, reference, critic, reward
  (`--<role>.num_nodes` x `num_gpus_per_node`); `--train.colocate_actor_ref` puts the reference on
  the actor's GPUs, `--train.colocate_critic_reward` the reward model on the critic's,
  `--train.colocate_all` every model and the engines on one group (in async mode the engines keep
  their own GPUs: the parser's own warning). The actor's old logprobs run on the actor's group.
  Layouts: DeepSpeed ZeRO `--ds.zero_stage` (forward passes ZeRO-3 under stage 3, else whole
  weights: utils/deepspeed/deepspeed.py), `--ds.tensor_parallel_size` as tp, `--ds.ring_attn_size`
  as cp, `--actor.gradient_checkpointing_enable` (actor and critic) as full recomputation,
  `--train.micro_batch_size` and `--rollout.micro_batch_size` as micro-batches,
  `--ds.packing_samples` as packing (`--train.dynamic_batch_enable`: `--train.max_tokens_per_gpu`
  over the longest sequence, packed); the logits path of the actor and the reference is fp32-ce
  (Actor.forward's fp32 copy and flash-attn's cross-entropy: rpeg/perf/logits.py); `--ref.offload`
  keeps the reference on the host;
  `--ds.adam_offload` (older `--adam_offload`) keeps the actor's and the critic's optimizer on the
  host with its Adam step (offload_optimizer = 1, rpeg/perf/offload.py). With the engines on the
  trainers' GPUs, `--ds.enable_sleep` moves the trainers' optimizer state to pinned host memory around
  generation and keeps their bf16 weights on the GPUs (resident = weights); without it everything stays
  (resident = weights + optimizer, + gradients under ZeRO-3); `--vllm.enable_sleep` is the context
  switch's engine sleep and wake (vLLM level 1, a pinned backup). Async:
  `--train.async_enable` with a queue of `--train.async_queue_size` batches (k), and
  `--train.partial_rollout_enable`. The weight sync broadcasts every tensor gathered in full.
- Agent RLHF: `--train.agent_func_path` (a Python file with an AgentExecutor, not read) makes the
  job's rollouts multi-turn episodes (Job.episode) and the agent the reward; OpenRLHF has no turn
  flag (an episode ends when the agent says done or at `--data.max_len`), so the cap on replies is
  the response's token budget and the turns are assumed (common.episode_of). An export of a job
  with episodes writes a placeholder agent path and names a turn cap it cannot write.

What OpenRLHF cannot express (`project`): critic sharing, fusion, streaming, pipeline
parallelism, device groups other than the per-model ones and the three colocation flags,
asynchrony with the engines on the training GPUs, forward passes laid out apart from their
model's group, the corrections tis-seq (its loss refuses clip at level seq), mask-token and
mask-seq (its masks keep the kept tokens' weight rho and every token in the denominator).

The code: openrlhf_keys.py holds the entry point, the value tables, the parser's defaults and the flags that
change nothing; openrlhf_flags.py the older underscore flags; openrlhf_read.py reads (`read`); openrlhf_write.py
projects and writes (`project`, `arguments`, `write`). This module is their public surface: what
`rpeg.interop.system("openrlhf")` gives.
"""

from __future__ import annotations

from rpeg.interop.openrlhf_keys import (  # noqa: F401 (the tables: the tests)
    CORRECTIONS, DEFAULTS, ENTRY, ESTIMATORS, EXPORTS, FLAGS, FLOAT2, SUFFIX, SYSTEM, _ENTRY,
)
from rpeg.interop.openrlhf_read import read  # noqa: F401
from rpeg.interop.openrlhf_write import arguments, project, write  # noqa: F401
