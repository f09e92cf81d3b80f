"""The Megatron-Core training rows (rpeg/data/validation/megatron-bridge.yaml and
megatron-lm-moe-recipes.yaml) and the training options they need: every row parses and predicts,
or is named as not fitting with its memory and the time it would take; each option's bad values
are refused in one line naming key, value and the allowed values; the MoE options reach the model
(rpeg/perf/moe.py); the options the cost model has no mechanism for change no prediction."""

from __future__ import annotations

import math

import pytest

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.perf.validation import IGNORED_OPTIONS, bundled, validate_data, validate_file

BRIDGE = bundled()["megatron-bridge"]


RECIPES = bundled()["megatron-lm-moe-recipes"]


@pytest.fixture(scope="module")
def rows():
    return validate_file(str(BRIDGE))


@pytest.mark.parametrize("name, at_least", [("megatron-bridge", 30), ("megatron-lm-moe-recipes", 8)])
def test_every_row_predicts_or_says_why_it_does_not_fit(name, at_least):
    rows = validate_file(str(bundled()[name]))
    assert len(rows) >= at_least and len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.kind == "training" and r.measured > 0
        if r.fits:
            assert r.predicted > 0 and sum(v for _, v in r.parts) == pytest.approx(r.predicted, rel=1e-6)
        else:  # the memory it needs, the device's, and the time it would take
            assert r.note.startswith("OOM: ") and "GiB per device" in r.note and "s if it fit" in r.note, r.note


def test_rows_cover_dense_moe_devices_batches_and_lengths():
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import _model

    entries = read_yaml_file(str(BRIDGE))["training"]
    systems = {e["system"] for e in entries}
    assert {"dgx-h100", "dgx-b200", "gb200-nvl72"} <= systems
    moe = [e for e in entries if _model(e["model"], {}).is_moe]
    assert moe and len(moe) < len(entries)  # both kinds
    assert {e["dtype"] for e in entries} == {"bf16", "fp8"}
    tokens_per_gpu = [e["global_batch"] * e["seq"] / e["gpus"] for e in entries]
    assert min(tokens_per_gpu) <= 4096 and max(tokens_per_gpu) >= 200_000  # RL-sized and pre-training batches
    assert max(e["seq"] for e in entries) == 32768
    assert {e.get("routing") for e in moe} >= {"balanced", "natural"}


def test_the_measured_iteration_follows_from_a_published_throughput(rows):
    """A summary row gives tokens/s/GPU only: iteration = global_batch x seq / (rate x gpus)."""
    by_id = {r.id: r for r in rows}
    r = by_id["s2511-llama3-8b-h100-fp8-fsdp"]
    assert r.measured == pytest.approx(128 * 8192 / (14451 * 8))


def test_the_measured_iteration_follows_from_published_tflops_and_flops_per_token():
    """A recipe row gives model TFLOP/s only: iteration = global_batch x seq x GFLOP/token / (TFLOP/s x gpus)."""
    r = next(r for r in validate_file(str(RECIPES)) if r.id == "mlm-qwen3-30b-a3b-h100-bf16")
    assert r.measured == pytest.approx(256 * 4096 * 23.00e9 / (240.5e12 * 32))


ROW = ("{id: r, system: dgx-h100, model: Qwen/Qwen3-30B-A3B, gpus: 16, tp: 1, pp: 1, dp: 16, ep: 16, "
       "global_batch: 64, micro_batch: 1, seq: 4096, dtype: bf16, flash_attention: true, zero: 1, "
       "measured_iteration_s: 2.0%s}")


def _one(extra: str = "", row: str = ROW):
    from yaml import safe_load

    return validate_data(safe_load("training:\n  - " + row % extra), "x.yaml")


@pytest.mark.parametrize("extra, needle", [
    (", dtype: fp4", "x.yaml: training[0] (r).dtype: 'fp4' is not one of fp16, bf16, fp8"),
    (", flash_attention: maybe", ".flash_attention: 'maybe' is not one of false, true"),
    (", routing: random", ".routing: 'random' is not one of balanced, natural"),
    (", cuda_graphs: true", ".cuda_graphs: True is not one of none, partial, full"),
    (", cuda_graphs: [attn, router]", ".cuda_graphs: ['attn', 'router'] must list scopes of attn, mlp, moe"),
    (", cuda_graphs: [moe_preprocess]", "cuda_graphs scope moe_preprocess needs moe_router too"),
    (", rank_capacity_factor: 0.5", "rank_capacity_factor = 0.5 must be 0 (buffers sized by a sync) or a per-rank"),
    (", dispatcher: nccl", ".dispatcher: 'nccl' is not one of alltoall, allgather, deepep, hybridep"),
    (", ep_overlap: 1", ".ep_overlap: 1 is not one of false, true"),
    (", packing: packed", ".packing: 'packed' is not one of false, true"),
    (", capacity_factor: 0", ".capacity_factor: capacity_factor = 0 must be positive"),
    (", capacity_factor: 1.0, dispatcher: deepep", "capacity_factor = 1 needs the alltoall or allgather dispatcher"),
    (", recompute: some", ".recompute: 'some' is not one of none, selective, full"),
    (", sequence_parallel: sometimes", ".sequence_parallel: 'sometimes' is not one of false, true"),
    (", etp: 2", ".etp: 2 must be 1 or tp = 1"),
    (", etp: 0", ".etp: etp = 0 must be positive"),
    (", zero: 4", ".zero: 4 is not one of 0, 1, 2, 3"),
    (", zero: true", ".zero: True is not one of 0, 1, 2, 3"),
    (", offload_optimizer: 1.5", ".offload_optimizer: 1.5 is not a fraction in [0, 1]"),
    (", measured_tokens_per_s_per_gpu: 100", "measured_tokens_per_s_per_gpu implies 163.8 s"),
    (", measured_tokens_per_s_per_gpu: -1", ".measured_tokens_per_s_per_gpu: measured_tokens_per_s_per_gpu = -1"),
    (", measured_model_tflops_per_gpu: .nan", "measured_model_tflops_per_gpu = nan must be a finite number"),
    (", cuda_graph: full", "unknown key 'cuda_graph'"),
    (", model_gflop_per_token: 23", ".model_gflop_per_token: only for an entry whose one measurement is"),
    (", model_gflop_per_token: 0", ".model_gflop_per_token: model_gflop_per_token = 0 must be positive"),
    (", recompute: selective, recompute_modules: [attn]", ".recompute_modules: ['attn'] is not a list of core_attn,"),
    (", recompute_modules: [moe_act]", ".recompute_modules: needs recompute: selective, not 'none'"),
    (", recompute: selective, recompute_layers: 4", ".recompute_layers: needs recompute: full, not 'selective'"),
    (", recompute: full, recompute_layers: -1", ".recompute_layers: recompute_layers = -1 must be positive"),
    (", offload_activation_layers: 1.5", ".offload_activation_layers: expected an integer, got 1.5"),
    (", grad_dtype: fp16", ".grad_dtype: 'fp16' is not one of fp32, bf16"),
    (", optimizer_moments: fp8", ".optimizer_moments: 'fp8' is not one of fp32, bf16"),
    (", pp_embedding_loss_slots: true", ".pp_embedding_loss_slots: needs pp > 1"),
])
def test_bad_option_values_are_refused_by_name(extra, needle):
    with pytest.raises(RpegError) as info:
        _one(extra)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize("row, needle", [
    (ROW.replace("ep: 16,", "ep: 32,"), "ep*etp = 32*1 does not divide dp*cp*tp = 16"),
    (ROW.replace("Qwen/Qwen3-30B-A3B", "qwen3-8B").replace("ep: 16, ", ""), ".routing: qwen3-8B has no experts"),
    (ROW.replace("ep: 16,", "ep: 1,"), ".ep_overlap: true needs ep > 1"),
    (ROW.replace("global_batch: 64", "global_batch: 40"), "global_batch = 40 is not a whole number of micro-batches"),
    (ROW.replace("measured_iteration_s: 2.0", "notes: x"), "missing 'measured_iteration_s'"),
    (ROW.replace("measured_iteration_s: 2.0", "measured_model_tflops_per_gpu: 200"), "missing 'measured_iteration_s'"),
])
def test_inconsistent_rows_are_refused(row, needle):
    extra = ", routing: natural" if "has no experts" in needle else ", ep_overlap: true" if "ep > 1" in needle else ""
    with pytest.raises(RpegError) as info:
        _one(extra, row)
    assert needle in str(info.value), str(info.value)


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("training:\n  - " + ROW % ", routing: random" + "\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "routing: 'random' is not one of balanced, natural" in err and err.count("\n") == 1


def test_options_the_model_ignores_are_printed_and_change_nothing():
    plain = _one()[0]
    marked = _one(", packing: true, etp: 1")[0]
    assert marked.predicted == plain.predicted and marked.parts == plain.parts
    assert marked.note == "packing"
    assert set(IGNORED_OPTIONS) == {"packing"}


def test_moe_options_reach_the_model_each_on_its_line():
    """routing, dispatcher, ep_overlap and cuda_graphs are priced by rpeg/perf/moe.py; absent, they are
    balanced, the per-(token, expert) all-to-all, no overlap and no graphs."""
    plain = _one()[0]
    assert _one(", routing: balanced, dispatcher: alltoall, cuda_graphs: none, ep_overlap: false")[0].parts == \
        plain.parts
    parts = dict(plain.parts)
    assert _one(", routing: natural")[0].predicted > plain.predicted  # the busiest rank sets the time
    hybrid = dict(_one(", dispatcher: hybridep")[0].parts)
    assert hybrid["expert-parallel comm"] < parts["expert-parallel comm"] / 3  # once per node across the network
    overlapped = dict(_one(", dispatcher: hybridep, ep_overlap: true")[0].parts)
    assert "expert-parallel comm" not in overlapped and overlapped["expert-parallel overlap, SMs lent"] > 0
    graphed = dict(_one(", cuda_graphs: full")[0].parts)
    assert "MoE kernel launches" in parts and "MoE kernel launches" not in graphed
    assert _one(", routing: natural")[0].note == ""
    capped = dict(_one(", routing: natural, capacity_factor: 1.0")[0].parts)  # padded: no sync, no busiest rank
    assert capped["MoE kernel launches"] < parts["MoE kernel launches"]
    scoped = dict(_one(", cuda_graphs: [attn, moe_router, moe_preprocess]")[0].parts)  # the router's kernels
    assert 0 < scoped["MoE kernel launches"] < parts["MoE kernel launches"]
    assert 0 < scoped["kernel launches"] < parts["kernel launches"]  # the attention half captured
    buffered = dict(_one(", dispatcher: hybridep, cuda_graphs: full, rank_capacity_factor: 1.5")[0].parts)
    assert buffered["expert capacity padding"] > 0 and buffered["expert-parallel comm"] == pytest.approx(
        hybrid["expert-parallel comm"])  # the buffer is computed whole; the exchange sends the routed tokens


def test_options_the_model_reads_change_the_prediction():
    base = _one()[0].predicted
    # fp8 GEMMs run faster, but each local expert's input is quantized by a kernel of its own that the host
    # waits for after the dispatcher's sync: on this small EP16 row the two nearly cancel (as Megatron-LM's
    # Qwen3-30B-A3B H100 pair measured: 3.10 s fp8 against 3.13 bf16), so the compute line is what must fall
    fp8 = _one("", ROW.replace("dtype: bf16", "dtype: fp8"))[0]
    assert fp8.predicted != base and dict(fp8.parts)["compute"] < dict(_one()[0].parts)["compute"]
    assert dict(fp8.parts)["MoE kernel launches"] > dict(_one()[0].parts)["MoE kernel launches"]
    assert _one("", ROW.replace("flash_attention: true", "flash_attention: false"))[0].predicted > base
    assert _one(", offload_optimizer: 1.0")[0].predicted > base
    assert _one("", ROW.replace("zero: 1", "zero: 3"))[0].predicted != base


def test_a_row_predicted_out_of_memory_is_named_not_scored():
    r = _one("", ROW.replace("model: Qwen/Qwen3-30B-A3B", "model: deepseek-v3"))[0]
    assert not r.fits and r.error is None and math.isinf(r.predicted) and r.note.startswith("OOM: ")


def test_json_carries_the_notes(capsys):
    import json

    assert main(["validate", "megatron-bridge", "--json"]) == 0  # every row fits
    entries = {e["id"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    assert entries["qwen3-30b-a3b-h100-sft-2k"]["note"] == "packing"
    assert "note" not in entries["qwen3-30b-a3b-h100-pretrain-tuned"]  # its MoE conditions are modelled
    assert "note" not in entries["qwen3-8b-h100-pretrain"]


def test_every_measured_run_is_predicted_to_fit():
    """Runs that ran must not be predicted out of memory: the recipes' memory settings (selective
    recompute modules, activation offload, bf16 gradient buffers, the precision-aware optimizer,
    sequence parallelism, the pipeline split) are on the rows, and the memory model reads them."""
    for name in ("megatron-bridge", "megatron-lm-moe-recipes"):
        assert [r.id for r in validate_file(str(bundled()[name])) if not r.fits] == []


@pytest.mark.parametrize("extra", [
    ", grad_dtype: bf16", ", optimizer_moments: bf16", ", recompute: selective, recompute_modules: [moe_act]",
    ", recompute: full, recompute_layers: 12",
])
def test_recipe_memory_options_reach_the_memory_model(extra):
    from rpeg.perf.validation import _model, predict_training
    from yaml import safe_load

    def peak(more):
        import rpeg.perf.training as training
        seen = {}
        real = training.memory.training_memory

        def spy(*a, **k):
            seen["m"] = real(*a, **k)
            return seen["m"]
        training.memory.training_memory = spy
        try:
            predict_training(safe_load(ROW % more), {}, "x")
        finally:
            training.memory.training_memory = real
        return seen["m"].total

    base = peak(", recompute: full") if "recompute_layers" in extra else peak("")
    assert peak(extra) != base
    assert _model("Qwen/Qwen3-30B-A3B", {}).is_moe


def test_recompute_layers_costs_time_in_proportion():
    """Full recomputation of 12 of 48 layers re-runs a quarter of what recomputing all of them does."""
    none = _one()[0].predicted
    full = _one(", recompute: full")[0].predicted
    part = _one(", recompute: full, recompute_layers: 12")[0].predicted
    assert none < part < full and (part - none) == pytest.approx((full - none) / 4, rel=0.02)


def test_lora_rows_train_adapters_and_a_bad_lora_is_refused_in_one_line():
    """The published Llama 3 70B LoRA rows are priced with their adapters (without them the same rows do not
    fit and run longer), within the error of the SFT rows of the same model and data; a row's `lora:` is
    checked as a job file's is."""
    import yaml

    from rpeg.perf.validation import predict_training

    data = yaml.safe_load(BRIDGE.read_text())
    lora = [e for e in data["training"] if e.get("lora")]
    assert len(lora) >= 3 and all(e["lora"] == {"rank": 16, "alpha": 32, "targets": ["q", "k", "v"]} for e in lora)
    for entry in lora:
        got = predict_training(entry, {}, entry["id"])
        assert got.fits and abs(got.predicted / got.measured - 1) < 0.25, (entry["id"], got.predicted, got.measured)
        full = predict_training({k: v for k, v in entry.items() if k != "lora"}, {}, entry["id"])
        assert not full.fits and float(full.note.split("; ")[1].split(" s if")[0]) > 1.3 * got.predicted
    with pytest.raises(RpegError, match=r"^row: lora: rank = 0 must be a whole number"):
        predict_training(lora[0] | {"lora": {"rank": 0}}, {}, "row")
