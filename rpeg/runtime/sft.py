"""Supervised warm-up: a few hundred steps of next-token training on the task's answers, so a
tiny model's first RL rewards are not all zero (RL needs some successes to reinforce)."""

from __future__ import annotations

import torch

from rpeg.tasks.base import Problem


def supervised_warmup(model, tokenizer, problems: list[Problem], *, steps: int, lr: float, batch: int,
                      seed: int) -> list[float]:
    """Train on prompt + answer + <eos> with the loss on the answer tokens; returns the losses."""
    if steps <= 0 or not problems:
        return []
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(steps, 1))
    encoded = []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((prompt, answer))
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(encoded), (batch,), generator=gen).tolist()
        rows = [encoded[i] for i in idx]
        width = max(len(a) + len(b) for a, b in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attn = torch.zeros((batch, width), dtype=torch.long)
        for i, (a, b) in enumerate(rows):
            seq = a + b
            ids[i, :len(seq)] = torch.tensor(seq)
            attn[i, :len(seq)] = 1
            labels[i, len(a):len(seq)] = torch.tensor(b)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
