"""The one numba compile policy of embgeom: typed, eager, cached where a cache can be written.

Every kernel module (:mod:`embgeom._kernels`, :mod:`embgeom._rare_kernels`) decorates with
:func:`njit`: ``numba.njit(signature, cache=True, **options)``, an explicit signature so the
kernel compiles once at import for the types the callers pass (a wrong dtype is refused, not
recompiled). numba's ``cache=True`` raises "cannot cache function ...: no locator available" at
decoration time when none of its cache locations can be written (``NUMBA_CACHE_DIR``, the
``__pycache__`` folder next to the source, the user cache folder): a read-only install on a
machine without a writable home. There the kernels are compiled in memory instead, with one
``RuntimeWarning`` for the whole package, and everything works, only each import compiles again
(a few seconds). Any other numba error is raised as it is.
"""

from __future__ import annotations

import itertools
import warnings

import numba

__all__ = ["njit"]

_CACHE_WARNED = False


def _with_readonly(signature, readonly: tuple) -> list:
    """The signature and its variants with any subset of the ``readonly`` arguments read-only
    (numba types a read-only array, e.g. a memory-mapped file or one from Ray's object store,
    as its own type: a kernel compiled for writable arrays refuses it)."""
    if not readonly:
        return [signature]
    from numba.core import sigutils

    args, ret = sigutils.normalize_signature(signature)
    ret = numba.types.none if ret is None else ret
    sigs = []
    for flags in itertools.product((False, True), repeat=len(readonly)):
        a = list(args)
        for i, ro in zip(readonly, flags):
            if ro:
                a[i] = a[i].copy(readonly=True)
        sigs.append(ret(*a))
    return sigs


def njit(signature, *, readonly: tuple = (), **options):
    """``numba.njit(signature, cache=True, **options)``, without the cache where none is writable.

    Parameters
    ----------
    signature : str or numba signature
        The kernel's explicit signature (eager compilation at decoration).
    readonly : tuple of int, default ()
        Positions of array arguments the kernel only reads: it is also compiled for read-only
        arrays there (memory-mapped inputs, Ray's object store), so they need no copy.
    **options
        Other ``numba.njit`` options (``nogil``, ``fastmath``, ...); not ``cache``, which this
        policy sets.

    Returns
    -------
    callable
        A decorator returning the compiled dispatcher.

    Raises
    ------
    TypeError
        ``cache`` among ``options``.
    RuntimeError
        A numba failure other than "cannot cache" (e.g. a typing error).

    Warns
    -----
    RuntimeWarning
        Once per process, when no cache location is writable.
    """
    if "cache" in options:
        raise TypeError("cache: set by embgeom._numba.njit (cached where a location is writable)")

    sigs = _with_readonly(signature, tuple(readonly))

    def decorate(func):
        global _CACHE_WARNED
        try:
            return numba.njit(sigs, cache=True, **options)(func)
        except RuntimeError as exc:
            if "cannot cache" not in str(exc):
                raise
            if not _CACHE_WARNED:
                _CACHE_WARNED = True
                warnings.warn(
                    f"embgeom: numba found no writable cache location ({exc}); the kernels are "
                    "compiled without an on-disk cache, so each import compiles them again. Set "
                    "NUMBA_CACHE_DIR to a writable folder to cache them.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return numba.njit(sigs, cache=False, **options)(func)

    return decorate
