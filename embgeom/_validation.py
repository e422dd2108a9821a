"""Input checks shared by every module.

Every public entry point validates its arrays here, once, so that bad input gets one clear
``TypeError``/``ValueError`` naming the argument instead of a silent wrong number deeper down.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "check_array",
    "check_positive",
    "check_positive_int",
    "check_probability",
    "check_seed",
]


def check_array(
    x,
    name: str,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtype=np.float64,
    allow_empty: bool = False,
    finite: bool = True,
    shape: tuple | None = None,
) -> np.ndarray:
    """Validate a floating-point array and return it as a contiguous array of ``dtype``.

    Parameters
    ----------
    x : array_like
        The input. Must already be real floating point (float32 or float64); integers, booleans,
        complex numbers and float16 are refused (float16 has 11 significant bits: a computation
        of geometry at that precision is not what the caller meant; cast explicitly).
    name : str
        The argument's name, used in error messages.
    ndim : int or tuple of int, optional
        Allowed number(s) of dimensions.
    dtype : numpy dtype, default float64
        Output dtype. ``None`` keeps the input's float32/float64.
    allow_empty : bool, default False
        Accept arrays with zero elements.
    finite : bool, default True
        Refuse NaN and +-inf.
    shape : tuple, optional
        Expected shape; ``None`` entries match any length.

    Returns
    -------
    numpy.ndarray
        C-contiguous copy or view of ``x`` with the requested dtype.

    Raises
    ------
    TypeError
        Not an array of real floats, or float16.
    ValueError
        Wrong ndim or shape, empty, or not finite.
    """
    if x is None:
        raise TypeError(f"{name}: expected an array of floats, got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: accept, convert
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == np.float16:
        raise TypeError(
            f"{name}: float16 input is refused (11 significant bits); cast it to float32 or "
            "float64 explicitly"
        )
    if arr.dtype.kind not in "f":
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {arr.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            raise ValueError(
                f"{name}: expected an array with ndim in {allowed}, got shape {arr.shape}"
            )
    if shape is not None:
        if len(shape) != arr.ndim or any(
            s is not None and s != a for s, a in zip(shape, arr.shape)
        ):
            want = tuple("any" if s is None else s for s in shape)
            raise ValueError(f"{name}: expected shape {want}, got {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    if finite and arr.size and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.isfinite(arr).sum())
        raise ValueError(f"{name}: contains {bad} NaN or infinite value(s)")
    out_dtype = arr.dtype if dtype is None else np.dtype(dtype)
    return np.ascontiguousarray(arr, dtype=out_dtype)


def check_positive(x, name: str, *, allow_zero: bool = False) -> float:
    """Return ``x`` as a float after checking it is finite and > 0 (>= 0 with ``allow_zero``).

    Raises
    ------
    TypeError
        Not a real number.
    ValueError
        Not finite, or not positive.
    """
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    v = float(x)
    if not np.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v}")
    if v < 0 or (v == 0 and not allow_zero):
        cmp = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a number {cmp}, got {v}")
    return v


def check_positive_int(x, name: str, *, minimum: int = 1) -> int:
    """Return ``x`` as an int after checking it is an integer >= ``minimum``.

    Raises
    ------
    TypeError
        Not an integer (floats such as ``2.0`` are refused too).
    ValueError
        Smaller than ``minimum``.
    """
    if isinstance(x, bool) or not isinstance(x, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: expected an integer, got {type(x).__name__} {x!r}")
    v = int(x)
    if v < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {v}")
    return v


def check_probability(x, name: str, *, open_left: bool = True) -> float:
    """Return ``x`` as a float in (0, 1] (or [0, 1] with ``open_left=False``).

    Raises
    ------
    TypeError, ValueError
    """
    v = check_positive(x, name, allow_zero=not open_left)
    if v > 1:
        raise ValueError(f"{name}: expected a number in (0, 1], got {v}")
    return v


def check_seed(seed) -> np.random.Generator:
    """A ``numpy.random.Generator`` from ``None``, an int, or a Generator.

    Raises
    ------
    TypeError
        Anything else.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise TypeError(f"seed: expected None, an int or a numpy Generator, got {type(seed).__name__}")
