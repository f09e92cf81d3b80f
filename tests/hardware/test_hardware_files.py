"""User device and cluster files: the schema, unit conversion, and errors that name file and key."""

import textwrap

import pytest

from rpeg.errors import RpegError
from rpeg.hardware import load_cluster, load_device

DEVICE = """\
name: my-gpu
kind: gpu
bf16_dense_tflop_per_s: 500
fp16_dense_tflop_per_s: 500
fp8_dense_tflop_per_s: 0
hbm_capacity_gib: 64
hbm_bandwidth_tb_per_s: 2.5
scaleup_bandwidth_gbit_per_s: 1600
sources:
  bf16_dense_tflop_per_s: vendor sheet (2025)
  fp16_dense_tflop_per_s: vendor sheet (2025)
  fp8_dense_tflop_per_s: vendor sheet (2025), none
  hbm_capacity_gib: vendor sheet (2025)
  hbm_bandwidth_tb_per_s: vendor sheet (2025)
  scaleup_bandwidth_gbit_per_s: vendor sheet (2025)
"""

CLUSTER = """\
name: lab
device: h100-sxm
gpus: 32
gpu_hour_usd: 2.5
levels:
  - name: node
    gpus: 8
    link: nvlink
    bandwidth_gb_per_s: 450
    latency_us: 3
    sources: {gpus: our racks, bandwidth_gb_per_s: datasheet, latency_us: nccl-tests}
  - name: system
    link: ethernet
    bandwidth_gbit_per_s: 100
    latency_us: 12.5
    oversubscription: 4
    sources: {bandwidth_gbit_per_s: our NICs, latency_us: nccl-tests, oversubscription: our switches}
sources:
  gpus: our inventory
  gpu_hour_usd: our accounting
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_user_device_units_convert_to_si(tmp_path):
    d = load_device(write(tmp_path, "my-gpu.yaml", DEVICE))
    assert d.name == "my-gpu" and d.bf16_flop_per_s == 5e14 and d.fp8_flop_per_s == 0
    assert d.hbm_capacity_bytes == 64 * 2**30
    assert d.hbm_bandwidth_bytes_per_s == 2.5e12
    assert d.scaleup_bandwidth_bytes_per_s == 2e11  # 1600 Gb/s = 200 GB/s
    assert d.source("hbm_capacity_bytes") == d.source("hbm_capacity") == d.source("hbm_capacity_gib") == "vendor sheet (2025)"


def test_user_cluster_from_a_file(tmp_path):
    c = load_cluster(write(tmp_path, "lab.yaml", CLUSTER))
    assert (c.name, c.gpus, c.gpu_hour_usd, c.device.name) == ("lab", 32, 2.5, "h100-sxm")
    node, system = c.levels
    assert node.latency_s == 3e-6 and system.latency_s == 12.5e-6
    assert system.bandwidth_bytes_per_s == 12.5e9  # 100 Gb/s
    assert system.gpus == 32 and system.effective_bandwidth_bytes_per_s == 12.5e9 / 4
    assert dict(c.sources)["levels.system.oversubscription"] == "our switches"
    assert load_cluster(write(tmp_path, "lab.yaml", CLUSTER), gpus=16).levels[-1].gpus == 16
    assert c.span(16, 1).level.link == "ethernet"


def test_cluster_device_inline_or_by_relative_path(tmp_path):
    write(tmp_path, "my-gpu.yaml", DEVICE)
    by_path = load_cluster(write(tmp_path, "a.yaml", CLUSTER.replace("device: h100-sxm", "device: ./my-gpu.yaml")))
    assert by_path.device.name == "my-gpu"
    inline = "device:\n" + textwrap.indent(DEVICE.replace("name: my-gpu\n", ""), "  ")
    c = load_cluster(write(tmp_path, "b.yaml", CLUSTER.replace("device: h100-sxm\n", inline)))
    assert c.device.name == "lab-device" and c.device.hbm_capacity_bytes == 64 * 2**30


def test_a_memory_level_may_take_the_device_bandwidth(tmp_path):
    text = """\
    device: h100-sxm
    levels:
      - {name: gpu, gpus: 1, link: memory, latency_us: 1, sources: {gpus: one, latency_us: guess}}
      - {name: box, gpus: 8, link: nvlink, bandwidth_gb_per_s: 450, latency_us: 2,
         sources: {gpus: eight, bandwidth_gb_per_s: sheet, latency_us: nccl}}
    """
    c = load_cluster(write(tmp_path, "m.yaml", text))
    assert c.levels[0].bandwidth_bytes_per_s == 3350e9 and c.name == "m"


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("bf16_dense_tflop_per_s: 500", "bf16_tflops: 500"), ["bf16_tflops", "unknown key"]),
    (lambda t: t.replace("  fp8_dense_tflop_per_s: vendor sheet (2025), none\n", ""), ["sources.fp8_dense_tflop_per_s", "missing"]),
    (lambda t: t.replace("vendor sheet (2025), none", "''"), ["sources.fp8_dense_tflop_per_s", "citation"]),
    (lambda t: t + "  hbm_capacity_gb: extra\n", ["sources.hbm_capacity_gb", "no such figure"]),
    (lambda t: t.replace("hbm_bandwidth_tb_per_s: 2.5", "hbm_bandwidth_tb_per_s: 0"), ["hbm_bandwidth_tb_per_s", "positive"]),
    (lambda t: t.replace("fp16_dense_tflop_per_s: 500", "fp16_dense_tflop_per_s: -1"), ["fp16_dense_tflop_per_s", "positive"]),
    (lambda t: t.replace("hbm_bandwidth_tb_per_s: 2.5", "hbm_bandwidth_tb_per_s: fast"), ["hbm_bandwidth_tb_per_s", "a number"]),
    (lambda t: t.replace("hbm_capacity_gib: 64", "hbm_capacity_gb_per_s: 64"), ["hbm_capacity_gb_per_s", "unknown key"]),
    (lambda t: t.replace("scaleup_bandwidth_gbit_per_s: 1600\n", ""), ["scaleup_bandwidth_<unit>", "missing"]),
    (lambda t: t + "hbm_capacity_gb: 64\n", ["hbm_capacity_gb", "already given"]),
    (lambda t: t.replace("kind: gpu", "kind: tpu"), ["kind", "tpu"]),
    (lambda t: t.replace("name: my-gpu", "name: [oops"), ["bad.yaml:2", "malformed YAML"]),
    # out of every device's range: a step of 1e300 seconds before (issue 23)
    (lambda t: t.replace("bf16_dense_tflop_per_s: 500", "bf16_dense_tflop_per_s: 1.0e-300"),
     ["bf16_dense_tflop_per_s: 1e-300 is outside [1e-06, 1e+06]", "1e+06 to 1e+18 FLOP/s"]),
    (lambda t: t.replace("fp16_dense_tflop_per_s: 500", "fp16_dense_tflop_per_s: 1.0e+300"),
     ["fp16_dense_tflop_per_s: 1e+300 is outside"]),
    (lambda t: t.replace("hbm_bandwidth_tb_per_s: 2.5", "hbm_bandwidth_tb_per_s: 1.0e-300"),
     ["hbm_bandwidth_tb_per_s: 1e-300 is outside [1e-09, 1000]", "bytes/s"]),
    (lambda t: t.replace("hbm_capacity_gib: 64", "hbm_capacity_gib: 1.0e-300"), ["hbm_capacity_gib: 1e-300 is outside"]),
    (lambda t: t.replace("name: my-gpu", "name: ''"), ["name: an empty name"]),
])
def test_device_errors_name_the_file_and_the_key(tmp_path, edit, words):
    path = write(tmp_path, "bad.yaml", edit(DEVICE))
    with pytest.raises(RpegError) as err:
        load_device(path)
    message = str(err.value)
    assert path.split("/")[-1] in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("gpus: 32\n", "gpus: 32\nnodes: 4\n"), ["nodes", "unknown key"]),
    (lambda t: t.replace("    oversubscription: 4\n", "    oversubscription: 4\n    mtu: 9000\n"), ["levels[1] (system).mtu", "unknown key"]),
    (lambda t: t.replace("latency_us: nccl-tests, oversubscription", "oversubscription"), ["levels[1] (system).sources.latency_us", "missing"]),
    (lambda t: t.replace("  gpu_hour_usd: our accounting\n", ""), ["sources.gpu_hour_usd", "missing"]),
    (lambda t: t.replace("link: ethernet", "link: carrier-pigeon"), ["levels[1] (system).link", "carrier-pigeon"]),
    (lambda t: t.replace("bandwidth_gb_per_s: 450", "bandwidth_gb_per_s: 0"), ["levels[0] (node).bandwidth_gb_per_s", "positive"]),
    (lambda t: t.replace("latency_us: 3", "latency_us: -3"), ["levels[0] (node).latency_us", "positive"]),
    (lambda t: t.replace("oversubscription: 4", "oversubscription: 0.5"), ["oversubscription", "at least 1"]),
    (lambda t: t.replace("    gpus: 8\n", ""), ["levels[0] (node).gpus", "missing"]),
    (lambda t: t.replace("gpus: 8", "gpus: 2.5"), ["levels[0] (node).gpus", "whole number"]),
    (lambda t: t.replace("device: h100-sxm", "device: h900"), ["device", "unknown device 'h900'", "h100-sxm"]),
    (lambda t: t.replace("device: h100-sxm", "device: ./nowhere.yaml"), ["device", "cannot read"]),
    (lambda t: t.replace("    link: ethernet", "    gpus: 12\n    link: ethernet").replace(
        "{bandwidth_gbit_per_s: our NICs", "{gpus: ours, bandwidth_gbit_per_s: our NICs"), ["8 -> 12", "whole multiples"]),
    (lambda t: t.replace("gpus: 32", "gpus: 30"), None),  # fine: the system level rounds up to 32
    (lambda t: t.replace("levels:", "level:"), ["level", "unknown key"]),
    (lambda t: t.replace("bandwidth_gb_per_s: 450", "bandwidth_gb_per_s: 1.0e-300"),
     ["levels[0] (node).bandwidth_gb_per_s: 1e-300 is outside [1e-06, 1e+06]"]),
    (lambda t: t.replace("latency_us: 3", "latency_us: 1.0e+300"), ["levels[0] (node).latency_us: 1e+300 is outside"]),
    (lambda t: t.replace("oversubscription: 4", "oversubscription: 1.0e+300"),
     ["levels[1] (system).oversubscription: 1e+300 exceeds 1,000"]),
    (lambda t: t.replace("gpu_hour_usd: 2.5", "gpu_hour_usd: 1.0e+300"), ["gpu_hour_usd: 1e+300 exceeds 10,000"]),
    (lambda t: t.replace("gpus: 32", "gpus: 1000000000000000"), ["gpus: 1,000,000,000,000,000 exceeds 1,000,000"]),
    (lambda t: t.replace("gpus: 8", "gpus: 1000000000000000"), ["levels[0] (node).gpus: 1,000,000,000,000,000 exceeds"]),
    (lambda t: t.replace("name: lab", "name: ' '"), ["name: an empty name"]),
    (lambda t: t.replace("name: node", "name: ' '"), ["levels[0].name: missing"]),
])
def test_cluster_errors_name_the_file_and_the_key(tmp_path, edit, words):
    path = write(tmp_path, "bad.yaml", edit(CLUSTER))
    if words is None:
        assert load_cluster(path).levels[-1].gpus == 32
        return
    with pytest.raises(RpegError) as err:
        load_cluster(path)
    message = str(err.value)
    assert "bad.yaml" in message
    for word in words:
        assert word in message, message


def test_unknown_names_list_the_presets():
    with pytest.raises(RpegError, match="unknown device 'h1000'.*h100-sxm"):
        load_device("h1000")
    with pytest.raises(RpegError, match="unknown cluster 'dgx-z'.*dgx-h100"):
        load_cluster("dgx-z")
    with pytest.raises(RpegError, match="cannot read"):
        load_cluster("/nonexistent/cluster.yaml")
