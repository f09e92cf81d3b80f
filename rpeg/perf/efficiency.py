"""The global efficiency factors: one table for every prediction, each factor with its reason.

Nothing here is fitted to one published point. A factor is per device kind, per link kind, or a
curve over operation size (the roofline: an operation is compute-bound or memory-bound by its
size, so small GEMMs - decode, narrow tensor-parallel shards - fall off the tensor-core peak by
themselves). Change one and every validation entry moves together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Factor:
    value: float
    reason: str


# ---- compute (per device, and per device kind) ----------------------------------------------------
GEMM_PEAK_FRACTION = {  # the largest square bf16 GEMMs in cuBLAS/hipBLASLt, as a fraction of the datasheet peak
    "a100": Factor(0.87, "A100: ~270 of 312 TFLOP/s for large bf16 GEMMs; the sustained clock holds the boost"),
    "h100": Factor(0.78, "H100 SXM: ~750-800 of 989 TFLOP/s; under dense tensor-core load the clock settles below "
                         "the boost clock the peak assumes (power cap)"),
    "h200": Factor(0.78, "the H100 chip with more HBM: same compute behaviour as H100"),
    "gh200": Factor(0.80, "the H100 chip with a higher power budget in GH200: slightly more of its peak"),
    "h20": Factor(0.90, "H20's tensor cores are cut to 148 TFLOP/s against 4 TB/s: large GEMMs run near peak"),
    "b200": Factor(0.75, "Blackwell: early cuBLAS releases reach about three quarters of the dense peak"),
    "gb200": Factor(0.75, "Blackwell in GB200: as B200"),
    "mi300x": Factor(0.60, "MI300X: hipBLASLt bf16 GEMMs reach ~700-800 of 1307 TFLOP/s"),
    "cpu": Factor(1.0, "cpu-local figures are measured matmul rates already"),
}
DEFAULT_GEMM_PEAK_FRACTION = Factor(0.80, "a device without a measured figure: the middle of the GPUs above")
LAYER_GEMM = Factor(0.80, "a transformer layer's GEMMs (K = hidden of 2-8K, N split by tensor parallelism) and the "
                          "small kernels between them reach about 80% of the largest-GEMM rate")
GEMM_ROWS_HALF = {  # the curve over operation size: rate ~ rows / (rows + half), per device kind
    "gpu": Factor(64.0, "a GEMM with few rows (tokens) fills few of the 128-256-row tensor-core tiles and launches "
                        "fewer thread blocks than there are SMs: half rate at 64 rows, 94% at 1024"),
    "cpu": Factor(16.0, "CPU GEMM micro-kernels are 6-16 rows tall and reuse each packed weight panel across all "
                        "rows, so the rate recovers after a few tiles: fp32 matmul (numpy and torch 2.13, K = N = "
                        "1024 and K = 128, N = 352, on a 2-core x86 VM) ran at 33-47% of its large-GEMM rate at 8 "
                        "rows, 36-52% at 16, 64-72% at 64 and 78-91% at 128 rows: half rate near 16 rows"),
}
HBM = {
    "gpu": Factor(0.80, "streaming kernels reach about 80% of nominal HBM bandwidth (STREAM-like copies on "
                        "A100/H100 reach 1.6-1.7 of 2.0 TB/s and 2.6-2.9 of 3.35 TB/s)"),
    "cpu": Factor(1.0, "cpu-local figures are measured copy bandwidth already"),
}
ATTENTION = {
    "gpu": Factor(0.45, "fused attention kernels (FlashAttention-2, cuDNN) run at 35-70% of peak forward and lower "
                        "backward (Dao 2023, arXiv 2307.08691, figures 4-7); 0.45 for forward and backward together"),
    "cpu": Factor(0.5, "attention on CPU is a batched matmul plus softmax; half the matmul rate"),
}
KERNEL_LAUNCH_S = Factor(4e-6, "a CUDA kernel launch plus its tail costs a few microseconds; counted per kernel of "
                               "a layer (about 12 per layer forward) when work per kernel is small")
HOST_TIME = {  # host-side time (Python, the PyTorch dispatcher, kernel launches) against an x86 server host
    "x86": Factor(1.0, "the host the host-time figures here (KERNEL_LAUNCH_S, DECODE_*_S) were measured on: x86 "
                       "servers (DGX A100 EPYC, DGX H100 Xeon 8480C)"),
    "grace": Factor(2.6, "Grace (Arm Neoverse V2) hosts spend 2.5-2.8x as long on the host side of the same PyTorch "
                         "call: a torch.nn.Linear forward (bf16, hidden 2048, 8192 tokens) took 13.5 us of CPU time "
                         "on a DGX H100 (Xeon 8480C), 33.2 us on GH200 and 37.1 us on GB200 (TransformerEngine "
                         "issue #2053, 2025); Megatron-Core's DeepSeek-V3-on-GB200 guide names this host-boundedness "
                         "its largest performance problem"),
}
KERNELS_PER_LAYER = 12  # norms, QKV, rotary, attention, output, residual, MLP in/act/out: a forward layer's kernels
# of them, the attention half (its norm, QKV, rotary, the attention kernel, output projection and residual add):
# what Megatron-Core's `attn` CUDA-graph scope captures (TransformerLayer._forward_attention); the rest is the MLP
# half (`mlp` scope on a dense layer, `moe` on an MoE layer: training.layer_launches)
ATTENTION_KERNELS_PER_LAYER = 6

# ---- generation engine (vLLM-class) --------------------------------------------------------------
DECODE_STEP_OVERHEAD_S = Factor(
    2e-3, "a continuous-batching engine spends CPU time on every decode step (scheduling, input tensors, "
          "sampling, stop checks) that CUDA graphs do not hide: a fixed part ...")
DECODE_OVERHEAD_PER_SEQ_S = Factor(
    12e-6, "... and a part per running sequence; measured analyses put the host side of a step at a quarter to a "
           "half of decode time for 8B models at batch 32-256 (Srivatsa et al. 2024, 'scheduling overhead in vLLM "
           "and SGLang'; Hugging Face 2025, asynchronous continuous batching: GPU idle 24% of the time)")
DECODE_HBM = Factor(0.60, "decode kernels read the KV cache through block tables (paged attention, 16-token blocks) "
                          "and the weights through skinny GEMMs (M = batch): ~60% of HBM bandwidth, below the ~80% "
                          "of streaming copies")
KV_MEMORY_UTILIZATION = Factor(0.9, "vLLM's default gpu_memory_utilization, for an engine on its own devices")
KV_MEMORY_UTILIZATION_COLOCATED = Factor(
    0.6, "an engine sharing devices with a trainer gets less: NeMo-RL's colocated default gpu_memory_utilization is "
         "0.6 and verl's rollout default 0.5, leaving room for what the trainer keeps resident")

# ---- links (per link kind) ----------------------------------------------------------------------------
LINK = {
    "nvlink": Factor(0.80, "nccl-tests all_reduce bus bandwidth reaches ~360 of 450 GB/s per direction on "
                           "DGX H100 and ~230 of 300 on DGX A100"),
    "xgmi": Factor(0.70, "RCCL all_reduce bus bandwidth on MI300X platforms is ~300+ of ~448 GB/s per direction"),
    "infiniband": Factor(0.90, "nccl-tests reach ~46 of 50 GB/s per 400 Gb/s NDR port across nodes"),
    "slingshot": Factor(0.80, "NCCL over libfabric on Slingshot-11 reaches ~20 of 25 GB/s per NIC"),
    "ethernet": Factor(0.80, "RoCE reaches ~80% of line rate in NCCL"),
    "pcie": Factor(0.80, "PCIe DMA reaches ~80% of link rate"),
    "memory": Factor(1.0, "in-memory copies on one host: the cpu-local calibration is already measured"),
    "loopback": Factor(1.0, "processes on one machine over loopback TCP (gloo): `rpeg calibrate --devices D` measures "
                            "the link's bandwidth and latency as gloo all-reduces reach them"),
}

# ---- mixture of experts (rpeg/perf/moe.py; its fitted constants, the routing spread and the MoE layer's host
# time, are declared there: rpeg/perf/fitted.py) -------------------------------------------------------------
GROUPED_GEMM_ROWS_HALF = {  # the grouped-GEMM curve over rows (tokens) per expert, by compute dtype, on GPUs
    "bf16": Factor(64.0, "as GEMM_ROWS_HALF[gpu]: a bf16 expert GEMM reaches half its large-GEMM rate at 64 rows "
                         "per expert"),
    "fp8": Factor(100.0, "an fp8 tile finishes its K loop twice as fast, so it needs more rows to fill the tensor "
                         "cores: DeepGEMM's fp8 grouped GEMMs on H800 (README tables, 2025) reach 932 and 815 TFLOP/s "
                         "at 256 rows per group against 1297 and 1099 at 4,096-8,192 (N x K = 4096 x 7168 and "
                         "7168 x 2048), 1040 and 916 at 512: rows / (rows + 100) to within 6%"),
}
MOE_KERNELS_PER_EXPERT = {  # per local expert, per MoE layer forward
    "bf16": Factor(2.0, "Transformer Engine's GroupedLinear runs one cuBLAS GEMM per local expert (fc1, fc2; "
                        "general_grouped_gemm over streams), so the host launches two GEMMs per expert"),
    "fp8": Factor(4.0, "... and in fp8 each expert's input is quantized by a kernel of its own before each GEMM"),
}
# Megatron-Core's token permutation without --moe-permute-fusion (ParallelLayout.permute_fusion false, NeMo-RL's
# default megatron_cfg): megatron/core/transformer/moe/moe_utils.py's PyTorch branches of permute, unpermute and
# sort_chunks_by_idxs, each in place of one Transformer Engine kernel.
UNFUSED_PERMUTE_KERNELS = Factor(
    8.0, "kernels an MoE layer's forward launches beyond the fused path's (Megatron-Core moe_utils.py, dropless "
         "all-to-all with probs): permute transposes the routing map into a contiguous copy, argsorts it, takes the "
         "token index modulo the token count, copies the transposed probs and gathers them, and index_selects the "
         "tokens (6 for TE's one); sort_chunks_by_idxs concatenates the tokens and, separately, the probs (2 for 1); "
         "unpermute allocates zeros, scatter-adds and casts back (3 for 1)")
UNFUSED_CHUNK_S = Factor(
    0.55e-6, "host time per chunk of sort_chunks_by_idxs's PyTorch path, forward (torch.split into one view per "
             "(rank, local expert) chunk, torch.cat of them in a new order): 0.52-0.58 us on an x86 Xeon, "
             "scripts/measure_permute_host.py (slope over 8 to 512 chunks, two runs)")
UNFUSED_CHUNK_BWD_S = Factor(
    1.0e-6, "the same per chunk in the backward (autograd's CatBackward narrows each chunk out of the gradient, "
            "SplitWithSizesBackward concatenates them): 0.92-1.05 us, scripts/measure_permute_host.py")
EP_OVERLAP_SM_SHARE = Factor(
    0.18, "an all-to-all overlapped with compute runs its kernels on SMs the compute loses meanwhile: DeepEP's "
          "normal kernels take 24 of an H100's 132 SMs (its README's tests; vLLM's default is 20)")

# ---- training frameworks -------------------------------------------------------------------------------
OPTIMIZER_BYTES_PER_PARAM = Factor(
    36.0, "a fused Adam step reads fp32 grad, master weight, two moments (16 B) and writes master, moments "
          "(12 B), a bf16 copy (2 B) and zeroes the grad (4 B), plus ~2 B of norm/clip reads")
DP_OVERLAP = Factor(0.5, "Megatron/FSDP overlap gradient reduce-scatter with the backward of earlier layers; "
                         "about half of it stays exposed at the end of the last micro-batch")

# ---- RL step -------------------------------------------------------------------------------------------
HOST_LINK_BYTES_PER_S = Factor(25e9, "device <-> host copies run at ~25 GB/s per GPU over PCIe Gen5 x16 "
                                     "(half of its 64 GB/s when all GPUs of a node copy at once)")
HOST_LINK_C2C_BYTES_PER_S = Factor(
    170e9, "a Grace-hosted GPU (GH200, GB200) copies to and from host memory over NVLink-C2C (450 GB/s per "
           "direction): nvbandwidth's copy-engine device-to-host rate is 170 GB/s per GPU on 4x GH200 and 193 on "
           "4x GB300, host-to-device 411 and 211 (Megatron-LM issue #6491, 2026); the slower direction is taken")
# Both rates above are pinned (page-locked) copies. A copy to or from pageable memory is staged by the
# driver through a pinned bounce buffer and a CPU memcpy, chunk by chunk: on x86 hosts it runs at the
# rates below whatever the link. Which copies of which system are pageable: rpeg/perf/offload.py
# (ParallelLayout.pageable names them in a plan).
PAGEABLE_D2H_BYTES_PER_S = {  # device -> pageable host memory
    "x86": Factor(2.5e9, "a device-to-host copy into pageable memory goes through the driver's bounce buffer and a "
                         "CPU memcpy: ~2.8 GB/s for module.to('cpu') on an H200's PCIe Gen5 x16 (sglang PR #32032), "
                         "2.3 GB/s on an H20 (63 GB in 27.2 s, vllm-omni PR #5922), 1.4 against 12.6 GB/s pinned on an "
                         "A100 (PyTorch PR #138018)"),
    "grace": Factor(160e9, "a Grace-hosted GPU reaches pageable memory through the CPU's page tables over NVLink-C2C "
                           "(ATS), with no bounce buffer: cuMemcpyHtoD of 1 GiB from pageable memory ran at 93.0 GiB/s "
                           "against 97.4 from pinned on a GH200 (vortex-data/vortex PR #7815, 2026), ~0.95 of the "
                           "pinned rate; taken for both directions (no device-to-host figure was found)"),
}
PAGEABLE_H2D_BYTES_PER_S = {  # pageable host memory -> device
    "x86": Factor(5e9, "host-to-device from pageable memory overlaps the CPU's staging copy with the DMA and runs "
                       "faster than the other way, still a fifth of pinned: 8.4 GB/s on an H20 (63 GB in 7.5 s, "
                       "vllm-omni PR #5922); pinned buffers made ZeRO-Offload's host-to-device copy 6x faster on one "
                       "GPU and 4-5x on an 8-GPU node (DeepSpeed PR #5301): ~5 GB/s per GPU when all copy at once"),
    "grace": Factor(160e9, "as PAGEABLE_D2H_BYTES_PER_S[grace]: 93.0 against 97.4 GiB/s pinned on a GH200 "
                           "(vortex-data/vortex PR #7815)"),
}
HOST_OPTIMIZER_BYTES_PER_S = {  # host DRAM bandwidth one GPU's CPU Adam step gets (rpeg/perf/offload.py)
    "x86": Factor(50e9, "a CPU Adam step (DeepSpeedCPUAdam, Megatron's HybridDeviceOptimizer) is bound by host "
                        "DRAM: it streams the fp32 gradient, master weight and two moments "
                        "(OPTIMIZER_BYTES_PER_PARAM). "
                        "A two-socket DGX host has 16 DDR4-3200 channels (2x EPYC 7742, 410 GB/s) or 16 DDR5-4800 "
                        "(2x Xeon 8480C, 614 GB/s); STREAM reaches ~70-75% of that, shared by the node's 8 GPUs' "
                        "ranks: ~40-55 GB/s per GPU"),
    "grace": Factor(200e9, "a Grace CPU has ~500 GB/s of LPDDR5X (NVIDIA Grace Hopper Superchip datasheet, up to "
                           "512 GB/s); a GB200 superchip's Grace serves two GPUs: ~200 GB/s each at STREAM-like ~80%"),
}


def gemm_efficiency(device) -> float:
    """Fraction of the datasheet tensor-core peak a layer's GEMMs reach on `device`."""
    if device.kind == "cpu":
        return GEMM_PEAK_FRACTION["cpu"].value
    name = device.name.lower()
    for key in sorted(GEMM_PEAK_FRACTION, key=len, reverse=True):
        if name.startswith(key):
            return GEMM_PEAK_FRACTION[key].value * LAYER_GEMM.value
    return DEFAULT_GEMM_PEAK_FRACTION.value * LAYER_GEMM.value


def host_time(device) -> float:
    """How much longer host-side work takes on the CPU that drives `device` (HOST_TIME)."""
    return HOST_TIME[device.host].value


def host_link_bytes_per_s(device) -> float:
    """Pinned device <-> host copy bandwidth of one of `device`'s GPUs (PCIe on x86 hosts, NVLink-C2C on Grace)."""
    return (HOST_LINK_C2C_BYTES_PER_S if device.host == "grace" else HOST_LINK_BYTES_PER_S).value


def host_copy_bytes_per_s(device, copy: str, pageable: tuple[str, ...] = ()) -> float:
    """The rate of one host copy of `device`'s GPUs: `copy` is one of graph.layout.HOST_COPIES
    (`weights-out`: device to host, ...), pinned unless `pageable` (a layout's) lists it. None: an x86 host."""
    if copy not in pageable:
        return host_link_bytes_per_s(device) if device is not None else HOST_LINK_BYTES_PER_S.value
    rates = PAGEABLE_D2H_BYTES_PER_S if copy.endswith("-out") else PAGEABLE_H2D_BYTES_PER_S
    return rates["x86" if device is None else device.host].value


def link_efficiency(link: str) -> float:
    return LINK[link].value if link in LINK else 0.8


def table() -> list[tuple[str, float, str]]:
    """Every factor with its value and reason, for docs and `rpeg validate`."""
    rows = []
    for name, obj in sorted(globals().items()):
        if isinstance(obj, Factor):
            rows.append((name, obj.value, obj.reason))
        elif isinstance(obj, dict) and obj and all(isinstance(v, Factor) for v in obj.values()):
            rows += [(f"{name}[{k}]", v.value, v.reason) for k, v in obj.items()]
    return rows
