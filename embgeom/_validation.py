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
    "check_int_array",
    "check_seed",
    "seed_sequence",
]


#: torch dtypes below float32, with their significant bits (refused like numpy's float16)
_TORCH_HALF = {"torch.float16": 11, "torch.bfloat16": 8}


def _from_torch(x, name: str, *, integer: bool = False):
    """A torch tensor as a numpy array; half precision refused by name (``.numpy()`` cannot
    even represent bfloat16: torch would say "unsupported ScalarType BFloat16")."""
    dt = str(getattr(x, "dtype", ""))
    if integer and dt in _TORCH_HALF:
        raise TypeError(f"{name}: expected integers, got dtype {dt}")
    if dt in _TORCH_HALF:
        raise TypeError(
            f"{name}: {dt} input is refused ({_TORCH_HALF[dt]} significant bits); cast it to "
            "float32 explicitly (tensor.float()), as embgeom.adapters does for a model run in "
            "half precision"
        )
    return x.detach().cpu().numpy()


def _is_pandas(x) -> bool:
    return type(x).__module__.split(".")[0] == "pandas" and hasattr(x, "to_numpy")


def _from_pandas(x, name: str, kinds: str):
    """A pandas Series/DataFrame as a numpy array, its nullable dtypes handled by name.

    Columns whose dtype kind is in ``kinds`` ("f" for floats, "iu" for integers) are converted
    (``Float64`` -> float64, ``Int64`` -> int64). A missing value (``pd.NA``) is refused in an
    integer array; in a float array it becomes NaN, which the finiteness check then refuses
    with the argument's name. Any other column dtype is refused here by name (never as
    "dtype object"). Plain numpy columns are left to ``numpy.asarray``.
    """
    dtypes = list(x.dtypes) if hasattr(x, "columns") else [getattr(x, "dtype", None)]
    if all(isinstance(d, np.dtype) for d in dtypes):
        return np.asarray(x)
    bad = sorted({str(d) for d in dtypes if getattr(d, "kind", "O") not in kinds})
    if bad:
        want = "real floating-point" if kinds == "f" else "integer"
        raise TypeError(f"{name}: expected {want} columns, got pandas dtype(s) {', '.join(bad)}")
    n_na = int(np.asarray(x.isna()).sum())
    if kinds == "f":
        itemsizes = {getattr(d, "itemsize", 8) for d in dtypes}
        out = np.float32 if itemsizes == {4} else np.float64
        return x.to_numpy(dtype=out, na_value=np.nan)
    if n_na:
        raise ValueError(f"{name}: contains {n_na} missing value(s) (pandas NA)")
    return x.to_numpy(dtype=np.int64)


def _check_ndim_shape(arr: np.ndarray, name: str, ndim, shape) -> None:
    """The one ndim / shape rule of :func:`check_array` and :func:`check_int_array`."""
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
    x : array_like, torch.Tensor or pandas Series/DataFrame
        The input. Must already be real floating point (float32 or float64); integers, booleans,
        complex numbers and float16 are refused (float16 has 11 significant bits: a computation
        of geometry at that precision is not what the caller meant; cast explicitly). The same
        rule holds for torch tensors: ``torch.float16`` and ``torch.bfloat16`` (what a model run
        in half precision returns) are refused by name, never upcast silently; cast with
        ``tensor.float()``. pandas' nullable ``Float64``/``Float32`` columns are accepted and
        converted to float64/float32; a missing value (``pd.NA``) counts as NaN (refused with
        ``finite=True``); nullable integer columns (``Int64``) are refused like numpy integers.
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
        Not an array of real floats, or float16 (numpy or torch) or bfloat16 (torch).
    ValueError
        Wrong ndim or shape, empty, or not finite (pandas NA counts as NaN).

    Examples
    --------
    >>> check_array([[1.0, 2.0]], "H", ndim=2).dtype
    dtype('float64')
    >>> check_array(np.zeros(2, dtype=np.float16), "H")
    Traceback (most recent call last):
    TypeError: H: float16 input is refused (11 significant bits); cast it to float32 or float64 explicitly
    """
    if x is None:
        raise TypeError(f"{name}: expected an array of floats, got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: accept, convert
        x = _from_torch(x, name)
    elif _is_pandas(x):
        x = _from_pandas(x, name, "f")
    arr = as_array(x, name)
    if arr.dtype == np.float16:
        raise TypeError(
            f"{name}: float16 input is refused (11 significant bits); cast it to float32 or "
            "float64 explicitly"
        )
    if arr.dtype.kind not in "f":
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {arr.dtype}")
    _check_ndim_shape(arr, name, ndim, shape)
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    # min and max propagate NaN and reach +-inf: both finite iff every entry is, with no
    # temporary as large as the array (a bool mask of SmolLM2's unembedding: 28M entries)
    if finite and arr.size and not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        bad = int(np.size(arr) - np.isfinite(arr).sum())
        raise ValueError(f"{name}: contains {bad} NaN or infinite value(s)")
    out_dtype = arr.dtype if dtype is None else np.dtype(dtype)
    return np.ascontiguousarray(arr, dtype=out_dtype)


def as_array(x, name: str) -> np.ndarray:
    """``np.asarray(x)``, with numpy's error for ragged nested lists ("setting an array element
    with a sequence") reworded to name the argument.

    Raises
    ------
    ValueError
        ``x`` is a ragged nested sequence (rows of different lengths).
    """
    try:
        return np.asarray(x)
    except ValueError as exc:
        if "inhomogeneous" in str(exc) or "sequence" in str(exc):
            raise ValueError(f"{name}: expected a rectangular array, got nested sequences of "
                             f"different lengths (ragged rows)") from None
        raise


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``os.sysconf``), or None where it cannot tell."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def check_allocation(n_bytes: int, name: str, value, what: str) -> None:
    """Refuse, before allocating, an array larger than this machine's physical memory.

    numpy answers such a request with a ``MemoryError`` after the operating system refuses it, or
    with "Maximum allowed dimension exceeded" past 2**63 bytes, or pages for minutes first; a
    ``ValueError`` naming the argument says what to change.

    Raises
    ------
    ValueError
        ``n_bytes`` above the physical memory (or above 2**62 bytes where it is unknown).
    """
    limit = physical_memory_bytes() or 2**62
    if n_bytes > limit:
        raise ValueError(f"{name}: {value!r} needs {what} of {n_bytes / 2**30:.3g} GiB, more than "
                         f"this machine's {limit / 2**30:.3g} GiB of memory; pass a smaller {name}")


def check_bool(x, name: str, *, optional: bool = False):
    """``x`` as a bool: True or False (numpy's bool too; ``None`` as well with ``optional``),
    else a TypeError naming ``name``. A string such as ``"no"`` is truthy, so ``bool(x)`` would
    read it as True; it is refused."""
    if optional and x is None:
        return None
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False{', or None' if optional else ''}, got "
                        f"{type(x).__name__} {x!r}")
    return bool(x)


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


def check_probability(x, name: str, *, open_left: bool = True, open_right: bool = False) -> float:
    """Return ``x`` as a float in (0, 1] (``[0`` with ``open_left=False``, ``1)`` with
    ``open_right=True``); a value outside gets one message naming the whole interval.

    Raises
    ------
    TypeError
        Not a real number.
    ValueError
        NaN/inf, or outside the interval.
    """
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    v = float(x)
    low_ok = v > 0 or (v == 0 and not open_left)
    high_ok = v < 1 or (v == 1 and not open_right)
    if not (np.isfinite(v) and low_ok and high_ok):
        interval = ("(" if open_left else "[") + "0, 1" + (")" if open_right else "]")
        raise ValueError(f"{name}: expected a number in {interval}, got {v}")
    return v


def _seed_error(seed, exc=None) -> TypeError:
    return TypeError(
        "seed: expected what numpy.random.default_rng accepts (None, an int >= 0, an array of "
        "ints >= 0, a SeedSequence, a BitGenerator or a Generator), got "
        f"{type(seed).__name__} {seed!r}" + (f" ({exc})" if exc else "")
    )


def check_seed(seed) -> np.random.Generator:
    """A ``numpy.random.Generator`` from anything ``numpy.random.default_rng`` accepts.

    This is the one seed rule of embgeom: every public ``seed`` argument that feeds a random draw
    goes through here (or through :func:`seed_sequence` when the draws are split into
    independent streams).

    Parameters
    ----------
    seed : None, int, array_like of int, numpy.random.SeedSequence, BitGenerator or Generator
        ``None``: fresh OS entropy (not reproducible). An int or an array of ints (each >= 0):
        the entropy of a ``SeedSequence``. A ``SeedSequence`` or ``BitGenerator``: wrapped. A
        ``Generator``: returned unchanged (drawing from it advances the caller's stream).

    Returns
    -------
    numpy.random.Generator

    Raises
    ------
    TypeError
        Anything else: a bool, a float (``1.0`` is refused: a seed is an integer), a string.
    ValueError
        A negative int (numpy refuses it too).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    _refuse_non_integer_seed(seed)
    _refuse_negative_seed(seed)
    try:
        return np.random.default_rng(seed)
    except ValueError as exc:
        raise ValueError(f"seed: {exc} (got {seed!r})") from None
    except TypeError as exc:
        raise _seed_error(seed, exc) from None


def _refuse_negative_seed(seed) -> None:
    """A negative int (or an array holding one): the one ValueError of every seed argument."""
    if isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"seed: expected integers >= 0, got {seed!r}")
        return
    if isinstance(seed, (list, tuple, np.ndarray)):
        try:
            vals = [int(v) for v in np.atleast_1d(np.asarray(seed, dtype=object)).ravel()]
        except (TypeError, ValueError):
            return  # not integers: numpy's TypeError, reworded by the caller
        if any(v < 0 for v in vals):
            raise ValueError(f"seed: expected integers >= 0, got {seed!r}")


def _refuse_non_integer_seed(seed) -> None:
    """bools and floats are accepted by numpy in places (``SeedSequence(True)``); not here."""
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.BitGenerator,
                                         np.random.Generator)):
        return
    if isinstance(seed, (bool, np.bool_, str, bytes)):
        raise _seed_error(seed)
    if isinstance(seed, (numbers.Integral, np.integer)):
        return
    arr = np.asarray(seed) if not isinstance(seed, dict) else None
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise _seed_error(seed)


def seed_sequence(seed, *keys: int) -> np.random.SeedSequence:
    """The root ``SeedSequence`` of ``seed`` (extended by ``keys``), for independent streams.

    Use it where a computation splits its draws into streams that must not depend on each other
    (chunks of a Monte Carlo run: ``seed_sequence(seed).spawn(n_chunks)``; one stream per length
    or per target: ``seed_sequence(seed, length)``). Same accepted inputs as :func:`check_seed`.

    Parameters
    ----------
    seed : None, int, array_like of int, SeedSequence, BitGenerator or Generator
        ``None``: fresh OS entropy. An int or array of ints: the entropy. A ``SeedSequence``:
        used as it is. A ``BitGenerator`` / ``Generator``: a child of its own seed sequence
        (``spawn(1)``; as with a draw, the caller's generator is advanced, so two calls give two
        independent streams).
    *keys : int
        Non-negative ints naming a sub-stream. For int and array seeds they are appended to the
        entropy, so ``seed_sequence(s, *keys)`` equals ``SeedSequence([s, *keys])`` and
        ``default_rng(seed_sequence(s, *keys))`` draws the same numbers as
        ``default_rng([s, *keys])``. For the other kinds they extend the ``spawn_key``.

    Returns
    -------
    numpy.random.SeedSequence

    Raises
    ------
    TypeError, ValueError
        As :func:`check_seed`; a key that is not an int >= 0.
    """
    keys = tuple(check_positive_int(k, "keys", minimum=0) for k in keys)
    if isinstance(seed, np.random.Generator):
        seed = seed.bit_generator
    if isinstance(seed, np.random.BitGenerator):
        parent = getattr(seed, "seed_seq", None)
        if not isinstance(parent, np.random.SeedSequence):
            raise _seed_error(seed, "its seed sequence is unknown")
        seed = parent.spawn(1)[0]
    if isinstance(seed, np.random.SeedSequence):
        if not keys:
            return seed
        return np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, *keys),
                                      pool_size=seed.pool_size)
    _refuse_non_integer_seed(seed)
    _refuse_negative_seed(seed)  # the one message, as in check_seed
    if seed is None:
        return np.random.SeedSequence(spawn_key=keys)
    try:
        entropy = [int(v) for v in np.atleast_1d(np.asarray(seed)).tolist()]
        return np.random.SeedSequence(entropy + list(keys))  # == SeedSequence(s) for an int
    except ValueError as exc:
        raise ValueError(f"seed: {exc} (got {seed!r})") from None
    except TypeError as exc:
        raise ValueError(f"seed: {exc} (got {seed!r})") from None


def check_int_array(
    x,
    name: str,
    *,
    ndim: int | tuple[int, ...] | None = None,
    shape: tuple | None = None,
    low: int | None = None,
    high: int | None = None,
    allow_empty: bool = False,
) -> np.ndarray:
    """Validate an array of integers (token ids, lengths, counts) and return it as int64.

    The one integer-array rule of embgeom: integer dtypes only (a float array is refused even
    when its values are whole: ``2.0`` is not a token id), no bools, values in
    ``[low, high)``.

    Parameters
    ----------
    x : array_like of int, torch.Tensor of an integer dtype, or pandas Series/DataFrame
        pandas' nullable ``Int64`` (and other nullable integer) columns are accepted when they
        hold no missing value (``pd.NA`` is refused by name).
    name : str
        The argument's name, used in error messages.
    ndim : int or tuple of int, optional
        Allowed number(s) of dimensions.
    shape : tuple, optional
        Expected shape; ``None`` entries match any length.
    low, high : int, optional
        Every value must satisfy ``low <= v`` and ``v < high`` (``high`` exclusive, as a
        vocabulary size).
    allow_empty : bool, default False

    Returns
    -------
    numpy.ndarray of int64
        C-contiguous.

    Raises
    ------
    TypeError
        ``None``, a non-integer dtype (float, bool, complex, object).
    ValueError
        Wrong ndim or shape, empty, a value outside ``[low, high)``, a missing value (pandas).
    """
    if x is None:
        raise TypeError(f"{name}: expected an array of integers, got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = _from_torch(x, name, integer=True)
    elif _is_pandas(x):
        x = _from_pandas(x, name, "iu")
    arr = np.asarray(x)
    if not allow_empty and arr.size == 0:  # first: np.asarray([]) is float64
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype == np.float64):
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    _check_ndim_shape(arr, name, ndim, shape)
    if arr.size and arr.dtype.kind == "u" and arr.dtype.itemsize >= 8 and int(arr.max()) > 2**63 - 1:
        raise ValueError(f"{name}: values beyond the int64 range")
    out = np.ascontiguousarray(arr, dtype=np.int64)
    if out.size and ((low is not None and int(out.min()) < low)
                     or (high is not None and int(out.max()) >= high)):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(
            f"{name}: values must lie in [{lo}, {hi}), got range [{int(out.min())}, {int(out.max())}]"
        )
    return out
