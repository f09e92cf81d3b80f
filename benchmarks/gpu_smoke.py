"""One GRPO step on one device with only torch and transformers (no Ray, no vLLM): the runtime's
trainer and `hf` engine on CUDA in bf16 (fp32 master weights), measured against the performance
model's prediction for the same step on that device.

A Qwen2-architecture model is built from a preset's dimensions with random weights (nothing is
downloaded) and the character tokenizer of the tiny model; prompts are arithmetic problems. The
step: sample `samples` responses for each of `prompts` prompts, score them, group-normalized
advantages, the policy's logprobs, one optimizer step over them. Prints JSON: measured generation
tokens/s, logprob and training time, peak memory per phase, and the model's prediction for each
(`--cluster`, 1 GPU; default dgx-h200 on CUDA, cpu-local on the CPU), with predicted / measured.

    python benchmarks/gpu_smoke.py                         # CUDA if torch sees it, else the CPU
    python benchmarks/gpu_smoke.py --device cpu --model tiny-qwen2 --prompts 8 --samples 4 --max-new-tokens 8
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="preset whose dimensions to build (default qwen2.5-0.5B on CUDA, "
                                                  "tiny-qwen2 on the CPU)")
    ap.add_argument("--cluster", default=None, help="cluster preset for the prediction (default dgx-h200 on CUDA, "
                                                    "cpu-local on the CPU)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    name = args.model or ("qwen2.5-0.5B" if cuda else "tiny-qwen2")
    cluster_name = args.cluster or ("dgx-h200" if cuda else "cpu-local")

    from transformers import AutoModelForCausalLM, Qwen2Config

    from rpeg.graph import get_model
    from rpeg.graph.config import AlgoConfig
    from rpeg.runtime import algos
    from rpeg.runtime.batch import build_batch
    from rpeg.runtime.models import build_tokenizer, quiet
    from rpeg.runtime.rollout import HFEngine, SamplingParams
    from rpeg.runtime.trainer import OptimConfig, Trainer
    from rpeg.tasks import get_task

    quiet()
    torch.manual_seed(args.seed)
    tok = build_tokenizer()
    spec = get_model(name).replace(vocab=len(tok))
    config = Qwen2Config(vocab_size=len(tok), hidden_size=spec.hidden, intermediate_size=spec.ffn,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = AutoModelForCausalLM.from_config(config)
    cfg = AlgoConfig(adv_estimator="grpo")
    trainer = Trainer(model, cfg, OptimConfig(lr=1e-6, micro_batch=args.micro_batch), device=args.device, bf16=cuda)
    engine = HFEngine(trainer.model, tok.eos_token_id, tok.pad_token_id, device=args.device, bf16=cuda)

    task = get_task("arithmetic", ops=["add", "mul"], level=3)
    problems = task.problems("train", args.prompts, seed=args.seed)
    ids = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    prompts = [x for x in ids for _ in range(args.samples)]

    def phase(fn):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return out, time.perf_counter() - t, (torch.cuda.max_memory_allocated() if cuda else 0)

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=2), args.seed)  # warm-up: kernels, allocator
    (responses, logprobs), gen_s, gen_mem = phase(lambda: engine.generate(prompts, params, args.seed))
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    scores = torch.tensor([task.reward(problems[i // args.samples], t) for i, t in enumerate(texts)])
    batch = build_batch(prompts, responses, logprobs, [i // args.samples for i in range(len(prompts))],
                        [0] * len(prompts), tok.pad_token_id)
    old, lp_s, lp_mem = phase(lambda: trainer.logprobs(batch))
    batch.extras["old_logprobs"] = old
    adv, _ = algos.compute_advantages("grpo", scores=scores, mask=batch.mask, group_index=batch.group_index,
                                      config=cfg)
    batch.extras["advantages"] = adv
    train_metrics, train_s, train_mem = phase(lambda: trainer.train(batch, 1, 1, args.seed))

    generated = sum(map(len, responses))
    measured = {"generate_s": gen_s, "generate_tokens_per_s": generated / gen_s, "logprobs_s": lp_s,
                "train_s": train_s, "peak_gb": {"generate": gen_mem / 1e9, "logprobs": lp_mem / 1e9,
                                                "train": train_mem / 1e9}}
    predicted = _predict(spec, cluster_name, args, prompt_len=sum(map(len, ids)) / len(ids),
                         response_len=generated / len(responses))
    ratios = {k: predicted[k] / measured[k] for k in ("generate_s", "logprobs_s", "train_s") if predicted.get(k)}
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "model": f"{name} dimensions, vocab {len(tok)}, random weights", "cluster": cluster_name,
           "sequences": len(prompts), "mean_response_tokens": generated / len(responses),
           "reward": float(scores.mean()), "grad_norm": float(train_metrics["grad_norm"]),
           "measured": measured, "predicted": predicted, "predicted_over_measured": ratios}
    print(json.dumps(out, indent=1))
    return out


def _predict(spec, cluster_name: str, args, *, prompt_len: float, response_len: float) -> dict:
    """The model's prediction for the same step: the job as measured (mean lengths), one device,
    colocated, synchronous; each stage's time and the predicted peak memory per GPU."""
    from rpeg.algorithms import Models, build_graph
    from rpeg.graph import Job, LengthDistribution
    from rpeg.hardware import load_cluster
    from rpeg.passes import colocate, parallelize
    from rpeg.perf.step import predict_step

    job = Job(prompts=args.prompts, samples_per_prompt=args.samples, prompt_len=max(1, round(prompt_len)),
              response=LengthDistribution.fixed(max(1, round(response_len))))
    g = colocate(build_graph("grpo", job, Models(actor=spec), kl_coef=0.0), 1)
    for s in g.stages:
        if s.kind.value == "generate":
            g = parallelize(g, s.name, dp=1, zero=0)
        elif s.kind.value in ("infer", "train"):  # the trainer's micro-batches of --micro-batch padded rows
            g = parallelize(g, s.name, dp=1, zero=0, micro_batch=args.micro_batch, packing=False)
    pred = predict_step(g, load_cluster(cluster_name, 1))
    stages = pred.stages
    return {"generate_s": stages["generate"].seconds, "logprobs_s": stages["actor_logprobs"].seconds,
            "train_s": stages["actor_update"].seconds,
            "peak_gb": pred.peak_memory_bytes / 1e9, "fits": pred.fits}


if __name__ == "__main__":
    main()
