"""Monte Carlo volumes of the decoder cells ``E_t`` inside a support, with intervals and histograms.

Draw ``n`` points uniformly in the support ``S``, assign each to its decoder cell (the greedy next
token, :meth:`embgeom.cells.Decoder.assign`) and count: the fraction of hits of token ``t``
estimates ``vol(E_t ∩ S) / vol(S)``. Counts are multinomial, so each token's count is
``Binomial(n, p_t)`` and gets an exact (Clopper-Pearson) or Wilson two-sided interval. Tokens with
no hit keep an honest upper bound (``1 - (alpha/2)^(1/n)`` for Clopper-Pearson).

These fractions feed the non-uniform-cell refinement of the paper (docs/theory.md, section 5 "The non-uniform-cell refinement and lambda":
the per-token rate ``lambda``) and the cells section of the report.

Reference: M. Meyer et al., "How Many Different Outputs Can a Transformer Generate?", ICML 2026,
Sec. 4 (decoder cells, non-uniform cell volumes). Intervals: C. J. Clopper and E. S. Pearson,
Biometrika 26 (1934); E. B. Wilson, JASA 22 (1927).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels
from ._validation import check_positive_int, check_probability
from .cells import Decoder

__all__ = [
    "CellVolumes", "cell_volumes", "binomial_interval", "wilson_interval", "cells_report_section",
]


def wilson_interval(successes, trials, confidence: float = 0.95):
    """Wilson score interval for binomial proportions ``successes / trials``.

    Parameters
    ----------
    successes : array_like of int or float
        Successes, ``0 <= successes <= trials`` (a proportion times ``trials`` is accepted).
    trials : int or array_like of int
        Trials (>= 1), broadcast against ``successes``.
    confidence : float, default 0.95
        Coverage ``1 - alpha``, in (0, 1).

    Returns
    -------
    lower, upper : numpy.ndarray of float64
        Same shape as the broadcast inputs, in [0, 1]; exactly 0 at ``successes = 0`` and 1 at
        ``successes = trials``.

    Raises
    ------
    ValueError
        ``trials < 1``, ``successes`` outside ``[0, trials]``, or ``confidence`` not in (0, 1).

    References
    ----------
    E. B. Wilson, "Probable inference, the law of succession, and statistical inference", JASA 22
    (1927); Brown, Cai, DasGupta, Statistical Science 16 (2001), eq. (4).

    Examples
    --------
    >>> lo, hi = wilson_interval(0, 10)
    >>> float(lo), round(float(hi), 4)
    (0.0, 0.2775)
    """
    from scipy import stats

    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(n))):
        raise ValueError("successes, trials: expected finite numbers")
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError("successes, trials: expected 0 <= successes <= trials and trials >= 1")
    conf = check_probability(confidence, "confidence")
    if conf >= 1.0:
        raise ValueError("confidence: expected a number in (0, 1)")
    z = stats.norm.ppf(0.5 + conf / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(np.maximum(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    lower = np.where(k <= 0, 0.0, np.clip(centre - half, 0.0, 1.0))  # exact ends, no round-off
    upper = np.where(k >= n, 1.0, np.clip(centre + half, 0.0, 1.0))
    return lower, upper


def binomial_interval(counts, n: int, confidence: float = 0.95, method: str = "clopper-pearson"):
    """Two-sided confidence interval for binomial proportions.

    Parameters
    ----------
    counts : array_like of int, shape (K,)
        Successes, ``0 <= counts <= n``.
    n : int
        Trials (>= 1).
    confidence : float, default 0.95
        Coverage ``1 - alpha``.
    method : {"clopper-pearson", "wilson"}
        ``"clopper-pearson"``: exact, ``[B(alpha/2; k, n-k+1), B(1-alpha/2; k+1, n-k)]`` with
        ``B`` the beta quantile (Clopper & Pearson 1934); coverage >= ``confidence`` for every
        ``p``. ``"wilson"``: the score interval (Wilson 1927), closer to nominal on average.

    Returns
    -------
    lower, upper : numpy.ndarray of float64, shape (K,)
        ``0 <= lower <= k/n <= upper <= 1``. For ``k = 0`` the Clopper-Pearson upper bound is
        ``1 - (alpha/2)^(1/n)``.

    Raises
    ------
    ValueError
        Counts outside ``[0, n]``, bad ``confidence`` or ``method``.
    """
    from scipy import stats

    n = check_positive_int(n, "n")
    conf = check_probability(confidence, "confidence")
    if conf >= 1.0:
        raise ValueError("confidence: expected a number in (0, 1)")
    k = np.asarray(counts)
    if k.dtype.kind not in "iu":
        raise TypeError(f"counts: expected integers, got dtype {k.dtype}")
    if k.size and (k.min() < 0 or k.max() > n):
        raise ValueError(f"counts: expected values in [0, n={n}]")
    k = k.astype(np.float64)
    alpha = 1.0 - conf
    if method == "clopper-pearson":
        with np.errstate(invalid="ignore"):
            lo = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
            hi = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    elif method == "wilson":
        lo, hi = wilson_interval(k, n, conf)
    else:
        raise ValueError(f"method: expected 'clopper-pearson' or 'wilson', got {method!r}")
    return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)


@dataclass
class CellVolumes:
    """Monte Carlo estimate of every decoder cell's share of a support (:func:`cell_volumes`).

    Attributes
    ----------
    fractions : numpy.ndarray of float64, shape (n_tokens,)
        ``counts / n_samples``: estimated ``vol(E_t ∩ S) / vol(S)``. Sums to 1 (the counts sum
        exactly to ``n_samples``; the float sum is 1 up to rounding).
    counts : numpy.ndarray of int64, shape (n_tokens,)
        Hits per token.
    n_samples : int
    lower, upper : numpy.ndarray of float64, shape (n_tokens,)
        Two-sided ``confidence`` intervals per token (:func:`binomial_interval`); a token with
        no hit still has ``upper > 0``.
    confidence : float
    interval : str
        ``"clopper-pearson"`` or ``"wilson"``.
    support_log_volume : float
        ``log vol(S)`` in nats (``nan`` if the support defines no volume).
    sampling : str
        ``"directions"`` (Gaussian directions: bias None and an origin-centred ball) or
        ``"support"`` (uniform points from ``support.sample``).
    seed_entropy : int
        Entropy of the root ``SeedSequence``; with it the run is reproducible.
    seconds : float
        Wall time.
    """

    fractions: np.ndarray
    counts: np.ndarray
    n_samples: int
    lower: np.ndarray
    upper: np.ndarray
    confidence: float
    interval: str
    support_log_volume: float
    sampling: str
    seed_entropy: int
    seconds: float
    extra: dict = field(default_factory=dict)

    @property
    def log_volumes(self) -> np.ndarray:
        """``log fraction_t + log vol(S)``: estimated log-volume of ``E_t ∩ S`` in nats.

        float64 (n_tokens,); ``-inf`` for tokens with no hit (their volume is only bounded above,
        by ``log upper + log vol(S)``).
        """
        with np.errstate(divide="ignore"):
            return np.log(self.fractions) + self.support_log_volume

    @property
    def n_zero(self) -> int:
        """Tokens with no hit."""
        return int((self.counts == 0).sum())

    def top(self, k: int = 20, tokenizer=None) -> list[dict]:
        """The ``k`` largest cells, largest first.

        Parameters
        ----------
        k : int, default 20
        tokenizer : optional
            Anything with ``convert_ids_to_tokens``; adds the token strings.

        Returns
        -------
        list of dict
            ``{"token_id", "fraction", "count", "lower", "upper"[, "token"]}``.
        """
        k = check_positive_int(k, "k")
        order = np.argsort(-self.counts, kind="stable")[:k]
        names = None
        if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
            names = tokenizer.convert_ids_to_tokens([int(i) for i in order])
        out = []
        for j, t in enumerate(order):
            row = {
                "token_id": int(t),
                "fraction": float(self.fractions[t]),
                "count": int(self.counts[t]),
                "lower": float(self.lower[t]),
                "upper": float(self.upper[t]),
            }
            if names is not None:
                row["token"] = str(names[j])
            out.append(row)
        return out

    def top_share(self, q: float = 0.01) -> float:
        """Share of the support's volume held by the largest ``ceil(q |V|)`` cells (estimate)."""
        q = check_probability(q, "q")
        k = max(1, math.ceil(q * self.counts.size))
        return float(np.sort(self.counts)[::-1][:k].sum() / self.n_samples)

    def to_dict(self) -> dict:
        """JSON-able summary (no per-token arrays; save ``fractions`` with numpy)."""
        nz = self.fractions[self.counts > 0]
        return {
            "n_tokens": int(self.counts.size),
            "n_samples": int(self.n_samples),
            "n_zero": self.n_zero,
            "n_hit": int(self.counts.size - self.n_zero),
            "confidence": self.confidence,
            "interval": self.interval,
            "support_log_volume": float(self.support_log_volume),
            "sampling": self.sampling,
            "seed_entropy": int(self.seed_entropy),
            "seconds": float(self.seconds),
            "max_fraction": float(self.fractions.max()),
            "median_hit_fraction": float(np.median(nz)) if nz.size else float("nan"),
            "top1pct_share": self.top_share(0.01),
            **self.extra,
        }

    def histogram(self, ax=None, path=None, bins: int = 50, title: str | None = None):
        """Histogram of per-token cell volumes: log10 fraction on x, number of tokens on y.

        Tokens with no hit have no finite log fraction: they are drawn as a separate grey bar to
        the left of the axis break, labelled with their count and the Clopper-Pearson/Wilson
        upper bound every one of them shares.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Draw into it; default a new figure.
        path : str or path-like, optional
            Save the figure as PNG there.
        bins : int, default 50
        title : str, optional

        Returns
        -------
        matplotlib Axes
        """
        import matplotlib

        if ax is None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        bins = check_positive_int(bins, "bins")
        fig = None
        if ax is None:
            fig, ax = plt.subplots(figsize=(7, 4))
        hit = self.counts > 0
        x = np.log10(self.fractions[hit])
        if x.size:
            lo, hi = float(x.min()), float(x.max())
            if hi - lo < 1e-9:
                lo, hi = lo - 0.5, hi + 0.5
            edges = np.linspace(lo, hi, bins + 1)
            ax.hist(x, bins=edges, color="C0", label=f"{int(hit.sum())} tokens with hits")
            width = (hi - lo) / bins
        else:
            lo, width = math.log10(1.0 / self.n_samples), 0.1
        if self.n_zero:
            ub = float(self.upper[~hit].max())
            xz = lo - 3 * width
            ax.bar([xz], [self.n_zero], width=2 * width, color="0.6",
                   label=f"{self.n_zero} tokens with 0 hits (fraction < {ub:.1e})")
            ax.annotate("0 hits", (xz, self.n_zero), ha="center", va="bottom", fontsize=8)
        ax.set_xlabel("log10 cell-volume fraction")
        ax.set_ylabel("number of tokens (log scale)")
        ax.set_yscale("log")  # the large-cell tail holds few tokens: visible only in logs
        ax.set_title(title or f"decoder cell volumes ({self.n_samples} samples, {self.sampling})")
        ax.legend(fontsize=8)
        if path is not None:
            (fig or ax.figure).savefig(path, dpi=120, bbox_inches="tight")
        if fig is not None and path is not None:
            plt.close(fig)
        return ax


def _direction_map(decoder: Decoder, support) -> tuple[bool, np.ndarray | None]:
    """Whether Gaussian directions suffice, and the map applied to them.

    With no bias every cell is a cone; when the support is an origin-centred ellipsoid ``G B``
    (``support.origin_ellipsoid_map()`` is not None) a cell's share of it is the standard
    Gaussian measure of ``G^{-1} E_t``, so Gaussian directions mapped by ``G`` give the same
    estimate as uniform points (docs/theory.md, section 1). Returns ``(directions, G32)`` with ``G32`` the
    float32 ``G.T`` to right-multiply rows by, or None when ``G`` is a positive multiple of the
    identity (no map needed: the cells are scale-invariant).
    """
    G = support.origin_ellipsoid_map() if decoder.bias_ is None else None
    if G is None:
        return False, None
    G = np.asarray(G, dtype=np.float64)
    if G.shape != (decoder.dim, decoder.dim):
        raise ValueError(f"support.origin_ellipsoid_map: returned shape {G.shape}, expected "
                         f"{(decoder.dim, decoder.dim)}")
    diag = np.diag(G)
    if np.count_nonzero(G - np.diag(diag)) == 0 and np.all(diag == diag[0]) and diag[0] > 0:
        return True, None
    return True, np.ascontiguousarray(G.T, dtype=np.float32)


def _count_chunk(m: int, *, decoder: Decoder, support, directions: bool, seed,
                 G32: np.ndarray | None = None) -> np.ndarray:
    """Hits per token of one chunk of ``m`` points drawn from ``seed`` (a SeedSequence).

    One chunk of :func:`cell_volumes` (and the task of its parallel version): Gaussian float32
    directions when ``directions`` (mapped by ``G32``, see :func:`_direction_map`), else
    ``support.sample(m, rng)``; returns int64 (n_tokens,) summing to ``m``.
    """
    rng = np.random.default_rng(seed)
    if directions:
        X = rng.standard_normal((m, decoder.dim), dtype=np.float32)
        if G32 is not None:
            X = X @ G32
    else:
        X = np.asarray(support.sample(m, seed=rng))
        if X.shape != (m, decoder.dim):
            raise ValueError(f"support.sample: returned shape {X.shape}, expected {(m, decoder.dim)}")
    return _kernels.count_tokens(decoder.assign(X), decoder.n_tokens)


def cell_volumes(
    decoder: Decoder,
    support,
    n_samples: int,
    seed=None,
    *,
    batch_size: int = 8192,
    confidence: float = 0.95,
    interval: str = "clopper-pearson",
    progress: bool = True,
) -> CellVolumes:
    """Monte Carlo volume fraction of every decoder cell inside a support.

    Points are drawn uniformly in ``support`` in chunks of ``batch_size`` (never all at once),
    assigned with :meth:`Decoder.assign` (blocked product + numba running argmax) and counted with
    a numba kernel. Chunk ``i`` draws from child ``i`` of ``numpy.random.SeedSequence(seed)``,
    so the result depends on ``seed`` and ``batch_size`` only, not on timing or threads.

    When the decoder has no bias and the support is an origin-centred ellipsoid ``G B``
    (``support.origin_ellipsoid_map()`` returns ``G``: an origin-centred ball or ellipsoid, the
    final-norm shell without bias), every cell is a cone with apex at the origin and its share of
    ``G B`` is the Gaussian measure of ``{x : G x in the cell}`` (docs/theory.md, section 1 "Cells, and the power diagram behind them"):
    then only Gaussian directions are drawn (float32) and mapped by ``G`` (not at all when ``G``
    is a multiple of the identity, the ball), the same estimate more cheaply
    (``sampling="directions"``).

    Parameters
    ----------
    decoder : Decoder
    support : Support
        Anything with ``dim``, ``sample(n, seed)`` (uniform points, float64 (n, d)),
        ``origin_ellipsoid_map()`` (``G`` (d, d) or None) and ``log_volume`` (nats); see
        :mod:`embgeom.supports`.
    n_samples : int
        Number of points (>= 1).
    seed : None, int, or numpy.random.SeedSequence
    batch_size : int, default 8192
        Points drawn per chunk.
    confidence : float, default 0.95
    interval : {"clopper-pearson", "wilson"}
    progress : bool, default True
        tqdm progress bar (points).

    Returns
    -------
    CellVolumes

    Raises
    ------
    TypeError
        ``decoder`` not a Decoder, ``support`` without ``dim``/``sample``/``origin_ellipsoid_map``,
        bad seed or counts
        types.
    ValueError
        ``n_samples <= 0``, support of another dimension, the support's samples of the wrong
        shape or not finite.
    """
    from tqdm.auto import tqdm

    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder: expected an embgeom.cells.Decoder, got {type(decoder).__name__}")
    n_samples = check_positive_int(n_samples, "n_samples")
    batch_size = check_positive_int(batch_size, "batch_size")
    if not all(hasattr(support, a) for a in ("dim", "sample", "origin_ellipsoid_map")):
        raise TypeError(
            "support: expected a Support with .dim, .sample and .origin_ellipsoid_map, got "
            f"{type(support).__name__}"
        )
    if int(support.dim) != decoder.dim:
        raise ValueError(f"support: has dimension {support.dim}, the decoder's hidden size is d={decoder.dim}")
    if interval not in ("clopper-pearson", "wilson"):
        raise ValueError(f"interval: expected 'clopper-pearson' or 'wilson', got {interval!r}")
    confidence = check_probability(confidence, "confidence")
    if isinstance(seed, np.random.SeedSequence):
        root = seed
    elif seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        root = np.random.SeedSequence(seed)
    else:
        raise TypeError(f"seed: expected None, an int or a SeedSequence, got {type(seed).__name__}")
    try:
        log_vol = float(support.log_volume)
    except (AttributeError, RuntimeError):
        log_vol = float("nan")
    directions, G32 = _direction_map(decoder, support)
    t0 = time.perf_counter()
    n_chunks = -(-n_samples // batch_size)
    children = root.spawn(n_chunks)
    counts = np.zeros(decoder.n_tokens, dtype=np.int64)
    bar = tqdm(total=n_samples, desc="cell volumes", unit="pt", disable=not progress)
    for i, child in enumerate(children):
        m = min(batch_size, n_samples - i * batch_size)
        counts += _count_chunk(m, decoder=decoder, support=support, directions=directions,
                               seed=child, G32=G32)
        bar.update(m)
    bar.close()
    lower, upper = binomial_interval(counts, n_samples, confidence, interval)
    return CellVolumes(
        fractions=counts / n_samples,
        counts=counts,
        n_samples=n_samples,
        lower=lower,
        upper=upper,
        confidence=confidence,
        interval=interval,
        support_log_volume=log_vol,
        sampling="directions" if directions else "support",
        seed_entropy=int(root.entropy) if isinstance(root.entropy, (int, np.integer)) else 0,
        seconds=time.perf_counter() - t0,
        extra={"batch_size": batch_size},
    )


def cells_report_section(
    decoder: Decoder,
    support,
    n_samples: int,
    seed,
    out_dir,
    tokenizer=None,
    *,
    unargmaxable: str = "full",
    max_lp: int | None = 200,
    lp_time_limit: float = 60.0,
    top_k: int = 20,
    progress: bool = True,
    return_volumes: bool = False,
):
    """The cells section of the report: cell volumes, the largest cells, unargmaxable tokens.

    Writes ``cell_fractions.npy`` (float64 (n_tokens,)) and ``cell_volumes.png`` (the
    histogram) into ``out_dir``.

    Parameters
    ----------
    decoder : Decoder
    support : Support
        Where the hidden states live (the fitted support); passed to :func:`cell_volumes`.
    n_samples : int
        Monte Carlo points.
    seed : int or None
    out_dir : str or path-like
        Existing or new folder.
    tokenizer : optional
        ``convert_ids_to_tokens`` gives the token strings of the largest cells.
    unargmaxable : {"full", "off"}, default "full"
        ``"full"``: the exact scan of every token over the whole space
        (:meth:`Decoder.unargmaxable` with no support; the canonical notion of Grivas et al.
        2022), at most ``max_lp`` LPs (the rest reported as undecided). ``"off"``: skipped.
    max_lp : int or None, default 200
    lp_time_limit : float, default 60
        Seconds per LP token before it is reported undecided.
    top_k : int, default 20
    progress : bool, default True
    return_volumes : bool, default False
        Also return the :class:`CellVolumes` (for the bounds section's lambda).

    Returns
    -------
    dict
        JSON-able: ``unargmaxable`` (dict: ``n_unargmaxable``, ``n_lp``, ``n_undecided``, ids,
        status counts, seconds; or None when off), ``fractions_path`` (str), ``histogram_path``,
        ``top`` (list of the ``top_k`` largest cells with token strings), ``top1pct_share``
        (share of the volume in the largest 1% of cells), ``volumes`` (the
        :meth:`CellVolumes.to_dict` summary).

    Raises
    ------
    TypeError, ValueError
        As :func:`cell_volumes`; ``unargmaxable`` not one of the choices.
    """
    if unargmaxable not in ("full", "off"):
        raise ValueError(f"unargmaxable: expected 'full' or 'off', got {unargmaxable!r}")
    os.makedirs(out_dir, exist_ok=True)
    cv = cell_volumes(decoder, support, n_samples, seed=seed, progress=progress)
    fpath = os.path.join(os.fspath(out_dir), "cell_fractions.npy")
    np.save(fpath, cv.fractions)
    hpath = os.path.join(os.fspath(out_dir), "cell_volumes.png")
    cv.histogram(path=hpath)
    un = None
    if unargmaxable == "full":
        res = decoder.unargmaxable(max_lp=max_lp, lp_time_limit=lp_time_limit, progress=progress)
        un = res.to_dict()
        if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens") and res.tokens.size:
            un["tokens"] = [str(s) for s in tokenizer.convert_ids_to_tokens([int(i) for i in res.tokens[:200]])]
    section = {
        "unargmaxable": un,
        "fractions_path": fpath,
        "histogram_path": hpath,
        "top": cv.top(top_k, tokenizer=tokenizer),
        "top1pct_share": cv.top_share(0.01),
        "volumes": cv.to_dict(),
    }
    return (section, cv) if return_volumes else section
