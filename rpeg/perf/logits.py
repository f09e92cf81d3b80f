"""The logits of a training or log-prob pass: bytes per device, by the path the system takes.

Every token of a micro-batch becomes a row of vocab/tp logits on the last pipeline stage, and what
the system does with those rows sets how many bytes each (token, vocab/tp) entry holds at the pass's
peak. ParallelLayout.logits names the path; `LOGITS` says, per path, the bytes per entry live at the
peak of a forward-only (log-prob) pass and of a training pass (its forward or its backward with the
logits' gradient, whichever holds more: the layers' activations are live through both), counted
tensor by tensor from the system's code. A chunked path holds `whole` bytes per entry over all the
micro-batch's tokens plus `chunk` bytes over at most `chunk_tokens` of them.

Counting rules: the head writes bf16 (2 bytes); a tensor lives until nothing refers to it (a local
name, a tensor autograd saved, an output object the trainer keeps); in-place operations (`exp_`,
`div_`, `-=`, flash-attn's `inplace_backward`) add nothing; a gradient that reaches a bf16 tensor from
fp32 is cast back (2 more). Fused Triton kernels (flash-attn's cross-entropy) work row block by row
block in registers and hold nothing of full size. torch.compile'd reductions (verl's entropy, AReaL's
log-softmax) are counted as fused, keeping no full-size temporary: an estimate, not a measurement.

Korthikanti et al. 2022 (arXiv 2205.05198, section 4.3) count the 4sbv/t bytes of fp32 logits that
Megatron's cross-entropy keeps between forward and backward; the peaks below add what lives beside
them while they are made and consumed.

Tests: tests/perf/test_perf_logits.py (each path's bytes by hand).
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.layout import DEFAULT_LOGITS
from rpeg.graph.model import ModelSpec


@dataclass(frozen=True, slots=True)
class LogitsPath:
    """Bytes per (token, vocab/tp) entry at the peak of a pass, and where they come from."""

    forward: float  # a forward-only pass (old, reference log-probs), over every token of the micro-batch
    train: float  # a training pass: max(its forward, its backward), over every token
    source: str
    chunk_tokens: int = 0  # > 0: the path also holds the chunk bytes below over at most this many tokens
    forward_chunk: float = 0.0
    train_chunk: float = 0.0


LOGITS: dict[str, LogitsPath] = {
    "fp32-logsoftmax": LogitsPath(10, 12, (
        "RPEG's runtime (rpeg/runtime/trainer.py `_next_logprobs`: log_softmax(logits.float() / T).gather). Forward: "
        "the head's bf16 output the model returns (2), its fp32 copy divided by the temperature (4; the undivided "
        "copy is freed) and the log-softmax (4) = 10. Backward: the log-softmax's saved output (4), the gather's "
        "zero-filled fp32 gradient (4) and the log-softmax's input gradient (4) = 12; nothing keeps the bf16 output")),
    "distributed-logprob": LogitsPath(12, 12, (
        "NeMo-RL's DistributedLogprob (nemo_rl/distributed/model_utils.py) on Megatron's output, which "
        "Float16Module upcasts to fp32 (defer_fp32_logits false, the default; the bf16 output is freed at the "
        "cast, 2 + 4 = 6). _compute_distributed_log_softmax: the fp32 logits (4), the max-shifted copy (4) and its "
        "exp (4) summed, then the log-probs (4) beside logits and shifted copy, then softmax_output = log_probs.exp() "
        "(4) beside logits and log-probs = 12 at each step. Backward: the saved softmax (4), grad_input = "
        "softmax.neg() (4) and its bf16 cast for the head (2) = 10")),
    "softmax-inplace": LogitsPath(8, 8, (
        "slime's _VocabParallelLogProbEntropy (slime/utils/ppo_utils.py) on Megatron's fp32-upcast output: the fp32 "
        "logits (4) and one scratch buffer (logits - max, then exp_ and div_ in place into the softmax) (4) = 8. "
        "Backward: the softmax turned into the gradient in place (4) and its bf16 cast (2) = 6. With an entropy "
        "gradient it saves the logits and a second buffer: more")),
    "fused-ce": LogitsPath(6, 6, (
        "Megatron-Core's vocab-parallel cross-entropy (tensor_parallel.vocab_parallel_cross_entropy and "
        "fusions/fused_cross_entropy.py, used for pretraining and SFT; verl's Megatron actor calls it for its "
        "log-probs): the head's bf16 output (2) and its .float() copy (4), which the max subtraction, exp and "
        "division overwrite in place into the softmax it saves = 6. Backward: the saved softmax becomes the "
        "gradient in place (4), cast to bf16 for the head (2) = 6. A forward without labels: Float16Module's "
        "upcast, 2 + 4 = 6. Korthikanti 2022 section 4.3's 4 bytes are what stays between forward and backward")),
    "fp32-ce": LogitsPath(6, 10, (
        "OpenRLHF's Actor.forward (openrlhf/models/actor.py): output['logits'].to(torch.float32) beside the bf16 "
        "output (2 + 4 = 6; the bf16 is freed when replaced), then flash-attn's Triton cross_entropy_loss "
        "(inplace_backward false) in log_probs_from_logits. Backward: the fp32 logits the loss saves and the "
        "trainer's `output` keeps (4), the loss's new fp32 gradient (4) and its bf16 cast for the head (2) = 10")),
    "bf16-ce": LogitsPath(2, 2, (
        "verl's FSDP actor without fused kernels (dp_actor._forward_micro_batch): the model's bf16 logits, "
        "div_(temperature) in place, then flash-attn's Triton cross-entropy (logprobs_from_logits) with "
        "inplace_backward: the gradient is written into the logits. 2 bytes forward and backward; the log-prob "
        "pass's entropy is torch.compile'd (entropy_from_logits) under no_grad and fused")),
    "bf16-ce-entropy": LogitsPath(2, 6, (
        "verl's FSDP actor when the update computes the entropy (actor.calculate_entropy, or entropy_coeff != 0): "
        "inplace_backward is turned off, so the backward holds the bf16 logits (2), the cross-entropy's own "
        "gradient (2) and the entropy's gradient (2) that autograd sums into it = 6")),
    "chunked-logsoftmax": LogitsPath(2, 6, (
        "AReaL's gather_logprobs (areal/utils/functional/vocab_parallel.py): the model's bf16 logits (2) and, per "
        "1,024-token slice, a torch.compile'd log_softmax(logits.float() / T): the slice's fp32 copy and result "
        "(4 + 4). Backward: the logits (2), the gradient autograd accumulates over the slices (2) and one slice's "
        "gradient, which slicing's backward spreads over a zero tensor of the whole logits' shape (2) = 6; the "
        "compiled slice recomputed (8 over 1,024 tokens)"), chunk_tokens=1024, forward_chunk=8, train_chunk=8),
    "fused-linear": LogitsPath(0, 0, (
        "verl's use_fused_kernels (verl/utils/experimental/torch_functional.py FusedLinearForPPOFunction, "
        "chunk_size 512): the head and the log-softmax run over 512 tokens at a time and only hidden states are "
        "saved. Forward chunk: fp32 logits (4; the bf16 product and its temperature division freed), probs (4), "
        "log_probs (4) and the entropy's probs * logits (4) = 16. Backward chunk, recomputed: fp32 logits (4), "
        "probs (4), the one-hot (4), dlog_probs * (one_hot - probs) (4) and dlogits (4) = 20, without an entropy "
        "gradient"), chunk_tokens=512, forward_chunk=16, train_chunk=20),
}


@dataclass(frozen=True, slots=True)
class LogitsTraffic:
    """HBM bytes a pass moves per (token, vocab/tp) entry on its way from the head's GEMM to the log-probs
    (and back, in a training pass), counted kernel by kernel from the system's code: what the time of the
    path costs, where LogitsPath is what its memory holds."""

    forward: float  # a forward-only pass
    train: float  # a training pass: its forward and its backward
    per_sequence: float  # a training pass whose loss runs on one packed sequence at a time: per sequence, over
    #                      every entry of the micro-batch (a slice's backward spreads its gradient over a zero
    #                      tensor of the whole logits' shape, which autograd then adds up)
    source: str


# what rpeg/perf/compute.py's head_forward already charges a pass: its fp32 logits written and read once
# (8 bytes an entry), a training pass three times over (the head's forward plus a backward twice the forward)
HEAD_TRAFFIC = {"forward": 8.0, "train": 24.0}

# Paths whose kernels were counted; the others are charged the head's HEAD_TRAFFIC alone.
TRAFFIC: dict[str, LogitsTraffic] = {
    "distributed-logprob": LogitsTraffic(48, 70, 16, (
        "NeMo-RL v0.5.0-v0.6.0 (nemo_rl/distributed/model_utils.py DistributedLogprob, the code the memory "
        "entry above counts) on Megatron's output, which Float16Module upcasts to fp32. Forward: the GEMM's bf16 "
        "write (2), the upcast (2 + 4), amax (4), logits - max (4 + 4), its exp (4 + 4) and sum (4), the "
        "log-softmax's subtraction (4 + 4), softmax_output = log_probs.exp() (4 + 4) = 48. Backward: "
        "softmax.neg() (4 + 4), mul_(grad_output) (4 + 4), the chosen entries' scatter_add (none of full size) "
        "and the upcast's backward to bf16 (4 + 2) = 22; 48 + 22 = 70. Packed, the loss runs per sequence "
        "(SequencePackingLossWrapper) on next_token_logits[:, start:end]: each slice's backward writes an fp32 "
        "zero tensor of the micro-batch's logits (4) and autograd adds it to the others (4 + 4 + 4) = 16 per "
        "sequence. v0.3.0 moved more, not priced here (its rows would need a path of their own): a clone of the "
        "log-probs in the forward (+8) and an int64 one_hot, an int64 product and its .float() in the "
        "backward (62 instead of 22)")),
}


@dataclass(frozen=True, slots=True)
class LossHost:
    """The host work of a training loss that runs on one packed sequence at a time, counted from the
    system's code: framework ops in its forward (kernels and device-to-host syncs, each paid in full:
    after a sync the GPU waits for the host), and kernels its backward launches (queued ahead)."""

    forward_ops: float  # per sequence
    backward_kernels: float  # per sequence
    source: str


LOSS_HOST: dict[str, LossHost] = {
    "distributed-logprob": LossHost(95, 50, (
        "NeMo-RL v0.3.0's SequencePackingLossWrapper (nemo_rl/algorithms/loss_functions.py) calls ClippedPGLossFn "
        "once per packed sequence: per sequence the wrapper's 2 .item() on the bin's offsets, 6 unpadding slices "
        "by a device tensor's length (each an implicit sync) and the logits' slice; the loss's ~80 kernel "
        "launching ops (masks, the token-mult-prob error, the fp32 cast, DistributedLogprob's ~20 with its 3 "
        "tensor-parallel all-reduces, the KL, the clipped ratio, the importance weights, five masked means) and 8 "
        ".item() for its metrics: about 95 ops that launch a kernel or sync, of which 17 syncs. Its backward: "
        "about 50 kernels (DistributedLogprob's, the elementwise graph's, the slice's zero fill and copy). v0.5.0 "
        "and v0.6.0 loop the same way and log more metrics (15 .item() in ClippedPGLossFn at v0.5.0): a lower "
        "bound there")),
}


def loss_host_s(*, path: str, sequences: float, op_s: float, launch_s: float) -> float:
    """Host seconds of a packed training micro-batch's per-sequence loss (LOSS_HOST) over `sequences`
    sequences: each forward op at `op_s` (the GPU waits), each backward kernel at `launch_s`. 0 for a
    path whose loss runs on the micro-batch at once."""
    h = LOSS_HOST.get(path)
    if h is None:
        return 0.0
    return sequences * (h.forward_ops * op_s + h.backward_kernels * launch_s)


def traffic_bytes(spec: ModelSpec, *, tokens: float, tp: int = 1, path: str = DEFAULT_LOGITS, train: bool = False,
                    sequences: float = 0.0, value_head: bool = False) -> float:
    """HBM bytes per device that one micro-batch of `tokens` tokens moves on `path` (TRAFFIC) beyond
    what the head's cost already holds (HEAD_TRAFFIC); `sequences`: how many packed sequences its
    training loss runs over one by one (0: the micro-batch at once). 0 for a path not counted."""
    t = TRAFFIC.get(path)
    if value_head or t is None:
        return 0.0
    if train:
        per_entry = t.train + t.per_sequence * sequences - HEAD_TRAFFIC["train"]
    else:
        per_entry = t.forward - HEAD_TRAFFIC["forward"]
    return max(0.0, per_entry) * tokens * spec.vocab / tp


def logits_path(name: str) -> LogitsPath:
    try:
        return LOGITS[name]
    except KeyError:
        raise RpegError(f"logits = {name!r} is not a logits path; the paths are {', '.join(LOGITS)}") from None


def logits_bytes(spec: ModelSpec, *, tokens: float, tp: int = 1, path: str = DEFAULT_LOGITS, train: bool = False,
                 value_head: bool = False) -> float:
    """Peak bytes per device of the logits of one micro-batch of `tokens` tokens (after cp) on the last
    pipeline stage, along `path` (LOGITS), for a training pass (`train`) or a forward-only one. A
    critic's or reward model's value head has no vocabulary logits: 0."""
    if value_head:
        return 0.0
    p = logits_path(path)
    whole, chunk = (p.train, p.train_chunk) if train else (p.forward, p.forward_chunk)
    live_chunk = min(tokens, p.chunk_tokens) if p.chunk_tokens else 0.0
    return (tokens * whole + live_chunk * chunk) * spec.vocab / tp

