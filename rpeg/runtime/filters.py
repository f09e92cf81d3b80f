"""Group filters: which of a step's prompt groups to train on, between scoring and training.

The graph's filter stage (a group-granular compute stage that produces the trained responses,
DAPO's `dynamic_sampling`) says that a filter runs; this is what it computes, beside the other
algorithm math (advantages.py, losses.py), not in the driver.
"""

from __future__ import annotations

import torch


def mixed_groups(scores: torch.Tensor, n: int, limit: int) -> list[int]:
    """DAPO's dynamic sampling: the first `limit` groups (of `n` consecutive samples) whose rewards are not
    all equal — a group scored alike has zero advantage under group normalization and teaches nothing."""
    groups = scores.view(-1, n)
    mixed = (groups != groups[:, :1]).any(dim=1)
    return [int(g) for g in torch.nonzero(mixed).flatten()[:limit]]
