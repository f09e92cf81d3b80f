"""The logits paths (rpeg/perf/logits.py): each path's bytes worked by hand, tensor by tensor."""

from __future__ import annotations

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.graph.layout import DEFAULT_LOGITS, LOGITS_PATHS
from rpeg.perf.logits import LOGITS, logits_bytes
from rpeg.perf.memory import inference_memory, training_memory

# Qwen2.5-7B's 152,064 vocabulary, one 2,048-token micro-batch, tp = 1: one byte per entry is 311.4 MB
V, T = 152_064, 2048
ENTRY = T * V


def _pair(path: str) -> tuple[float, float]:
    m = get_model("qwen2.5-7B")
    assert m.vocab == V
    return (logits_bytes(m, tokens=T, path=path), logits_bytes(m, tokens=T, path=path, train=True))


def test_the_paths_the_layout_names_are_the_paths_costed():
    assert tuple(LOGITS) == LOGITS_PATHS and DEFAULT_LOGITS == "fp32-logsoftmax"
    assert all(p.source for p in LOGITS.values())


def test_rpegs_own_runtime_path():
    # forward: bf16 output 2 + fp32 copy / T 4 + log_softmax 4; backward: saved output 4 + gather grad 4 + grad 4
    assert _pair("fp32-logsoftmax") == (ENTRY * (2 + 4 + 4), ENTRY * (4 + 4 + 4))


def test_nemo_rl_distributed_logprob():
    # fp32 logits 4 + max-shifted 4 + exp (or log-probs, then softmax) 4; backward 4 + 4 + 2 stays under
    assert _pair("distributed-logprob") == (ENTRY * 12, ENTRY * 12)


def test_slime_one_scratch_buffer():
    assert _pair("softmax-inplace") == (ENTRY * (4 + 4), ENTRY * (4 + 4))


def test_megatron_vocab_parallel_cross_entropy():
    # bf16 2 + its fp32 copy 4 (made into the softmax in place); backward: the softmax as gradient 4 + bf16 cast 2
    assert _pair("fused-ce") == (ENTRY * 6, ENTRY * 6)


def test_openrlhf_fp32_copy_and_flash_attn_cross_entropy():
    # bf16 2 + fp32 4; backward: fp32 logits 4 + the loss's new gradient 4 + bf16 cast 2
    assert _pair("fp32-ce") == (ENTRY * 6, ENTRY * 10)


def test_verl_fsdp_bf16_logits_with_and_without_the_entropy():
    assert _pair("bf16-ce") == (ENTRY * 2, ENTRY * 2)  # the gradient written into the logits
    assert _pair("bf16-ce-entropy") == (ENTRY * 2, ENTRY * (2 + 2 + 2))  # logits + CE gradient + entropy gradient
    # verl's run_qwen2-7b_math.sh: 16 x 2,048 packed tokens: 66.5 GB at NeMo-RL's 12 bytes... 10.0 GB at 2
    assert 16 * ENTRY * 2 == pytest.approx(9.97e9, rel=1e-3)


def test_areal_slices_and_verl_fused_kernels_hold_a_chunk():
    # AReaL: bf16 logits 2 over all tokens + one 1,024-token slice's fp32 copy and log-softmax (4 + 4)
    assert _pair("chunked-logsoftmax") == (ENTRY * 2 + 1024 * V * 8, ENTRY * 6 + 1024 * V * 8)
    # verl use_fused_kernels: 512 tokens at a time, 16 bytes forward, 20 backward, nothing over the whole batch
    assert _pair("fused-linear") == (512 * V * 16, 512 * V * 20)
    m = get_model("qwen2.5-7B")
    assert logits_bytes(m, tokens=300, path="fused-linear") == 300 * V * 16  # a chunk longer than the batch


def test_the_layout_carries_the_path_into_the_memory_lines():
    m = get_model("qwen2.5-7B")
    mem = training_memory(m, Layout(tp=2, logits="bf16-ce-entropy"), seq_len=T, micro_batch=1)
    assert mem.logits == T * V / 2 * 6
    fwd = inference_memory(m, Layout(tp=2, logits="bf16-ce-entropy"), seq_len=T, micro_batch=1)
    assert fwd.logits == T * V / 2 * 2
    assert Layout(logits="fused-ce").describe() == "logits=fused-ce" and Layout().describe() == "single device"


def test_an_unknown_path_is_refused_with_the_list():
    with pytest.raises(RpegError, match=r"logits = 'fp16' is not a logits path; the paths are fp32-logsoftmax, "):
        Layout(logits="fp16")
    with pytest.raises(RpegError, match="logits = 'x'"):
        logits_bytes(get_model("qwen2.5-7B"), tokens=1, path="x")
