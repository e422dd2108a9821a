"""Argument checks shared by the bounds modules (each names the argument it refuses)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import check_positive, check_positive_int


def _check_eps(eps) -> float:
    return check_positive(eps, "eps")


def _check_vocab(vocab_size) -> int:
    return check_positive_int(vocab_size, "vocab_size", minimum=2)


def _check_rate(rate, vocab_size) -> float:
    """The per-token rate (nats): ``log|V|`` by default, or a positive normal number (a
    subnormal one, below 2.2e-308, has lost its digits and overflows every division)."""
    if rate is None:
        return math.log(vocab_size)
    lam = check_positive(rate, "rate")
    if lam < np.finfo(np.float64).tiny:
        raise ValueError(f"rate: expected nats per token of at least "
                         f"{np.finfo(np.float64).tiny:.3g} (a normal float64), got {lam!r}")
    return lam


def _per_token(log_count, lam: float, what: str, names: str):
    """``log_count / lam`` (nats over nats per token: tokens), refused where it overflows
    float64 instead of returned as ``inf`` (the count itself is finite)."""
    with np.errstate(over="ignore"):
        out = np.asarray(log_count, dtype=np.float64) / lam
    if not np.all(np.isfinite(out[np.isfinite(np.asarray(log_count, dtype=np.float64))])):
        raise ValueError(f"{names}: {what} = {names.replace(' and ', ' / ')} overflows float64 "
                         f"(above 1.8e308 tokens); got rate {lam!r} nats per token")
    return out


def _log_count(m, lp: float, names: str = "m and log_packing", what: str = "m log P"):
    """A log-count in nats, ``m lp``: ``m log P`` (Theorem 4.5's, for ``m`` vectors), or ``n
    log|V|`` (``n`` tokens). ``m``: an int or a float64 array. Refused where it overflows
    float64 instead of returned as ``inf``, as :func:`_per_token` refuses an ``inf`` number of
    tokens (the product of finite numbers is finite); ``names`` and ``what`` name the factors
    and the product in the ValueError."""
    try:
        mm = np.asarray(m, dtype=np.float64)
    except OverflowError:  # a Python int beyond float64 (10**400)
        mm = np.asarray(np.inf)
    with np.errstate(over="ignore"):
        count = mm * lp
    if not np.all(np.isfinite(count)):
        raise ValueError(f"{names}: {what} overflows float64 (above 1.8e308 nats; got {lp!r} "
                         f"nats times {_largest(m)})")
    return count if count.ndim else float(count)


def _largest(m) -> str:
    """The largest of ``m`` (a number or an array) for a message, even beyond float64."""
    big = max(np.asarray(m, dtype=object).flat)
    try:
        return f"{float(big):.3g}"
    except OverflowError:
        return f"an integer of {len(str(abs(int(big))))} digits"


def _check_log_packing(log_packing) -> float:
    if isinstance(log_packing, bool) or not isinstance(log_packing, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"log_packing: expected a real number (nats), got {type(log_packing).__name__}")
    v = float(log_packing)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"log_packing: expected a finite number >= 0 (nats), got {v}")
    return v


def _exact_ints(x, name: str):
    """``(array, big)``: ``np.asarray(x)``, or for Python ints beyond int64 (``10**30``, which
    numpy stores as an object array) their float64 array and ``big=True``, so that callers take
    them instead of refusing them as 'not integers'. An int beyond float64 (``10**400``) is a
    ValueError naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype == object and arr.size and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in arr.flat):
        try:
            return arr.astype(np.float64), True
        except OverflowError:
            raise ValueError(f"{name}: expected integers below 1.8e308 (float64), got "
                             f"{_largest(arr)}") from None
    return arr, False


def _m_array(m) -> np.ndarray:
    arr, big = _exact_ints(m, "m")
    if big:
        if np.any(arr < 1):
            raise ValueError(f"m: expected integers >= 1, got min {arr.min()}")
        return arr
    if arr.size == 0:  # a value problem, not a type one: np.asarray([]) is float64
        raise ValueError(f"m: expected at least one number of prompt vectors (an integer >= 1 "
                         f"or a non-empty array of them), got {m!r}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"m: expected an integer or an array of integers, got {m!r}")
    if np.any(arr < 1):
        raise ValueError(f"m: expected integers >= 1, got min {arr.min()}")
    return arr.astype(np.float64)


