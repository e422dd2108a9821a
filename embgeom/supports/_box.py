"""The box ``{x : lower <= R x <= upper}`` (axis-aligned or principal axes)."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from .._special import _log_kappa, log1p_ratio, log_binomial_row, log_elementary_symmetric
from .._validation import check_array, check_positive, check_probability, check_seed
from ._base import (
    BoxRegion,
    Support,
    as_real_points,
    check_scale_factor,
    normalise,
    refuse_degenerate,
    scale_lengths,
    trim,
    unscale,
    vector_norm,
)
from ._volumetric import circumball_terms

__all__ = ["Box"]


def _check_rotation(rotation, d):
    R = check_array(as_real_points(rotation, "rotation"), "rotation", ndim=2, shape=(d, d))
    if not np.allclose(R @ R.T, np.eye(d), atol=1e-8):
        raise ValueError("rotation: rows must be orthonormal (R R^T = I)")
    return R


def box_terms(extents: np.ndarray, rotation, eps: float) -> dict:
    """Rigorous bounds (nats) for a box with side lengths ``extents`` and rows ``rotation``."""
    d = extents.shape[0]
    out = {}
    # every ratio a / eps is taken in logs: 1e30 / 1e-300 overflows
    log_a = np.log(extents)
    log_eps = math.log(eps)
    if rotation is None:
        out["vinf_box"] = float(np.sum(log1p_ratio(extents, eps)))
        return out
    R = np.asarray(rotation, dtype=np.float64)
    # Vinf: the model-axis cube Q(eps) seen in the box's frame fits in a box of half-sides
    # eps/2 ||R_i||_1, so S + Q(eps) fits in the box with sides a_i + eps ||R_i||_1
    out["vinf_box_rotated"] = float(np.sum(np.logaddexp(log_a - log_eps, np.log(np.abs(R).sum(axis=1)))))
    # V2: Steiner formula, vol(box + B(rho)) = sum_j e_j(a) kappa_{d-j} rho^{d-j}
    j = np.arange(d + 1)
    log_rho = log_eps - math.log(2.0)
    log_e = log_elementary_symmetric(log_a - log_rho)
    out["v2_box_steiner"] = float(special.logsumexp(log_e + _log_kappa(d - j)) - _log_kappa(d))
    log_rho_p_eps = math.log(0.5 * math.sqrt(d))  # rho' / eps, rho' = sqrt(d) eps / 2
    log_e2 = log_elementary_symmetric(log_a - log_eps)
    # Vinf exact as a zonotope: box + Q(eps) has generators a_i R_i and eps e_j; its volume is
    # sum over d-subsets of |det|, i.e. sum_k sum_{|A|=k,|I|=k} prod_A (a_i/eps) |det R_{A,I}|
    # (times eps^d); Cauchy-Schwarz and Cauchy-Binet (sum_I det^2 R_{A,I} = 1, orthonormal rows)
    # bound the inner sum by sqrt(C(d,k))
    out["vinf_box_zonotope"] = float(special.logsumexp(log_e2 + 0.5 * log_binomial_row(d)))
    out["vinf_box_steiner"] = float(special.logsumexp(
        log_e2 + _log_kappa(d - j) + (d - j) * log_rho_p_eps))
    return out


class Box(Support):
    """The box ``{x : lower <= R x <= upper}`` (``R = I``: axis-aligned).

    Fit with ``Box().fit(X)`` (``Box(rotation="pca").fit(X)`` for a principal-axes box); build a
    ready box with :meth:`Box.from_params`.

    Parameters
    ----------
    rotation : None, "pca", or array_like of float, shape (d, d)
        ``None``: axis-aligned. ``"pca"``: rows of ``rotation_`` are the principal axes of the
        (kept) points, in decreasing variance. A matrix: its rows are the box axes and must be
        orthonormal.
    quantile : float in (0, 1], default 1.0
        Robust fit: drop the points with the largest ``max_k |y_k - median_k| / MAD_k`` (in the
        box's coordinates) before taking min/max.
    min_width : float, optional
        A side of zero width makes the volume zero (``log_volume = -inf``), which the bounds cannot
        use; by default the fit raises ``ValueError``. With ``min_width=w`` such sides are widened
        symmetrically to width ``w``, and the widened axes are recorded in ``widened_``.

    Attributes
    ----------
    lower_, upper_ : ndarray of float64, shape (d,)
    rotation_ : ndarray of float64, shape (d, d), or None
        Rows are the box axes.
    widened_ : list of int
        Axes widened to ``min_width``.
    n_features_in_, feature_names_in_, n_samples_, n_fit_, n_dropped_, quantile_, solver_, fit_seconds_, offset_
        See :class:`Support`.

    Notes
    -----
    ``log_volume = sum_k log(upper_k - lower_k)`` (nats); a rotation preserves volume. The
    paper's box refinement ``log P <= sum_k log(1 + a_k / eps)`` uses the extents
    ``a_k = upper_k - lower_k`` (docs/theory.md, section 4.2).

    Examples
    --------
    >>> import numpy as np
    >>> box = Box.from_params(np.zeros(2), np.ones(2))
    >>> round(box.log_volume, 12)
    0.0
    """

    shape = "box"

    def __init__(self, rotation=None, *, quantile=1.0, min_width=None):
        self.rotation = rotation
        self.quantile = quantile
        self.min_width = min_width

    @classmethod
    def from_params(cls, lower, upper, rotation=None) -> "Box":
        """A ready box ``{x : lower <= R x <= upper}`` (no data).

        Parameters
        ----------
        lower, upper : array_like of float, shape (d,)
            Bounds in the box's own coordinates ``y = R x``; ``upper > lower`` everywhere.
        rotation : array_like of float, shape (d, d), or None
            Orthonormal rows (the box axes); ``None``: axis-aligned.

        Returns
        -------
        Box
            Fitted state set (``solver_ = "given"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            ``upper <= lower`` somewhere, shapes that differ, a rotation that is a string or
            not orthonormal, NaN/inf.
        """
        lo = check_array(as_real_points(lower, "lower"), "lower", ndim=1)
        hi = check_array(as_real_points(upper, "upper"), "upper", ndim=1, shape=(lo.shape[0],))
        if not np.all(hi > lo):
            bad = np.flatnonzero(~(hi > lo))
            raise ValueError(f"upper must exceed lower in every coordinate; fails at {bad[:10].tolist()}")
        with np.errstate(over="ignore"):
            too_wide = not np.all(np.isfinite(hi - lo))
        if too_wide:
            raise ValueError("upper - lower: the side lengths exceed the float64 range (about 1.8e308)")
        R = None
        if rotation is not None:
            if isinstance(rotation, str):
                raise ValueError("rotation='pca' is a fit option; Box.from_params needs a (d, d) matrix or None")
            R = _check_rotation(rotation, lo.shape[0])
        box = cls(rotation=R)
        box._set(lo, hi, R, [])
        box._record_given(lo.shape[0])
        return box

    def _set(self, lo, hi, R, widened):
        self.lower_ = np.asarray(lo, dtype=np.float64)
        self.upper_ = np.asarray(hi, dtype=np.float64)
        self.rotation_ = R
        self.widened_ = list(widened)

    def _coords(self, X):
        return X if self.rotation_ is None else X @ self.rotation_.T

    def fit(self, X, y=None):
        """Fit the min/max box of the hidden states.

        Parameters
        ----------
        X : array_like of float, shape (N, d)
            float32/float64; integers are converted to float64. A DataFrame's column
            names become ``feature_names_in_``.
        y : None
            Ignored.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``X`` not a real array (float16, booleans, text refused; complex numbers raise
            ``ComplexDataError``, also a ``ValueError``).
        ValueError
            NaN/inf, N < 2, bad ``quantile``/``rotation``, degenerate data (all points
            coincide, or they lie in a proper affine subspace so that a side has zero width)
            without ``min_width``, a ``min_width`` below the rounding of the coordinates, or a
            box built with :meth:`from_params`. Collinear points off the coordinate axes give
            an axis-aligned box of positive volume (a correct answer).

        Notes
        -----
        The fit runs on ``X 2^-k`` (largest entry in ``[0.5, 1)``) and maps the bounds back
        exactly: ``X`` at scale ``1e-160`` or ``1e160`` gives the box at scale 1 times the scale.
        """
        H, t0 = self._start_fit(X)
        q = check_probability(self.quantile, "quantile")
        d = H.shape[1]
        H, k = normalise(H)  # fit at unit scale; the bounds are mapped back exactly
        R = None
        if isinstance(self.rotation, str):
            if self.rotation != "pca":
                raise ValueError(f"rotation: expected None, 'pca' or a (d, d) matrix, got {self.rotation!r}")
            Hc = H - H.mean(axis=0)
            # principal axes: right singular vectors, decreasing variance
            _, _, Vt = np.linalg.svd(Hc, full_matrices=False)  # thin: U would be (N, N)
            if Vt.shape[0] < d:  # N < d: complete the basis with the null space
                from scipy.linalg import null_space

                Vt = np.vstack([Vt, null_space(Vt).T])
            R = np.ascontiguousarray(Vt)
        elif self.rotation is not None:
            R = _check_rotation(self.rotation, d)
        Y = H if R is None else H @ R.T
        med = np.median(Y, axis=0)
        mad = np.median(np.abs(Y - med), axis=0)
        mad = np.where(mad > 0, mad, 1.0)
        Yk, _ = trim(Y, (np.abs(Y - med) / mad).max(axis=1), q)
        lo, hi = Yk.min(axis=0), Yk.max(axis=0)
        widened = []
        # axis-aligned: min and max are exact, a zero width is exactly zero. Rotated: widths at
        # the rounding level of the product H R^T (e.g. a PCA axis off the data's affine hull)
        # count as zero.
        floor = 0.0 if R is None else 64 * np.finfo(np.float64).eps * float(np.abs(Yk).max())
        zero = np.flatnonzero(~(hi - lo > floor))
        lo, hi = unscale(lo, k, "lower bounds"), unscale(hi, k, "upper bounds")
        if self.min_width is not None:  # checked whether or not a side needs it
            check_positive(self.min_width, "min_width")
        if zero.size:
            if self.min_width is None:
                what = (f"all {Yk.shape[0]} points coincide" if not np.any(Yk != Yk[0]) else
                        f"the box has zero width along {zero.size} axis/axes (first "
                        f"{zero[:10].tolist()}): the points lie in a proper affine subspace")
                refuse_degenerate(
                    "box", what, "its volume would be 0. Pass min_width=w to widen those sides to "
                    "w explicitly")
            w = check_positive(self.min_width, "min_width")
            mid = 0.5 * lo[zero] + 0.5 * hi[zero]
            lo[zero], hi[zero] = mid - 0.5 * w, mid + 0.5 * w
            if not np.all(hi[zero] > lo[zero]) or not np.all(np.isfinite(hi[zero] - lo[zero])):
                raise ValueError(
                    f"min_width: {w:g} is below the rounding of the coordinates ({float(np.abs(mid).max()):.3g}) "
                    "along the flat axes (or beyond the float64 range): mid +- w/2 gives no width; "
                    "pass a larger min_width"
                )
            widened = zero.tolist()
        with np.errstate(over="ignore"):
            too_wide = not np.all(np.isfinite(hi - lo))
        if too_wide:
            raise ValueError("X: the box's side lengths exceed the float64 range; rescale X")
        self._set(lo, hi, R, widened)
        self.n_features_in_ = d
        self._record_fit(H.shape[0], Yk.shape[0], q, "closed_form", t0)
        return self

    @property
    def log_volume(self) -> float:
        """``sum_k log(upper_k - lower_k)`` in nats."""
        self._check_fitted()
        return float(np.sum(np.log(self.upper_ - self.lower_)))

    @property
    def extents_(self) -> np.ndarray:
        """Side lengths ``upper_ - lower_``, shape (d,)."""
        self._check_fitted()
        return self.upper_ - self.lower_

    def _gauge(self, X):
        Y = self._coords(X)
        mid = 0.5 * self.lower_ + 0.5 * self.upper_  # no overflow near the float64 limit
        half = 0.5 * self.upper_ - 0.5 * self.lower_
        with np.errstate(over="ignore"):
            return (np.abs(Y - mid) / half).max(axis=1)

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the box.

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)
            Uniform in the box's coordinates, mapped back by ``x = R^T y``.

        Raises
        ------
        TypeError, ValueError
            Bad ``n`` or ``seed``; ``NotFittedError`` before a fit.
        """
        n = self._check_sample_args(n)
        rng = check_seed(seed)
        Y = self.lower_ + (self.upper_ - self.lower_) * rng.uniform(size=(n, self.dim))
        return Y if self.rotation_ is None else Y @ self.rotation_

    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(box, eps)`` (nats), by name.

        Parameters
        ----------
        eps : float
            Precision, > 0.

        Returns
        -------
        dict
            ``paper = sum_k log(1 + a_k/eps)`` (docs/theory.md 4.2; rigorous, equal to ``vinf_box``, for an
            axis-aligned box). A rotated box adds ``vinf_box_rotated``
            ``sum_k log(a_k/eps + ||R_k||_1)``, ``v2_box_steiner`` and ``vinf_box_steiner``
            (Steiner formula), ``vinf_box_zonotope`` (Cauchy-Binet) and the circumscribed ball's
            ``v2_ball_circumball``, ``vinf_steiner_circumball``.

        Raises
        ------
        ValueError, TypeError
            ``eps <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        eps = check_positive(eps, "eps")
        a = self.upper_ - self.lower_
        out = {"paper": float(np.sum(log1p_ratio(a, eps)))}
        out.update(box_terms(a, self.rotation_, eps))
        if self.rotation_ is not None:
            # the box lies in the ball of radius |a|/2 around its centre
            out.update(circumball_terms(a.size, 0.5 * vector_norm(a), eps, "_circumball"))
        return out

    def lp_region(self) -> BoxRegion:
        """``BoxRegion(lower_, upper_, rotation_)``: the box is exactly its linear constraints."""
        self._check_fitted()
        return BoxRegion(self.lower_, self.upper_, self.rotation_)

    def _params(self):
        return {
            "lower": self.lower_,
            "upper": self.upper_,
            "rotation": None if self.rotation_ is None else self.rotation if isinstance(self.rotation, str) else "given",
            "widened": self.widened_,
        }

    @classmethod
    def _from_fit_options(cls, *, center, quantile, solver, **kw):
        if center == "origin":
            raise ValueError("center='origin' is only for the ball (and the cone, always at the origin), not 'box'")
        return cls(quantile=quantile, **kw)

    def scaled(self, factor) -> "Box":
        """The box with the same centre, rotation and axes, every side times ``factor`` (see
        :meth:`Support.scaled`).

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        Box
            A ready set (``solver_ = "given"``) with the same ``rotation_`` and
            ``feature_names_in_``.

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite; bounds that would leave the float64 range, or sides
            so short that ``centre +- factor * half-width`` rounds to one number;
            ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        mid = 0.5 * self.lower_ + 0.5 * self.upper_  # halves first: no overflow near 1.8e308
        half = scale_lengths(0.5 * self.upper_ - 0.5 * self.lower_, s, "half-widths")
        with np.errstate(over="ignore"):
            lo, hi = mid - half, mid + half
            ok = np.all(np.isfinite(hi - lo)) and np.all(hi > lo)
        if not ok:
            raise ValueError(
                f"factor: {s:.3g} times the half-widths gives bounds outside the float64 range or "
                "sides that round to zero width at the box's centre"
            )
        return self._derived(type(self).from_params(lo, hi, self.rotation_))
