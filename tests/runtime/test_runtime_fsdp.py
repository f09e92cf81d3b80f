"""A 2-process FSDP2 training step (gloo) equals the single-process step on the same batch."""

from __future__ import annotations

import os
import socket

import pytest
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
    """A free port below the kernel's ephemeral range (32768 and up here): a port the kernel hands
    out can be taken by another process's outgoing connection (Ray's, in a parallel test) between
    this check and the ranks binding it."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


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


def _perturbed(path: str) -> dict:
    """The tiny model's weights moved off their initial values (a weight sync, not a reload)."""
    model, _ = load(path)
    g = torch.Generator().manual_seed(3)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _rank_tp_engine(rank: int, world: int, port: int, path: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rpeg.runtime.rollout import HFEngine, SamplingParams
    from rpeg.runtime.trainer import tensor_parallel

    _join(rank, world, port)
    model, tok = load(path)
    tensor_parallel(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, group=dist.group.WORLD)
    engine.load_weights(_perturbed(path), version=1)
    prompts = [[5 + i % 7, 6, 14, 7][: 2 + i % 3] for i in range(6)]
    result = {"sampled": engine.generate(prompts, SamplingParams(max_new_tokens=6), seed=11),
              "greedy": engine.generate(prompts, SamplingParams(max_new_tokens=6, greedy=True), seed=0)}
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    _leave(rank, out, gathered)


def test_tensor_parallel_generation_matches_one_process(tmp_path):
    """A 2-rank tensor-parallel hf engine: each rank holds half of every decoder layer; after a weight
    sync it samples what the one-process engine samples with the same weights and seed, and both
    ranks return the same responses."""
    from rpeg.runtime.rollout import HFEngine, SamplingParams

    path = build_tiny(str(tmp_path / "tiny"))
    torch.set_num_threads(1)
    model, tok = load(path)
    single = HFEngine(model, tok.eos_token_id, tok.pad_token_id)
    single.load_weights(_perturbed(path), version=1)
    prompts = [[5 + i % 7, 6, 14, 7][: 2 + i % 3] for i in range(6)]
    want = {"sampled": single.generate(prompts, SamplingParams(max_new_tokens=6), seed=11),
            "greedy": single.generate(prompts, SamplingParams(max_new_tokens=6, greedy=True), seed=0)}
    out = str(tmp_path / "tp-engine.pt")
    mp.start_processes(_rank_tp_engine, args=(2, _free_port(), path, out), nprocs=2, join=True, start_method="spawn")
    ranks = torch.load(out, weights_only=False)
    assert all(ranks[0][k][0] == ranks[1][k][0] for k in want)  # both ranks hold the same tokens
    for kind in want:
        responses, logprobs = ranks[0][kind]
        assert responses == want[kind][0], kind
        worst = max(abs(a - b) for x, y in zip(logprobs, want[kind][1]) for a, b in zip(x, y))
        assert worst < 1e-4, (kind, worst)
    # the weight sync took: the file's own weights sample something else
    base = HFEngine(load(path)[0], tok.eos_token_id, tok.pad_token_id)
    assert base.generate(prompts, SamplingParams(max_new_tokens=6), seed=11) != want["sampled"]


PP_OPT = OptimConfig(lr=1e-2, micro_batch=2)  # 4 micro-batches of 2 rows: the schedule has work to overlap


def _rank_pp(rank: int, world: int, port: int, path: str, out: str, pp: int, tp: int, schedule: str) -> None:
    import torch.distributed as dist

    _join(rank, world, port)
    model, _ = load(path)
    dp = world // (pp * tp)
    trainer = Trainer(model, CFG, PP_OPT, shard=dp > 1, tp=tp, pp=pp, pp_schedule=schedule)
    b = _batch()
    rows = torch.tensor_split(torch.arange(b.size), dp)[rank // (pp * tp)]  # this rank's data shard
    logp = trainer.logprobs(b.select(rows))
    metrics = trainer.train(b.select(rows), epochs=1, mini_batches=1, seed=0)
    shards = [None] * world
    dist.all_gather_object(shards, logp)
    _leave(rank, out, {"weights": trainer.full_state_dict(), "logprobs": torch.cat(shards[::pp * tp]),
                       "metrics": metrics, "layers": sorted({k.split(".")[2] for k in trainer.model.state_dict()
                                                           if k.startswith("model.layers.")})})


@pytest.mark.parametrize("pp, tp, world, schedule", [(2, 1, 2, "gpipe"), (2, 1, 2, "1f1b"), (2, 1, 4, "1f1b"),
                                                     (2, 2, 4, "1f1b")])
def test_pipeline_parallel_step_matches_one_process(tmp_path, pp, tp, world, schedule):
    """Two pipeline stages (alone, with FSDP2 over two data-parallel ranks, or with tensor parallelism
    over two): each rank holds half of the decoder layers; the logprobs and the training step equal
    the one-process ones."""
    path = build_tiny(str(tmp_path / "tiny"))
    torch.set_num_threads(1)
    model, _ = load(path)
    single = Trainer(model, CFG, PP_OPT)
    ref_logp = single.logprobs(_batch())
    ref_metrics = single.train(_batch(), epochs=1, mini_batches=1, seed=0)
    ref = single.full_state_dict()
    out = str(tmp_path / "pp.pt")
    mp.start_processes(_rank_pp, args=(world, _free_port(), path, out, pp, tp, schedule), nprocs=world, join=True,
                       start_method="spawn")
    got = torch.load(out, weights_only=False)
    assert got["layers"] == ["0", "1"]  # rank 0 holds the first stage's layers only
    assert set(got["weights"]) == set(ref)
    assert float((got["logprobs"] - ref_logp).abs().max()) < 1e-5
    assert abs(got["metrics"]["grad_norm"] - ref_metrics["grad_norm"]) < 1e-4 * ref_metrics["grad_norm"]
    if world == pp * tp:  # one data shard (with two, a rank's loss is its shard's, as in every FSDP2 group)
        assert abs(got["metrics"]["pg_loss"] - ref_metrics["pg_loss"]) < 1e-5
    worst = max(float((got["weights"][k] - ref[k]).abs().max()) for k in ref)
    assert worst < 0.02 * PP_OPT.lr, worst  # Adam on near-zero gradients: as in the tensor-parallel test


def _rank_bf16(rank: int, world: int, port: int, path: str, out: str) -> None:
    _join(rank, world, port)
    model, _ = load(path)
    trainer = Trainer(model, CFG, OPT, shard=True, bf16=True)
    b = _batch()
    shard = torch.arange(rank * 4, rank * 4 + 4)
    logp = trainer.logprobs(b.select(shard))
    trainer.train(b.select(shard), epochs=1, mini_batches=1, seed=0)
    dtypes = {p.to_local().dtype for p in trainer.model.parameters()}
    moments = {v.dtype for st in trainer.opt.state.values() for k, v in st.items() if k != "step"}
    _leave(rank, out, {"weights": trainer.full_state_dict(), "logprobs": logp, "dtypes": dtypes, "moments": moments})


def test_two_rank_fsdp2_in_bf16_keeps_fp32_master_weights(tmp_path):
    """bf16 on sharded ranks: FSDP2's MixedPrecisionPolicy computes with bf16 copies of the weights and
    reduces gradients in fp32, while the shards the optimizer steps (and its moments) stay fp32."""
    path = build_tiny(str(tmp_path / "tiny"))
    torch.set_num_threads(1)
    single = Trainer(load(path)[0], CFG, OPT)
    ref_logp = single.logprobs(_batch())
    single.train(_batch(), epochs=1, mini_batches=1, seed=0)
    ref = single.full_state_dict()
    out = str(tmp_path / "bf16.pt")
    mp.start_processes(_rank_bf16, args=(2, _free_port(), path, out), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out, weights_only=False)
    assert got["dtypes"] == {torch.float32} and got["moments"] == {torch.float32}
    assert all(v.dtype == torch.float32 for v in got["weights"].values())
    gap = float((got["logprobs"] - ref_logp[:4]).abs().max())
    assert 0 < gap < 0.1, gap  # computed in bf16: close to the fp32 logprobs, not equal to them
    # the same Adam step to bf16's precision: Adam moves every weight by about lr in its gradient's
    # sign, so compare directions (a near-zero gradient may flip sign in bf16, as in the fp32 TP test)
    start = load(path)[0].state_dict()
    want = torch.cat([(ref[k] - start[k]).sign().flatten() for k in ref])
    have = torch.cat([(got["weights"][k] - start[k]).sign().flatten() for k in ref])
    agree = float((want == have)[want != 0].float().mean())
    assert agree > 0.9, agree
