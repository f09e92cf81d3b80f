"""Offload of a trainer's state to host memory: what each system's flag does, and what it costs.

Two mechanisms hide behind the word "offload", and the systems' flags name either:

(a) State that stays on the host while the stage computes. The optimizer state (fp32 master weights
    and Adam moments) lives in host memory and the Adam step runs on the host CPU: every optimizer
    step the reduced gradients go down to the host, the CPU updates, and the new bf16 weights come
    back. DeepSpeed's `zero_optimization.offload_optimizer: {device: cpu, pin_memory}` (ZeRO-Offload,
    Ren et al. 2021, arXiv 2101.06840; the step is DeepSpeedCPUAdam, and with ZeRO-2/3 the gradient
    partition is kept in pinned host buffers too), which OpenRLHF turns on with `--ds.adam_offload`
    (older `--adam_offload`); Megatron-Core's `--optimizer-cpu-offload` with
    `--optimizer-offload-fraction f` (HybridDeviceOptimizer: a fraction f of the parameters is updated
    by a CPU optimizer, its gradients copied out of the device's gradient buffer to pinned host
    memory and the parameters copied back; `--overlap-cpu-optimizer-d2h-h2d` overlaps those copies
    with the step - Megatron-Core's optimizer_cpu_offload guide). ZeRO-3's
    `offload_param: {device: cpu}` and FSDP2's `CPUOffloadPolicy` (verl's
    `fsdp_config.offload_policy: true`) go further: the sharded parameters and gradients live on the
    host, each layer's shard is copied to the device before its all-gather in every forward and
    backward, and the optimizer step runs on the CPU. RPEG: ParallelLayout.offload_optimizer (the
    fraction) and offload_params.

(b) State moved to the host between phases. With generation colocated with training, the trainer's
    weights and optimizer state go to host memory while the engine generates and come back before
    the update; its gradients are freed. verl's `actor.fsdp_config.param_offload` /
    `optimizer_offload` (fsdp_workers.py: offload_fsdp_model_to_cpu / offload_fsdp_optimizer after
    each phase, load_fsdp_model_to_gpu / load_fsdp_optimizer before the next) and
    `actor.megatron.param_offload` / `grad_offload` / `optimizer_offload` (megatron_workers.py:
    offload_megatron_model_to_cpu frees the gradient buffer, offload_megatron_optimizer), OpenRLHF's
    `--ds.enable_sleep` (DeepSpeed's offload_states), AReaL's `enable_offload` (torch_memory_saver).
    The training step itself still holds everything on the device. RPEG's context switch
    (rpeg/perf/weightsync.py) has charged this move on every colocated plan; ParallelLayout.resident
    names the parts a plan keeps on the device instead (verl's flags set to false): they are not
    copied, and they stay in the devices' memory while the engine runs, where vLLM must still find its
    gpu_memory_utilization share free (the per-device sum of rpeg/perf/residency.py).

Pinned or pageable (what each system's copies really are, from its source; the rates are
efficiency.HOST_LINK_* pinned and PAGEABLE_* pageable; ParallelLayout.pageable names the pageable
copies of a plan). PyTorch's `t.to("cpu", non_blocking=True)` from a GPU allocates its destination in
pinned memory (`_to_copy`'s pin_out, aten/src/ATen/native/TensorConversions.cpp) and PyTorch's caching
host allocator keeps those blocks for the next offload; a plain `t.cpu()`, `module.cpu()` or
`module.to(device)` copies through pageable memory.
(a) DeepSpeed ZeRO-Offload: pinned with `pin_memory: true` (OpenRLHF always writes it,
    utils/deepspeed/deepspeed_utils.py; DeepSpeed's default since PR #8207, 2026, false before, when its
    gradient and weight copies were pageable). Megatron-Core's HybridDeviceOptimizer: pinned gradient and
    parameter copies by default (`pin_cpu_grads`, `pin_cpu_params`; `--no-pin-cpu-grads` /
    `--no-pin-cpu-params` make them pageable). FSDP2's CPUOffloadPolicy: verl builds it with
    pin_memory=True. RPEG: pinned unless `pageable` lists gradients-out / weights-in.
(b) verl FSDP (strategy fsdp, FSDP1): the flat parameters and the optimizer state go out with
    `.to("cpu", non_blocking=True)` and back the same way (utils/fsdp_utils.py): pinned. verl FSDP2
    (strategy fsdp2): the optimizer as FSDP1, but the weights go out with `module.cpu()` and back with
    `module.to(device)` (offload_fsdp2_model_to_cpu / load_fsdp2_model_to_gpu): pageable both ways,
    pageable = ["weights"]. verl Megatron (utils/megatron_utils.py, offload_megatron_model_to_cpu): the
    parameter buffer goes out with `.cpu().pin_memory()` every time, a pageable copy then a host copy
    into pinned memory, and back from that pinned copy; the optimizer with non_blocking `.to`: pageable
    = ["weights-out"]. NeMo-RL's Megatron worker (the validation rows): the parameter buffer through
    Megatron-Core's offload_to_cpu (a pinned buffer kept from the first offload), the optimizer state
    with a blocking `v.to("cpu")` / `v.to("cuda")` (offload_optimizer_for_refit, on by default):
    pageable = ["optimizer"]; its DTensor worker moves both with `module.to` / `v.to`: pageable both.
    OpenRLHF `--ds.enable_sleep` (DeepSpeed's offload_states with pin_memory=True): the fp32 master
    weights, Adam moments and bf16 gradient partition into pinned buffers kept across steps, the
    contiguous gradient bucket freed, and the bf16 weights (lp_params, left out of the list) kept on
    the devices: resident = ["weights"], all pinned. torch_memory_saver (slime, AReaL, SGLang's
    weights backup) copies into pinned memory it allocates with cudaMallocHost at every pause and frees
    at resume (csrc/cpu_backup.h): 2.41 GiB/s out and 5.32 GiB/s back on an L20 whose pinned copies run
    at 24 (issue #111), 4.8 s against 0.6 s for an H100 weight resume once the backup is kept (PR #86):
    the pageable rates, pageable = both directions. The engines: vLLM's sleep level 1 backs the
    weights up in pinned memory (CuMemAllocator; OpenRLHF's --vllm.enable_sleep, NeMo-RL); verl's hybrid
    engine sleeps vLLM at level 2 (vLLM >= 0.8.5) and SGLang without a weights backup, so its engine
    weights are dropped, not copied, and the weight sync refills them (the engine sleep and wake lines
    overcount verl by their copies: not modelled apart).

Costs. Memory: rpeg/perf/memory.py (`_state_bytes`): what (a) offloads leaves the device's peak;
what stays is the working set (ZeRO's reduce bucket, which is there without offload too, and
ZeRO-3's gathered layers); the pinned staging buffers are host memory. Time, per optimizer step of
(a) (`optimizer_offload_parts`): the gradients down and the weights up over the host link, each at
its copy's rate (efficiency.host_copy_bytes_per_s: pinned, or pageable where the layout says,
the line then marked "(pageable)"), and the CPU Adam step, bound by host DRAM
(HOST_OPTIMIZER_BYTES_PER_S); charged one after another (the overlaps DeepSpeed and Megatron have
are not credited: an upper bound). With offload_params, each micro-batch's forward and backward
fetch the weight shards (`param_fetch_bytes`), overlapped with compute like ZeRO-3's gathers. (b):
the context switch's two moves, less what stays resident (`switched_state_parts`), each part at its
copy's rate.
"""

from __future__ import annotations

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.device import Device
from rpeg.perf import memory
from rpeg.perf.compute import BF16
from rpeg.perf.efficiency import HOST_OPTIMIZER_BYTES_PER_S, OPTIMIZER_BYTES_PER_PARAM, host_copy_bytes_per_s

GRAD_BYTES = 4.0  # fp32 main gradients, as the gradient sync and the memory model count them
GRADS_DOWN = "gradients to host"
HOST_STEP = "optimizer step on host"
WEIGHTS_UP = "updated weights from host"
FETCH = "weights fetched from host"


def optimizer_offload_parts(optimizer_params: float, layout: ParallelLayout,
                            device: Device) -> tuple[tuple[str, float], ...]:
    """Seconds per optimizer step of the host-side optimizer, one line each. `optimizer_params`: the
    parameters whose optimizer state one device owns (ZeRO-sharded as the layout says)."""
    n = layout.offload_optimizer * optimizer_params
    if n <= 0:
        return ()
    down = host_copy_bytes_per_s(device, "gradients-out", layout.pageable)
    up = host_copy_bytes_per_s(device, "weights-in", layout.pageable)
    step = n * OPTIMIZER_BYTES_PER_PARAM.value / HOST_OPTIMIZER_BYTES_PER_S[device.host].value
    return ((_label(GRADS_DOWN, "gradients-out", layout), n * GRAD_BYTES / down), (HOST_STEP, step),
            (_label(WEIGHTS_UP, "weights-in", layout), n * BF16 / up))


def _label(line: str, copy: str, layout: ParallelLayout) -> str:
    """A copy's breakdown line, saying so when it goes through pageable memory (it is ~10x slower)."""
    return f"{line} (pageable)" if copy in layout.pageable else line


def fetch_label(layout: ParallelLayout) -> str:
    return _label(FETCH, "weights-in", layout)


def param_fetch_bytes(spec: ModelSpec, layout: ParallelLayout, *, value_head: bool = False) -> float:
    """Bytes of weight shards one device copies from the host for one pass over its layers
    (offload_params: ZeRO-3 offload_param, FSDP2's CPUOffloadPolicy); 0 without."""
    if not layout.offload_params:
        return 0.0
    p = memory.device_params(spec, layout, value_head=value_head)
    dense, expert = memory.data_parallel_groups(spec, layout)
    return (p.dense / dense + p.expert / expert) * BF16


def switched_state_parts(spec: ModelSpec, layout: ParallelLayout, lora=None) -> dict[str, float]:
    """Bytes of trainer state one device moves to the host before a colocated engine generates
    (and back after), per part: the bf16 weights and the optimizer's fp32 master weights and moments,
    as the trainer holds them on its fullest pipeline stage (memory.trainer_state_bytes: ZeRO shards
    the dense parts over dp*cp and a mixture-of-experts model's experts over dp*cp*tp/ep, Megatron's
    expert data-parallel group), less what is already on the host (offload_optimizer, offload_params)
    and what stays resident. Gradients are freed, not moved. `lora` (rpeg/graph/lora.py): the optimizer
    state of the adapters alone."""
    state = memory.trainer_state_bytes(spec, layout, lora=lora)
    weights = 0.0 if "weights" in layout.resident else state["weights"]
    optimizer = 0.0 if "optimizer" in layout.resident else state["optimizer"]
    return {"weights": weights, "optimizer": optimizer}


def switch_seconds(parts: dict[str, float], layout: ParallelLayout, device, direction: str) -> float:
    """Seconds of one move of the context switch (`direction` out: to the host before generation; in:
    back before training) of `parts` (`switched_state_parts`), each part at its copy's rate (pinned, or
    pageable where the layout says)."""
    by_rate: dict[float, float] = {}  # the bytes that share a rate, summed first (all pinned: bytes / rate)
    for part, b in parts.items():
        rate = host_copy_bytes_per_s(device, f"{part}-{direction}", layout.pageable)
        by_rate[rate] = by_rate.get(rate, 0.0) + b
    return sum(b / rate for rate, b in by_rate.items())
