"""What verifying a weight sync costs (runtime.weights: fingerprints sent beside the weights and checked on
each engine), measured side by side with the same sync unverified.

Two processes on this machine, a sender (the trainer's rank 0) and one engine rank, over the weight-sync
group (gloo), for a model of random weights of each shape below (built from its config: nothing downloaded):
the tiny model of the demos and one of SmolLM2-135M's dimensions. Per sync: the broadcast alone
(`verify_every` 0), and with fingerprints (1): the sender's fingerprints and their broadcast, and on the
engine the check of what it received, of what it serves after loading and of what it served since the
last sync. Prints JSON: seconds per sync, median of `--syncs`, and the ratio.

    .venv/bin/python benchmarks/sync_verify.py [--syncs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

from rpeg.runtime.weights import Channel, manifest, verify


def _model(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rpeg.runtime.models import build_tiny, load

    if kind == "tiny":
        with tempfile.TemporaryDirectory() as d:
            return load(build_tiny(d))[0]
    # SmolLM2-135M's config (HuggingFaceTB/SmolLM2-135M config.json): 30 layers, hidden 576, 9 heads, 3 KV heads
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def _rank(rank: int, port: int, kind: str, syncs: int, every: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = _model(kind)
    state = model.state_dict()
    ch = Channel(f"127.0.0.1:{port}", rank, 2, manifest(state), verify_every=every)
    times, last = [], None
    for _ in range(syncs + 1):  # the first is a warm-up
        t = time.perf_counter()
        if rank == 0:
            ch.send(state)
        else:
            got = ch.receive()
            if ch.expected is not None:
                if last is not None:
                    verify(ch.metas, last, None, model.state_dict(), served_as="was served since the last sync")
                model.load_state_dict(got)
                verify(ch.metas, ch.expected, got, model.state_dict())
                last = ch.expected
            else:
                model.load_state_dict(got)
        times.append(time.perf_counter() - t)
    with open(os.path.join(out, f"{rank}.json"), "w") as fh:
        json.dump({"seconds": times[1:], "bytes": sum(m.nbytes for m in ch.metas)}, fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--syncs", type=int, default=5)
    args = ap.parse_args()
    result = {}
    for kind in ("tiny", "smollm2-135m-shaped"):
        row = {}
        for every in (0, 1):
            with tempfile.TemporaryDirectory() as out:
                mp.start_processes(_rank, args=(random.randrange(20000, 32000), kind, args.syncs, every, out),
                                   nprocs=2, start_method="spawn")
                engine = json.load(open(os.path.join(out, "1.json")))
            row["verified" if every else "unverified"] = round(statistics.median(engine["seconds"]), 4)
            row["megabytes"] = round(engine["bytes"] / 1e6, 1)
        row["ratio"] = round(row["verified"] / row["unverified"], 2)
        result[kind] = row
    print(json.dumps({"syncs": args.syncs, "engine_seconds_per_sync": result}, indent=1))


if __name__ == "__main__":
    main()
