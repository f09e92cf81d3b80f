"""The generation engines of a plan (`Engines`): their calls started, awaited and, after an engine's
restart, made again; and the helpers for their data shards and spans."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rpeg.runtime.workers import Span


@dataclass
class Engines:
    """The generation engines: `ranks[j]` are engine j's workers, one, or the `tp` ranks of a
    tensor-parallel engine (they all take the same prompts; the first one's result stands for them).
    Each worker has generate(prompts, params, seed), and either load_weights(version) (colocated: the
    trainer's weights in the same process) or receive_weights(version) (over the weight-sync group)."""

    ray: object
    ranks: list[list]
    # each call's first future -> (engine, method, arguments, whether every rank took it): what a restarted
    # engine is given again (`resubmit`); a step forgets its calls when it is done (`forget`)
    sent: dict = field(default_factory=dict)

    def _call(self, j: int, method: str, args: tuple, every_rank: bool = True) -> list:
        futures = [getattr(w, method).remote(*args) for w in (self.ranks[j] if every_rank else self.ranks[j][:1])]
        self.sent[futures[0]] = (j, method, args, every_rank)
        return futures

    def submit(self, prompts: list, params, seed: int, segment: int = 0) -> list[list]:
        """Start generating `prompts`, split over the engines (engine j seeded `seed + j`): the futures.
        `segment` > 0: partial rollout, `segment` tokens at a time (workers.RolloutWorker.generate_partial)."""
        parts = shards(len(prompts), len(self.ranks))
        method, extra = ("generate_partial", (segment,)) if segment > 0 else ("generate", ())
        return [self._call(j, method, ([prompts[i] for i in idx], params, seed + j, *extra))
                for j, idx in enumerate(parts)]

    def submit_episodes(self, problems: list, spec, params, seed: int, partial: bool = False) -> list[list]:
        """Start one multi-turn episode per problem, split over the engines like `submit`: the futures.
        `partial`: partial rollout, the episodes in each engine's pool (workers.RolloutWorker.episodes_partial)."""
        parts = shards(len(problems), len(self.ranks))
        method = "episodes_partial" if partial else "episodes"
        return [self._call(j, method, ([problems[i] for i in idx], spec, params, seed + j), every_rank=False)
                for j, idx in enumerate(parts)]

    def resubmit(self, part: list[list], dead: list[int]) -> int:
        """A launched part's calls on engines `dead` (restarted since) made again on their new ranks, with the
        same arguments, in place; the calls of the other engines stand. How many were made again."""
        again = 0
        for i, futures in enumerate(part):
            j, method, args, every_rank = self.sent.get(futures[0], (None, "", (), True))
            if j in dead:
                part[i] = self._call(j, method, args, every_rank)
                again += 1
        return again

    def forget(self, part: list[list]) -> None:
        """A finished part's calls: no longer to be made again."""
        for futures in part:
            self.sent.pop(futures[0], None)

    def dead(self, probe_s: float = 2.0) -> list[int]:
        """The engines with a rank that has died: each rank is asked where it runs; a dead one's answer is an
        error at once, a live one answers or is busy (a generation under way) past `probe_s`."""
        probes = [[w.where.remote() for w in ranks] for ranks in self.ranks]
        ready, _ = self.ray.wait([p for ps in probes for p in ps], num_returns=sum(map(len, probes)),
                                 timeout=probe_s)
        return [j for j, ps in enumerate(probes) if any(p in ready and self._died(p) for p in ps)]

    def _died(self, probe) -> bool:
        """Whether a ready probe's answer is its rank's death."""
        try:
            self.ray.get(probe, timeout=0)
        except self.ray.exceptions.RayActorError:
            return True
        return False

    def wait(self, pending: list[list]) -> list:
        """Each engine's workers.Generated, in order (a partial rollout's segments followed to the last)."""
        out = []
        for futures in pending:
            got = self.ray.get(futures[0], what="generation")
            while isinstance(got, self.ray.ObjectRef):  # the reference to a partial rollout's next segment
                got = self.ray.get(got, what="generation")
            self.ray.get(futures[1:], what="generation")  # a tensor-parallel engine's other ranks (hf generate only)
            out.append(got)
        return out

    def one(self, prompts: list, params, seed: int):
        """All of `prompts` on the first engine (held-out evaluation)."""
        return self.ray.get([w.generate.remote(prompts, params, seed) for w in self.ranks[0]], what="generation")[0]

    def one_episodes(self, problems: list, spec, params, seed: int):
        """An episode per problem on the first engine (held-out evaluation of a multi-turn job)."""
        return self.ray.get(self.ranks[0][0].episodes.remote(problems, spec, params, seed), what="episodes")

    @property
    def workers(self) -> list:
        return [w for ranks in self.ranks for w in ranks]

    def load(self, version: int) -> Span:
        """The trainer's new weights, in the same process, into every engine: the span."""
        return joined(self.ray.get([w.load_weights.remote(version) for w in self.workers], what="the weight load"))

    def receive(self, version: int) -> list:
        """Every engine rank starts taking the weights broadcast over the weight-sync group: the futures."""
        return [w.receive_weights.remote(version) for w in self.workers]


def joined(spans) -> Span:
    """The span of several workers' parts: first start to last end, and the highest peak memory."""
    spans = list(spans)
    return Span(min(s[0] for s in spans), max(s[1] for s in spans), max((s[2] if len(s) > 2 else 0.0) for s in spans))


def shards(n: int, parts: int) -> list[torch.Tensor]:
    """Rows 0..n-1 in `parts` contiguous, near-equal index ranges (data shards, streamed parts)."""
    return [c for c in torch.tensor_split(torch.arange(n), parts)]
