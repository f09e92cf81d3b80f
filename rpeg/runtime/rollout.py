"""Rollout engines behind one interface: sample responses, report their logprobs, take new weights.

`hf` (the default on CPU): a batched sampling loop over a Hugging Face causal LM with its KV cache;
it returns the log-probability of every sampled token under the sampling distribution
(temperature applied), so the trainer's importance ratios start from exact behaviour logprobs.
`vllm`: vLLM's offline engine, for GPU users (see rpeg/runtime/vllm_engine.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import torch

from rpeg.runtime.models import autocast


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    greedy: bool = False


@dataclass
class InFlight:
    """Generations under partial rollout: they advance a segment of at most `segment` tokens at a time,
    each on the weights the engine holds when the segment starts, so new weights that arrive while they
    run are taken at the next segment instead of waiting for (or discarding) the whole generation.

    A segment continues a sequence by sampling from prompt + its tokens so far: the engine computes
    that prefix's KV cache again, with its current weights (AReaL's interruptible generation and
    verl's partial rollout do the same after a weight update). Every token keeps the logprob and the
    weight version it was sampled with: the behaviour policy of that token, which the trainer's
    importance ratio and off-policy correction read."""

    prompts: list[list[int]]
    params: SamplingParams
    seed: int
    segment: int
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)  # per token: the weight version that sampled it
    done: list[bool] = field(default_factory=list)
    segments: int = 0
    start: float = 0.0
    start_version: int = -1
    # the engine calls it led (advance_together): start, end, rows (of every flight in them), tokens decoded
    calls: list[tuple[float, float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        self.tokens = self.tokens or [[] for _ in range(n)]
        self.logprobs = self.logprobs or [[] for _ in range(n)]
        self.versions = self.versions or [[] for _ in range(n)]
        self.done = self.done or [False] * n

    @property
    def finished(self) -> bool:
        return all(self.done)

    def running(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]

    def budget(self) -> int:
        """Tokens its next segment adds to each running sequence: at most `segment`, and no more than
        max_new_tokens allows (its running sequences all have the same number of tokens: they started
        together and each segment adds `segment` tokens to a sequence unless it ends)."""
        rows = self.running()
        return min(self.segment, self.params.max_new_tokens - len(self.tokens[rows[0]])) if rows else 0

    def samples_like(self, other: InFlight) -> bool:
        """Whether one engine call can sample both: the same temperature and greedy choice."""
        return (self.params.temperature, self.params.greedy) == (other.params.temperature, other.params.greedy)

    def advance(self, engine) -> bool:
        """One segment, on the engine's current weights, for every sequence still running. True when
        every sequence is done."""
        advance_together([self], engine)
        return self.finished


def advance_together(flights: list[InFlight], engine) -> None:
    """One engine call: a segment for every running sequence of `flights` (of several launched steps,
    sampled alike: InFlight.samples_like), on the engine's current weights. The call decodes the longest
    budget among them; a sequence keeps the tokens of its own budget. It is the first flight's turn: its
    seed and segment count pick the call's random stream, and the call is recorded in its `calls`."""
    lead = flights[0]
    parts = [(f, f.running(), f.budget()) for f in flights if not f.finished]
    if not parts:
        return
    for f, _, _ in parts:
        if f.start_version < 0:
            f.start_version = engine.version
    n = max(b for _, _, b in parts)
    prompts = [f.prompts[i] + f.tokens[i] for f, rows, _ in parts for i in rows]
    t = time.time()
    out, lps = engine.generate(prompts, replace(lead.params, max_new_tokens=n), lead.seed + 7919 * lead.segments)
    lead.calls.append((t, time.time(), len(prompts), n))
    k = 0
    for f, rows, b in parts:
        for i in rows:
            toks, lp = out[k][:b], lps[k][:b]
            k += 1
            f.tokens[i] += toks
            f.logprobs[i] += lp
            f.versions[i] += [engine.version] * len(toks)
            f.done[i] = (not toks or toks[-1] == engine.eos_id or len(toks) < b
                         or len(f.tokens[i]) >= f.params.max_new_tokens)
        f.segments += 1


class SegmentPool:
    """Partial rollout's generations in flight on one engine, of every step launched on it: the
    request-level pool. Each call advances the running sequences of all of them together, so a step's
    last long responses share their calls with the next step's first tokens (one continuous batch, as
    the planner prices partial rollout: perf/generation.py) instead of decoding alone in calls of their
    own. A weight update enters between two calls (the worker's queue: workers.RolloutWorker)."""

    def __init__(self) -> None:
        self.flights: dict[int, InFlight] = {}
        self._keys = itertools.count()

    def add(self, flight: InFlight) -> int:
        key = next(self._keys)
        self.flights[key] = flight
        return key

    def advance(self, key: int, engine) -> InFlight | None:
        """Flight `key`'s turn: unless another flight's call already finished it, one call over every
        running flight that samples like it (it first). Then the flight, taken out of the pool, if it
        is finished; else None."""
        flight = self.flights[key]
        if not flight.finished:
            others = [f for k, f in self.flights.items() if k != key and not f.finished and f.samples_like(flight)]
            advance_together([flight] + others, engine)
        return self.flights.pop(key) if flight.finished else None


class HFEngine:
    """Batched sampling with a KV cache on a Hugging Face model (CPU or one GPU)."""

    def __init__(self, model, eos_id: int, pad_id: int, batch_size: int = 256, device: str | None = None,
                 bf16: bool = False, group=None):
        """`device` None: the model's own (the CPU path, sampled with a CPU generator); else the
        batch and a generator of its own live there, and `bf16` runs the forward under autocast.
        `group`: the process group of a tensor-parallel model (DTensor-sharded layers): every rank
        runs the same batch and takes the tokens its rank 0 sampled, so the ranks never diverge."""
        import inspect

        self.model = model.eval()
        self.eos_id, self.pad_id, self.batch_size = eos_id, pad_id, batch_size
        self.device, self.bf16 = device, bf16
        self.version = 0
        self.group = group
        # transformers 5.x names the KV cache argument `cache`; 4.x `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """The full weights, or a model with LoRA adapters its adapters alone (runtime.adapters); a
        tensor-parallel rank keeps its slice of each (cut here, no communication)."""
        from rpeg.runtime.adapters import is_adapter

        partial = bool(state_dict) and all(is_adapter(k) for k in state_dict)
        if self.group is None and not partial:
            self.model.load_state_dict(state_dict, strict=True)
        else:
            from torch.distributed.tensor import DTensor, distribute_tensor

            own = self.model.state_dict()
            wrong = set(state_dict) - set(own) if partial else set(own) ^ set(state_dict)
            if wrong:
                raise KeyError(f"weights do not match the engine's model: {sorted(wrong)[:4]}")
            with torch.no_grad():
                for name, full in state_dict.items():
                    p = own[name]
                    if isinstance(p, DTensor):
                        full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                        p = p.to_local()
                    p.copy_(full)
        self.version = version

    def served(self) -> dict[str, torch.Tensor] | None:
        """The weights this engine samples with, named as the trainer's (runtime.weights.verify); None for a
        tensor-parallel rank, whose tensors are slices."""
        return self.model.state_dict() if self.group is None else None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int):
        gen = torch.Generator(device=self.device or "cpu").manual_seed(seed)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        for start in range(0, len(prompts), self.batch_size):
            r, lp = self._generate(prompts[start:start + self.batch_size], params, gen)
            responses += r
            logprobs += lp
        return responses, logprobs

    def _generate(self, prompts: list[list[int]], params: SamplingParams, gen: torch.Generator):
        b = len(prompts)
        p = max(len(x) for x in prompts)
        ids = torch.full((b, p), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, p), dtype=torch.long)
        for i, x in enumerate(prompts):
            ids[i, p - len(x):] = torch.tensor(x, dtype=torch.long)
            attn[i, p - len(x):] = 1
        if self.device is not None:
            ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        past = None
        cur, cur_pos = ids, pos
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        tokens, lps = [], []
        for _ in range(params.max_new_tokens):
            with autocast(self.device, self.bf16):
                out = self.model(input_ids=cur, attention_mask=attn, position_ids=cur_pos, use_cache=True,
                                 **{self._cache_arg: past})
            past = getattr(out, self._cache_arg)
            logits = out.logits[:, -1, :].float()
            logp = torch.log_softmax(logits / max(params.temperature, 1e-6), dim=-1)
            if params.greedy:
                tok = logp.argmax(-1)
            else:
                tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            if self.group is not None:  # the ranks' logits agree to rounding; their tokens must agree exactly
                import torch.distributed as dist

                dist.broadcast(tok, src=dist.get_global_rank(self.group, 0), group=self.group)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            lp = torch.where(done, torch.zeros_like(lp), lp)
            tokens.append(tok)
            lps.append(lp)
            done = done | (tok == self.eos_id)
            if bool(done.all()):
                break
            cur = tok[:, None]
            attn = torch.cat([attn, (~done).long()[:, None] | 1], dim=1)
            cur_pos = cur_pos[:, -1:] + 1
        toks = torch.stack(tokens, 1).cpu() if tokens else torch.zeros((b, 0), dtype=torch.long)
        lpt = torch.stack(lps, 1).cpu() if lps else torch.zeros((b, 0))
        responses, logprobs = [], []
        for i in range(b):
            row, lrow = toks[i].tolist(), lpt[i].tolist()
            n = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            responses.append(row[:n])
            logprobs.append(lrow[:n])
        return responses, logprobs

