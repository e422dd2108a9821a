"""The functional front door :func:`fit_support` and the registry of fittable shapes.

Adding a shape: write its module (a :class:`~embgeom.supports._base.Support` subclass) and add
one line to :data:`SHAPES`.
"""

from __future__ import annotations

from ._ball import Ball
from ._base import _CENTERINGS, _SOLVERS, Support, check_choice, check_hidden, feature_names_of
from ._conformal import _check_alpha, calibrate_support, conformal_rank, split_for_calibration
from ._box import Box
from ._cone import Cone
from ._ellipsoid import Ellipsoid
from ._shell import FinalNormShell

__all__ = ["SHAPES", "fit_support"]

#: Shape name -> support class. ``fit_support(H, name)`` builds the class's estimator with
#: ``cls._from_fit_options`` and fits it; ``"final_norm"`` is listed so that its name is known,
#: and refuses to be fitted (its set comes from the model, see ``support_from_final_norm``).
SHAPES: dict[str, type[Support]] = {
    "ball": Ball,
    "ellipsoid": Ellipsoid,
    "cone": Cone,
    "box": Box,
    "final_norm": FinalNormShell,
}


def _fit_named(est, H):
    """``est.fit(H)``, its errors naming ``H`` (this function's argument), not the
    estimator's ``X``."""
    try:
        return est.fit(H)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("X: "):
            raise type(exc)("H: " + msg[3:]) from None
        raise


def fit_support(H, shape, *, center="free", quantile=1.0, solver="auto", calibrate=None,
                calibration_fraction=0.5, seed=0, **kw) -> Support:
    """Fit the smallest support of a given shape that holds the hidden states.

    Parameters
    ----------
    H : array_like of float, shape (N, d)
        Hidden states (N >= 2, finite); integers are converted to float64 (float16 refused). A
        DataFrame's column names become the support's ``feature_names_in_``.
    shape : {"ball", "ellipsoid", "cone", "box"}
        The shape to fit (a key of :data:`SHAPES`). The final-norm shell is not a fit: see
        :func:`support_from_final_norm`.
    center : {"free", "origin"}, default "free"
        Ball: free centre (minimum enclosing ball) or origin-centred (``r = max |h_i|``). Cones
        always have their apex at the origin (either value accepted). Ellipsoid and box have a
        free centre: ``"origin"`` raises ``ValueError``.
    quantile : float in (0, 1], default 1.0
        Fraction of points kept; the most outlying are trimmed first (per shape: distance to
        the coordinatewise median for the ball, Mahalanobis distance for the ellipsoid, angle to
        the mean direction for the cone, MAD-scaled L-infinity distance to the median for the
        box). ``n_dropped_`` and ``n_fit_`` record it.
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        See each class.
    calibrate : float in (0, 1), optional
        Split-conformal calibration at miscoverage ``alpha = calibrate``: the shape is fitted on
        a random ``1 - calibration_fraction`` of the rows and scaled about its centre by the
        ``ceil((n + 1)(1 - alpha))``-th smallest gauge of the other ``n`` rows
        (:func:`embgeom.supports.calibrate_support`), so that a fresh point drawn like the rows
        of ``H`` is inside with probability ``>= 1 - alpha`` (Vovk et al. 2005; Angelopoulos and
        Bates 2021). The result is a ready set (``calibration_`` records the level, the split
        and the scale). ``None``: no calibration, the smallest set holding the (kept) rows.
    calibration_fraction : float in (0, 1), default 0.5
        Share of the rows used for calibration (with ``calibrate``).
    seed : seed, default 0
        Seed of the random split (with ``calibrate``): the calibration rows are the first
        ``round(calibration_fraction N)`` of ``numpy.random.default_rng(seed).permutation(N)``.
    **kw
        Further options of the class (``tol``, ``rotation``, ``ridge``, ``min_width``,
        ``max_iter``, ``progress``, ...).

    Returns
    -------
    Support
        The fitted :class:`Ball`, :class:`Ellipsoid`, :class:`Cone` or :class:`Box` (with
        ``calibrate``: the calibrated ready set of that class).

    Raises
    ------
    ValueError
        Unknown shape, a bad value of an option, or bad ``H`` (NaN/inf, N < 2, ...); with
        ``calibrate``, a calibration split too small for the level (``n >= 1/alpha - 1``
        points are needed).
    TypeError
        ``H`` not a real array (float16, booleans, complex numbers refused); a keyword that is
        not an option of the shape's class (named, with the options it takes).

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).standard_normal((300, 4))
    >>> S = fit_support(H, "ellipsoid")
    >>> bool(S.contains(H).all())
    True
    """
    if not isinstance(shape, str) or shape not in SHAPES:
        raise ValueError(f"shape: expected one of {tuple(SHAPES)}, got {shape!r}")
    check_choice(center, "center", _CENTERINGS)
    check_choice(solver, "solver", _SOLVERS)
    cls = SHAPES[shape]
    known = set(cls._get_param_names()) - {"centering", "quantile", "solver"}
    unknown = sorted(set(kw) - known)
    if unknown:
        raise TypeError(f"fit_support: {', '.join(map(repr, unknown))} is not an option of "
                        f"shape={shape!r} ({cls.__name__}); its further options are "
                        f"{sorted(known)}")
    est = cls._from_fit_options(center=center, quantile=quantile, solver=solver, **kw)
    if calibrate is None:
        return _fit_named(est, H)
    calibrate = _check_alpha(calibrate, "calibrate")
    names = feature_names_of(H)
    H = check_hidden(H, "H")
    fit_idx, cal_idx = split_for_calibration(H.shape[0], calibration_fraction, seed)
    try:  # a split too small for the level fails before the fit
        conformal_rank(cal_idx.size, calibrate)
    except ValueError as exc:
        raise ValueError(f"calibrate={calibrate}, calibration_fraction={calibration_fraction} "
                         f"({cal_idx.size} of {H.shape[0]} rows): {exc}") from None
    _fit_named(est, H[fit_idx])
    out = calibrate_support(est, H[cal_idx], calibrate)
    out.calibration_["calibration_fraction"] = float(calibration_fraction)
    out.calibration_["n_fit"] = int(fit_idx.size)
    # the fit's own record, so to_dict() says how the set was made (the rows given, the rows
    # the shape was fitted on after trimming, the solver, then the conformal scaling)
    out.n_samples_ = int(H.shape[0])
    out.n_fit_ = est.n_fit_
    out.n_dropped_ = est.n_dropped_
    out.quantile_ = est.quantile_
    out.solver_ = f"{est.solver_} + conformal"
    out.fit_seconds_ = est.fit_seconds_
    if names is not None:  # fitted and calibrated on the rows as arrays; the columns were named
        out.feature_names_in_ = names
    return out
