"""A 2-process FSDP2 training step (gloo) equals the single-process step on the same batch."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from rpeg.graph.config import AlgoConfig
from rpeg.runtime.batch import build_batch
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.trainer import OptimConfig, Trainer

CFG = AlgoConfig(adv_estimator="grpo", loss_agg="seq-mean-token-mean")
OPT = OptimConfig(lr=1e-2, micro_batch=64)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [[5 + (i % 7), 6, 14, 7] for i in range(8)]
    responses = [[int(x) for x in torch.randint(4, 20, (3,), generator=g)] for _ in range(8)]
    b = build_batch(prompts, responses, [[-1.0] * 3] * 8, [i // 2 for i in range(8)], [0] * 8, pad_id=0)
    b.extras["old_logprobs"] = torch.full_like(b.mask, -1.5) * b.mask
    b.extras["advantages"] = torch.linspace(-1, 1, 8)[:, None] * b.mask
    return b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _leave(rank: int, out: str, result) -> None:
    """Rank 0 saves the result; then every rank leaves the group together."""
    import torch.distributed as dist

    if rank == 0:
        torch.save(result, out)
    dist.barrier()  # no rank tears gloo down while its peer still has a collective in flight
    dist.destroy_process_group()


def _rank(rank: int, world: int, port: int, path: str, out: str) -> None:
    _join(rank, world, port)
    model, _ = load(path)
    trainer = Trainer(model, CFG, OPT, shard=True)
    b = _batch()
    shard = torch.arange(rank * 4, rank * 4 + 4)
    trainer.train(b.select(shard), epochs=1, mini_batches=1, seed=0)
    _leave(rank, out, trainer.full_state_dict())


def test_two_rank_fsdp2_step_matches_one_process(tmp_path):
    path = build_tiny(str(tmp_path / "tiny"))
    torch.set_num_threads(1)
    model, _ = load(path)
    single = Trainer(model, CFG, OPT)
    single.train(_batch(), epochs=1, mini_batches=1, seed=0)
    ref = single.full_state_dict()
    out = str(tmp_path / "rank0.pt")
    mp.start_processes(_rank, args=(2, _free_port(), path, out), nprocs=2, join=True, start_method="spawn")
    sharded = torch.load(out)
    assert set(sharded) == set(ref)
    worst = max(float((sharded[k] - ref[k]).abs().max()) for k in ref)
    assert worst < 1e-5, worst
    start, _ = load(path)
    assert any(not torch.equal(start.state_dict()[k], ref[k]) for k in ref)  # the step did change weights


def _rank_tp(rank: int, world: int, port: int, path: str, out: str, tp: int) -> None:
    _join(rank, world, port)
    model, _ = load(path)
    trainer = Trainer(model, CFG, OPT, tp=tp)
    b = _batch()
    logp = trainer.logprobs(b)  # every tensor-parallel rank sees the whole batch
    trainer.train(b, epochs=1, mini_batches=1, seed=0)
    _leave(rank, out, {"weights": trainer.full_state_dict(), "logprobs": logp})


def test_two_rank_tensor_parallel_step_matches_one_process(tmp_path):
    path = build_tiny(str(tmp_path / "tiny"))
    torch.set_num_threads(1)
    model, _ = load(path)
    single = Trainer(model, CFG, OPT)
    ref_logp = single.logprobs(_batch())
    single.train(_batch(), epochs=1, mini_batches=1, seed=0)
    ref = single.full_state_dict()
    out = str(tmp_path / "tp.pt")
    mp.start_processes(_rank_tp, args=(2, _free_port(), path, out, 2), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out)
    assert float((got["logprobs"] - ref_logp).abs().max()) < 1e-5
    # the row-parallel all-reduces sum in another order; Adam turns tiny gradient differences on
    # near-zero gradients into differences of a few percent of one step (lr): allow 2% of lr
    worst = max(float((got["weights"][k] - ref[k]).abs().max()) for k in ref)
    assert worst < 0.02 * OPT.lr, worst
    start, _ = load(path)
    moved = max(float((ref[k] - start.state_dict()[k]).abs().max()) for k in ref)
    assert moved > 0.5 * OPT.lr  # the step moved weights by about lr, far more than the difference
