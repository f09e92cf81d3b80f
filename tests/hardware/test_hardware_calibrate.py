"""cpu-local: `rpeg calibrate` measures into a readable cache file; loading only reads it (never
measures, never writes)."""

import os
import subprocess
import sys

import pytest
import yaml

from rpeg.errors import RpegError
from rpeg.hardware import calibrate as calibration
from rpeg.hardware import load_cluster, load_device
from rpeg.hardware.loader import load_cpu_local


def test_loading_never_measures_calibrate_writes_a_readable_file_then_loading_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(tmp_path))
    budgets = []  # the measurement is bounded by its time budget (no wall-clock assert: the machine is shared)
    for name in ("_matmul_flop_per_s", "_copy_bytes_per_s"):
        real = getattr(calibration, name)
        monkeypatch.setattr(calibration, name, lambda np, budget_s, real=real: budgets.append(budget_s)
                            or real(np, budget_s))
    path = tmp_path / "cpu-local.yaml"
    for load in (lambda: load_device("cpu-local"), lambda: load_cluster("cpu-local", gpus=1)):
        with pytest.raises(RpegError, match="has not been measured: run `rpeg calibrate`"):
            load()
    assert budgets == [] and list(tmp_path.iterdir()) == []  # no measurement, nothing written
    device = calibration.calibrate()  # the default file and budget
    assert len(budgets) == 2 and sum(budgets) == pytest.approx(2.0)
    text = path.read_text()
    assert text.startswith("# cpu-local")
    data = yaml.safe_load(text)
    assert data["name"] == "cpu-local" and data["kind"] == "cpu"
    for key in ("bf16_dense_gflop_per_s", "hbm_bandwidth_gb_per_s", "hbm_capacity_gb"):
        assert data[key] > 0
        assert "numpy" in data["sources"][key] and "rpeg.hardware.calibrate" in data["sources"][key]
    assert "stands in" in data["sources"]["bf16_dense_gflop_per_s"]
    assert device.kind == "cpu" and device.fp8_flop_per_s == 0 and device.scaleup_bandwidth_bytes_per_s == 0
    assert device.bf16_flop_per_s == pytest.approx(data["bf16_dense_gflop_per_s"] * 1e9)
    assert device.hbm_capacity_bytes == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), rel=1e-3)

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the cache exists")

    monkeypatch.setattr(calibration, "_matmul_flop_per_s", no_measuring)
    monkeypatch.setattr(calibration, "_copy_bytes_per_s", no_measuring)
    mtime = path.stat().st_mtime_ns
    assert load_device("cpu-local") == device
    assert load_cluster("cpu-local", gpus=1).device == device and path.stat().st_mtime_ns == mtime
    # two devices share this machine's cores: their own measurement, never the one-device figures
    with pytest.raises(RpegError, match=r"as 2 devices sharing its cores\) has not been measured: run "
                                        r"`rpeg calibrate --devices 2`"):
        load_cluster("cpu-local", gpus=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-local.yaml"]


@pytest.mark.long  # measures this machine as 2 devices in subprocesses: make test-long
def test_several_devices_are_measured_together_and_used_for_plans_on_that_many(tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(tmp_path))
    one = calibration.calibrate(seconds=0.2)
    two = calibration.calibrate(seconds=0.2, devices=2)
    data = yaml.safe_load((tmp_path / "cpu-local-x2.yaml").read_text())
    assert "one of 2 processes" in data["sources"]["bf16_dense_gflop_per_s"] and "all measuring at once" in \
        data["sources"]["hbm_bandwidth_gb_per_s"]
    assert two.hbm_capacity_bytes == pytest.approx(one.hbm_capacity_bytes / 2, rel=1e-3)
    assert 0 < two.bf16_flop_per_s and two.description.startswith("one of 2 devices")
    cluster = load_cluster("cpu-local", gpus=2)
    assert cluster.device == two and cluster.gpus == 2
    node, system = cluster.levels
    assert (node.gpus, node.link, node.bandwidth_bytes_per_s) == (1, "memory", two.hbm_bandwidth_bytes_per_s)
    assert system.link == "loopback" and cluster.span(2).level is system
    if "fsdp_unit_us" in data:  # FSDP2 as the trainer runs it over the 2 processes (when the probe's fit held)
        assert two.fsdp_unit_s == pytest.approx(data["fsdp_unit_us"] * 1e-6) and two.gather_tensor_s > 0
        assert "FSDP2-sharded" in data["sources"]["fsdp_unit_us"]
    link = data.get("loopback")  # the probe's gloo all-reduces between the 2 processes (when torch is here)
    if link is not None:
        assert system.latency_s == pytest.approx(link["latency_us"] * 1e-6)
        assert system.bandwidth_bytes_per_s == pytest.approx(link["bandwidth_gbit_per_s"] * 1e9 / 8)
        assert "gloo all_reduce" in dict(cluster.sources)["levels.system.latency_us"]
    assert load_cluster("cpu-local", gpus=1).device == one
    with pytest.raises(RpegError, match="devices = 0 must be a whole number from 1 to 64"):
        calibration.calibrate(seconds=0.1, devices=0)


def test_calibrate_writes_where_asked(tmp_path):
    path = tmp_path / "sub" / "mine.yaml"
    device = calibration.calibrate(path, seconds=0.1)
    assert path.exists() and load_cpu_local(path) == device


def test_a_broken_cache_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(tmp_path))
    (tmp_path / "cpu-local.yaml").write_text("name: cpu-local\nkind: cpu\n")
    with pytest.raises(RpegError, match="cpu-local.yaml.*missing.*measure again"):
        load_device("cpu-local")


def test_importing_the_package_measures_nothing(tmp_path):
    env = dict(os.environ, RPEG_CACHE_DIR=str(tmp_path))
    code = "import rpeg.hardware, rpeg.hardware.calibrate, sys; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # numpy is imported only when measuring
    assert not (tmp_path / "cpu-local.yaml").exists()


@pytest.mark.long  # measures this machine as 2 devices in subprocesses: make test-long
def test_a_measured_loopback_replaces_the_assumed_system_link(tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(tmp_path))
    calibration.calibrate(seconds=0.1, devices=2)
    path = tmp_path / "cpu-local-x2.yaml"
    data = yaml.safe_load(path.read_text())
    data["loopback"] = {"bandwidth_gbit_per_s": 4.0, "latency_us": 300.0,
                        "sources": {"bandwidth_gbit_per_s": "measured", "latency_us": "measured"}}
    path.write_text(yaml.safe_dump(data))
    system = load_cluster("cpu-local", gpus=2).levels[1]
    assert (system.bandwidth_bytes_per_s, system.latency_s) == (pytest.approx(0.5e9), pytest.approx(300e-6))
    del data["loopback"]
    path.write_text(yaml.safe_dump(data))
    system = load_cluster("cpu-local", gpus=2).levels[1]  # none measured: the preset's assumption
    assert (system.bandwidth_bytes_per_s, system.latency_s) == (pytest.approx(1.25e9), pytest.approx(50e-6))
    data["loopback"] = {"latency_us": 3}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RpegError, match="loopback: expected bandwidth_gbit_per_s, latency_us and sources"):
        load_cluster("cpu-local", gpus=2)
