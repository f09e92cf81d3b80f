"""A training update with LoRA against the same update in full, side by side in one process, on this machine.

The model: a local Hugging Face folder (default models/smollm2-135m-instruct, `make smollm2`; `tiny` builds
the tiny one). The batch: `--rows` sequences of `--prompt` + `--response` random tokens with random
advantages, one optimizer step of micro-batches of `--micro-batch` rows, as the runtime's trainer runs it
(rpeg/runtime/trainer.py). For each of full fine-tuning and LoRA (`--rank`, alpha 2 x rank, every
projection), alternating, `--repeats` times: the update's wall time, and the bytes the optimizer holds and
that a weight sync of the adapters (or the whole model) moves. Prints JSON with the medians and the ratios
LoRA / full.

    PYTHONPATH=. .venv/bin/python benchmarks/lora_update.py [--model PATH] [--rows 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rpeg.graph.config import AlgoConfig  # noqa: E402
from rpeg.graph.lora import LoRA  # noqa: E402
from rpeg.runtime.batch import build_batch  # noqa: E402
from rpeg.runtime.models import build_tiny, load  # noqa: E402
from rpeg.runtime.trainer import OptimConfig, Trainer  # noqa: E402


def batch(rows: int, prompt: int, response: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(4, vocab, (prompt,), generator=g)] for _ in range(rows)]
    responses = [[int(x) for x in torch.randint(4, vocab, (response,), generator=g)] for _ in range(rows)]
    b = build_batch(prompts, responses, [[-1.0] * response] * rows, [i // 8 for i in range(rows)], [0] * rows,
                    pad_id=0)
    b.extras["old_logprobs"] = torch.full_like(b.mask, -1.5) * b.mask
    b.extras["advantages"] = torch.randn(rows, generator=g)[:, None] * b.mask
    return b


def state_bytes(trainer: Trainer) -> int:
    return sum(t.numel() * t.element_size() for s in trainer.opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = build_tiny(os.path.join(tempfile.mkdtemp(), "tiny")) if args.model == "tiny" else args.model
    if not os.path.exists(os.path.join(path, "config.json")):
        print(json.dumps({"error": f"{path} is not a model folder (make smollm2, or --model tiny)"}))
        return 2
    cfg = AlgoConfig(adv_estimator="grpo", loss_agg="seq-mean-token-mean")
    opt = OptimConfig(lr=1e-5, micro_batch=args.micro_batch)
    lora = LoRA(rank=args.rank, alpha=2.0 * args.rank)
    trainers = {"full": Trainer(load(path)[0], cfg, opt), "lora": Trainer(load(path)[0], cfg, opt, lora=lora)}
    b = batch(args.rows, args.prompt, args.response, trainers["full"].model.config.vocab_size)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for i in range(args.repeats + 1):  # the first round warms up (allocations, the optimizer's state)
        for name, tr in trainers.items():
            t = time.perf_counter()
            tr.train(b, epochs=1, mini_batches=1, seed=i)
            if i:
                times[name].append(time.perf_counter() - t)
    out = {"model": path, "rows": args.rows, "tokens_per_row": args.prompt + args.response,
           "micro_batch": args.micro_batch, "rank": args.rank, "threads": args.threads, "repeats": args.repeats}
    for name, tr in trainers.items():
        out[name] = {"update_s": statistics.median(times[name]), "update_s_all": times[name],
                     "optimizer_bytes": state_bytes(tr),
                     "trained_params": sum(p.numel() for p in tr.model.parameters() if p.requires_grad),
                     "sync_bytes": sum(v.numel() * v.element_size() for v in tr.engine_weights(merged=False).values())}
    full, low = out["full"], out["lora"]
    out["ratios_lora_over_full"] = {k: low[k] / full[k] for k in ("update_s", "optimizer_bytes", "trained_params",
                                                                   "sync_bytes")}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
