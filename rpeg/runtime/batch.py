"""Rollout batches: prompts and responses of one step as padded tensors, with per-token fields.

Layout: every sequence is its prompt, left-padded to the batch's longest prompt P, then its
response, right-padded to the longest response R; L = P + R. Per-token fields are *shifted*:
position t holds the value for predicting token t + 1 (so a (B, L - 1) tensor), and
`mask` (B, L - 1) is 1 where token t + 1 is a response token. This is the shape the advantage
estimators and losses in `rpeg.runtime.algos` take.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # (B, L) 1 on real tokens
    mask: torch.Tensor  # (B, L-1) float, 1 where the next token is a response token
    prompt_len: int  # P
    group_index: torch.Tensor  # (B,) which prompt each sequence answers
    weight_version: torch.Tensor  # (B,) actor version that sampled each response
    rollout_logprobs: torch.Tensor  # (B, L-1) the engine's logprobs of the sampled tokens
    scores: torch.Tensor | None = None  # (B,) reward per sequence
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # old/ref logprobs, values, ...

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def position_ids(self) -> torch.Tensor:
        return (self.attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def to(self, device) -> Batch:
        """The same batch with its tensors on `device` (a GPU rank's micro-batch)."""
        return self._map(lambda t: t.to(device))

    def select(self, idx: torch.Tensor) -> Batch:
        """The sequences at `idx` (a mini- or micro-batch)."""
        return self._map(lambda t: t[idx])

    def _map(self, fn) -> Batch:
        """The batch with `fn` applied to every per-sequence tensor."""
        return replace(self, input_ids=fn(self.input_ids), attention_mask=fn(self.attention_mask), mask=fn(self.mask),
                       group_index=fn(self.group_index), weight_version=fn(self.weight_version),
                       rollout_logprobs=fn(self.rollout_logprobs),
                       scores=None if self.scores is None else fn(self.scores),
                       extras={k: fn(v) for k, v in self.extras.items()})

    def response_lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    @staticmethod
    def join(parts: list[Batch], pad_id: int) -> Batch:
        """The batches' sequences as one batch (micro-batches of a step, streamed through its stages),
        re-padded to the longest prompt and response; one part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        p = max(b.prompt_len for b in parts)
        r = max(b.input_ids.shape[1] - b.prompt_len for b in parts)

        def padded(b: Batch, t: torch.Tensor, value) -> torch.Tensor:
            left = p - b.prompt_len  # prompts stay left-padded, responses right-padded
            right = r - (b.input_ids.shape[1] - b.prompt_len)
            return torch.nn.functional.pad(t, (left, right), value=value)

        def cat(get, value=0) -> torch.Tensor:
            return torch.cat([padded(b, get(b), value) if get(b).dim() == 2 else get(b) for b in parts])
        extras = {k: cat(lambda b, k=k: b.extras[k]) for k in parts[0].extras}
        return Batch(input_ids=cat(lambda b: b.input_ids, pad_id), attention_mask=cat(lambda b: b.attention_mask),
                     mask=cat(lambda b: b.mask), prompt_len=p, group_index=cat(lambda b: b.group_index),
                     weight_version=cat(lambda b: b.weight_version), rollout_logprobs=cat(lambda b: b.rollout_logprobs),
                     scores=None if parts[0].scores is None else cat(lambda b: b.scores), extras=extras)


def build_batch(prompts: list[list[int]], responses: list[list[int]], logprobs: list[list[float]],
                group_index: list[int], versions: list[int], pad_id: int,
                loss_masks: list[list[int]] | None = None, token_rewards: list[list[float]] | None = None) -> Batch:
    """Pad prompts left and responses right into one Batch. `loss_masks`: per response token, 1 where the
    engine sampled it and 0 on a multi-turn episode's observation tokens, which then stay out of `mask`
    (and so out of every loss, KL, entropy, ratio and advantage) while the model still reads them.
    `token_rewards`: per response token, the rewards an episode earned there (its turns', its outcome),
    shifted like `mask` into extras["token_scores"], which the token-level advantage estimators read."""
    b = len(prompts)
    p = max(len(x) for x in prompts)
    r = max(1, max(len(x) for x in responses))
    ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    mask = torch.zeros((b, p + r - 1))
    lps = torch.zeros((b, p + r - 1))
    earned = torch.zeros((b, p + r - 1)) if token_rewards is not None else None
    for i, (pr, rs, lp) in enumerate(zip(prompts, responses, logprobs)):
        ids[i, p - len(pr):p] = torch.tensor(pr, dtype=torch.long)
        attn[i, p - len(pr):p] = 1
        if rs:
            ids[i, p:p + len(rs)] = torch.tensor(rs, dtype=torch.long)
            attn[i, p:p + len(rs)] = 1
            mask[i, p - 1:p - 1 + len(rs)] = 1.0 if loss_masks is None else torch.tensor(loss_masks[i],
                                                                                          dtype=torch.float32)
            lps[i, p - 1:p - 1 + len(rs)] = torch.tensor(lp, dtype=torch.float32)
            if earned is not None:
                earned[i, p - 1:p - 1 + len(rs)] = torch.tensor(token_rewards[i], dtype=torch.float32)
    return Batch(input_ids=ids, attention_mask=attn, mask=mask, prompt_len=p,
                 group_index=torch.tensor(group_index, dtype=torch.long),
                 weight_version=torch.tensor(versions, dtype=torch.long), rollout_logprobs=lps,
                 extras={} if earned is None else {"token_scores": earned})
