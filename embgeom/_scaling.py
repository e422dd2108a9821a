"""Power-of-two scaling: the one helper for bringing arrays to unit scale exactly.

Multiplying by a power of two changes no significant bit (outside the subnormal range), so a
computation run on ``x / 2^k`` and scaled back gives the figures of the unscaled one, while its
intermediate products stay inside float32's or HiGHS's range.
"""

from __future__ import annotations

import math

__all__ = ["nearest_power_of_two_exponent", "frexp_exponent"]


def nearest_power_of_two_exponent(x: float) -> int:
    """``k = round(log2 x)`` for a finite ``x > 0``, else 0: ``x / 2^k`` lies in [0.71, 1.41].

    Parameters
    ----------
    x : float
        A size (a norm, a largest entry).

    Returns
    -------
    int

    Examples
    --------
    >>> nearest_power_of_two_exponent(1e20), nearest_power_of_two_exponent(0.0)
    (66, 0)
    """
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        return 0
    return int(round(math.log2(x)))


def frexp_exponent(x: float) -> int:
    """``e`` with ``x / 2^e`` in [0.5, 1) for a finite ``x > 0`` (``math.frexp``), else 0."""
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        return 0
    return math.frexp(x)[1]
