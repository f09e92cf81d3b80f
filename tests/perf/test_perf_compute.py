"""One layer's roofline on an H100 SXM (989 TFLOP/s bf16, 3.35 TB/s): compute-bound for
thousands of tokens, weight-read-bound for a decode step, split by tensor and expert parallelism."""

import pytest

from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf.compute import BF16, experts_touched, layer_forward, rows_efficiency
from rpeg.perf.efficiency import DECODE_HBM, GEMM_ROWS_HALF, gemm_efficiency

LLAMA = get_model("llama-3.1-8B")
MOE = get_model("qwen3-30B-A3B")  # 128 routed experts, 8 per token, no shared expert


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", 8).device


def _dense_gemm_params(spec, tp=1):
    return (spec.attention_params() + spec.mlp_params(spec.ffn)) / tp


def test_rows_efficiency_curve():
    for kind in ("gpu", "cpu"):
        half = GEMM_ROWS_HALF[kind].value
        assert rows_efficiency(half, kind) == pytest.approx(0.5)
        assert rows_efficiency(1024, kind) == pytest.approx(1024 / (1024 + half))
        assert rows_efficiency(1, kind) < rows_efficiency(64, kind) < rows_efficiency(8192, kind) < 1.0
    # CPU micro-kernels are a few rows tall: a 16-row GEMM is at half rate there, a quarter on tensor cores
    assert rows_efficiency(16, "cpu") == pytest.approx(0.5)
    assert rows_efficiency(16, "gpu") == pytest.approx(0.2)


def test_a_cpu_device_uses_its_own_rows_curve():
    from rpeg.hardware.loader import device_from_data

    cpu = device_from_data({"name": "test-cpu", "kind": "cpu", "bf16_dense_gflop_per_s": 100.0,
                            "fp16_dense_gflop_per_s": 100.0, "fp8_dense_gflop_per_s": 0, "hbm_capacity_gb": 16,
                            "hbm_bandwidth_gb_per_s": 20.0, "scaleup_bandwidth_gb_per_s": 0,
                            "sources": {k: "test" for k in ("bf16_dense_gflop_per_s", "fp16_dense_gflop_per_s",
                                                            "fp8_dense_gflop_per_s", "hbm_capacity_gb",
                                                            "hbm_bandwidth_gb_per_s",
                                                            "scaleup_bandwidth_gb_per_s")}}, "test")
    tokens = 16
    lt = layer_forward(LLAMA, cpu, tokens=tokens, context=8)
    compute_bound = 2.0 * tokens * _dense_gemm_params(LLAMA) / (cpu.flop_per_s("bf16") * gemm_efficiency(cpu) * 0.5)
    assert lt.gemm_s == pytest.approx(compute_bound, rel=1e-9)  # 16 rows: half the CPU's GEMM rate


def test_a_prefill_of_thousands_of_tokens_is_compute_bound(h100):
    tokens = 8192
    lt = layer_forward(LLAMA, h100, tokens=tokens, context=tokens / 2)
    flops = 2.0 * tokens * _dense_gemm_params(LLAMA)
    rate = h100.flop_per_s("bf16") * gemm_efficiency(h100) * rows_efficiency(tokens, "gpu")
    assert lt.gemm_s == pytest.approx(flops / rate, rel=1e-9)
    # the weights and activations it reads would take far less at HBM speed
    moved = BF16 * _dense_gemm_params(LLAMA) + BF16 * tokens * (4 * LLAMA.hidden + 3 * LLAMA.ffn)
    assert moved / h100.hbm_bandwidth_bytes_per_s < 0.2 * lt.gemm_s
    attn_flops = 2.0 * tokens * (tokens / 2) * LLAMA.heads * (LLAMA.q_head_dim + LLAMA.v_head_dim)
    assert lt.flops == pytest.approx(flops + attn_flops, rel=1e-12)


def test_a_decode_step_of_a_few_tokens_reads_the_weights(h100):
    lt = layer_forward(LLAMA, h100, tokens=4, context=1000, kv_read_tokens=4 * 1000)
    weights = BF16 * _dense_gemm_params(LLAMA)  # 436 MB per layer
    read_s = weights / (h100.hbm_bandwidth_bytes_per_s * DECODE_HBM.value)
    assert lt.gemm_s == pytest.approx(read_s, rel=0.01)  # activations of 4 tokens add < 1%
    assert lt.gemm_s >= read_s
    # well above what its FLOPs take, even at the few-row rate (4 of 64 + 4 rows: 6% of the GEMM rate)
    rate = h100.flop_per_s("bf16") * gemm_efficiency(h100) * rows_efficiency(4, "gpu")
    assert 2.0 * 4 * _dense_gemm_params(LLAMA) / rate < 0.5 * lt.gemm_s


def test_a_dense_decode_step_costs_about_the_same_for_1_or_8_tokens(h100):
    one = layer_forward(LLAMA, h100, tokens=1, context=1000, kv_read_tokens=1000)
    eight = layer_forward(LLAMA, h100, tokens=8, context=1000, kv_read_tokens=8000)
    assert eight.gemm_s == pytest.approx(one.gemm_s, rel=0.02)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallelism_divides_the_work(h100, tp):
    one = layer_forward(LLAMA, h100, tokens=8192, context=4096)
    split = layer_forward(LLAMA, h100, tokens=8192, context=4096, tp=tp)
    assert split.flops == pytest.approx(one.flops / tp, rel=1e-12)
    assert split.gemm_s == pytest.approx(one.gemm_s / tp, rel=1e-12)  # compute-bound, same rows
    assert split.attention_s == pytest.approx(one.attention_s / tp, rel=1e-12)
    # without sequence parallelism the norms and residuals stay whole on every rank
    assert one.seconds / tp < split.seconds < one.seconds
    with_sp = layer_forward(LLAMA, h100, tokens=8192, context=4096, tp=tp, sp=True)
    assert with_sp.elementwise_s < split.elementwise_s
    assert with_sp.gemm_s == split.gemm_s


def test_tensor_parallelism_divides_the_weights_a_decode_step_reads(h100):
    one = layer_forward(LLAMA, h100, tokens=4, context=1000, kv_read_tokens=4000)
    eight = layer_forward(LLAMA, h100, tokens=4, context=1000, kv_read_tokens=4000, tp=8)
    assert eight.gemm_s == pytest.approx(one.gemm_s / 8, rel=0.02)


def test_attention_without_flash_attention_costs_more(h100):
    flash = layer_forward(LLAMA, h100, tokens=8192, context=4096)
    eager = layer_forward(LLAMA, h100, tokens=8192, context=4096, flash_attention=False)
    assert eager.attention_s > flash.attention_s
    assert eager.bytes > flash.bytes  # the s x s score matrix goes through HBM
    assert eager.gemm_s == flash.gemm_s and eager.elementwise_s == flash.elementwise_s
    assert eager.seconds > flash.seconds


# ---- mixture of experts --------------------------------------------------------------------------
def test_experts_touched_grows_with_tokens_and_saturates_at_the_expert_count():
    assert experts_touched(MOE, 1) == pytest.approx(MOE.experts_per_token)  # one token: its 8 experts
    counts = [experts_touched(MOE, t) for t in (1, 2, 4, 16, 64, 256, 4096)]
    assert all(a < b or b == MOE.experts for a, b in zip(counts, counts[1:]))
    assert counts[1] > counts[0] and counts[3] > counts[2]
    assert all(c <= MOE.experts for c in counts)
    assert experts_touched(MOE, 4096) == pytest.approx(MOE.experts, rel=1e-9)
    # uniform routing: 1 - (1 - k/E)^t of the experts
    assert experts_touched(MOE, 16) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16), rel=1e-12)
    assert experts_touched(LLAMA, 1000) == 0.0


def test_more_decode_tokens_read_more_experts(h100):
    """Unlike a dense layer, an MoE decode step reads the experts its batch touches."""
    times = [layer_forward(MOE, h100, tokens=t, context=1000, kv_read_tokens=t * 1000).gemm_s for t in (1, 8, 64)]
    assert times[0] < times[1] < times[2]
    assert times[2] > 5 * times[0]


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_parallelism_spreads_the_experts(h100, ep):
    kw = dict(tokens=32, context=1000, kv_read_tokens=32 * 1000)
    one = layer_forward(MOE, h100, **kw)
    spread = layer_forward(MOE, h100, ep=ep, **kw)
    assert spread.bytes < one.bytes
    assert spread.gemm_s < one.gemm_s
    assert spread.flops == one.flops  # the same tokens x experts per token on this device
    # only the expert weights read differ: the touched experts, 1/ep of those the ep x larger
    # batch (all devices' tokens) touches
    expert = MOE.mlp_params(MOE.moe_ffn)
    saved = BF16 * expert * (experts_touched(MOE, 32) - experts_touched(MOE, 32 * ep) / ep)
    assert one.bytes - spread.bytes == pytest.approx(saved, rel=1e-9)
    wider = layer_forward(MOE, h100, ep=2 * ep, **kw)
    assert wider.bytes < spread.bytes


def _eager_cpu(host_us: float, token_us: float):
    from dataclasses import replace

    from rpeg.hardware import load_device

    cpu = replace(load_device("h100-sxm"), name="box", kind="cpu", bf16_flop_per_s=200e9,
                  hbm_bandwidth_bytes_per_s=25e9)
    return cpu, replace(cpu, layer_host_s=host_us * 1e-6, layer_token_s=token_us * 1e-6)


def test_measured_eager_figures_cost_a_layer_by_its_flops_and_its_tokens():
    from rpeg.perf.compute import eager_host_s, head_forward

    tiny = get_model("tiny-qwen2")
    generic, eager = _eager_cpu(600, 3)
    for tokens in (10, 640):
        roof = layer_forward(tiny, generic, tokens=tokens, context=5.5)
        t = layer_forward(tiny, eager, tokens=tokens, context=5.5)
        assert t.flops == roof.flops and t.bytes == roof.bytes
        rate = 200e9 * rows_efficiency(tokens, "cpu")
        assert t.seconds == pytest.approx(max(t.flops / rate, t.bytes / 25e9) + tokens * 3e-6)
        head = head_forward(tiny, eager, tokens=tokens)
        assert head.seconds == pytest.approx(max(head.flops / rate, head.bytes / 25e9) + tokens * 3e-6)
    assert eager_host_s(eager, 4) == pytest.approx(5 * 600e-6)  # four layers and one for the call and head
    assert eager_host_s(generic, 4) == 0.0  # not measured (every GPU preset): the generic terms apply


def test_a_forward_pass_on_measured_figures_pays_the_host_time_once_per_micro_batch():
    from dataclasses import replace

    from rpeg.graph.layout import ParallelLayout
    from rpeg.perf.training import PassWorkload, pass_cost

    tiny = get_model("tiny-qwen2")
    _, eager = _eager_cpu(600, 3)
    cluster = replace(load_cluster("dgx-h100", 1), device=eager)
    work = PassWorkload(sequences=256, seq_len=10, attention_context=5.5, micro_batch=64, forward_only=True)
    cost = pass_cost("logprobs", tiny, ParallelLayout(micro_batch=64, packing=False), cluster, work)
    parts = dict(cost.parts)
    assert parts["kernel launches"] == pytest.approx(4 * 5 * 600e-6)  # 4 micro-batches x (4 layers + 1)
    assert cost.microbatches == 4


def test_measured_fsdp_figures_replace_the_collective_model_for_zero_3():
    from dataclasses import replace

    from rpeg.graph.layout import ParallelLayout
    from rpeg.perf.collectives import weight_tensors
    from rpeg.perf.training import PassWorkload, pass_cost
    from rpeg.perf.weightsync import weight_sync_cost

    tiny = get_model("tiny-qwen2")
    _, eager = _eager_cpu(600, 3)
    measured = replace(eager, fsdp_unit_s=2e-3, gather_tensor_s=1e-3)
    plain, cluster = replace(load_cluster("dgx-h100", 2), device=eager), replace(load_cluster("dgx-h100", 2),
                                                                                 device=measured)
    lay = ParallelLayout(dp=2, zero=3, micro_batch=64, packing=False)
    fwd = PassWorkload(sequences=256, seq_len=10, attention_context=5.5, micro_batch=64, forward_only=True)
    train = PassWorkload(sequences=128, seq_len=10, attention_context=5.5, micro_batch=64)
    # 2 micro-batches a rank, 5 FSDP units (4 layers and the root): a forward gathers each unit once,
    # a training micro-batch three times as much (gathers again for the backward, reduce-scatters)
    assert dict(pass_cost("lp", tiny, lay, cluster, fwd).parts)["gradient sync"] == pytest.approx(2 * 5 * 2e-3)
    assert dict(pass_cost("up", tiny, lay, cluster, train).parts)["gradient sync"] == pytest.approx(3 * 5 * 2e-3)
    assert dict(pass_cost("lp", tiny, lay, plain, fwd).parts)["gradient sync"] < 2 * 5 * 2e-3  # NVLink's model
    sync = weight_sync_cost("sync", tiny, lay, ParallelLayout(dp=2), cluster, colocated=True, separation=0)
    assert dict(sync.parts)["gather over data parallelism"] == pytest.approx(weight_tensors(tiny) * 1e-3)
