"""Every test process reads cpu-local from a calibration of its own, never the user's ~/.cache:
loading cpu-local only reads `rpeg calibrate`'s file, so the session measures one first (a short
budget: no test depends on the figures' precision). A test that sets RPEG_CACHE_DIR itself
(monkeypatch) still sees only its own folder.

Two tiers. `make test` is the quick suite: every test not marked `long` or `slow`. `make
test-long` runs exactly the rest: the tests marked `long` (end-to-end runtime runs on Ray,
kill/resume, measuring this machine as several devices) and those marked `slow` (a real pretrained
model, minutes each), which run only with `--run-slow` (`make test-slow` runs them alone). CI
(`.ci/run`) runs both tiers."""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def cpu_local_calibration():
    from rpeg.hardware.calibrate import calibrate
    from rpeg.hardware.loader import CACHE_ENV, cpu_local_path

    before = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="rpeg-test-cache-") as folder:
        os.environ[CACHE_ENV] = folder  # subprocesses (rpeg train, the kill/resume test) inherit it
        calibrate(cpu_local_path(), seconds=0.2)
        yield folder
        if before is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = before


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run the tests marked slow (make test-slow)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes on a real pretrained model; runs with --run-slow only")
    config.addinivalue_line("markers", "long: end-to-end runs left out of the quick suite (make test-long runs them)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: runs with --run-slow (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
