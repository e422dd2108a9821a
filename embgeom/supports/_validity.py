"""Held-out validity of a support: the share of fresh hidden states inside, with a guarantee.

A support fitted to a sample bounds the model's hidden states only if it also holds the ones it
has not seen. :func:`containment_check` counts the fresh points inside and gives the one-sided
Clopper-Pearson lower confidence bound on the share ``q`` of the sampled distribution that lies
inside; the support is called *valid* when that lower bound reaches ``min_share``. With the
defaults (95% confidence, ``min_share = 0.99``) a valid support holds at least 99% of the hidden
states drawn like the fresh ones, with 95% confidence; this needs at least 299 fresh points
with none outside (``0.05^(1/n) >= 0.99``), and about 2,000 points tolerate 12 outside.

References
----------
C. J. Clopper, E. S. Pearson, "The use of confidence or fiducial limits illustrated in the case of
the binomial", Biometrika 26 (1934). One-sided form: e.g. L. D. Brown, T. T. Cai, A. DasGupta,
"Interval Estimation for a Binomial Proportion", Statistical Science 16 (2001).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .._json import to_jsonable
from .._stats import clopper_pearson_lower
from .._validation import check_positive, check_probability
from ._base import Support, check_hidden

__all__ = ["ContainmentCheck", "containment_check", "clopper_pearson_lower", "min_points_for"]


def min_points_for(min_share: float, confidence: float = 0.95) -> int:
    """Fewest fresh points that can make a support valid: all inside and ``(1 - c)^(1/n) >= min_share``.

    Parameters
    ----------
    min_share : float in (0, 1)
    confidence : float in (0, 1), default 0.95

    Returns
    -------
    int
        ``ceil(log(1 - confidence) / log(min_share))`` (299 for the defaults 0.99 and 0.95).

    Raises
    ------
    ValueError, TypeError
        Arguments outside (0, 1).
    """
    s = check_probability(min_share, "min_share", open_right=True)
    c = check_probability(confidence, "confidence", open_right=True)
    return int(math.ceil(math.log1p(-c) / math.log(s) - 1e-12))


@dataclass
class ContainmentCheck:
    """Result of :func:`containment_check`.

    Attributes
    ----------
    n : int
        Fresh points checked.
    n_inside : int
        Points inside the support (``contains(tol)``).
    share : float
        ``n_inside / n``.
    lower_bound : float
        One-sided Clopper-Pearson lower bound on the contained share at ``confidence``.
    confidence : float
    min_share : float
        The validity threshold on ``lower_bound``.
    valid : bool
        ``lower_bound >= min_share``.
    tol : float
        The relative tolerance of :meth:`Support.contains` used.
    """

    n: int
    n_inside: int
    share: float
    lower_bound: float
    confidence: float
    min_share: float
    valid: bool
    tol: float

    def to_dict(self) -> dict:
        """The fields as a strict-JSON dict (through :func:`embgeom._json.to_jsonable`: a value
        that is not finite would be ``None``)."""
        return to_jsonable(asdict(self))

    def sentence(self) -> str:
        """The evidence in words, e.g. ``"holds 2,004 of 2,004 fresh hidden states (one-sided
        95% lower bound on the contained share 0.9985)"``."""
        return (f"holds {self.n_inside:,} of {self.n:,} fresh hidden states (one-sided "
                f"{100 * self.confidence:g}% lower bound on the contained share {self.lower_bound:.4f})")


def containment_check(support: Support, H_fresh, *, confidence: float = 0.95,
                      min_share: float = 0.99, tol: float = 1e-6) -> ContainmentCheck:
    """Share of fresh points inside a support, its one-sided lower bound, and the validity rule.

    Parameters
    ----------
    support : Support
        Fitted (or built with ``from_params``).
    H_fresh : array_like of float, shape (n, d)
        Points the support has not seen (other seeds and prompt lengths than the fit); integers
        are converted to float64; a DataFrame must have the support's ``feature_names_in_``.
    confidence : float in (0, 1), default 0.95
        Level of the one-sided Clopper-Pearson bound.
    min_share : float in (0, 1], default 0.99
        The support is valid when the lower bound is at least this.
    tol : float, default 1e-6
        Relative tolerance of :meth:`Support.contains` (a point on the boundary up to rounding
        counts as inside).

    Returns
    -------
    ContainmentCheck

    Raises
    ------
    ValueError, TypeError
        Bad ``H_fresh`` (NaN/inf, fewer than 2 rows, wrong width, float16, other column names
        than the support's), arguments out of range; ``NotFittedError`` for an unfitted support.
    """
    if not isinstance(support, Support):
        raise TypeError(f"support: expected an embgeom.supports.Support, got {type(support).__name__}")
    H = check_hidden(H_fresh, "H_fresh")
    if H.shape[1] != support.dim:
        raise ValueError(f"H_fresh: expected {support.dim} columns, got {H.shape[1]}")
    support._check_names(H_fresh, "H_fresh")  # a DataFrame: the support's columns, in order
    min_share = check_probability(min_share, "min_share")
    tol = check_positive(tol, "tol", allow_zero=True)
    inside = support._contains(H, tol)
    n, k = int(H.shape[0]), int(np.count_nonzero(inside))
    lb = clopper_pearson_lower(k, n, confidence)
    return ContainmentCheck(n=n, n_inside=k, share=k / n, lower_bound=lb,
                            confidence=float(confidence), min_share=float(min_share),
                            valid=bool(lb >= min_share), tol=float(tol))

