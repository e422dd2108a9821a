"""Thread limits: the one home of "run this block on one BLAS thread"."""

from __future__ import annotations

import contextlib

__all__ = ["single_blas_thread"]


def single_blas_thread():
    """A context manager under which numpy's BLAS uses one thread.

    For loops of small products (a few MFLOP each: the rare-event sampler's moves, per-length
    fits): on a shared machine handing them to a thread pool costs more than it saves (measured
    on 2 busy cores: a (256, 64) x (64, 40) product took 22 ms threaded, 0.07 ms on one thread;
    a (256, 576) x (576, 2000) float32 product 69 ms against 17 ms). Parallelism then comes from
    running independent tasks side by side (:mod:`embgeom.parallel`).

    Returns
    -------
    context manager
        ``threadpoolctl.threadpool_limits(limits=1, user_api="blas")``, or a
        ``contextlib.nullcontext()`` where threadpoolctl (a dependency of scikit-learn) is not
        installed. The previous limits come back on exit.

    Examples
    --------
    >>> import numpy as np
    >>> with single_blas_thread():
    ...     x = np.ones((4, 4)) @ np.ones((4, 4))
    >>> float(x[0, 0])
    4.0
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
