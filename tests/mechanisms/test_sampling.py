"""``dpbudget.mechanisms.Sampler``: the one place noise is drawn. Seeded KS tests of every distribution with
a stated α and a power check on both sides, the OS-CSPRNG path, shapes and types, reproducibility,
and typed rejection of bad ``rng`` arguments."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import InvalidArgumentError, InvalidTypeError, PrivacyError
from dpbudget.mechanisms.sampling import Sampler
from tests.support import SEED

N = 20_000
ALPHA = 1e-6  # the significance level of every seeded test below (stated again in each test)

# name -> (draw(sampler, scale, size), scipy distribution with that scale)
DISTRIBUTIONS: dict[str, tuple[Any, Any]] = {
    "laplace": (lambda s, b, n: s.laplace(b, size=n), lambda b: stats.laplace(scale=b)),
    "gaussian": (lambda s, b, n: s.gaussian(b, size=n), lambda b: stats.norm(scale=b)),
    "exponential": (lambda s, b, n: s.exponential(b, size=n), lambda b: stats.expon(scale=b)),
    "gumbel": (lambda s, b, n: s.gumbel(b, size=n), lambda b: stats.gumbel_r(scale=b)),
    # uniform has no scale parameter: its "scale b" is the uniform on (0, b), drawn as b·U.
    "uniform": (lambda s, b, n: b * s.uniform(size=n), lambda b: stats.uniform(scale=b)),
}
SCALE = 2.5


def ks_pvalue(sample: np.ndarray, dist: Any) -> float:
    return float(stats.kstest(np.ravel(sample), dist.cdf).pvalue)


@pytest.mark.statistical
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_seeded_distribution(name: str) -> None:
    alpha = 1e-6  # fixed seed: deterministic; a correct sampler fails with probability 1e-6
    draw, dist = DISTRIBUTIONS[name]
    sample = draw(Sampler(SEED), SCALE, N)
    assert sample.shape == (N,) and sample.dtype == np.float64
    assert ks_pvalue(sample, dist(SCALE)) >= alpha


@pytest.mark.statistical
@pytest.mark.parametrize("factor", [0.7, 1.3], ids=["scale-too-small", "scale-too-large"])
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_power_check_rejects_wrong_scale(name: str, factor: float) -> None:
    """Test the test: a sampler whose scale is off by ×0.7 or ×1.3 fails the same KS test. Both
    sides are separate parametrized cases, so neither can be dropped silently."""
    alpha = 1e-6
    draw, dist = DISTRIBUTIONS[name]
    wrong = draw(Sampler(SEED), SCALE * factor, N)
    assert ks_pvalue(wrong, dist(SCALE)) < alpha


@pytest.mark.statistical
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_os_csprng_distribution(name: str) -> None:
    """``Sampler(None)`` reads os.urandom, so it cannot be seeded. We use α = 1e-9: a correct
    sampler fails this test once in a billion runs, which for practical purposes is deterministic,
    while the power at n = 20000 against a ±30% scale error stays ≈ 1 (KS distance ≥ 0.048 versus
    a critical value of ≈ 0.017 at α = 1e-9)."""
    alpha = 1e-9
    draw, dist = DISTRIBUTIONS[name]
    sampler = Sampler(None)
    assert sampler.is_cryptographic
    sample = draw(sampler, SCALE, N)
    assert ks_pvalue(sample, dist(SCALE)) >= alpha
    wrong = draw(sampler, SCALE * 1.3, N)
    assert ks_pvalue(wrong, dist(SCALE)) < alpha


@pytest.mark.statistical
@pytest.mark.parametrize("name", ["laplace", "gaussian", "exponential"])
def test_scalar_path_matches_vector_path(name: str) -> None:
    alpha = 1e-6
    sampler = Sampler(SEED)
    method = getattr(sampler, name)
    sample = np.array([method(SCALE) for _ in range(5_000)])
    assert ks_pvalue(sample, DISTRIBUTIONS[name][1](SCALE)) >= alpha


@pytest.mark.statistical
def test_laplace_sign_balance_and_independence_of_magnitude() -> None:
    """The sign comes from the lowest bit and the magnitude from the top 53: the sign is a fair
    coin (exact binomial test) and |noise| is exponential on both signs (KS), α = 1e-6 each."""
    alpha = 1e-6
    x = Sampler(SEED).laplace(1.0, size=N)
    assert stats.binomtest(int((x > 0).sum()), N).pvalue >= alpha
    assert ks_pvalue(x[x > 0], stats.expon()) >= alpha
    assert ks_pvalue(-x[x < 0], stats.expon()) >= alpha


def test_supports() -> None:
    s = Sampler(SEED)
    u = s.uniform(size=N)
    assert (u > 0).all() and (u < 1).all()
    assert (s.exponential(1.0, size=N) > 0).all()
    for x in (s.laplace(1e-300, size=100), s.gaussian(1e300, size=100), s.gumbel(1.0, size=100)):
        assert np.isfinite(x).all()


@pytest.mark.parametrize("method", ["laplace", "gaussian", "exponential", "gumbel"])
def test_shapes_and_types(method: str) -> None:
    s = Sampler(SEED)
    draw = getattr(s, method)
    assert type(draw(1.0)) is float
    assert draw(1.0, size=3).shape == (3,)
    assert draw(1.0, size=(2, 3)).shape == (2, 3)
    assert draw(1.0, size=(2, 1, 4)).dtype == np.float64
    assert type(s.uniform()) is float and s.uniform(size=(4, 2)).shape == (4, 2)


def test_reproducible_with_seed_and_generator() -> None:
    a, b = Sampler(SEED), Sampler(SEED)
    assert np.array_equal(a.laplace(1.0, size=10), b.laplace(1.0, size=10))
    assert a.gaussian(1.0) == b.gaussian(1.0)
    gen = np.random.default_rng(SEED)
    c = Sampler(gen)
    state = gen.bit_generator.state
    assert not c.is_cryptographic
    c.uniform()
    assert gen.bit_generator.state != state  # the injected generator is the one used
    assert np.array_equal(Sampler(np.int64(SEED)).uniform(size=5), Sampler(SEED).uniform(size=5))
    assert not np.array_equal(Sampler(SEED).uniform(size=5), Sampler(SEED + 1).uniform(size=5))


def test_csprng_draws_differ() -> None:
    s = Sampler()
    assert s.is_cryptographic
    assert len(set(s.uniform(size=1000).tolist())) == 1000
    assert Sampler(None).laplace(1.0) != Sampler(None).laplace(1.0)


@pytest.mark.parametrize("rng", [
    "seed", b"1", 1.5, True, False, [1, 2], np.random.RandomState(0), object(),
    np.random.PCG64(0), math.pi,
], ids=["str", "bytes", "float", "True", "False", "list", "RandomState", "object", "bitgen", "pi"])
def test_rejects_bad_rng_types(rng: Any) -> None:
    with pytest.raises(InvalidTypeError) as info:
        Sampler(rng)
    assert isinstance(info.value, PrivacyError) and isinstance(info.value, TypeError)
    assert info.value.argument == "rng"
    assert "'rng'" in str(info.value)


def test_rejects_negative_seed_with_typed_error() -> None:
    """numpy refuses a negative seed with a bare ValueError; ours must be typed and name 'rng'."""
    with pytest.raises(InvalidArgumentError) as info:
        Sampler(-1)
    assert info.value.argument == "rng" and "-1" in str(info.value)
