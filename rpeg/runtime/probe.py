"""The layer probe: what one decoder layer's forward costs as PyTorch eager runs it on this CPU.

`rpeg calibrate` (rpeg.hardware.calibrate) runs this module in a subprocess, so that the
planning side never imports torch, and writes two figures into the cpu-local device file:
- `layer_host_s`: the fixed host time of one decoder layer's forward per call (Python, module
  and op dispatch: what a 1-row forward still costs);
- `layer_token_s`: the time per token of a layer's forward beyond its FLOPs at the matmul rate
  (`--matmul-gflop-per-s`, the numpy rate calibrate measured in the same run): the norms,
  rotary, activation and residual ops and the attention kernel, which at small widths cost per
  token rather than per FLOP.

How: a Qwen2ForCausalLM with random weights is built in-process (no downloads) at PROBE dims,
deliberately not the tiny test model's, so the figures are not fitted to the model they will
predict. Under `torch.no_grad()` a forward of SEQ tokens a row is timed at R1 and R2 rows, each
the median of repeated runs within its half of the budget (interleaved, so that other load on the
machine falls on both alike; the median, not the best, because a run's step time is the median of
its steps and what it pays is the typical call: on this VM one process's best 32-row forward
varied from 15.1 to 18.5 ms between five probes a few seconds apart); t(r) = a + b*r through the
two points. The model call and the output head count as one more layer (`units` = layers + 1):
layer_host_s = a / units and layer_token_s = (b - flops_per_row / matmul rate) / (SEQ x units),
with flops_per_row what the perf model counts for this shape (`layer_flops_per_row`). A fit with
a <= 0 or a per-token time <= 0 (noise: a loaded machine) is reported as such and calibrate writes
neither figure.

    python -m rpeg.runtime.probe --threads T --seconds S [--devices D] [--matmul-gflop-per-s R]

prints one JSON object on stdout (warnings go to stderr). Without R the probe times a 1024 x 1024
float32 torch matmul for it. With D > 1, D processes with T threads each build the model, wait at
a barrier and measure together (the runtime's D workers share the cores the same way); the
figures are their mean, with `spread` giving each figure's min and max; then they measure the
loopback link between them (`loopback`) and what FSDP2 adds there (`loopback.fsdp`, `fsdp`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

PROBE_DIMS = {"hidden_size": 256, "intermediate_size": 704, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 64}
SEQ = 16  # tokens a row
ROWS = (2, 32)  # R1, R2: the fit's two points
WARMUP = 2
MIN_RUNS = 3
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def probe_spec():
    """The probe's shape as the perf model sees it."""
    from rpeg.graph.model import ModelSpec

    d = PROBE_DIMS
    return ModelSpec(name="layer-probe", layers=d["num_hidden_layers"], hidden=d["hidden_size"],
                     heads=d["num_attention_heads"], kv_heads=d["num_key_value_heads"], ffn=d["intermediate_size"],
                     vocab=d["vocab_size"], qkv_bias=True, tied_embeddings=True)


def layer_flops_per_row(spec, seq: int = SEQ) -> float:
    """Forward FLOPs of one row of `seq` tokens: per token, 2 x (attention + MLP weights) plus the
    attention scores and values over the mean causal context (seq + 1) / 2, per layer; plus the
    output head."""
    context = (seq + 1) / 2
    per_layer = (2 * (spec.attention_params() + spec.mlp_params(spec.ffn))
                 + 2 * context * spec.heads * (spec.q_head_dim + spec.v_head_dim))
    return seq * (spec.layers * per_layer + 2 * spec.vocab * spec.hidden)


def build_model(seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rpeg.runtime.models import quiet

    quiet()
    config = Qwen2Config(**PROBE_DIMS, tie_word_embeddings=True, rope_theta=10000.0, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(torch.float32).eval()


def probe(threads: int, seconds: float, ready=None, matmul_flop_per_s: float = 0.0) -> dict:
    """Measure the layer figures with `threads` torch threads within about `seconds` (model
    building not counted). `ready`, when given, is called once the model is built (a barrier);
    `matmul_flop_per_s`: the device's matmul rate (0: time a torch matmul for it)."""
    import torch

    torch.set_num_threads(threads)
    model = build_model()
    spec = probe_spec()
    vocab = PROBE_DIMS["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    inputs = {r: torch.randint(0, vocab, (r, SEQ), generator=gen) for r in ROWS}  # (r, SEQ)
    if ready is not None:
        ready()
    masks = {r: torch.ones_like(ids) for r, ids in inputs.items()}
    with torch.no_grad():
        times = _typical_times([lambda r=r: model(input_ids=inputs[r], attention_mask=masks[r]) for r in ROWS],
                               seconds)
    (r1, r2), (t1, t2) = ROWS, times
    per_row = layer_flops_per_row(spec)
    units = spec.layers + 1  # the model call and the output head count as one more layer
    rate = matmul_flop_per_s or _torch_matmul_rate(torch)
    b = (t2 - t1) / (r2 - r1)
    a = t1 - b * r1
    token = (b - per_row / rate) / (SEQ * units)
    fit = (f"t(r) = a + b*r through both points: a = {a * 1e3:.3f} ms, b = {b * 1e3:.4f} ms/row, of which "
           f"{per_row / rate * 1e3:.4f} ms the row's {per_row / 1e6:.2f} MFLOP at {rate / 1e9:.1f} GFLOP/s; "
           f"over {units} units (layers + the head) and {SEQ} tokens a row")
    return {"layer_host_s": a / units, "layer_token_s": token, "rows": list(ROWS), "seq": SEQ, "units": units,
            "times_s": times, "threads": threads, "torch": torch.__version__, "dims": dict(PROBE_DIMS),
            "flops_per_row": per_row, "matmul_flop_per_s": rate, "fit": fit}


def _torch_matmul_rate(torch) -> float:
    """A 1024 x 1024 float32 matmul's FLOP/s, the best of ten (when calibrate gave no rate)."""
    a = torch.randn(1024, 1024)
    best = math.inf
    for _ in range(10):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


def _typical_times(runs, budget_s: float) -> list[float]:
    """The median time of each run, over repeated calls within the budget: WARMUP calls of each
    first, then rounds in which each run is called for about the same time (so each has its share
    of the budget, and a load that comes and goes on this machine falls on all of them alike), until
    the budget is spent and each has had MIN_RUNS calls. The median, not the shortest: what a run
    pays is the typical call (with D processes measuring together, more processes than cores, the
    shortest is a moment the others left it alone; alone, a moment the machine ran fast)."""
    for run in runs:
        for _ in range(WARMUP):
            run()
    seen: list[list[float]] = [[] for _ in runs]
    deadline = time.perf_counter() + budget_s
    while min(len(t) for t in seen) < MIN_RUNS or time.perf_counter() < deadline:
        # a round: about the slowest run's typical time each
        share = max(statistics.median(t) for t in seen) if all(seen) else 0.0
        for i, run in enumerate(runs):
            until = time.perf_counter() + share
            while True:
                start = time.perf_counter()
                run()
                end = time.perf_counter()
                seen[i].append(end - start)
                if end >= until:
                    break
    return [statistics.median(t) for t in seen]


# ---- several devices sharing this machine's cores -------------------------------------------------
def probe_together(devices: int, threads: int, seconds: float, rate: float = 0.0) -> dict:
    """`devices` processes with `threads` threads each, measuring at once: the mean of their
    figures, with each figure's min and max in `spread`; then the loopback link between them
    (`loopback`: gloo all-reduces, as the runtime's process groups run on CPUs)."""
    import socket

    from rpeg.errors import RpegError
    from rpeg.hardware.calibrate import measure_together

    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        out = measure_together(_device_process, [(threads, seconds, rate, r, devices, port) for r in range(devices)],
                               120 + 4 * seconds)
    except RpegError as e:
        raise SystemExit(f"probe: {e}") from None
    merged = dict(out[0])
    merged["spread"] = {}
    for key in ("layer_host_s", "layer_token_s"):
        values = [o[key] for o in out]
        merged[key] = sum(values) / devices
        merged["spread"][key] = [min(values), max(values)]
    merged["times_s"] = [sum(o["times_s"][i] for o in out) / devices for i in range(len(ROWS))]
    merged["fit"] = "; ".join(f"process {i}: {o['fit']}" for i, o in enumerate(out))
    merged["devices"] = devices
    merged["loopback"] = next(o["loopback"] for o in out if o.get("loopback"))
    return merged


def _device_process(start, results, threads: int, seconds: float, rate: float, rank: int, world: int,
                    port: int) -> None:
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    with contextlib.redirect_stdout(sys.stderr):
        result = probe(threads, seconds, ready=start.wait, matmul_flop_per_s=rate)
        link = loopback(rank, world, port)
        if rank == 0:
            result["loopback"] = link
        results.put(result)


LINK_BYTES = (4, 4 * 2**20)  # a one-float all-reduce (latency) and a 4 MiB one (bandwidth)
LINK_RUNS = 20


def loopback(rank: int, world: int, port: int) -> dict:
    """The link between `world` processes on this machine as gloo runs it: the median of LINK_RUNS
    all-reduces of LINK_BYTES each. The perf model's ring all-reduce takes 2 (n - 1) latencies plus
    2 (n - 1) / n of the bytes over the bus bandwidth, so the latency is t(small) / (2 (n - 1)) and
    the bandwidth 2 (n - 1) / n x (large - small bytes) / (t(large) - t(small))."""
    import statistics

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        times = []
        for nbytes in LINK_BYTES:
            x = torch.ones(nbytes // 4)
            for _ in range(3):
                dist.all_reduce(x)
            runs = []
            for _ in range(LINK_RUNS):
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(x)
                runs.append(time.perf_counter() - t)
            times.append(statistics.median(runs))
        sharded = fsdp()
    finally:
        dist.destroy_process_group()
    (small, large), n = times, world
    steps = 2 * (n - 1)
    latency = small / steps
    bandwidth = steps / n * (LINK_BYTES[1] - LINK_BYTES[0]) / max(large - small, 1e-9)
    return {"latency_s": latency, "bandwidth_bytes_per_s": bandwidth, "bytes": list(LINK_BYTES), "times_s": times,
            "runs": LINK_RUNS, "world": n, "fsdp": sharded}


FSDP_RUNS = 15


def fsdp() -> dict:
    """What FSDP2 adds as the runtime's trainer shards the probe model over the process group's
    ranks (fully_shard per decoder layer and the root, rpeg.runtime.trainer): FSDP_RUNS logprob
    passes over R2 rows, sharded and whole (the same trainer code, the same processes), and
    FSDP_RUNS gathers of the full weights (`full_state_dict`: one all-gather per tensor, as a weight
    sync does), the median of each (gloo's waits vary from call to call; a run pays the typical
    one). unit_s = (sharded - whole) / (layers + 1 units); tensor_s = the gather's time / its tensors."""
    import statistics

    import torch
    import torch.distributed as dist

    from rpeg.graph.config import AlgoConfig
    from rpeg.runtime.batch import build_batch
    from rpeg.runtime.trainer import OptimConfig, Trainer

    rows, half = ROWS[-1], SEQ // 2
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, PROBE_DIMS["vocab_size"], (rows, SEQ), generator=gen).tolist()
    batch = build_batch([r[:half] for r in ids], [r[half:] for r in ids], [[0.0] * half] * rows, list(range(rows)),
                        [0] * rows, 0)
    optim = OptimConfig(forward_batch=rows)

    def median(run) -> float:
        run()
        times = []
        for _ in range(FSDP_RUNS):
            dist.barrier()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    whole = Trainer(build_model(), AlgoConfig(adv_estimator="grpo"), optim)
    shard = Trainer(build_model(), AlgoConfig(adv_estimator="grpo"), optim, shard=True)
    t_whole, t_shard = median(lambda: whole.logprobs(batch)), median(lambda: shard.logprobs(batch))
    t_gather = median(shard.full_state_dict)
    units, tensors = PROBE_DIMS["num_hidden_layers"] + 1, len(shard.model.state_dict())
    return {"unit_s": (t_shard - t_whole) / units, "tensor_s": t_gather / tensors, "units": units,
            "tensors": tensors, "rows": rows, "whole_s": t_whole, "sharded_s": t_shard, "gather_s": t_gather}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpeg.runtime.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (per process)")
    ap.add_argument("--seconds", type=float, default=1.5, help="time budget of the timed runs")
    ap.add_argument("--devices", type=int, default=1, help="processes measuring at once")
    ap.add_argument("--matmul-gflop-per-s", type=float, default=0.0,
                    help="the device's matmul rate (calibrate's); 0: time a torch matmul")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.devices < 1 or not args.seconds > 0:
        ap.error("--threads and --devices must be at least 1 and --seconds positive")
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON only
        if args.devices == 1:
            result = probe(args.threads, args.seconds, matmul_flop_per_s=args.matmul_gflop_per_s * 1e9)
        else:
            result = probe_together(args.devices, args.threads, args.seconds, args.matmul_gflop_per_s * 1e9)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
