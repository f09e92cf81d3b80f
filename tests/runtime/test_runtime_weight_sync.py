"""Weight sync over a group of its own (runtime.weights): buckets, and a broadcast from rank 0
that every receiver unpacks into the sender's tensors, beside each process's own default group."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from rpeg.errors import RpegError
from rpeg.runtime.weights import Channel, Meta, buckets, fingerprint, fingerprints, manifest, verify
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


def test_a_fingerprint_changes_with_any_changed_swapped_or_shifted_element():
    t = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0))
    base = fingerprint(t)
    assert fingerprint(t.clone()) == base
    changed = t.clone()
    changed[999, 63] += 1e-3  # an element the strided sample does not read: the total sees it
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # two rows trade places: the sum cannot see it, the weighted sample can
    for other in (changed, swapped, torch.roll(t, 1)):
        assert fingerprint(other) != base
    assert fingerprint(torch.zeros(0)) == (0.0, 0.0)


def test_verify_names_the_tensor_that_arrived_or_is_served_wrong():
    state = _state()
    metas = manifest(state)
    expected = fingerprints(state, metas)
    verify(metas, expected, state, dict(state), where="engine rank 1")  # the same tensors: nothing to say
    bad = dict(state, norm=state["norm"].clone())
    bad["norm"][3] = 7.0
    with pytest.raises(RpegError, match=r"tensor 'norm' arrived on engine rank 1 different from the trainer's"):
        verify(metas, expected, bad, where="engine rank 1")
    with pytest.raises(RpegError, match=r"tensor 'norm' is served after loading on engine rank 1 different"):
        verify(metas, expected, state, bad, where="engine rank 1")
    with pytest.raises(RpegError, match=r"engine rank 1 has no tensor 'head'"):
        verify(metas, expected, {k: v for k, v in state.items() if k != "head"}, where="engine rank 1")


def _verified_rank(rank: int, world: int, sync_port: int, out: str) -> None:
    torch.set_num_threads(1)
    state = _state()
    ch = Channel(f"127.0.0.1:{sync_port}", rank, world, manifest(state), verify_every=2)
    if rank == 0:
        for step in range(3):
            ch.send({k: v + step for k, v in state.items()})
        return
    seen = []
    for step in range(3):
        got = ch.receive()
        if rank == 2 and step == 2:  # one engine's copy goes wrong between the wire and the model
            got["embed"][5, 1] += 0.5
        try:
            if ch.expected is not None:
                verify(ch.metas, ch.expected, got, where=f"engine rank {rank}")
            seen.append("verified" if ch.expected is not None else "unchecked")
        except RpegError as e:
            seen.append(str(e))
    torch.save(seen, os.path.join(out, f"{rank}.pt"))


def test_every_nth_sync_carries_the_senders_fingerprints_and_a_corrupted_copy_is_caught(tmp_path):
    world = 3
    mp.start_processes(_verified_rank, args=(world, _free_port(), str(tmp_path)), nprocs=world, start_method="spawn")
    assert torch.load(tmp_path / "1.pt") == ["verified", "unchecked", "verified"]  # syncs 0 and 2 of every 2nd
    seen = torch.load(tmp_path / "2.pt")
    assert seen[:2] == ["verified", "unchecked"]
    assert "tensor 'embed' arrived on engine rank 2 different from the trainer's" in seen[2]


@pytest.mark.long
def test_a_weight_corrupted_on_one_engine_is_caught_at_the_next_sync(tmp_path, monkeypatch):
    """runtime.faults' corrupt_weights: after loading version 1, engine rank 1 changes one element of what it
    serves; the sync of version 2 checks what it served since version 1 and stops the run naming the tensor."""
    from rpeg.runtime.run import run
    from tests.runtime.test_runtime_e2e import rt, split_async_plan

    monkeypatch.setenv("RPEG_FAULTS", "corrupt_weights:1")
    with pytest.raises(RpegError, match=r"tensor '[^']+' was served since version 1 on engine rank 1 different"):
        run(split_async_plan(), rt(tmp_path, steps=4, checkpoint_every=0), progress=False)
    monkeypatch.delenv("RPEG_FAULTS")
    result = run(split_async_plan(), rt(tmp_path / "clean", steps=3, checkpoint_every=0), progress=False)
    assert len(result.metrics) == 3  # unarmed: every sync verified, nothing to say


@pytest.mark.long
@pytest.mark.parametrize("plan", ["split", "colocated"])
def test_an_engine_that_stops_answering_ends_the_run_with_one_line(tmp_path, monkeypatch, plan):
    """runtime.faults' hang_engine: after loading version 2 an engine's thread sleeps for an hour; the
    driver's wait on step 2's weight sync (or load) gives up at runtime.wait_timeout_s (step 1 has the
    startup bound) and names what it waited on (with runtime.max_restarts 0 the run stops there;
    tests/runtime/test_runtime_recovery.py restarts)."""
    from rpeg.runtime.run import run
    from tests.runtime.test_runtime_e2e import colocated_plan, rt, split_async_plan

    monkeypatch.setenv("RPEG_FAULTS", "hang_engine:2")
    with pytest.raises(RpegError, match=r"step 2: the weight (sync|load).* gave no answer within 5 s \(still "
                                        r"waiting on 1 of \d: rank\(s\) \d\)"):
        run(split_async_plan() if plan == "split" else colocated_plan(),
            rt(tmp_path, steps=3, checkpoint_every=0, wait_timeout_s=5.0, max_restarts=0), progress=False)
