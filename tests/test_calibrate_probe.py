"""The transformer-layer probe (rpeg.runtime.probe) and the two optional cpu-local figures it gives
`rpeg calibrate`: layer_host_us and layer_token_us."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import yaml

from rpeg.errors import RpegError
from rpeg.hardware import calibrate as calibration
from rpeg.hardware import device_from_data
from rpeg.hardware.report import device_sources

BASE = {"name": "box", "kind": "cpu", "bf16_dense_gflop_per_s": 100, "fp16_dense_gflop_per_s": 100,
        "fp8_dense_gflop_per_s": 0, "hbm_capacity_gb": 8, "hbm_bandwidth_gb_per_s": 20,
        "scaleup_bandwidth_gb_per_s": 0}


def _file(**figures) -> dict:
    data = dict(BASE, **figures)
    data["sources"] = {k: "measured" for k in data if k not in ("name", "kind")}
    return data


def test_the_probe_measures_a_positive_host_and_token_time_and_more_rows_take_longer():
    proc = subprocess.run([sys.executable, "-m", "rpeg.runtime.probe", "--threads", "1", "--seconds", "0.4",
                           "--matmul-gflop-per-s", "1000"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is the JSON object and nothing else
    for key in ("layer_host_s", "layer_token_s"):
        assert math.isfinite(result[key]) and result[key] > 0, result
    (r1, r2), (t1, t2) = result["rows"], result["times_s"]
    assert r1 < r2 and 0 < t1 < t2  # it really ran the model at both sizes
    assert result["seq"] == 16 and result["threads"] == 1 and result["dims"]["hidden_size"] == 256
    # the fit: a line through both times, the row's FLOPs at the given rate taken out of its slope
    b = (t2 - t1) / (r2 - r1)
    units, seq = result["units"], result["seq"]
    assert units == 3 and result["matmul_flop_per_s"] == 1e12
    assert result["layer_host_s"] == pytest.approx((t1 - b * r1) / units)
    assert result["layer_token_s"] == pytest.approx((b - result["flops_per_row"] / 1e12) / (seq * units))
    assert result["torch"]


def test_the_probe_counts_flops_as_the_perf_model_does():
    from rpeg.runtime.probe import SEQ, layer_flops_per_row, probe_spec

    spec = probe_spec()
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == (2, 256, 4, 2, 704, 1024)
    per_token_layer = 2 * (spec.attention_params() + spec.mlp_params(704)) + 2 * 8.5 * 4 * (64 + 64)
    assert layer_flops_per_row(spec) == pytest.approx(SEQ * (2 * per_token_layer + 2 * 1024 * 256))


def test_a_file_with_the_layer_figures_loads_them_in_si_units():
    device = device_from_data(_file(layer_host_us=650.5, layer_token_us=2.75), "box.yaml")
    assert device.layer_host_s == pytest.approx(650.5e-6) and device.layer_token_s == pytest.approx(2.75e-6)
    assert device.source("layer_host") == "measured" and device.source("layer_token_us") == "measured"
    assert "| layer_host |" in device_sources([device])


def test_a_file_without_the_layer_figures_still_loads_with_them_zero():
    device = device_from_data(_file(), "box.yaml")
    assert device.layer_host_s == 0 and device.layer_token_s == 0
    assert "layer_host" not in device_sources([device])


@pytest.mark.parametrize("key", ["layer_host_us", "layer_token_us"])
def test_a_layer_figure_needs_a_source_and_a_positive_value(key):
    data = _file(**{key: 5})
    del data["sources"][key]
    with pytest.raises(RpegError, match=f"box.yaml: sources.{key}: missing"):
        device_from_data(data, "box.yaml")
    for bad in (0, -3):
        with pytest.raises(RpegError, match=f"box.yaml: {key}: must be positive, got {bad}"):
            device_from_data(_file(**{key: bad}), "box.yaml")


def test_the_device_rejects_a_negative_layer_figure():
    good = device_from_data(_file(), "box.yaml")
    with pytest.raises(RpegError, match="layer_host_s must be positive"):
        dataclasses.replace(good, layer_host_s=-1e-6)


def test_calibrate_writes_the_layer_figures_with_their_sources(tmp_path, monkeypatch):
    # one torch thread: tests running alongside cannot starve an OpenMP barrier into a useless fit
    monkeypatch.setattr(calibration.os, "cpu_count", lambda: 1)
    path = tmp_path / "cpu.yaml"
    # the probe fits a line through two timings; another test process on the same 2 cores can bend it
    # into no usable fit (calibrate then writes no layer figures and says why): up to three tries
    for _ in range(3):
        device = calibration.calibrate(path, seconds=0.2)
        data = yaml.safe_load(path.read_text())
        if "layer_host_us" in data:
            break
    assert data["layer_host_us"] > 0 and data["layer_token_us"] > 0
    for key in ("layer_host_us", "layer_token_us"):
        source = data["sources"][key]
        assert "rpeg.runtime.probe --threads 1" in source and "torch" in source and "hidden_size 256" in source
    assert device.layer_host_s == pytest.approx(data["layer_host_us"] * 1e-6)
    assert device.layer_token_s == pytest.approx(data["layer_token_us"] * 1e-6)


@pytest.mark.parametrize("broken", [("PROBE_NEEDS", "no_such_torch_for_rpeg"), ("PROBE_MODULE", "rpeg.no_such_probe")])
def test_without_the_probe_calibrate_still_writes_the_file_without_the_layer_figures(tmp_path, monkeypatch, capsys,
                                                                                       broken):
    monkeypatch.setattr(calibration, *broken)
    path = tmp_path / "cpu.yaml"
    device = calibration.calibrate(path, seconds=0.1)
    data = yaml.safe_load(path.read_text())
    assert "layer_host_us" not in data and "layer_host_us" not in data["sources"]
    assert device.layer_host_s == 0 and device.layer_token_s == 0 and device.bf16_flop_per_s > 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no transformer-layer figures" in err[0] and "generic host-time figures" in err[0]
    assert ("not importable" if broken[0] == "PROBE_NEEDS" else "exited with") in err[0]
