"""Sequence packing as NeMo-RL shards a pass: bins, their dealing to data-parallel ranks, padding.

`ParallelLayout.bins = "even"` (the default) spreads a packed pass's tokens evenly: every rank holds
sequences / dp of the mean length, in micro-batches filled to their token budget. `"ffd"` is what
NeMo-RL's driver does (`BatchedDataDict.shard_by_batch_size` with `sequence_packing_args`,
nemo_rl/distributed/batched_data_dict.py, v0.3.0 to v0.6.0): per chunk (one optimizer step's
`train_global_batch_size` sequences for a training pass, the whole batch for a log-prob pass) it
pads each sequence to a multiple of tp (2 x cp x tp under context parallelism), packs them into bins
of the micro-batch's token budget with modified first-fit-decreasing, and deals the bins round-robin
(bin i to rank i mod dp). Each bin is one micro-batch. With pipeline parallelism every micro-batch is
padded to the rank's longest bin (`pad_full_seq_to`: Megatron's pipeline sends one activation shape;
NVIDIA-NeMo/RL issue #2438 describes it). The step waits for the busiest rank.

`busiest_rank` costs that on the chunk's sequence lengths at evenly spaced quantiles of the job's
distribution (the runaways at the cap included): the busiest rank's tokens (padding counted) and
its bins. NeMo-RL's default packer is modified first-fit-decreasing (Johnson & Garey 1985: one bin
per sequence longer than half a bin, then medium and pairs of small sequences into those bins, then
first-fit decreasing for the rest); plain first-fit decreasing stands for it here, not checked
against it bin by bin.

Tests: tests/perf/test_perf_packing.py (bins and ranks by hand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from rpeg.graph.job import LengthDistribution

LABEL = "packed bins: the busiest rank's tokens and bins beyond the mean share"


@dataclass(frozen=True, slots=True)
class RankLoad:
    """The busiest data-parallel rank of one packed chunk: its tokens (padding included) and its bins."""

    tokens: float
    bins: int


def ffd(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: each length, longest first, into the first bin with room (a length above
    the capacity gets a bin of its own). Returns the bins, in the order they were opened."""
    bins: list[list[int]] = []
    room: list[int] = []
    for n in sorted(lengths, reverse=True):
        for i, r in enumerate(room):
            if n <= r:
                bins[i].append(n)
                room[i] -= n
                break
        else:
            bins.append([n])
            room.append(capacity - n)
    return bins


def deal(bins: list[list[int]], dp: int, pad_to_longest: bool) -> RankLoad:
    """Bin i to rank i mod dp; a rank's tokens are its bins' (each padded to its longest bin when
    `pad_to_longest`). The busiest rank by tokens (ties: more bins)."""
    best = RankLoad(0.0, 0)
    for r in range(dp):
        mine = [sum(b) for b in bins[r::dp]]
        if not mine:
            continue
        tokens = len(mine) * max(mine) if pad_to_longest else sum(mine)
        if (tokens, len(mine)) > (best.tokens, best.bins):
            best = RankLoad(float(tokens), len(mine))
    return best


@lru_cache(maxsize=4096)
def busiest_rank(response: LengthDistribution, prompt_len: int, sequences: int, capacity: int, dp: int,
                 pad_to_longest: bool, multiple: int = 1) -> RankLoad:
    """The busiest rank of a chunk of `sequences` sequences (prompt + response at evenly spaced
    quantiles, each padded to `multiple`) packed into bins of `capacity` tokens and dealt to `dp`
    ranks (module docstring)."""
    lengths = [math.ceil((prompt_len + response.quantile((i + 0.5) / sequences)) / multiple) * multiple
               for i in range(sequences)]
    return deal(ffd(lengths, capacity), dp, pad_to_longest)
