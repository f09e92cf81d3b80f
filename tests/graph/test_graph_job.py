"""Job, LengthDistribution, AlgoConfig and the execution annotations' validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.errors import RpegError
from rpeg.graph import AlgoConfig, DeviceGroup, Job, LengthDistribution, ParallelLayout


def _grid_mean(dist: LengthDistribution, points: int = 300) -> float:
    """E[length] = integral over u in (0, 1) of the quantile function, by the midpoint rule on a
    grid that refines by decades towards u = 1, where a long tail keeps its mass."""
    edges = [0.0] + [1 - 10.0 ** -k for k in range(1, 8)] + [1.0]
    total = 0.0
    for a, b in zip(edges, edges[1:]):
        h = (b - a) / points
        total += h * sum(dist.quantile(a + (i + 0.5) * h) for i in range(points))
    return total


lengths = st.integers(1, 8192)


@st.composite
def distributions(draw):
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "empirical"]))
    if kind == "fixed":
        return LengthDistribution.fixed(draw(lengths))
    if kind == "uniform":
        lo, hi = sorted((draw(lengths), draw(lengths)))
        return LengthDistribution(kind="uniform", min=lo, max=hi)
    if kind == "lognormal":
        cap = draw(st.integers(2, 16384))
        mean = draw(st.floats(1.0, float(cap)))
        return LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=draw(st.floats(0.05, 2.5)))
    return LengthDistribution(kind="empirical", points=tuple(draw(st.lists(lengths, min_size=1, max_size=40))))


# ---- LengthDistribution ------------------------------------------------------------------------
def test_fixed():
    d = LengthDistribution.fixed(1000)
    assert (d.mean, d.max) == (1000, 1000)
    assert d.quantile(0.0) == d.quantile(0.5) == d.quantile(1.0) == 1000
    assert d.expected_max(64) == pytest.approx(1000)
    assert LengthDistribution(kind="fixed", mean=2.5).max == 3  # max covers a fractional mean


def test_uniform():
    d = LengthDistribution(kind="uniform", min=100, max=300)
    assert d.mean == 200
    assert (d.quantile(0.0), d.quantile(0.5), d.quantile(1.0)) == (100, 200, 300)
    for n in (2, 4, 16):  # E[max of n] = a + (b - a) n / (n + 1)
        assert d.expected_max(n) == pytest.approx(100 + 200 * n / (n + 1), rel=1e-3)


def test_empirical():
    d = LengthDistribution(kind="empirical", points=(300, 100, 1000, 200))
    assert d.mean == 400 and d.max == 1000
    assert d.quantile(0.0) == 100 and d.quantile(0.99) == 1000 and d.quantile(1.0) == 1000
    # P(max of 2 = k-th smallest) = (k/4)^2 - ((k-1)/4)^2
    assert d.expected_max(2) == pytest.approx((100 * 1 + 200 * 3 + 300 * 5 + 1000 * 7) / 16)


@pytest.mark.parametrize("mean, cap, sigma", [(2000, 16384, 1.0), (500, 4096, 0.5), (3000, 4096, 1.5),
                                              (100, 32768, 2.0)])
def test_lognormal_truncated_mean_is_the_requested_mean(mean, cap, sigma):
    d = LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=sigma)
    assert _grid_mean(d) == pytest.approx(mean, rel=0.01)
    assert d.quantile(1.0) == cap
    assert d.quantile(0.5) <= min(cap, mean) or mean > cap / 2  # right-skewed unless the cap bites


@pytest.mark.parametrize("mean, cap, runaway", [(749, 16234, None), (749, 16234, 0.03), (2000, 8192, 0.05),
                                                (100, 32768, None)])
def test_runaways_sit_at_the_cap_and_the_mean_holds(mean, cap, runaway):
    d = LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=0.8, runaway=runaway)
    c = d.runaway
    assert c == (min(0.01, mean / cap / 2) if runaway is None else runaway)
    assert _grid_mean(d) == pytest.approx(mean, rel=0.01)
    assert d.expect(lambda r: r) == pytest.approx(mean, rel=0.01)
    assert d.quantile(1 - c / 2) == cap and d.quantile(1 - 2 * c) < cap
    body = LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=0.8, runaway=0.0)
    assert d.moments()[1] > body.moments()[1]  # the runaways carry E[r^2]
    assert cap >= d.expected_max(2048) >= cap * (1 - (1 - c) ** 2048)  # 2,048 responses likely hold one


def test_a_batch_waits_for_a_runaway_only_when_it_likely_holds_one():
    """The batch's longest (quantile 0.5 ** (1 / N)) is the cap once N exceeds ln 2 / runaway."""
    d = LengthDistribution(kind="lognormal", mean=749, max=16234, sigma=0.8, runaway=0.001)
    assert d.quantile(0.5 ** (1 / 1000)) == 16234  # 1,000 > ln 2 / 0.001 = 693
    assert d.quantile(0.5 ** (1 / 400)) < 16234


@settings(max_examples=25, deadline=None)
@given(mean=st.floats(1.0, 8000.0), extra=st.floats(1.0, 8.0), sigma=st.floats(0.05, 2.5))
def test_lognormal_mean_property(mean, extra, sigma):
    cap = math.ceil(mean * extra)
    d = LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=sigma)
    assert _grid_mean(d, 60) == pytest.approx(mean, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(dist=distributions())
def test_quantiles_monotone_and_expected_max_non_decreasing(dist):
    qs = [dist.quantile(i / 50) for i in range(51)]
    assert all(a <= b for a, b in zip(qs, qs[1:]))
    assert qs[-1] <= dist.max
    ems = [dist.expected_max(n) for n in (1, 2, 3, 8, 64, 512)]
    assert all(a <= b + 1e-9 * dist.max for a, b in zip(ems, ems[1:])), ems
    assert all(e <= dist.max + 1e-9 for e in ems)
    assert ems[0] == pytest.approx(dist.mean)


@pytest.mark.parametrize("kwargs, words", [
    (dict(kind="fixed", mean=0), "fixed mean = 0"),
    (dict(kind="uniform", min=10, max=5), "min (10) <= max (5)"),
    (dict(kind="uniform", min=0, max=5), "1 <= min (0)"),
    (dict(kind="lognormal", mean=5000, max=4096), "0 < mean (5000) <= max (4096)"),
    (dict(kind="lognormal", mean=0, max=4096), "0 < mean (0)"),
    (dict(kind="lognormal", mean=100, max=4096, sigma=0), "sigma = 0"),
    (dict(kind="empirical", points=()), "non-empty"),
    (dict(kind="empirical", points=(5, 0)), "positive lengths"),
    (dict(kind="gamma", mean=3), "unknown kind 'gamma'"),
    (dict(kind="lognormal", mean=749, max=16384, runaway=0.05), "alone give a mean of 819.2 tokens"),
    (dict(kind="lognormal", mean=749, max=16384, runaway=-0.01), "runaway = -0.01 must be >= 0"),
    (dict(kind="lognormal", mean=749, max=16384, runaway=float("nan")), "runaway = nan"),
    (dict(kind="fixed", mean=100, runaway=0.01), "runaway applies to a lognormal"),
])
def test_bad_distributions(kwargs, words):
    with pytest.raises(RpegError, match="response length") as err:
        LengthDistribution(**kwargs)
    assert words in str(err.value)


# ---- Job ---------------------------------------------------------------------------------------
def test_job_sizes():
    job = Job(prompts=16, samples_per_prompt=4, prompt_len=100,
              response=LengthDistribution(kind="uniform", min=100, max=300))
    assert job.sequences == 64
    assert job.mean_seq_len == 300
    assert job.max_seq_len == 400
    assert "16 prompts x 4 samples = 64 sequences" in job.describe()


@pytest.mark.parametrize("field", ["prompts", "samples_per_prompt", "prompt_len", "ppo_epochs", "mini_batches"])
def test_job_fields_must_be_positive(field):
    with pytest.raises(RpegError, match=f"job: {field} = 0 must be positive"):
        Job(**{field: 0})


def test_job_mini_batches_cannot_exceed_sequences():
    with pytest.raises(RpegError, match="mini_batches = 9 exceeds the 8 sequences"):
        Job(prompts=2, samples_per_prompt=4, mini_batches=9)
    assert Job(prompts=2, samples_per_prompt=4, mini_batches=8).mini_batches == 8


def test_job_lists_every_problem():
    with pytest.raises(RpegError) as err:
        Job(prompts=0, prompt_len=-1)
    assert "prompts = 0" in str(err.value) and "prompt_len = -1" in str(err.value)


# ---- AlgoConfig and execution annotations --------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(kl_coef=-0.1), "kl_coef = -0.1"),
    (dict(clip_low=-0.1), "clip_low = -0.1"),
    (dict(gamma=1.5), "gamma = 1.5"),
    (dict(lam=-0.5), "lam = -0.5"),
    (dict(oversample=0.5), "oversample = 0.5"),
])
def test_algo_config_validation(kwargs, words):
    with pytest.raises(RpegError, match="algorithm config") as err:
        AlgoConfig(adv_estimator="grpo", **kwargs)
    assert words in str(err.value)
    assert not AlgoConfig(adv_estimator="grpo").uses_reference
    assert AlgoConfig(adv_estimator="grpo", kl_coef=0.01).uses_reference


@pytest.mark.parametrize("kwargs, words", [
    (dict(dp=0), "dp = 0"),
    (dict(tp=-1, pp=0), "tp = -1, pp = 0"),
    (dict(zero=4), "zero = 4"),
    (dict(recompute="some"), "recompute = 'some'"),
    (dict(sequence_parallel=True), "sequence_parallel needs tp > 1"),
    (dict(pp_interleave=2), "pp_interleave = 2 needs pp > 1"),
])
def test_parallel_layout_validation(kwargs, words):
    with pytest.raises(RpegError, match="parallel layout") as err:
        ParallelLayout(**kwargs)
    assert words in str(err.value)


def test_parallel_layout_product():
    lay = ParallelLayout(dp=2, tp=4, pp=2, cp=1, ep=2, zero=3)
    assert lay.devices == 16
    assert lay.product_terms() == "dp*tp*pp*cp = 2*4*2*1 = 16"
    assert lay.describe() == "dp2 tp4 pp2 ep2 zero3"
    assert ParallelLayout().describe() == "single device"


def test_device_groups():
    with pytest.raises(RpegError, match="count = 0"):
        DeviceGroup(name="g", first=0, count=0)
    with pytest.raises(RpegError, match="first = -1"):
        DeviceGroup(name="g", first=-1, count=2)
    a, b, c = (DeviceGroup(name="a", first=0, count=8), DeviceGroup(name="b", first=4, count=8),
               DeviceGroup(name="c", first=8, count=8))
    assert a.overlaps(b) and b.overlaps(a) and b.overlaps(c)
    assert not a.overlaps(c) and not c.overlaps(a)
    assert list(a.devices) == list(range(8))
