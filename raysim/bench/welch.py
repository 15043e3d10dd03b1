"""Welch's interval for the difference of two means with unequal variances (no scipy needed).

The difference ``mean(a) - mean(b)`` +- ``t * se``, ``se = sqrt(var(a)/n_a + var(b)/n_b)`` (sample
variances), with Student's t quantile at the Welch–Satterthwaite degrees of freedom
``se**4 / ((var(a)/n_a)**2/(n_a-1) + (var(b)/n_b)**2/(n_b-1))``. The t quantile inverts the t CDF
(the regularized incomplete beta function, Numerical Recipes' continued fraction) by bisection.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    """``a - b``: the difference of means, its interval, and the Welch–Satterthwaite degrees of freedom."""

    difference: float
    low: float
    high: float
    dof: float


def welch(a: list[float], b: list[float], confidence: float = 0.95) -> Difference:
    """The difference of means ``mean(a) - mean(b)`` with its two-sided Welch interval (two values each at least)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs two values in each sample, got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(difference, difference, difference, math.inf)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2, dof) * se
    return Difference(difference, difference - half, difference + half, dof)


def t_quantile(p: float, dof: float) -> float:
    """Student's t quantile: the ``t`` with ``P(T <= t) = p`` at ``dof`` (> 0, not necessarily whole) degrees."""
    if not 0.0 < p < 1.0 or not dof > 0:
        raise ValueError(f"t quantile needs 0 < p < 1 and dof > 0, got p={p}, dof={dof}")
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, dof) < p else (low, middle)
        if high - low <= 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, dof: float) -> float:
    """Student's t CDF: ``1 - I_x(dof/2, 1/2) / 2`` for ``t >= 0``, ``x = dof / (dof + t**2)``."""
    tail = incomplete_beta(dof / (dof + t * t), dof / 2, 0.5) / 2
    return 1.0 - tail if t >= 0 else tail


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (continued fraction, Lentz's method)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only: use the symmetry
        return 1.0 - front * beta_fraction(1.0 - x, b, a) / b
    return front * beta_fraction(x, a, b) / a


def beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return fraction
