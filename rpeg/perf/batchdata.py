"""The batch of an RL step sent through Ray to every worker of a training or logprob pass.

An RL framework's driver holds the step's batch (token ids, masks, advantages, logprobs) and
hands each worker its data-parallel shard as the argument of a Ray call (NeMo-RL's
`RayWorkerGroup.run_all_workers_sharded_data`: `worker.train.remote(shard)` per worker, the shard
replicated along tensor, pipeline and context parallelism; verl's megatron dispatch the same way).
Ray serialises a plain argument once per call, so the driver puts and ships tp x pp x cp copies of
every shard: the whole batch tp x pp x cp times. The batch is a padded tensor: every sequence is
padded to the step's longest (NeMo-RL's `batched_message_log_to_flat_message`), so the bytes go
with the longest sequence, not the mean. One call per pass: the training call carries the step's
whole batch and loops over its optimizer steps inside the worker; the policy and reference
logprob passes are two calls.

    seconds = tp * pp * cp * sequences * padded_length * BATCH_BYTES_PER_TOKEN / BATCH_TRANSFER_BYTES_PER_S

The bytes per padded token are NeMo-RL's data dict (nemo_rl/algorithms/grpo.py at v0.3.0); the rate
at which a driver serialises and ships call arguments is nobody's published figure: it is fitted
(rpeg/perf/fitted.py) on the per-stage rows of nemo-rl-v0.3-stages.yaml.
"""

from __future__ import annotations

from rpeg.graph.layout import ParallelLayout
from rpeg.perf.efficiency import Factor
from rpeg.perf.fitted import declare

BATCH_BYTES_PER_TOKEN = {
    "infer": Factor(24, "NeMo-RL's GRPO train_data as the logprob passes get it (nemo_rl/algorithms/grpo.py, "
                        "v0.3.0): input_ids int64 (8 B), token_mask int64 (8 B: ones_like(token_ids)), "
                        "advantages fp32 (4 B) and generation_logprobs fp32 (4 B) per padded token"),
    "train": Factor(32, "the same data dict as the training call gets it: the logprob passes' 24 B per padded "
                        "token plus prev_logprobs and reference_policy_logprobs, fp32 each"),
}
BATCH_TRANSFER_BYTES_PER_S = declare(
    "rl.batch_transfer_bytes_per_s", unit="B/s", bounds=(2e8, 3e10),
    rows=("nemo-rl-v0.3-stages:rl:logprobs", "nemo-rl-v0.3-stages:rl:training"), group="rl-batch",
    mechanism="the rate at which an RL driver serialises a Ray call's tensor arguments into its object store "
              "and the workers pull them (one copy per call, so one per tensor-, pipeline- and context-parallel "
              "replica of a data-parallel shard: NeMo-RL's run_all_workers_sharded_data), the driver's "
              "single-threaded pickling and the object transfer between nodes together")
LABEL = "batch through Ray to every worker"


def batch_transfer_bytes(layout: ParallelLayout, sequences: float, padded_length: float, *, train: bool) -> float:
    """Bytes the driver ships for one pass: every shard once per tp x pp x cp replica, each
    sequence padded to `padded_length` tokens."""
    per_token = BATCH_BYTES_PER_TOKEN["train" if train else "infer"].value
    return layout.tp * layout.pp * layout.cp * sequences * padded_length * per_token


def batch_transfer_s(layout: ParallelLayout, sequences: float, padded_length: float, *, train: bool) -> float:
    """Seconds of one pass's batch transfer (module docstring)."""
    return batch_transfer_bytes(layout, sequences, padded_length, train=train) / BATCH_TRANSFER_BYTES_PER_S.value
