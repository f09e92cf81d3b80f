"""benchmarks/plan_shapes.py: its shapes build, the runtime accepts or refuses each with a reason
(the benchmark runs the accepted ones), and its rank correlation is Kendall's tau."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from rpeg.errors import RpegError
from rpeg.runtime.plan_check import check_plan
from rpeg.spec import load_spec

ROOT = pathlib.Path(__file__).parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("plan_shapes", ROOT / "benchmarks" / "plan_shapes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kendall_tau():
    tau = _module().kendall_tau
    assert tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)


def test_every_shape_builds_and_is_run_or_refused_with_a_reason():
    mod = _module()
    spec = load_spec(str(ROOT / "examples" / "demo-grpo-tiny.yaml"))
    shapes = mod.shapes(spec.graph().job, spec.models.actor)
    assert len(shapes) >= 8
    accepted, refused = [], []
    for name, build in shapes.items():
        g = build()
        try:
            check_plan(g)
            accepted.append((name, mod.devices(g)))
        except RpegError as e:
            assert str(e) and "\n" not in str(e)
            refused.append(name)
    assert ("colocated synchronous", 1) in accepted and any(d > 1 for _, d in accepted)
    # issue 11's shapes all run: streaming, colocated on 2 devices, pipeline and tensor parallelism
    assert not refused, refused


def test_calibration_rounds_span_the_run_and_each_reads_its_own_folder(tmp_path, monkeypatch):
    from rpeg.hardware.loader import CACHE_ENV, cpu_local_path

    mod = _module()
    assert mod.calibration_points(13, 3) == [0, 6, 13]  # before the first, at half, after the last
    assert mod.calibration_points(13, 1) == [0] and mod.calibration_points(4, 5) == [0, 1, 2, 3, 4]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    with mod.cache_folder(str(tmp_path / "round")):
        assert cpu_local_path(2) == tmp_path / "round" / "cpu-local-x2.yaml"
    assert cpu_local_path(1) == tmp_path / "mine" / "cpu-local.yaml"
    with mod.cache_folder(None):
        assert cpu_local_path(1) == tmp_path / "mine" / "cpu-local.yaml"
