"""The host's half of 16- and 8-bit lanes (host_agent/blocks.py; docs/bits.md): the shift that
keeps every rank's value and their sum inside the lane's width, stochastic rounding that is
unbiased and off by less than one unit, its error bound on a sum, and error feedback that loses
nothing. tests/test_narrow_lanes.py checks the agent and the software switch that use them.

Run just this file: python -m pytest tests/test_lanes.py
"""
from __future__ import annotations

import numpy as np
import pytest

from host_agent.blocks import (
    LANE_DTYPES,
    exponent_of_bits,
    headroom_bits,
    quant_shift,
    quantize_with_feedback,
    rounding_noise,
    stochastic_error_bound,
    stochastic_quantize,
)
from spina import wire


def _exponent(rows: np.ndarray) -> int:
    """The slot's shared exponent: smallest e with max |x| < 2**e over every rank's rows."""
    bits = np.abs(rows).astype(np.float32).view(np.int32).max()
    return int(exponent_of_bits(np.array([bits], np.int32))[0])


def test_int32_shift_is_the_one_the_data_path_uses():
    """lane_bits=32 keeps today's rule S = 30 - ceil(log2 N) - E (docs/aggregation.md)."""
    for n, e in ((1, 0), (2, 3), (4, -7), (5, 20), (64, -100)):
        assert quant_shift(e, n) == quant_shift(e, n, 32) == 30 - headroom_bits(n) - e
    assert quant_shift(wire.EXPONENT_NONE, 4, 8) == 0
    assert quant_shift(2, 4, 16) == 16 - 2 - 2 - 2
    assert quant_shift(2, 4, 8) == 8 - 2 - 2 - 2


@pytest.mark.parametrize("lane_bits", [16, 8])
@pytest.mark.parametrize("nworkers", [2, 3, 4, 8])
def test_every_value_and_the_sum_fit_the_lane_even_at_the_block_maximum(lane_bits, nworkers):
    """Values just below 2**E (the largest the exponent admits), all ranks the same sign, with
    draws just below 1: the worst case rounds every rank up and still fits."""
    e = 3
    top = np.float32(np.nextafter(np.float32(2.0 ** e), np.float32(0)))
    rows = np.full((nworkers, 64), top, np.float32)
    rows[:, 32:] = -top
    shift = quant_shift(_exponent(rows), nworkers, lane_bits)
    assert shift == lane_bits - 2 - headroom_bits(nworkers) - e
    noise = np.full(rows.shape, np.float32(np.nextafter(np.float32(1), np.float32(0))))
    q = stochastic_quantize(rows, shift, lane_bits, noise)
    assert q.dtype == LANE_DTYPES[lane_bits]
    limit = 2 ** (lane_bits - 2 - headroom_bits(nworkers))
    assert q.max() == limit and q.min() == -limit + 1  # both rounded up, a unit each
    assert stochastic_quantize(rows, shift, lane_bits, np.zeros_like(noise)).min() == -limit
    total = q.astype(np.int64).sum(axis=0)
    assert np.abs(total).max() <= 2 ** (lane_bits - 2) < 2 ** (lane_bits - 1)
    info = np.iinfo(LANE_DTYPES[lane_bits])
    assert info.min <= total.min() and total.max() <= info.max  # no wrap in the lane's width


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_stochastic_rounding_is_the_exact_floor_of_the_scaled_value_plus_the_draw(lane_bits):
    """stochastic_quantize's float32 comparisons (the compiled core's, tests/test_core.py) give
    floor(x 2**S + u) computed exactly in rationals: values at every scale below the block's
    maximum, both signs, integers, and draws 0, just below 1 and exactly at each value's
    rounding boundary (u = 1 - frac(x 2**S), the tie that rounds up), where a float32 sum
    s + u would round."""
    from fractions import Fraction
    rng = np.random.default_rng(lane_bits)
    n = 6000
    x = (rng.choice([-1.0, 1.0], n) * rng.uniform(1, 2, n)
         * 2.0 ** rng.integers(-40, 3, n)).astype(np.float32)
    x[:200] = np.round(x[:200] * 8) / 8  # integers after scaling
    shift = quant_shift(_exponent(x), 4, lane_bits)
    exact = [Fraction(float(v)) * Fraction(2) ** shift for v in x]
    tie = [(1 - (e - (e.numerator // e.denominator))) for e in exact]
    grid = Fraction(1, 1 << 24)
    for noise in (rounding_noise(3, 1, 2, x.shape), np.zeros(n, np.float32),
                  np.full(n, np.float32(1 - 2.0 ** -24)),
                  np.array([min(float((t // grid) * grid), 1 - 2.0 ** -24) for t in tie],
                           np.float32)):
        want = [(e + Fraction(float(u))).__floor__() for e, u in zip(exact, noise)]
        got = stochastic_quantize(x, shift, lane_bits, noise)
        assert got.tolist() == want


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_stochastic_rounding_is_unbiased_and_off_by_less_than_one_unit(lane_bits):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(4096).astype(np.float32)
    shift = quant_shift(_exponent(x), 1, lane_bits)
    ulp = 2.0 ** -shift
    draws = 400
    total = np.zeros(x.shape, np.float64)
    for step in range(draws):
        q = stochastic_quantize(x, shift, lane_bits, rounding_noise(11, 0, step, x.shape))
        err = q.astype(np.float64) * ulp - x
        assert np.abs(err).max() < ulp
        total += q * ulp
    # each error has a standard deviation of at most ulp / 2, so the mean of `draws` of them
    # one of ulp / (2 sqrt(draws)); six of those bound all 4096 elements, five the overall
    # mean (a fixed seed: the same numbers every run). Rounding to nearest, or floor, is
    # biased by up to ulp / 2 and fails both.
    bias = total / draws - x
    assert np.abs(bias).max() < 6 * ulp / (2 * np.sqrt(draws))
    assert abs(bias.mean()) < 5 * ulp / (2 * np.sqrt(draws * x.size))


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_the_sum_of_ranks_is_within_the_documented_bound(lane_bits):
    nworkers = 4
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((nworkers, 2048)) * 0.01).astype(np.float32)
    shift = quant_shift(_exponent(rows), nworkers, lane_bits)
    q = np.stack([stochastic_quantize(rows[r], shift, lane_bits,
                                      rounding_noise(5, r, 0, rows.shape[1]))
                  for r in range(nworkers)])
    summed = q.astype(np.int32).sum(axis=0)  # the switch adds into int32 registers
    result = summed.astype(np.float32) * np.float32(2.0 ** -shift)
    true = rows.astype(np.float64).sum(axis=0)
    err = np.abs(result - true)
    bound = stochastic_error_bound(nworkers, shift) + 2.0 ** -24 * np.abs(true)
    assert (err < bound).all()
    assert err.max() > stochastic_error_bound(nworkers, shift) / 16  # the bound is not vacuous


def test_rounding_noise_depends_on_seed_rank_and_step_only():
    a = rounding_noise(1, 2, 3, 1000)
    assert a.dtype == np.float32 and 0 <= a.min() and a.max() < 1
    assert np.array_equal(a, rounding_noise(1, 2, 3, 1000))
    for other in (rounding_noise(2, 2, 3, 1000), rounding_noise(1, 3, 3, 1000),
                  rounding_noise(1, 2, 4, 1000)):
        assert not np.array_equal(a, other)


def test_rounding_noise_is_uniform_and_uncorrelated():
    """The counter-based draws look like independent uniforms where rounding needs it: 2**20
    draws fill 256 bins evenly (chi-square), with mean 1/2 and variance 1/12, and neither the
    next draw nor another rank's, step's or seed's draw of the same element correlates (each
    within 5 standard errors; fixed seeds, the same numbers every run)."""
    n = 1 << 20
    a = rounding_noise(7, 1, 9, n).astype(np.float64)
    counts = np.bincount((a * 256).astype(np.int64), minlength=256)
    chi2 = ((counts - n / 256) ** 2 / (n / 256)).sum()
    assert 255 - 5 * np.sqrt(2 * 255) < chi2 < 255 + 5 * np.sqrt(2 * 255)
    se = 1 / np.sqrt(n)
    assert abs(a.mean() - 0.5) < 5 * se * np.sqrt(1 / 12)
    assert abs(a.var() - 1 / 12) < 5 * se * np.sqrt(1 / 180)  # the variance of (u - 1/2)**2
    for other in (a[1:], rounding_noise(7, 2, 9, n), rounding_noise(7, 1, 10, n),
                  rounding_noise(8, 1, 9, n)):
        b = np.asarray(other, np.float64)
        m = min(len(a), len(b))
        assert abs(np.corrcoef(a[:m], b[:m])[0, 1]) < 5 * se


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_error_feedback_loses_nothing_over_steps(lane_bits):
    """sum(sent) = sum(gradients) - residual after every step, and the residual stays below
    one unit: a value too small for the lane is sent once it has built up."""
    rng = np.random.default_rng(9)
    grads = (rng.standard_normal((50, 256)) * 0.1).astype(np.float32)
    grads[:, :8] = 1e-4  # far below one unit of an 8-bit lane: only feedback carries them
    residual = np.zeros(256, np.float32)
    sent = np.zeros(256, np.float64)
    for step, g in enumerate(grads):
        shift = quant_shift(_exponent(g + residual), 1, lane_bits)
        q = quantize_with_feedback(g, residual, shift, lane_bits,
                                   rounding_noise(0, 0, step, g.shape))
        sent += q.astype(np.float64) * 2.0 ** -shift
        assert np.abs(residual).max() < 2.0 ** -shift
        drift = np.abs(sent + residual - grads[:step + 1].astype(np.float64).sum(axis=0))
        assert drift.max() < 1e-5 * (step + 1)  # float32 rounding of g + residual only
    assert np.allclose(sent[:8], 50 * 1e-4, atol=2.0 ** -shift)
