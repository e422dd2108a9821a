"""The final-norm shell: the outputs of the final RMSNorm/LayerNorm, a support with no fit."""

from __future__ import annotations

import math

import numpy as np

from .._special import _log_kappa, log1p_ratio, log_sphere_area, log_unit_ball_volume
from .._validation import check_array, check_bool, check_positive, check_seed
from ._base import CONTAINS_TOL, Support, as_real_points, check_scale_factor, scale_lengths
from ._ellipsoid import Ellipsoid
from ._volumetric import (
    circumball_terms,
    ellipsoid_projection_terms,
    ellipsoid_terms,
    log_enclosing_ellipsoid_ratio,
)

__all__ = ["FinalNormShell", "support_from_final_norm"]


class FinalNormShell(Support):
    """The set of outputs of the final RMSNorm/LayerNorm: a data-free, architecture-certified
    support. Build it with :func:`support_from_final_norm` (or :meth:`FinalNormShell.from_params`).

    As an estimator, ``fit(X)`` reads nothing from ``X`` but its width: the set is given by the
    parameters (the norm's kind, gain, bias and eps); ``gain=None`` is the unit gain.

    Derivation (``h`` the output, ``g`` the effective gain, ``b`` the bias, ``eps`` the norm's
    epsilon, ``y_i = (h_i - b_i) / g_i``):

    - RMSNorm ``h = g * x / sqrt(ms + eps)``, ``ms = mean(x^2)``:
      ``sum_i y_i^2 = sum_i x_i^2 / (ms + eps) = d ms / (ms + eps) <= d``, with equality up to the
      factor ``ms / (ms + eps)``, which is ``1 - eps/ms``: 1 to float precision for real
      residual streams (``ms >> eps``). So ``h`` lies on the ellipsoidal shell
      ``{h : sum_i (h_i / g_i)^2 = d}`` (``b = 0``), semi-axes ``sqrt(d) |g_i|``.
    - LayerNorm ``h = g * (x - mu) / sqrt(var + eps) + b``: ``sum_i y_i = 0`` and
      ``sum_i y_i^2 = d var / (var + eps) <= d``: the same shell, shifted by ``b`` and cut by the
      hyperplane ``sum_i y_i = 0`` (a (d-2)-dimensional ellipsoid).

    Strictly the image over all inputs is the solid ``sum y_i^2 <= d`` (``ms`` can be as small as
    one likes); the shell is where the hidden states are in practice.

    Parameters
    ----------
    kind : {"rmsnorm", "layernorm"}, default "rmsnorm"
    gain : array_like of float, shape (d,), optional
        The effective gain ``g`` (Gemma's ``1 + w`` already applied); ``None``: all ones, with
        ``d`` taken from ``X`` in ``fit``. No zero entries.
    bias : array_like of float, shape (d,), optional
        The norm's bias ``b`` (LayerNorm); ``None``: no bias.
    eps : float, default 0.0
        The norm's epsilon (>= 0); recorded, it does not change the set (see below).

    Attributes
    ----------
    kind_ : {"rmsnorm", "layernorm"}
    gain_ : ndarray of float64, shape (d,)
        Effective gain (Gemma's ``1 + w`` already applied by the adapter).
    bias_ : ndarray of float64, shape (d,), or None
    radius_ : float
        ``sqrt(d)``: the radius of the shell in the normalised coordinates ``y``.
    eps_ : float
    n_features_in_, feature_names_in_, offset_, solver_ (``"closed_form"``), ...
        See :class:`Support`.

    Notes
    -----
    - ``log_volume`` is the volume of the *enclosing solid* ellipsoid
      ``{sum_i ((h_i - b_i)/g_i)^2 <= d}``: ``log vol(B_d) + sum_i log(sqrt(d) |g_i|)``. The shell
      itself has measure zero in ``R^d``.
    - ``log_area`` is the (d-1)-dimensional surface measure of the ellipsoid
      ``{sum_i y_i^2 = d}`` (the RMSNorm shell itself; for LayerNorm the shell is the
      (d-2)-dimensional slice of it by the mean-zero hyperplane, so this is an upper surface).
    - ``sample`` draws points *on the shell*, not in the volume: ``y = sqrt(d) z / |z|`` with
      ``z`` Gaussian (projected onto ``sum z = 0`` for LayerNorm), ``h = b + g y``: the output of
      the norm for isotropic input directions. This is not the uniform surface measure of the
      ellipsoid (it is the gain map's push-forward of the uniform sphere measure).
    - ``contains`` tests membership of the shell (``|sqrt(sum y^2 / d) - 1| <= tol``, and
      ``|sum y| <= tol d`` for LayerNorm); pass ``solid=True`` for the enclosing solid.
      ``predict``/``decision_function``/``score_samples`` use the enclosing solid (the set whose
      volume ``log_volume`` is): ``+1`` where ``sqrt(sum y^2 / d) <= 1 + CONTAINS_TOL``.
    - Zero gains are refused (``ValueError``): along such an axis every output equals ``b_i``, the
      shell is degenerate (a lower-dimensional set), and ``y_i`` is undefined.
    """

    shape = "final_norm"
    summary_keys = ("gain_abs_min", "gain_abs_max", "eps")

    def __init__(self, kind="rmsnorm", gain=None, bias=None, eps=0.0):
        self.kind = kind
        self.gain = gain
        self.bias = bias
        self.eps = eps

    @classmethod
    def from_params(cls, kind, gain, bias=None, eps=0.0) -> "FinalNormShell":
        """The shell of a final norm with the given kind, gain, bias and epsilon (no data).

        Parameters
        ----------
        kind : {"rmsnorm", "layernorm"}
        gain : array_like of float, shape (d,)
            Effective gain, no zero entries.
        bias : array_like of float, shape (d,), optional
        eps : float, default 0.0

        Returns
        -------
        FinalNormShell
            Fitted state set (``solver_ = "closed_form"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            Unknown ``kind``, zero or NaN gains, a bias of another length, ``eps < 0``.
        """
        if gain is None:
            raise ValueError("gain: FinalNormShell.from_params needs the gain, shape (d,)")
        shell = cls(kind=kind, gain=gain, bias=bias, eps=eps)
        d = shell._build(None)
        shell._record_given(d)
        shell.solver_ = "closed_form"
        return shell

    def _build(self, d) -> int:
        """Validate the parameters and set the fitted attributes; returns ``d``."""
        if self.kind not in ("rmsnorm", "layernorm"):
            raise ValueError(f"kind: expected 'rmsnorm' or 'layernorm', got {self.kind!r}")
        g = np.ones(d) if self.gain is None else check_array(as_real_points(self.gain, "gain"), "gain", ndim=1)
        if d is not None and g.shape[0] != d:
            raise ValueError(f"gain: has {g.shape[0]} entries, X has {d} features")
        zero = np.flatnonzero(g == 0)
        if zero.size:
            raise ValueError(
                f"gain: {zero.size} zero entries (first at {int(zero[0])}); the final-norm shell is "
                "degenerate along those axes (the output is constant there), so it has no "
                "d-dimensional volume; fit a data support instead"
            )
        if self.kind == "layernorm" and g.shape[0] < 3:
            raise ValueError(
                f"gain: a LayerNorm shell needs d >= 3, got d = {g.shape[0]} (its points have mean 0 "
                "and mean square 1: in d = 1 there are none, in d = 2 only two)")
        self.kind_ = self.kind
        self.gain_ = g
        self.bias_ = None if self.bias is None else check_array(as_real_points(self.bias, "bias"), "bias", ndim=1, shape=(g.shape[0],))
        self.eps_ = check_positive(self.eps, "eps", allow_zero=True)
        self.radius_ = math.sqrt(g.shape[0])
        self._log_area = None
        return g.shape[0]

    def fit(self, X, y=None):
        """Set the shell from the parameters, for points of ``X``'s width (the values are unused).

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
        ValueError, TypeError
            Bad ``X`` (as every support), bad parameters (see :meth:`from_params`), a gain whose
            length is not ``d``, or a shell built with :meth:`from_params`.
        """
        H, t0 = self._start_fit(X)
        d = self._build(H.shape[1])
        self.n_features_in_ = d
        self._record_fit(H.shape[0], H.shape[0], 1.0, "closed_form", t0)
        return self

    def _y(self, X):
        Y = X if self.bias_ is None else X - self.bias_
        return Y / self.gain_

    def _gauge(self, X):
        Y = self._y(X)
        return np.sqrt(np.einsum("ij,ij->i", Y, Y) / self.dim)

    def contains(self, X, tol: float = CONTAINS_TOL, solid: bool = False) -> np.ndarray:
        """Whether each point lies on the shell (or in the enclosing solid), up to relative ``tol``.

        Parameters
        ----------
        X : array_like of float, shape (N, d) or (d,)
        tol : float, default 1e-9
            Relative tolerance on the normalised radius ``sqrt(sum y^2 / d)`` (and, for
            LayerNorm, on ``|sum y| / d``). Hidden states computed in float32 need about 1e-5.
        solid : bool, default False
            Test the enclosing solid ``sum y^2 <= d (1 + tol)^2`` instead.

        Returns
        -------
        numpy.ndarray of bool, shape (N,)

        Raises
        ------
        ValueError, TypeError
            Wrong dimension, NaN/inf, float16, negative tol; ``NotFittedError`` before a fit.
        """
        tol = check_positive(tol, "tol", allow_zero=True)
        return self._contains(self._check_points(X), tol, solid=check_bool(solid, "solid"))

    def _contains(self, X, tol, solid=False):
        rho = self._gauge(X)
        if solid:
            return rho <= 1.0 + tol
        ok = np.abs(rho - 1.0) <= tol
        if self.kind_ == "layernorm":
            ok &= np.abs(self._y(X).sum(axis=1)) <= tol * self.dim
        return ok

    @property
    def semi_axes_(self) -> np.ndarray:
        """``sqrt(d) |g_i|``, shape (d,) (in coordinate order, not sorted)."""
        self._check_fitted()
        return self.radius_ * np.abs(self.gain_)

    @property
    def log_volume(self) -> float:
        """Log-volume (nats) of the enclosing solid ellipsoid ``sum ((h-b)/g)^2 <= d``."""
        return log_unit_ball_volume(self.dim) + float(np.sum(np.log(self.semi_axes_)))

    @property
    def log_area(self) -> float:
        """Log of the (d-1)-dimensional area (nats) of the ellipsoid ``sum ((h-b)/g)^2 = d``.

        ``area = prod_i s_i |S^{d-1}| E_u[ sqrt(sum_i u_i^2 / s_i^2) ]`` for ``u`` uniform on the
        sphere (the surface element of ``x -> S x`` is ``det S |S^{-1} u|``); the expectation is a
        Monte Carlo mean over 4096 fixed-seed directions, whose relative standard error (stored
        in ``log_area_stderr_``, in nats) is small in high d because the integrand concentrates.
        """
        self._check_fitted()
        if self._log_area is None:
            s = self.semi_axes_
            smin = float(s.min())
            # 1 / sn = smin / s in (0, 1], from logs: s / smin itself overflows for gains
            # spanning more than 1e308 (1e-200..1e200); a ratio below 1e-308 is quietly 0
            inv_sn = np.exp(math.log(smin) - np.log(s))
            rng = np.random.default_rng(0)
            vals = []
            for _ in range(4):
                z = rng.standard_normal((1024, self.dim))
                z /= np.linalg.norm(z, axis=1, keepdims=True)
                zs = z * inv_sn
                vals.append(np.sqrt(np.einsum("ij,ij->i", zs, zs)))
            v = np.concatenate(vals)
            mean = float(v.mean())
            self.log_area_stderr_ = float(v.std(ddof=1) / math.sqrt(v.size) / mean)
            self._log_area = (float(np.sum(np.log(s))) + log_sphere_area(self.dim) + math.log(mean)
                              - math.log(smin))
        return self._log_area

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points on the shell (not in its volume; see the class Notes).

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)

        Raises
        ------
        TypeError, ValueError
            Bad ``n`` or ``seed``; ``NotFittedError`` before a fit.
        """
        n = self._check_sample_args(n)
        rng = check_seed(seed)
        z = rng.standard_normal((n, self.dim))
        if self.kind_ == "layernorm":
            z -= z.mean(axis=1, keepdims=True)
        z *= self.radius_ / np.linalg.norm(z, axis=1, keepdims=True)
        h = z * self.gain_
        return h if self.bias_ is None else h + self.bias_

    def enclosing_ellipsoid(self) -> Ellipsoid:
        """The solid ellipsoid ``{h : sum_i ((h_i - b_i)/g_i)^2 <= d}`` as an :class:`Ellipsoid`.

        Returns
        -------
        Ellipsoid
            Built with :meth:`Ellipsoid.from_params` (``solver_ = "closed_form"``).
        """
        self._check_fitted()
        c = np.zeros(self.dim) if self.bias_ is None else self.bias_.copy()
        # by semi-axes sqrt(d) |g_i| (a shape matrix diag(1/(d g^2)) underflows for g ~ 1e160)
        ell = Ellipsoid.from_params(c, semi_axes=self.semi_axes_)
        ell.solver_ = "closed_form"
        return ell

    def _shell_semi_axes(self) -> tuple[np.ndarray, int]:
        """Semi-axes (descending) of the final-norm ellipsoid and its dimension (d, or d-1)."""
        gain = np.abs(self.gain_)
        d = gain.shape[0]
        if self.kind_ == "rmsnorm":
            return self.radius_ * np.sort(gain)[::-1], d
        # x_hat lies in the mean-zero hyperplane 1^perp; h - b = g o x_hat. The image of the
        # (d-1)-ball of radius sqrt(d) is a (d-1)-ellipsoid whose semi-axes are sqrt(d) times the
        # nonzero singular values of diag(g) restricted to 1^perp, i.e. the square roots of the
        # nonzero eigenvalues of diag(g^2) - g g^T / d.
        gmax = float(gain.max())
        gn = gain / gmax  # in units of the largest gain: no overflow of g^2 at g ~ 1e160
        M = np.diag(gn**2) - np.outer(gn, gn) / d
        ev = np.clip(np.linalg.eigvalsh(M), 0.0, None)[::-1][: d - 1]
        return self.radius_ * gmax * np.sqrt(ev), d - 1

    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(shell, eps)`` (nats), by name.

        Parameters
        ----------
        eps : float
            Precision, > 0.

        Returns
        -------
        dict
            ``paper = sum_i log(1 + 2 s_i/eps)`` over the shell ellipsoid's semi-axes. RMSNorm:
            the solid ellipsoid's rigorous terms (as :meth:`Ellipsoid.packing_bound_terms`, axes
            aligned with the coordinates). LayerNorm: the (d-1)-dimensional ellipsoid in its
            hyperplane times a slab of width ``2 rho`` (``v2_hyperplane``, ``vinf_hyperplane``)
            and the coordinate-projection bound. Both add the circumscribed ball's terms.

        Raises
        ------
        ValueError, TypeError
            ``eps <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        eps = check_positive(eps, "eps")
        s, k = self._shell_semi_axes()
        d = self.dim
        out = {"paper": float(np.sum(log1p_ratio(s, eps, 2.0)))}
        if self.kind_ == "rmsnorm":
            out.update(ellipsoid_terms(s, eps, aligned=True))  # diag(g): axes are coordinate axes
        else:
            with np.errstate(divide="ignore"):
                log_s = np.log(s)
            # LayerNorm: a k = d-1 dimensional ellipsoid E' in a hyperplane. E' + B_d(rho) lies in
            # (E' + B_k(rho)) x [-rho, rho] (normal direction); bound the k-dimensional part.
            log_rho = math.log(eps) - math.log(2.0)
            g2 = log_enclosing_ellipsoid_ratio(log_s - log_rho, 0.0)  # minus log kappa_k, k log rho
            out["v2_hyperplane"] = float(_log_kappa(k) - _log_kappa(d) + math.log(2.0) + g2)
            gi = log_enclosing_ellipsoid_ratio(log_s - math.log(eps), math.log(0.25 * d))
            out["vinf_hyperplane"] = float(_log_kappa(k) + gi + math.log(math.sqrt(d)))  # 2 rho'/eps
            # coordinate projections of the flat ellipsoid (M = d (diag(g^2) - g g^T/d), rank
            # d-1): the projection argument needs only the eigenvalues, one of which is 0
            log_s_full = np.concatenate([log_s, [-np.inf]]) - math.log(eps)
            out.update(ellipsoid_projection_terms(log_s_full, aligned=False))
        out.update(circumball_terms(s.size if self.kind_ == "rmsnorm" else k + 1, float(np.max(s)), eps,
                                    "_circumball"))
        return out

    def origin_ellipsoid_map(self):
        """``G`` with the shell's solid ``= G B``, when there is no bias; else None.

        RMSNorm: ``G = sqrt(d) diag(g)``. LayerNorm: ``G = sqrt(d) diag(g) (I - 1 1^T / d)``, of
        rank ``d - 1`` (the outputs lie in a hyperplane; ``G B`` is the flat ellipsoid there).
        In both cases ``G z`` for a standard Gaussian ``z`` has the directions of
        :meth:`sample`'s points.

        Returns
        -------
        numpy.ndarray of float64, shape (d, d), or None
        """
        self._check_fitted()
        if self.bias_ is not None:
            return None
        G = np.diag(self.radius_ * self.gain_)
        if self.kind_ == "layernorm":
            G = G - np.outer(self.radius_ * self.gain_, np.full(self.dim, 1.0 / self.dim))
        return G

    def star_about_origin(self) -> bool:
        """True for an RMSNorm shell without bias (its solid is a full-dimensional ellipsoid
        around the origin); a LayerNorm shell is flat, so False."""
        self._check_fitted()
        return self.bias_ is None and self.kind_ == "rmsnorm"

    def _params(self):
        return {
            "kind": self.kind_,
            "eps": self.eps_,
            "radius": self.radius_,
            "log_volume_is": "enclosing solid ellipsoid",
            "log_area": self.log_area,
            "log_area_stderr": self.log_area_stderr_,
            "gain_abs_min": float(np.abs(self.gain_).min()),
            "gain_abs_max": float(np.abs(self.gain_).max()),
            "has_bias": self.bias_ is not None,
        }

    @classmethod
    def _from_fit_options(cls, **kw):
        raise ValueError("shape='final_norm' is not a fit: use support_from_final_norm(unembedding)")

    def scaled(self, factor) -> "FinalNormShell":
        """The shell with the gain times ``factor`` (the homothety about the bias, or the
        origin; see :meth:`Support.scaled`).

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        FinalNormShell
            A ready set with the same kind, bias, eps and ``feature_names_in_``.

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite, a gain that would leave the float64 range;
            ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        gain = np.sign(self.gain_) * scale_lengths(np.abs(self.gain_), s, "gain")
        return self._derived(type(self).from_params(self.kind_, gain, self.bias_, self.eps_))


def support_from_final_norm(unembedding) -> FinalNormShell:
    """The final-norm shell of a model: a support certified by the architecture, no data needed.

    Parameters
    ----------
    unembedding : embgeom.adapters.Unembedding or FinalNorm
        Anything with a ``norm`` attribute (``kind``, ``weight`` (effective gain, (d,)), ``bias``,
        ``eps``), or such a norm object itself.

    Returns
    -------
    FinalNormShell
        See its docstring for the derivation: RMSNorm outputs satisfy
        ``sum_i (h_i/g_i)^2 = d ms/(ms + eps) <= d``; LayerNorm outputs also
        ``sum_i (h_i - b_i)/g_i = 0``.

    Raises
    ------
    ValueError
        No final norm (``kind`` None), an unknown kind, zero gains, NaN gains.
    TypeError
        Not an unembedding/norm object.
    """
    norm = getattr(unembedding, "norm", unembedding)
    if not hasattr(norm, "kind") or not hasattr(norm, "weight"):
        raise TypeError(
            "unembedding: expected an embgeom.adapters.Unembedding (or its FinalNorm), got "
            f"{type(unembedding).__name__}"
        )
    if norm.kind is None:
        raise ValueError("unembedding: the model has no final norm, so there is no final-norm shell")
    return FinalNormShell.from_params(norm.kind, norm.weight, getattr(norm, "bias", None),
                                      float(getattr(norm, "eps", 0.0)))
