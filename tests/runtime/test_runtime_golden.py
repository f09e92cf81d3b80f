"""Bitwise golden runs (torchtitan's rule, issue 11 Build 1): fixed-seed GRPO and PPO runs on the
tiny model whose metrics and final weights must come out bit for bit as checked in, so that a
restructuring of the runtime visibly changes no math.

`RPEG_GOLDEN_WRITE=1` rewrites the files (do so only for a change that is meant to change the
math, and say so in the commit). Bitwise equality holds for one torch build on one CPU kind; the
file records both (`fingerprint`), and may hold runs of other CPU kinds under `others` (AVX2 and
AVX512 builds of the same torch differ after a few RL steps by more than the tolerance below);
on a build or CPU kind the file does not hold, the run is compared with the file to a tolerance
instead (metrics to 1e-5 relative, each tensor's sum and absolute sum to 1e-4), and two runs on
this machine must still agree bit for bit with each other.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import platform

import pytest
import torch

from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import colocated_plan, rt, split_async_plan

GOLDEN = pathlib.Path(__file__).parents[1] / "golden" / "runtime"
WRITE = os.environ.get("RPEG_GOLDEN_WRITE") == "1"


CASES = {  # name -> (plan, steps); each exercises rewards, the policy loss and the KL or critic paths
    "grpo-colocated": (lambda: colocated_plan("grpo", kl_coef=0.04), 4),
    "ppo-colocated": (lambda: colocated_plan("ppo"), 3),
    "grpo-split-async1": (lambda: split_async_plan(kl_coef=0.04), 3),
}
TIMING = ("_s",)  # measured wall times: not part of the math


def fingerprint() -> dict:
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "cpu_model": cpu_model()}


def cpu_model() -> str:
    """The CPU's model name: two AVX512 CPUs (an Intel Xeon, an AMD EPYC) run other kernels and
    round differently, so the vector width alone does not name a run's numerics."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def recorded(want: dict, got: dict) -> dict | None:
    """The file's run of this machine's numerics: the one of the same fingerprint, else one recorded
    before fingerprints named the CPU model whose other keys agree."""
    runs = [want, *want.get("others", [])]
    exact = next((r for r in runs if r["fingerprint"] == got["fingerprint"]), None)
    coarse = {k: v for k, v in got["fingerprint"].items() if k != "cpu_model"}
    return exact or next((r for r in runs if "cpu_model" not in r["fingerprint"] and r["fingerprint"] == coarse), None)


def _tensors(state: dict | None, prefix: str) -> dict[str, torch.Tensor]:
    if not state:
        return {}
    return {f"{prefix}.{k}": v for k, v in state["model"].items()}


def record(out: str, metrics: list[dict]) -> dict:
    folder = os.path.join(out, "checkpoints")
    with open(os.path.join(folder, "latest"), encoding="utf-8") as fh:
        state = torch.load(os.path.join(folder, fh.read().strip(), "state.pt"), weights_only=False)
    tensors = {**_tensors(state["actor"], "actor"), **_tensors(state.get("critic"), "critic")}
    weights = {}
    for name, t in sorted(tensors.items()):
        t = t.detach().contiguous().cpu()
        weights[name] = {"sha256": hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest(),
                         "sum": float(t.double().sum()), "abs_sum": float(t.double().abs().sum())}
    kept = [{k: v for k, v in m.items() if not k.endswith(TIMING)} for m in metrics]
    return {"fingerprint": fingerprint(), "metrics": kept, "weights": weights}


def _run(name: str, tmp_path: pathlib.Path) -> dict:
    plan, steps = CASES[name]
    result = run(plan(), rt(tmp_path, steps=steps), progress=False)
    return record(result.out, result.metrics)


def _write(path: pathlib.Path, got: dict) -> None:
    """RPEG_GOLDEN_WRITE=1: this machine's run replaces the file's run of the same fingerprint (the main
    one, or one under `others`); a run of a new CPU kind is added under `others`."""
    if not path.exists():
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if data["fingerprint"] == got["fingerprint"]:
        data = {**got, "others": data.get("others", [])}
    else:
        data["others"] = [r for r in data.get("others", []) if r["fingerprint"] != got["fingerprint"]] + [got]
    if not data.get("others"):
        data.pop("others", None)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
    return a == b


@pytest.mark.parametrize("name", list(CASES))
def test_runs_match_the_golden_file_bit_for_bit(name, tmp_path):
    got = _run(name, tmp_path / "a")
    path = GOLDEN / f"{name}.json"
    if WRITE:
        _write(path, got)
    want = json.loads(path.read_text(encoding="utf-8"))
    assert any(m.get("reward", 0) > 0 for m in got["metrics"]), "no reward: the loss paths went untested"
    assert set(got["weights"]) == set(want["weights"])
    # the file's own run, and those recorded on other CPU kinds (`others`): bit for bit on a kind it holds
    same = recorded(want, got)
    if same is not None:
        assert got["metrics"] == same["metrics"]
        assert got["weights"] == same["weights"]
        return
    # another torch build or CPU kind: to a tolerance against the file, bit for bit run to run
    assert len(got["metrics"]) == len(want["metrics"])
    for g, w in zip(got["metrics"], want["metrics"]):
        assert g.keys() == w.keys() and all(_close(g[k], w[k]) for k in g), (g, w)
    for k, w in want["weights"].items():
        g = got["weights"][k]
        assert math.isclose(g["sum"], w["sum"], rel_tol=1e-4, abs_tol=1e-4), k
        assert math.isclose(g["abs_sum"], w["abs_sum"], rel_tol=1e-4), k
    again = _run(name, tmp_path / "b")
    assert again["metrics"] == got["metrics"] and again["weights"] == got["weights"]


def test_a_change_in_the_math_is_caught(tmp_path):
    """Not vacuous: the same run with a KL coefficient of 0.05 instead of 0.04 differs from the file."""
    result = run(colocated_plan("grpo", kl_coef=0.05), rt(tmp_path, steps=CASES["grpo-colocated"][1]), progress=False)
    got = record(result.out, result.metrics)
    want = json.loads((GOLDEN / "grpo-colocated.json").read_text(encoding="utf-8"))
    assert got["weights"] != want["weights"] and got["metrics"] != want["metrics"]
