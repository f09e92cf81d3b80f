"""Supervised warm-up: next-token training on the task's answers, so a tiny model's first RL
rewards are not all zero (RL needs some successes to reinforce).

Two ways to end it:
- a step count (`steps`, the rate decaying linearly to zero over them), or
- a target (`target`): every `check_every` steps the policy samples answers to a dev set of
  problems the warm-up never trains on (train-split problems, never the test split), and the
  warm-up stops as soon as its sampled accuracy there reaches the target; `steps` is then only a
  bound and the rate stays constant (the stop, not a schedule, ends the warm-up).

Why a target: on the tiny demo model a fixed step count lands in very different places. Accuracy
sits near 0.1 on a plateau and then climbs to 0.9 within a few hundred steps, and when the climb
starts depends on the seed and on the CPU's floating-point kernels (measured here, lr 1e-3: after
450 steps for seed 0 and 1,100 for seed 1; at lr 3e-3 seed 1 had not started after 1,500). A run
stopped by a step count is therefore anywhere from "nothing learned" to "task solved" depending
on the machine; a run stopped at a dev accuracy starts RL from the same place on every machine.

`prepare_model` is what `rpeg train` runs before RL: build or load the model, warm it up, save the
weights the workers load (`warm-model/`) and what the warm-up did (`warmup.json`).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.models import prompt_ids
from rpeg.runtime.outputs import WarmupBar
from rpeg.runtime.rollout import HFEngine, SamplingParams
from rpeg.tasks.base import Problem


@dataclass
class WarmupResult:
    steps: int = 0  # steps taken
    losses: list[float] = field(default_factory=list)
    checks: list[tuple[int, float]] = field(default_factory=list)  # (step, dev accuracy sampled)
    target: float = 0.0
    reached: bool = False  # the target was reached (always False without a target)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "target": self.target, "reached": self.reached,
                "dev_accuracy": self.checks[-1][1] if self.checks else None,
                "final_loss": self.losses[-1] if self.losses else None}


def supervised_warmup(model, tokenizer, problems: list[Problem], *, steps: int, lr: float, batch: int, seed: int,
                      target: float = 0.0, check: Callable[[], float] | None = None, check_every: int = 20,
                      on_step: Callable[[int, float, float | None], None] | None = None,
                      chat: bool = False, demonstrate: Callable | None = None,
                      opening: Callable | None = None) -> WarmupResult:
    """Train on prompt + answer + <eos> with the loss on the answer tokens. With `target > 0`,
    `check()` (the dev accuracy) runs every `check_every` steps and the warm-up stops once it is
    >= `target`; `on_step(step, loss, dev accuracy or None)` reports every step (a progress bar).
    `demonstrate(problem, rng)`: a multi-turn environment's demonstration instead of the bare answer,
    as (text, trained) segments (text None: the end token); untrained segments (observations) are read
    but carry no loss, as in RL. `opening(problem)`: the episode's opening as token ids (the environment's
    format), instead of the prompt."""
    result = WarmupResult(target=target)
    if steps <= 0 or not problems:
        return result
    if target > 0 and check is None:
        raise ValueError("a warm-up target needs a check")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    decay = (lambda s: 1.0) if target > 0 else (lambda s: 1.0 - s / max(steps, 1))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, decay)
    encoded = []
    rng = random.Random(seed)
    prompts = ([opening(p) for p in problems] if opening is not None else
               prompt_ids(tokenizer, [p.prompt for p in problems], chat))
    for p, prompt in zip(problems, prompts):
        segments = demonstrate(p, rng) if demonstrate else [(p.answer, True), (None, True)]
        ids, trained = [], []
        for text, on in segments:
            part = [tokenizer.eos_token_id] if text is None else tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += part
            trained += [on] * len(part)
        encoded.append((prompt, ids, trained))
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(len(encoded), (batch,), generator=gen).tolist()
        ids, attn, labels = _rows([encoded[i] for i in idx], tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        result.losses.append(float(loss.detach()))
        result.steps = step
        acc = None
        if target > 0 and step % check_every == 0:
            model.eval()
            acc = check()
            model.train()
            result.checks.append((step, acc))
        if on_step:
            on_step(step, result.losses[-1], acc)
        if acc is not None and acc >= target:
            result.reached = True
            break
    model.eval()
    return result


WARMUP_DEV_SIZE = 256  # dev problems for a warm-up target: a standard error of at most 0.031 on the accuracy


def prepare_model(rt: RuntimeConfig, task, out: str, resume: bool, progress: bool) -> tuple[str, object, dict]:
    """The model folder the workers load: the given one, or the tiny one, after the SFT warm-up.
    Returns (folder, tokenizer, what the warm-up did)."""
    from rpeg.runtime.models import build_tiny, load

    warm = os.path.join(out, "warm-model")
    record = os.path.join(out, "warmup.json")
    if resume and os.path.exists(os.path.join(warm, "config.json")):
        done = {}
        if os.path.exists(record):
            with open(record, encoding="utf-8") as fh:
                done = json.load(fh)
        return warm, load(warm)[1], done
    src = rt.model_path
    if src == "tiny":
        src = build_tiny(os.path.join(out, "tiny-model"), seed=rt.seed)
    model, tok = load(src)
    done: dict = {}
    if rt.warmup_sft_steps:
        torch.set_num_threads(rt.threads or os.cpu_count() or 2)  # the warm-up runs here, in the driver
        n_train = max(2000, rt.sft_batch * 4)
        problems = task.problems("train", n_train + (WARMUP_DEV_SIZE if rt.warmup_target else 0), seed=rt.seed + 7)
        train, dev = problems[:n_train], problems[n_train:]
        t0 = time.time()
        bar = WarmupBar(rt.warmup_sft_steps, rt.warmup_target, progress)
        try:
            env = rt.env_spec(task)
            episode = env.factory(tok)() if env is not None else None
            result = supervised_warmup(model, tok, train, steps=rt.warmup_sft_steps, lr=rt.sft_lr,
                                       batch=rt.sft_batch, seed=rt.seed, target=rt.warmup_target,
                                       check_every=rt.warmup_check_every, on_step=bar.update, chat=rt.chat,
                                       check=lambda: _accuracy(model, tok, task, dev, rt),
                                       demonstrate=episode.demonstration if episode else None,
                                       opening=(lambda p: _opening(episode, tok, p)) if episode else None)
        finally:
            bar.close()
        done = result.as_dict() | {"seconds": time.time() - t0}
        if rt.warmup_target and not result.reached:
            print(f"warning: the supervised warm-up stopped at its bound of {result.steps} steps with dev accuracy "
                  f"{result.checks[-1][1]:.3f}, below its target {rt.warmup_target}; RL starts from there")
    model.save_pretrained(warm, safe_serialization=True)
    tok.save_pretrained(warm)
    with open(record, "w", encoding="utf-8") as fh:
        json.dump(done, fh)
    return warm, tok, done


def _opening(env, tok, problem) -> list[int]:
    """An episode's opening as the rollout encodes it (episode.HFCodec): the environment's format."""
    return tok(env.format.opening(env.reset(problem), env.tools), add_special_tokens=False)["input_ids"]


def _accuracy(model, tok, task, problems: list, rt: RuntimeConfig) -> float:
    """Sampled accuracy of `model` on `problems`, as the rollout samples (temperature, length)."""

    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id)
    prompts = prompt_ids(tok, [p.prompt for p in problems], rt.chat)
    params = SamplingParams(max_new_tokens=rt.max_new_tokens, temperature=rt.temperature)
    env = rt.env_spec(task)
    if env is not None:  # episodes with the environment's tools: the share whose outcome is correct
        from rpeg.runtime.agent_engine import episodes_on

        outcomes = episodes_on(engine, tok, problems, env, params, rt.seed + 4243).outcomes
        return sum(o >= 1.0 for o in outcomes) / len(problems)
    responses, _ = engine.generate(prompts, params, rt.seed + 4243)
    return task.accuracy(problems, tok.batch_decode(responses, skip_special_tokens=True))


def _rows(rows: list[tuple[list[int], list[int], list[bool]]], pad: int):
    """(ids, attention mask, labels), each (B, T), right-padded; labels only on the answer's trained tokens."""
    width = max(len(a) + len(b) for a, b, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (a, b, trained) in enumerate(rows):
        seq = a + b
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        labels[i, len(a):len(seq)] = torch.where(torch.tensor(trained, dtype=torch.bool), torch.tensor(b), -100)
    return ids, attn, labels
