"""Precision: the smallest difference a float format resolves at a given magnitude."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import check_positive, check_positive_int

__all__ = ["FORMAT_BITS", "precision_eps"]

_FLOAT64_TINY = float(np.finfo(np.float64).tiny)  # smallest normal float64, 2.2e-308

#: Significant bits (mantissa + implicit bit) of the float formats.
FORMAT_BITS: dict[str, int] = {
    "float64": 53, "fp64": 53, "double": 53,
    "float32": 24, "fp32": 24, "float": 24, "single": 24,
    "tf32": 11,
    "float16": 11, "fp16": 11, "half": 11,
    "bfloat16": 8, "bf16": 8,
}


#: The most significant bits a float format has (IEEE binary128: 112 stored + 1 implicit).
MAX_BITS = 113


def _format_bits(dtype_or_bits) -> int:
    if dtype_or_bits is None:  # np.dtype(None) is float64: a silent default nobody asked for
        raise TypeError("dtype_or_bits: expected a dtype, a format name or an int of bits, got None")
    if isinstance(dtype_or_bits, bool):
        raise TypeError("dtype_or_bits: expected a dtype, a format name or an int of bits, got bool")
    if isinstance(dtype_or_bits, (numbers.Real, np.floating)) and not isinstance(
            dtype_or_bits, (numbers.Integral, np.integer)):  # 2.5 or 24.0: no format, no bits
        raise TypeError("dtype_or_bits: expected a dtype, a format name or an int of bits, got "
                        f"{type(dtype_or_bits).__name__} {dtype_or_bits!r}")
    if isinstance(dtype_or_bits, (numbers.Integral, np.integer)):
        bits = check_positive_int(dtype_or_bits, "dtype_or_bits")
        if bits > MAX_BITS:
            raise ValueError(
                f"dtype_or_bits: {bits} significant bits is more than any float format has "
                f"(binary128 has {MAX_BITS}); pass the format's significant bits (float32 24, "
                "bfloat16 8, float16 11, float64 53), not a vocabulary size or a bit width"
            )
        return bits
    if isinstance(dtype_or_bits, str):
        key = dtype_or_bits
    else:
        try:
            key = np.dtype(dtype_or_bits).name
        except TypeError:
            key = str(dtype_or_bits)  # e.g. torch.float32 -> "torch.float32" (no torch import)
    key = key.strip().lower().replace("torch.", "").replace("numpy.", "").replace("np.", "")
    if key not in FORMAT_BITS:
        raise ValueError(
            f"dtype_or_bits: unknown float format {dtype_or_bits!r}; expected an int of "
            f"significant bits or one of {sorted(FORMAT_BITS)}"
        )
    return FORMAT_BITS[key]


def precision_eps(radius, dtype_or_bits) -> float:
    """The precision ``eps = radius * 2**-bits`` of a float format at magnitude ``radius``.

    Parameters
    ----------
    radius : float
        The largest coordinate magnitude (the paper's ``r_inf``), > 0.
    dtype_or_bits : int, str, numpy dtype or torch dtype
        Significant bits (mantissa plus the implicit bit), or a format: float32 24, bfloat16 8,
        float16 11, float64 53 (names as in :data:`FORMAT_BITS`; ``torch.float32`` is read by
        name, torch is never imported).

    Returns
    -------
    float
        ``eps`` in the units of ``radius``.

    Raises
    ------
    TypeError, ValueError
        ``radius <= 0``, non-finite, an unknown format, bits < 1 or > 113 (binary128's, the
        most of any float format), or an ``eps`` below float64's
        normal range (``radius * 2**-bits < 2.2e-308``: it would lose digits or round to 0).

    Notes
    -----
    The paper's convention ``eps = r_inf 2^-11`` (docs/theory.md, section 2 "Supports and precision") is ``bits=11``. With
    ``p`` significant bits the spacing of floats near ``r`` is between ``r 2^-p`` and
    ``r 2^(1-p)``; ``r 2^-p`` is the smaller (so the count it gives is the larger, conservative).

    Examples
    --------
    >>> precision_eps(2.0, 11) == 2.0 / 2048
    True
    >>> precision_eps(1.0, "bfloat16")
    0.00390625
    """
    r = check_positive(radius, "radius")
    bits = _format_bits(dtype_or_bits)
    eps = math.ldexp(r, -bits)  # exact (a power of two), unless it leaves the normal range
    if not eps >= _FLOAT64_TINY:
        raise ValueError(
            f"radius, dtype_or_bits: radius * 2**-{bits} = {eps:.3g} underflows float64's normal "
            f"range (radius {r:.3g}); rescale the support or use fewer bits"
        )
    return eps
