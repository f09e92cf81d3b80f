"""Weight sync over a group of its own (runtime.weights): buckets, and a broadcast from rank 0
that every receiver unpacks into the sender's tensors, beside each process's own default group."""

from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp

from rpeg.runtime.weights import Channel, Meta, buckets, manifest
from tests.runtime.test_runtime_fsdp import _free_port, _join


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"embed": torch.randn(50, 8, generator=g), "norm": torch.randn(8, generator=g),
            "steps": torch.arange(5, dtype=torch.int64), "head": torch.randn(8, 50, generator=g)}


def test_buckets_keep_the_order_split_by_dtype_and_size():
    metas = manifest(_state())
    assert [m.name for m in metas] == ["embed", "norm", "steps", "head"]
    assert metas[0] == Meta("embed", (50, 8), torch.float32) and metas[0].nbytes == 1600
    # a dtype change starts a bucket; so does the limit (embed + norm fit in 1632 bytes, head does not)
    assert [[m.name for m in b] for b in buckets(metas, limit=1632)] == [["embed", "norm"], ["steps"], ["head"]]
    assert [[m.name for m in b] for b in buckets(metas, limit=100)] == [["embed"], ["norm"], ["steps"], ["head"]]


def _rank(rank: int, world: int, sync_port: int, own_port: int, out: str) -> None:
    torch.set_num_threads(1)
    if rank >= 1:  # the receivers also have a default group of their own (a tensor-parallel engine's)
        _join(rank - 1, world - 1, own_port)
    state = _state()
    ch = Channel(f"127.0.0.1:{sync_port}", rank, world, manifest(state))
    ch.buckets = buckets(manifest(state), limit=1632)  # several collectives per sync
    if rank == 0:
        for step in range(2):
            ch.send({k: v + step for k, v in state.items()})
        return
    got = [ch.receive() for _ in range(2)]
    torch.save(got, os.path.join(out, f"{rank}.pt"))


def test_every_receiver_gets_the_senders_tensors_at_each_sync(tmp_path):
    world = 3
    mp.start_processes(_rank, args=(world, _free_port(), _free_port(), str(tmp_path)), nprocs=world,
                       start_method="spawn")
    want = _state()
    for rank in (1, 2):
        got = torch.load(tmp_path / f"{rank}.pt")
        for step in range(2):
            assert list(got[step]) == list(want)
            for k, v in want.items():
                assert got[step][k].dtype == v.dtype and torch.equal(got[step][k], v + step), (rank, step, k)
