"""Fitted constants (rpeg/perf/fitted.py) and the fitter (rpeg/perf/fit.py)."""

import math

import numpy as np
import pytest

from rpeg.errors import RpegError
from rpeg.perf import fitted
from rpeg.perf.fit import Row, fit_group, loo_report, loss, rows_for, search


@pytest.fixture
def declared():
    """Declare constants for one test and forget them after (the registry is process-wide)."""
    names = []

    def make(name, bounds=(1e-6, 1e-1), group="test"):
        names.append(name)
        return fitted.declare(name, unit="s", mechanism="synthetic", bounds=bounds, rows=("published:training",),
                              group=group)
    yield make
    for n in names:
        fitted._DECLARED.pop(n, None)


def _rows(const, true, sizes, noise=None):
    noise = noise or [1.0] * len(sizes)
    return [Row(f"r{i}", (0.5 + n * true) * e, (lambda n=n: 0.5 + n * const.value)) for i, (n, e) in
            enumerate(zip(sizes, noise))]


def test_the_fitter_recovers_a_known_constant(declared):
    c = declared("test.per_item_s")
    rows = _rows(c, 2.5e-3, [100, 400, 1000, 3000, 8000])
    fit = fit_group((c,), rows, {})
    assert fit.values["test.per_item_s"] == pytest.approx(2.5e-3, rel=0.02)
    assert fit.in_sample_mape < 0.01 and fit.loo_mape < 0.02


def test_two_constants_are_recovered_together(declared):
    a, b = declared("test.a", group="ab"), declared("test.b", bounds=(1e7, 1e11), group="ab")
    sizes = [(100, 1e9), (5000, 2e9), (300, 3e10), (2000, 8e10), (50, 5e8)]
    rows = [Row(f"r{i}", n * 1e-3 + nb / 4e9, (lambda n=n, nb=nb: n * a.value + nb / b.value))
            for i, (n, nb) in enumerate(sizes)]
    fit = fit_group((a, b), rows, {})
    assert fit.values["test.a"] == pytest.approx(1e-3, rel=0.03)
    assert fit.values["test.b"] == pytest.approx(4e9, rel=0.03)


def test_leave_one_out_differs_from_in_sample_for_an_outlier(declared):
    c = declared("test.outlier_s")
    # four rows scattered by +-10-20% and one 5x off: the robust loss's optimum is an order statistic,
    # which the outlier shifts by one place when it is in the fit
    rows = _rows(c, 1e-3, [2000, 4000, 8000, 16000, 32000], noise=[0.8, 0.9, 1.1, 1.2, 5.0])
    fit = fit_group((c,), rows, {})
    errors_in = np.abs(np.array(fit.in_sample) / np.array(fit.measured) - 1)
    errors_loo = np.abs(np.array(fit.loo) / np.array(fit.measured) - 1)
    assert errors_loo[-1] > errors_in[-1] + 1e-3  # the outlier is predicted worse without itself
    assert fit.loo_mape > fit.in_sample_mape
    assert fit.values["test.outlier_s"] == pytest.approx(1e-3, rel=0.15)  # the robust loss is not dragged to 5x


def test_search_stays_within_bounds():
    best = search(lambda p: abs(math.log(p[0] / 50.0)), [(1.0, 10.0)])
    assert best[0] == pytest.approx(10.0)


def test_loss_counts_a_row_predicted_not_to_fit():
    assert loss(np.array([math.inf, 1.0]), np.array([1.0, 1.0])) == pytest.approx(5.0)


@pytest.mark.parametrize("call, words", [
    (lambda: fitted.declare("test.bad", unit="s", mechanism="m", bounds=(1.0, 0.5), rows=("x:rl",)), "bounds"),
    (lambda: fitted.declare("test.bad", unit="s", mechanism="m", bounds=(1.0, 2.0), rows=("nocolon",)), "rows"),
    (lambda: rows_for(["no-such-file:refit"]), "FILE"),
    (lambda: rows_for(["published:refit:generation"]), "STAGE"),
    (lambda: fitted.override({"test.never_declared": 1.0}).__enter__(), "not a declared"),
    (lambda: search(lambda p: 0.0, [(1.0, 2.0)], grid=2), "grid"),
])
def test_bad_inputs_give_one_line_errors(call, words):
    with pytest.raises(RpegError) as e:
        call()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_constant_without_a_value_names_the_script(declared):
    c = declared("test.unfitted")
    with pytest.raises(RpegError, match="scripts/fit_factors.py"):
        c.value
    with fitted.override({"test.unfitted": 3.0}):
        assert c.value == 3.0
    with pytest.raises(RpegError):
        c.value


def test_fit_group_without_rows_is_refused(declared):
    with pytest.raises(RpegError, match="no row exercises"):
        fit_group((declared("test.lonely"),), [], {})


def test_the_shipped_fit_is_current():
    """Every declared constant has a value, and the stored in-sample predictions are what the model
    predicts now with them (else rerun scripts/fit_factors.py)."""
    from rpeg.perf.fit import load_all

    names = load_all()
    stored = fitted.fitted_file()
    assert names and all(n in stored and stored[n]["loo_mape"] >= 0 for n in names)
    rows = loo_report()
    assert rows and not [r.id for r in rows if r.stale]


def test_the_fitted_values_are_package_data():
    """The model reads rpeg/data/fitted.yaml at run time: a pip-installed rpeg must have it."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"data/fitted.yaml"' in text


def test_rows_without_a_modelled_condition_are_not_fitted_on():
    """A training row run under a condition the model has no mechanism for (validation.IGNORED_OPTIONS:
    packing) is left out; a training row's measured seconds are what validation reads, an iteration time
    or the one its published throughput implies (global_batch x seq / (tokens/s/GPU x gpus))."""
    from rpeg.perf.fit import unmodelled

    assert unmodelled({"packing": True}, "training") and not unmodelled({"packing": False}, "training")
    assert not unmodelled({"packing": True}, "rl")  # an rl entry's packing is modelled (NeMo-RL's)
    rows = {r.id: r for r in rows_for(["megatron-bridge:training"])}
    assert "megatron-bridge:qwen3-30b-a3b-h100-sft-2k" not in rows
    assert "megatron-bridge:qwen3-30b-a3b-h100-pretrain-natural" in rows
    # s2604-qwen3-235b-h100-fp8 publishes 1,712 tokens/s/GPU: 8,192 x 4,096 / (1,712 x 256) = 76.56 s
    assert rows["megatron-bridge:s2604-qwen3-235b-h100-fp8"].measured == pytest.approx(8192 * 4096 / (1712 * 256))


def test_only_named_groups_are_refitted_and_merged(tmp_path):
    from rpeg.perf.fit import fit_all, merged

    with pytest.raises(RpegError, match="--only: 'nope' is not a group of fitted constants"):
        fit_all(only=["nope"])
    stored = tmp_path / "fitted.yaml"
    stored.write_text("constants: {a: {value: 1.0}, b: {value: 2.0}}\ngroups: {A: {x: 1}, B: {x: 2}}\n")
    out = merged({"constants": {"b": {"value": 3.0}}, "groups": {"B": {"x": 3}}}, stored)
    assert out["constants"] == {"a": {"value": 1.0}, "b": {"value": 3.0}}
    assert out["groups"] == {"A": {"x": 1}, "B": {"x": 3}}
