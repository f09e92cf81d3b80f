"""Every preset loads, every figure has a source, and the key figures are the datasheets'."""

import pathlib

import pytest

from rpeg.hardware import cluster_names, device_names, load_cluster, load_device
from rpeg.hardware.calibrate import calibrate
from rpeg.hardware.device import FIGURES, OPTIONAL
from rpeg.hardware.report import preset_tables

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "hardware.md"
DEVICES = ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "h20", "gh200-96gb", "gh200-144gb", "b200", "gb200", "mi300x")
CLUSTERS = ("dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "h20", "gb200-nvl72", "alps-gh200", "mi300x",
            "hybridflow-a100", "cpu-local")
T, G = 1e12, 1e9


@pytest.fixture(scope="module")
def cpu_cache(tmp_path_factory):
    """A cpu-local calibration made once for this module (short: the figures do not matter here)."""
    folder = tmp_path_factory.mktemp("rpeg-cache")
    calibrate(folder / "cpu-local.yaml", seconds=0.1)
    return folder


@pytest.fixture(autouse=True)
def _cache_env(cpu_cache, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(cpu_cache))


def test_the_presets_asked_for_exist():
    assert set(DEVICES) | {"cpu-local"} == set(device_names())
    assert set(CLUSTERS) == set(cluster_names())


@pytest.mark.parametrize("name", DEVICES + ("cpu-local",))
def test_every_device_loads_with_a_source_for_every_figure(name):
    device = load_device(name)
    assert device.name == name
    given = [f for f in FIGURES if f not in OPTIONAL or getattr(device, FIGURES[f])]  # optional: cpu-local's
    for figure in given:
        assert device.source(figure).strip(), f"{name}: {figure} has no source"
    assert len(device.sources) == len(given) + (device.host != "x86")  # a non-default host is sourced too
    if device.host != "x86":
        assert device.source("host").strip()


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_cluster_loads_with_a_source_for_every_figure(name):
    cluster = load_cluster(name)
    assert cluster.name == name and cluster.description
    keys = dict(cluster.sources)
    assert all(text.strip() for text in keys.values())
    assert "gpu_hour_usd" in keys  # a price, or the statement that none is published
    for i, level in enumerate(cluster.levels):
        assert f"levels.{level.name}.latency_us" in keys
        if i < len(cluster.levels) - 1:
            assert f"levels.{level.name}.gpus" in keys
        if level.link != "memory":
            assert any(k.startswith(f"levels.{level.name}.bandwidth_") for k in keys)
        if level.oversubscription != 1:
            assert f"levels.{level.name}.oversubscription" in keys


@pytest.mark.parametrize("name, bf16, fp16, fp8, hbm_bw, scaleup", [
    ("a100-80gb-sxm", 312, 312, 0, 2039, 300),
    ("h100-sxm", 989, 989, 1979, 3350, 450),
    ("h200-sxm", 989, 989, 1979, 4800, 450),
    ("h20", 148, 148, 296, 4000, 450),
    ("gh200-96gb", 989, 989, 1979, 4000, 450),
    ("gh200-144gb", 989, 989, 1979, 4900, 450),
    ("b200", 2250, 2250, 4500, 8000, 900),
    ("gb200", 2500, 2500, 5000, 8000, 900),
    ("mi300x", 1307.4, 1307.4, 2614.9, 5300, 448),
])
def test_datasheet_figures(name, bf16, fp16, fp8, hbm_bw, scaleup):
    d = load_device(name)
    assert (d.bf16_flop_per_s, d.fp16_flop_per_s, d.fp8_flop_per_s) == (bf16 * T, fp16 * T, fp8 * T)
    assert d.hbm_bandwidth_bytes_per_s == hbm_bw * G
    assert d.scaleup_bandwidth_bytes_per_s == scaleup * G  # per direction: half the "bidirectional" figure
    assert d.flop_per_s("bf16") == bf16 * T


@pytest.mark.parametrize("name, reported_mib, nominal_gb", [
    ("a100-80gb-sxm", 81920, 80), ("h100-sxm", 81559, 80), ("h200-sxm", 143771, 141), ("h20", 97871, 96),
    ("gh200-96gb", 97871, 96), ("gh200-144gb", 146831, 144), ("b200", 183359, 180), ("gb200", 189471, 186),
    ("mi300x", 196592, 192),
])
def test_hbm_capacity_is_what_the_device_reports(name, reported_mib, nominal_gb):
    capacity = load_device(name).hbm_capacity_bytes
    assert capacity == reported_mib * 2**20
    # the datasheet's round number is GiB-ish: the reported total sits within 0-8% above it in GB
    assert nominal_gb * 1e9 <= capacity <= 1.08 * nominal_gb * 1e9


def test_a100_has_no_fp8():
    with pytest.raises(Exception, match="no fp8"):
        load_device("a100-80gb-sxm").flop_per_s("fp8")


@pytest.mark.parametrize("name, node_gbs, nic_gbit", [
    ("dgx-a100-80gb", 300, 200), ("dgx-h100", 450, 400), ("dgx-h200", 450, 400), ("dgx-b200", 900, 400),
    ("h20", 450, 400), ("mi300x", 448, 400),
])
def test_eight_gpu_nodes_and_one_nic_per_gpu(name, node_gbs, nic_gbit):
    c = load_cluster(name)
    node, system = c.levels
    assert c.gpus_per_node == 8 and node.bandwidth_bytes_per_s == node_gbs * G
    assert system.bandwidth_bytes_per_s == nic_gbit * G / 8
    assert node.link in ("nvlink", "xgmi") and system.link == "infiniband"
    assert node.latency_s == 2e-6 and system.latency_s == 5e-6


def test_gb200_nvl72_and_alps_levels():
    gb = load_cluster("gb200-nvl72")
    assert [(lv.name, lv.link) for lv in gb.levels] == [("tray", "nvlink"), ("rack", "nvlink"), ("system", "infiniband")]
    assert gb.levels[1].gpus == 72 and gb.levels[1].bandwidth_bytes_per_s == 900 * G
    assert gb.levels[2].bandwidth_bytes_per_s == 50 * G  # ConnectX-7 400 Gb/s per GPU
    alps = load_cluster("alps-gh200")
    assert alps.gpus == 10752 and alps.gpus_per_node == 4 and alps.device.name == "gh200-96gb"
    assert [lv.link for lv in alps.levels] == ["nvlink", "slingshot", "slingshot"]
    assert alps.levels[1].bandwidth_bytes_per_s == 25 * G  # 200 Gb/s Slingshot-11
    assert alps.levels[2].effective_bandwidth_bytes_per_s < alps.levels[1].effective_bandwidth_bytes_per_s


def test_published_prices():
    assert load_cluster("dgx-h100").gpu_hour_usd == 4.916
    assert load_cluster("dgx-h200").gpu_hour_usd == 5.408
    assert load_cluster("alps-gh200").gpu_hour_usd == 0  # not published


def test_docs_tables_match_the_data_files():
    """docs/hardware.md holds `python -m rpeg.hardware.report` verbatim: regenerate it when a file changes."""
    assert preset_tables() in DOCS.read_text(encoding="utf-8")


def test_grace_hosts_are_named_and_a_bad_host_is_one_line(tmp_path):
    from rpeg.errors import RpegError
    from rpeg.hardware.loader import device_from_data

    assert {load_device(n).host for n in ("gh200-96gb", "gh200-144gb", "gb200")} == {"grace"}
    assert load_device("h100-sxm").host == "x86"
    base = {k: v for k, v in __import__("yaml").safe_load(
        (pathlib.Path(__file__).parents[2] / "rpeg/hardware/devices/h100-sxm.yaml").read_text()).items()}
    with pytest.raises(RpegError, match="host: 'arm' is not one of 'x86', 'grace'"):
        device_from_data({**base, "host": "arm"}, "x.yaml")
    with pytest.raises(RpegError, match="sources.host: missing"):
        device_from_data({**base, "host": "grace"}, "x.yaml")


def test_hybridflow_testbed_has_one_200_gbit_link_per_machine():
    c = load_cluster("hybridflow-a100", 128)
    assert c.levels[-1].bandwidth_bytes_per_s * 8 == pytest.approx(200e9 / 8)  # 25 GB/s per node, per GPU 1/8
