"""What tensor parallelism costs the runtime's trainer on this CPU: the same batch through a
1-process trainer and through a 2-rank DTensor tensor-parallel one (gloo), side by side.

The batch is the demo job's (examples/demo-grpo-tiny.yaml: prompts x samples rows of its prompt
and response lengths) on the tiny model, in the runtime's 64-row micro-batches: the policy's
logprobs (one forward pass over the batch) and one training pass (its mini-batches, each a
forward, a backward and an AdamW step). Each rank has one thread, so the 2-rank run uses both
cores and the 1-process run one. Times are medians of repeated calls after one warm-up call.
Prints JSON with each time and the tp-2 / tp-1 ratios: where tensor parallelism only split the
FLOPs and added the all-reduces, the ratio would be below 1 here.

    .venv/bin/python benchmarks/tp_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

from rpeg.graph.config import AlgoConfig
from rpeg.runtime.batch import build_batch
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.trainer import MicroBatch, OptimConfig, Trainer
from rpeg.spec import load_spec

MICRO_BATCH = 64  # the runtime's rows a call (benchmarks/plan_shapes.py)


def _batch(rows: int, prompt_len: int, response_len: int, group: int):
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(4, 40, (prompt_len,), generator=g)] for _ in range(rows)]
    responses = [[int(x) for x in torch.randint(4, 40, (response_len,), generator=g)] for _ in range(rows)]
    b = build_batch(prompts, responses, [[-1.0] * response_len] * rows, [i // group for i in range(rows)], [0] * rows,
                    pad_id=0)
    b.extras["old_logprobs"] = torch.full_like(b.mask, -1.5) * b.mask
    b.extras["advantages"] = torch.linspace(-1, 1, rows)[:, None] * b.mask
    return b


def _median(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _rank(rank: int, tp: int, port: int, path: str, shape: dict, repeats: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    if tp > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=tp)
    model, _ = load(path)
    micro = MicroBatch(rows=MICRO_BATCH)
    trainer = Trainer(model, AlgoConfig(adv_estimator="grpo"),
                      OptimConfig(lr=1e-4, micro_batch=micro, forward_batch=micro), tp=tp)
    batch = _batch(shape["rows"], shape["prompt_len"], shape["response_len"], shape["group"])
    logprobs = _median(lambda: trainer.logprobs(batch), repeats)
    train = _median(lambda: trainer.train(batch, 1, shape["mini_batches"], 0), repeats)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"logprobs_s": logprobs, "train_s": train}, fh)
    if tp > 1:
        dist.barrier()
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="examples/demo-grpo-tiny.yaml")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    job = load_spec(args.job).graph().job
    shape = {"rows": job.prompts * job.samples_per_prompt, "prompt_len": int(job.prompt_len),
             "response_len": int(job.response.mean), "group": job.samples_per_prompt,
             "mini_batches": job.mini_batches}
    folder = tempfile.mkdtemp(prefix="rpeg-tp-")
    path = build_tiny(os.path.join(folder, "tiny"))
    result = {"job": args.job, "batch": shape, "micro_batch_rows": MICRO_BATCH, "threads_per_rank": 1}
    for tp in (1, 2):
        out = os.path.join(folder, f"tp{tp}.json")
        mp.start_processes(_rank, args=(tp, _port(), path, shape, args.repeats, out), nprocs=tp,
                           start_method="spawn")
        with open(out) as fh:
            result[f"tp{tp}"] = json.load(fh)
    result["tp2_over_tp1"] = {k: result["tp2"][k] / result["tp1"][k] for k in ("logprobs_s", "train_s")}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
