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

import warnings

import numba

__all__ = ["njit"]

_CACHE_WARNED = False


def njit(signature, **options):
    """``numba.njit(signature, cache=True, **options)``, without the cache where none is writable.

    Parameters
    ----------
    signature : str or numba signature
        The kernel's explicit signature (eager compilation at decoration).
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

    def decorate(func):
        global _CACHE_WARNED
        try:
            return numba.njit(signature, cache=True, **options)(func)
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
            return numba.njit(signature, cache=False, **options)(func)

    return decorate
