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

**Verified syncs.** Every `verify_every`-th sync (1: each, the default; 0: never) rank 0 also
broadcasts a fingerprint of every tensor it sent (`fingerprint`: two exact integer sums of its bits,
one of all of them and one of a strided sample weighted by position), and each engine rank
compares it with the same fingerprint of what it serves after loading (an hf engine of one device: its
model's own tensors) or, where it cannot show that, of what it received. A mismatch stops the run
with the tensor's name and both sums, never a silently wrong engine (`verify`). Before loading, the
engine also checks what it served since the last verified sync against that sync's fingerprints: a
weight that changed while the engine sampled with it is caught at the next sync.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

import torch

from rpeg.errors import RpegError

# What bounds the extra memory a sync takes on the sender and on each receiver (one packed bucket,
# beside the weights): a 7B model in bf16 goes in 55 collectives. NeMo-RL sizes its buckets from a
# fraction of free memory; a fixed bound keeps both ends' buckets the same without asking.
BUCKET_BYTES = 256 * 2**20
# A sync may wait for an engine to finish the generation it is running (a bounded-async plan starts
# the next step's before this one's sync): long reasoning rollouts take tens of minutes.
TIMEOUT = datetime.timedelta(hours=2)
# the positions a fingerprint weighs, at most (a strided sample of the tensor)
SAMPLE = 4096


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


_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(t: torch.Tensor) -> tuple[int, int]:
    """Two integer sums of a tensor's bits: of all its bytes read 8 at a time as int64 (a changed element
    changes it), and of a strided sample of at most SAMPLE of its elements read as integers of their
    width, each weighted by its place in the sample (a swapped or shifted element changes it). Integer
    sums wrap around alike and do not depend on the order of the additions, so sender and engine agree
    to the bit; the int64 sum runs at memory speed (13 GB/s on one core here, against 1 GB/s for a
    float64 sum of the same tensor)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return 0, 0
    raw = flat.view(torch.uint8)
    whole = raw.numel() // 8 * 8
    try:
        words = raw[:whole].view(torch.int64)
    except RuntimeError:  # a view that starts off an 8-byte boundary (a tensor inside a received bucket)
        words = raw[:whole].clone().view(torch.int64)
    total = int(words.sum()) + int(raw[whole:].to(torch.int64).sum())
    bits = flat.view(_AS_INT[flat.element_size()]) if flat.is_floating_point() or flat.dtype == torch.bool else flat
    sample = bits[::max(1, bits.numel() // SAMPLE)].to(torch.int64)
    weights = torch.arange(1, sample.numel() + 1, dtype=torch.int64, device=sample.device)
    return total, int((sample * weights).sum())


def fingerprints(state: dict[str, torch.Tensor], metas: tuple[Meta, ...]) -> torch.Tensor:
    """(n, 2) int64: each manifest tensor's fingerprint, taken in the manifest's dtype (what is sent)."""
    return torch.tensor([fingerprint(state[m.name].to(m.dtype)) for m in metas], dtype=torch.int64)


def verify(metas: tuple[Meta, ...], expected: torch.Tensor, received: dict[str, torch.Tensor] | None,
           served: dict[str, torch.Tensor] | None = None, where: str = "an engine",
           served_as: str = "is served after loading") -> None:
    """The sender's fingerprints against what `where` serves, or where it cannot show that, what it
    received: an RpegError naming the first tensor that differs. What it serves after loading passes
    only if the transport and the load were both right; a mismatch there is then told apart by checking
    what arrived. With the previous sync's fingerprints, no `received` and `served_as` "was served since
    ...", it catches a weight that changed while the engine sampled with it."""
    def first_bad(state: dict[str, torch.Tensor]) -> tuple | None:
        missing = [m.name for m in metas if m.name not in state]
        if missing:
            raise RpegError(f"weight sync: {where} has no tensor {missing[0]!r} of the trainer's weights")
        for m, want, have in zip(metas, expected.tolist(), fingerprints(state, metas).tolist()):
            if want != have:
                return m.name, have, want
        return None

    bad = first_bad(served) if served is not None else None
    what = served_as
    if served is None or (bad is not None and received is not None):
        arrived = first_bad(received) if received is not None else None
        if arrived is not None or served is None:
            bad, what = arrived, "arrived"
    if bad is not None:
        name, have, want = bad
        raise RpegError(f"weight sync: tensor {name!r} {what} on {where} different from the trainer's "
                        f"(fingerprint {have[0]}, {have[1]} against {want[0]}, {want[1]}); the engine would "
                        "sample with wrong weights, so the run stops here")


class Channel:
    """This process's end of the weight-sync group: rank 0 sends, every other rank receives."""

    def __init__(self, master: str, rank: int, world: int, metas: tuple[Meta, ...], device: str | None = None,
                 verify_every: int = 1):
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
        self.metas, self.buckets = metas, buckets(metas)
        self.verify_every, self.syncs = verify_every, 0
        self.expected: torch.Tensor | None = None  # a receiver's: the sender's fingerprints of the last sync

    def _verifies(self) -> bool:
        """Whether this sync carries fingerprints (both ends count their syncs alike)."""
        verifies = self.verify_every > 0 and self.syncs % self.verify_every == 0
        self.syncs += 1
        return verifies

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
        if self._verifies():
            self._broadcast(fingerprints(state, self.metas).to(self.device or "cpu"))

    def receive(self) -> dict[str, torch.Tensor]:
        """Any other rank: the full weights rank 0 broadcast, as named tensors (views of the buckets)."""
        out: dict[str, torch.Tensor] = {}
        for bucket in self.buckets:
            flat = torch.empty(sum(m.numel for m in bucket), dtype=bucket[0].dtype, device=self.device or "cpu")
            self._broadcast(flat)
            for m, part in zip(bucket, flat.split([m.numel for m in bucket])):
                out[m.name] = part.view(m.shape)
        self.expected = None
        if self._verifies():
            expected = torch.empty((len(self.metas), 2), dtype=torch.int64, device=self.device or "cpu")
            self._broadcast(expected)
            self.expected = expected.cpu()
        return out
