"""Weight sync to generation engines on other devices, over a process group of its own.

The group joins the training group's rank 0 (its rank 0) with every engine rank (ranks 1..n). At a
sync every training rank gathers the full weights (FSDP2's `full_tensor`, a pipeline's stages) and
rank 0 broadcasts them to the engines in flat buckets, one collective per bucket; each engine rank
unpacks the bucket into named tensors and loads them (a tensor-parallel rank cuts its slice). NCCL
between GPUs, gloo on CPU. The tensors never pass through the driver or Ray's object store, which
cost 40 ms a sync for the tiny model here: two pickles, a copy into the store and one out.

This is the arrangement the peers use for a disaggregated refit: OpenRLHF joins its rank 0 and the
vLLM workers in a `model_update_group` and broadcasts from rank 0; NeMo-RL packs tensors into
buckets and broadcasts them from rank 0 (`packed_broadcast_producer`). The perf model costs the same
thing: `weight_sync_cost`, one sender's broadcast of the whole model.

Both ends agree on the buckets from one manifest (every tensor's name, shape and dtype, in the
trainer's order), taken once when the group forms.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

import torch

# What bounds the extra memory a sync takes on the sender and on each receiver (one packed bucket,
# beside the weights): a 7B model in bf16 goes in 55 collectives. NeMo-RL sizes its buckets from a
# fraction of free memory; a fixed bound keeps both ends' buckets the same without asking.
BUCKET_BYTES = 256 * 2**20
# A sync may wait for an engine to finish the generation it is running (a bounded-async plan starts
# the next step's before this one's sync): long reasoning rollouts take tens of minutes.
TIMEOUT = datetime.timedelta(hours=2)


@dataclass(frozen=True, slots=True)
class Meta:
    """One tensor of the synced weights: its name, full shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def manifest(state: dict[str, torch.Tensor]) -> tuple[Meta, ...]:
    """The tensors of a full state dict, in its order."""
    return tuple(Meta(k, tuple(v.shape), v.dtype) for k, v in state.items())


def buckets(metas: tuple[Meta, ...], limit: int = BUCKET_BYTES) -> list[list[Meta]]:
    """Consecutive tensors of one dtype, packed up to `limit` bytes a bucket (a larger tensor is a
    bucket of its own). Both ends compute the same buckets from the same manifest."""
    out: list[list[Meta]] = []
    size = 0
    for m in metas:
        if out and out[-1][0].dtype == m.dtype and size + m.nbytes <= limit:
            out[-1].append(m)
            size += m.nbytes
        else:
            out.append([m])
            size = m.nbytes
    return out


class Channel:
    """This process's end of the weight-sync group: rank 0 sends, every other rank receives."""

    def __init__(self, master: str, rank: int, world: int, metas: tuple[Meta, ...], device: str | None = None):
        import torch.distributed as dist

        host, port = master.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=TIMEOUT)
        # a group of its own beside the process's default one (the trainer's FSDP group, a
        # tensor-parallel engine's): built from its store, as vLLM's stateless groups are
        if device:
            self.group = dist.ProcessGroupNCCL(store, rank, world)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world, TIMEOUT)
        self.rank, self.world, self.device = rank, world, device
        self.buckets = buckets(metas)

    def _broadcast(self, flat: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()

    def send(self, state: dict[str, torch.Tensor]) -> None:
        """Rank 0: broadcast the full weights (named as in the manifest)."""
        for bucket in self.buckets:
            flat = torch.cat([state[m.name].detach().reshape(-1).to(device=self.device or "cpu", dtype=m.dtype)
                              for m in bucket])
            self._broadcast(flat)

    def receive(self) -> dict[str, torch.Tensor]:
        """Any other rank: the full weights rank 0 broadcast, as named tensors (views of the buckets)."""
        out: dict[str, torch.Tensor] = {}
        for bucket in self.buckets:
            flat = torch.empty(sum(m.numel for m in bucket), dtype=bucket[0].dtype, device=self.device or "cpu")
            self._broadcast(flat)
            for m, part in zip(bucket, flat.split([m.numel for m in bucket])):
                out[m.name] = part.view(m.shape)
        return out
