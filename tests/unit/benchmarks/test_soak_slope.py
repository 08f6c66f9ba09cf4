"""The soak's RSS slope and its two standard errors (benchmarks/soak_probe.py): residuals
taken as independent, and correlated over a fault period (Newey-West). RSS moves in steps and
saw-teeth minutes long, so "within noise of 0" must be judged with the second."""

from __future__ import annotations

import random

from benchmarks.soak_probe import slope_per_hour, slope_stderr_correlated

STEP_S, NUM_POINTS, PERIOD_S = 10.0, 180, 240.0  # the soak's sampling, a 30-min window


def _flat_but_correlated(seed: int, phi: float) -> list[tuple[float, float]]:
    """No trend at all; each sample `phi` of the last plus noise (phi 0.95 at 10 s: a
    correlation time of about 200 s, RSS's steps between kills)."""
    rng, value, points = random.Random(seed), 0.0, []
    for i in range(NUM_POINTS):
        value = phi * value + rng.gauss(0.0, 0.1)
        points.append((STEP_S * i, value))
    return points


def _growth_claimed(points, stderr) -> bool:
    slope, _ = slope_per_hour(points)
    return abs(slope) > 2 * stderr


def _claim_rates(phi: float, num_runs: int = 200) -> tuple[float, float]:
    """How often a flat series is called growing: with the independent and the correlated
    error."""
    independent = correlated = 0
    for seed in range(num_runs):
        points = _flat_but_correlated(seed, phi)
        independent += _growth_claimed(points, slope_per_hour(points)[1])
        correlated += _growth_claimed(points, slope_stderr_correlated(points, PERIOD_S))
    return independent / num_runs, correlated / num_runs


def test_correlated_noise_fools_the_independent_error_far_more_than_the_correlated_one():
    independent, correlated = _claim_rates(phi=0.95)
    assert independent > 0.6  # a flat series called growing most of the time
    assert correlated < independent / 1.8


def test_on_independent_noise_both_errors_rarely_call_a_flat_series_growing():
    independent, correlated = _claim_rates(phi=0.0)
    assert independent < 0.12 and correlated < 0.2


def test_a_real_trend_is_found_with_either_error():
    rng = random.Random(1)
    points = [(STEP_S * i, 2.0 * STEP_S * i / 3600 + rng.gauss(0.0, 0.05))
              for i in range(NUM_POINTS)]
    slope, independent = slope_per_hour(points)
    correlated = slope_stderr_correlated(points, PERIOD_S)
    assert abs(slope - 2.0) < 0.1
    assert slope > 10 * max(independent, correlated)
    assert 0.5 < correlated / independent < 2.0


def test_too_few_points_have_no_error():
    assert slope_stderr_correlated([(0.0, 1.0), (10.0, 2.0)], PERIOD_S) == float("inf")
    assert slope_stderr_correlated([(5.0, 1.0)] * 4, PERIOD_S) == float("inf")
