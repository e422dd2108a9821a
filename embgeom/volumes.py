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
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels
from ._rare_event import (EXACT_MAX_DIM, ConeMeasure, _seed_record, log_cone_gaussian_measure,
                          measure_cones, prepare_cones)
from ._stats import binomial_interval, wilson_interval
from ._validation import check_positive, check_positive_int, check_probability, seed_sequence
from .cells import Decoder
from .parallel import executor_scope, task_seed

#: spawn_key element of :meth:`CellVolumes.top_share_if_equal`'s stream (above any token id)
_BASELINE_STREAM = 2**32 - 1


def _copy_seed(root: np.random.SeedSequence) -> np.random.SeedSequence:
    """A copy of ``root`` (same entropy, spawn key and pool), so that a result never holds,
    and never advances, the caller's own object."""
    return np.random.SeedSequence(root.entropy, spawn_key=root.spawn_key, pool_size=root.pool_size)

__all__ = ["CellVolumes", "cell_volumes", "vocabulary_cell_volumes",
           "load_vocabulary_cell_volumes", "binomial_interval", "wilson_interval",
           "ConeMeasure", "log_cone_gaussian_measure"]


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
    seed : numpy.random.SeedSequence
        The root ``SeedSequence`` every draw of the run descends from (uniform blocks and
        rare-event tokens alike): ``cell_volumes(..., seed=cv.seed)`` with the same other
        arguments reproduces the run bit for bit. :meth:`to_dict` records it as
        ``seed_entropy`` (an int or a list of ints) and ``seed_spawn_key``.
    seconds : float
        Wall time.
    extra : dict
        Run details: the executor, and with the rare-event estimator ``"rare_event"`` (its
        settings and a summary, :meth:`embgeom._rare_event.ConeMeasure.to_dict`) and
        ``"rare_event_n_runs"`` (int64, shape (n_tokens,): the splitting runs of ``n_chains``
        chains each token took, the pilot included, 0 where it was not split) and
        ``"rare_event_std_err"`` (float64, shape (n_tokens,): each split token's standard error
        of its log-share in nats, nan elsewhere); both left out of :meth:`to_dict`.
    log_fractions : numpy.ndarray of float64, shape (n_tokens,)
        Best estimate of ``log(vol(E_t ∩ S) / vol(S))`` in nats: the rare-event estimate
        (:func:`embgeom._rare_event.log_cone_gaussian_measure`) where ``token_method`` is
        ``"rare-event"``, else ``log(fractions)``. ``-inf`` only for cells proven empty; ``nan``
        where unresolved (no uniform hit, or a token outside the rare-event token sample).
    log_lower, log_upper : numpy.ndarray of float64, shape (n_tokens,)
        Two-sided ``confidence`` interval on ``log_fractions`` (nats); for uniform tokens the
        logs of ``lower`` and ``upper``.
    token_method : numpy.ndarray of str, shape (n_tokens,)
        Which estimator produced each token's log figures: ``"rare-event"``, ``"uniform"``,
        ``"exact"`` (a cone of at most 2 dimensions, ``d <= 2`` or a support map ``G`` of rank
        <= 2: its angle, exact up to float64 rounding, an interval of width 0), ``"empty"``
        (proven empty) or ``"not estimated"`` (outside the token sample; its
        ``log_fractions`` is ``nan``, the uniform fields still hold).
    estimator : {"uniform", "rare-event"}
        Which estimator produced the log figures as a whole: ``"uniform"`` (counts only) or
        ``"rare-event"`` (multilevel splitting for the token sample). Follow-up questions
        (:meth:`cell_volume_rate`) are answered by it.
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
    seed: np.random.SeedSequence
    seconds: float
    extra: dict = field(default_factory=dict)
    log_fractions: np.ndarray | None = None
    log_lower: np.ndarray | None = None
    log_upper: np.ndarray | None = None
    token_method: np.ndarray | None = None
    estimator: str = "uniform"

    def __post_init__(self):
        if self.estimator not in ("uniform", "rare-event"):
            raise ValueError(f"estimator: expected 'uniform' or 'rare-event', got {self.estimator!r}")
        if not isinstance(self.seed, np.random.SeedSequence):
            raise TypeError(f"seed: expected the root numpy SeedSequence, got {type(self.seed).__name__}")
        if (self.log_fractions is None) != (self.estimator == "uniform"):
            raise ValueError("log_fractions: expected rare-event log figures exactly when "
                             "estimator='rare-event'")
        if self.log_fractions is None:  # uniform counts only: logs of the same figures
            self.log_fractions, self.log_lower, self.log_upper = _uniform_logs(
                self.counts, self.n_samples, self.lower, self.upper)
            self.token_method = np.full(self.counts.size, "uniform")

    def cell_volume_rate(self, k_max: int = 32, *, n_boot: int | None = None,
                         confidence: float = 0.95, seed=0, max_support: int = 4096,
                         exact_limit: int = 2**20, sum_tol: float = 1e-6, normalize=None):
        """lambda (nats per token) from these shares, by the functional that fits the estimator.

        ``estimator == "rare-event"``: :func:`embgeom.bounds.cell_volume_rate_from_logs` on the
        token sample (``token_method`` "rare-event", "empty" or, where the count was the
        tighter estimate, "uniform"), the rare-event log-shares first raised by ``se^2 / 2``
        (the first-order bias of the log of an unbiased share estimate, which an average of
        logs would keep: see ``_debiased_log_shares``), with their
        intervals read at their own level (``token_confidence = self.confidence``) and a
        bootstrap interval ``rate_ci`` at ``confidence``. ``"uniform"``:
        :func:`embgeom.bounds.cell_volume_rate` on ``fractions`` with ``lower``, ``upper`` and
        ``n_samples``.

        Parameters
        ----------
        k_max : int, default 32
            Largest number of tokens ``k`` of the median curve.
        n_boot : int, optional
            Bootstrap replicates. ``None``: 200 for rare-event log-shares (their interval is
            part of the estimate), 0 for uniform counts. An explicit 0 means none.
        confidence : float, default 0.95
            Level of ``rate_ci``, in (0, 1); only the rare-event estimator forms ``rate_ci``
            (the uniform counts' bootstrap gives ``rate_bootstrap``, a mean and a spread).
        seed : int, Generator or None, default 0
            Seed of the bootstrap.
        max_support, exact_limit : int
            Grid size and exact-enumeration limit of the median curve.
        sum_tol : float, default 1e-6
            Uniform counts only: tolerance on ``sum(fractions) = 1``.
        normalize : bool or "auto", optional
            ``None``: each functional's default (``"auto"`` for log-shares, True for counts).

        Returns
        -------
        embgeom.bounds.CellVolumeRate
            ``estimator`` is ``"log-shares"`` or ``"uniform counts"``.

        Raises
        ------
        TypeError, ValueError
            As the functional called (bad ``k_max``, ``n_boot``, ``confidence``, ...).
        """
        from .bounds import cell_volume_rate, cell_volume_rate_from_logs

        if self.estimator == "rare-event":
            ids = np.flatnonzero(self.token_method != "not estimated")  # the whole token sample
            x, lo, hi = self._debiased_log_shares(ids)
            return cell_volume_rate_from_logs(
                x, k_max, log_lower=lo, log_upper=hi, vocab_size=self.counts.size,
                normalize="auto" if normalize is None else normalize,
                n_boot=200 if n_boot is None else n_boot, confidence=confidence,
                token_confidence=self.confidence, max_support=max_support,
                exact_limit=exact_limit, seed=seed)
        return cell_volume_rate(
            self.fractions, k_max, lower=self.lower, upper=self.upper, n_samples=self.n_samples,
            n_boot=0 if n_boot is None else n_boot, seed=seed, max_support=max_support,
            exact_limit=exact_limit, sum_tol=sum_tol, normalize=normalize)

    def _debiased_log_shares(self, ids: np.ndarray):
        """The log-shares of ``ids`` (and their interval ends) with the first-order bias of a
        log removed for the rare-event tokens.

        Splitting estimates the share ``p`` without bias, so its log is low by about half the
        log's variance (delta method: ``E log p_hat ~ log p - Var(p_hat) / (2 p^2)``,
        ``Var(p_hat) / p^2 ~ se^2``). lambda averages log-shares over tokens, where that bias
        would not average out: with one 128-chain run per token (se about 0.6 nats on
        SmolLM2) it would raise lambda by about 0.18 nats, the unsafe direction for the refined
        bound. Each rare-event token's log-share and interval are shifted up by ``se^2 / 2``,
        ``se`` read from its interval at its own level (``self.confidence``) with the quantile
        that built it (Student t, ``R n_groups - 1`` degrees of freedom), and capped at 0;
        counted and empty tokens are left as they are.
        """
        from scipy import stats

        x = self.log_fractions[ids].astype(np.float64, copy=True)
        lo = self.log_lower[ids].astype(np.float64, copy=True)
        hi = self.log_upper[ids].astype(np.float64, copy=True)
        rare = (self.token_method[ids] == "rare-event") & np.isfinite(x) & np.isfinite(lo)
        # the intervals are Student-t on R * n_groups - 1 degrees of freedom (R runs of
        # n_groups groups each, _rare_event.log_cone_gaussian_measure); read se back with the
        # same quantile (a normal z would overstate se by t/z, 1.09 at one run of 16 groups)
        info = self.extra.get("rare_event") if isinstance(self.extra, dict) else None
        n_groups = int(info["n_groups"]) if isinstance(info, dict) and "n_groups" in info else 0
        runs = np.asarray(self.extra.get("rare_event_n_runs", np.ones(self.counts.size)))[ids]
        if n_groups > 1:
            df = np.maximum(runs * n_groups - 1, 1)
            q = stats.t.ppf(0.5 + self.confidence / 2, df)
        else:
            q = np.full(x.size, stats.norm.ppf(0.5 + self.confidence / 2))
        # only rare-event tokens are shifted; an empty cell's -inf - -inf is no standard error
        se = np.full(x.size, np.nan)
        se[rare] = (x[rare] - lo[rare]) / np.broadcast_to(q, x.shape)[rare]
        # each token's own standard error where the run recorded it: n_runs counts the pilot
        # (which is not in the estimate), so the read-back above would take too many degrees
        # of freedom (a t quantile too small, a shift too large); kept for files without it
        known = np.asarray(self.extra.get("rare_event_std_err", np.full(self.counts.size, np.nan)),
                           dtype=np.float64)[ids]
        se = np.where(np.isfinite(known), known, se)
        shift = np.zeros(x.size)
        shift[rare] = 0.5 * se[rare] ** 2
        x = np.minimum(x + shift, 0.0)
        lo = np.minimum(lo + shift, x)
        hi = np.minimum(hi + shift, 0.0)  # nan (unresolved) and -inf (empty) stay as they are
        return x, lo, hi

    @property
    def log_volumes(self) -> np.ndarray:
        """``log_fractions + log vol(S)``: estimated log-volume of ``E_t ∩ S`` in nats.

        float64 (n_tokens,), from the best estimate of each token (:attr:`log_fractions`: the
        rare-event share where ``token_method`` says so, else the count's). ``-inf`` only for
        cells proven empty; ``nan`` where unresolved, e.g. a token with no uniform hit outside
        the rare-event sample (its volume is only bounded above, by ``log_upper + log vol(S)``).
        """
        return self.log_fractions + self.support_log_volume

    @property
    def n_zero(self) -> int:
        """Tokens with no uniform hit (``counts == 0``). Not the proven-empty cells
        (``token_method == "empty"``): a tiny cell may have no hit and a finite rare-event
        share."""
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

    def top_share_if_equal(self, q: float = 0.01, n_draws: int = 32) -> float:
        """What :meth:`top_share` would read if every cell had the same share ``1/|V|``.

        The baseline for :meth:`top_share`: with ``n_samples`` uniform samples over ``|V|``
        cells the largest ``ceil(q |V|)`` counts hold more than ``q`` of the samples by chance
        alone (with fewer samples than ``q |V|``, all of them). The mean over ``n_draws``
        multinomial draws, seeded from this result's seed (reproducible).

        Raises
        ------
        ValueError
            ``q`` outside (0, 1]; ``n_draws`` outside [1, 10000].
        """
        q = check_probability(q, "q")
        n_draws = check_positive_int(n_draws, "n_draws")
        if n_draws > 10_000:
            raise ValueError(f"n_draws: expected at most 10000 (the mean's error is already "
                             f"far below the statistic's own), got {n_draws}")
        V = self.counts.size
        k = max(1, math.ceil(q * V))
        if k >= self.n_samples:  # at most n_samples cells are hit: the top k hold them all
            return 1.0
        # a named sub-stream of the result's seed (no spawn: that would advance the seed, and
        # a second call would draw other multinomials); the key lies above every token's
        seed = self.seed if isinstance(self.seed, np.random.SeedSequence) else None
        rng = np.random.default_rng(seed_sequence(seed, _BASELINE_STREAM) if seed is not None else 0)
        p = np.full(V, 1.0 / V)
        total = 0
        for _ in range(n_draws):
            c = rng.multinomial(self.n_samples, p)
            total += int(np.partition(c, V - k)[V - k:].sum())
        return total / (n_draws * self.n_samples)

    def to_dict(self) -> dict:
        """JSON-able summary (no per-token arrays, ``extra``'s left out too; save ``fractions``
        with numpy)."""
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
            "estimator": self.estimator,
            **_seed_record(self.seed),
            "seconds": float(self.seconds),
            "max_fraction": float(self.fractions.max()),
            "median_hit_fraction": float(np.median(nz)) if nz.size else float("nan"),
            "top1pct_share": self.top_share(0.01),
            **{k: v for k, v in self.extra.items() if not isinstance(v, np.ndarray)},
        }

    def histogram(self, ax=None, path=None, bins: int | None = None, title: str | None = None):
        """Histogram of per-token cell volumes: log-share in nats on x, number of tokens on y.

        With rare-event estimates (``token_method == "rare-event"``) the histogram shows
        ``log_fractions`` of every estimated token. Otherwise tokens with no hit have no finite
        log fraction: they are drawn as a separate grey bar to the left of the axis break,
        labelled with their count and the Clopper-Pearson/Wilson upper bound they all share.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Draw into it; default a new figure.
        path : str or path-like, optional
            Save the figure as PNG there (its folder must exist). A name without a suffix gets
            ``.png`` appended (``path="h"`` writes ``h.png``), as with every plot helper
            (:func:`embgeom.report.figures._figure_path`).
        bins : int, optional
            Default ``clip(sqrt(k), 5, 50)`` for k drawn tokens.
        title : str, optional
            Default: the estimator and its budget.

        Returns
        -------
        matplotlib Axes

        Raises
        ------
        TypeError
            ``ax`` not a matplotlib Axes; ``path`` not a str or path-like object; ``bins`` not
            an integer.
        ValueError
            ``path`` an existing directory, ending in a separator, or with a suffix matplotlib
            cannot write; ``bins < 1`` or above 10,000. All before anything is drawn.

        Notes
        -----
        The drawing lives in :func:`embgeom.report.figures.plot_cell_histogram` (matplotlib's
        object API; imported only when this method is called). The report draws the cells as a
        rank plot instead (:func:`embgeom.report.figures.plot_cell_shares`).
        """
        from .report.figures import plot_cell_histogram

        return plot_cell_histogram(self, ax=ax, path=path, bins=bins, title=title)


def _direction_map(decoder: Decoder, G) -> tuple[bool, np.ndarray | None]:
    """Whether Gaussian directions suffice, and the map applied to them.

    With no bias every cell is a cone; when the support is an origin-centred ellipsoid ``G B``
    (``support.origin_ellipsoid_map()`` is not None) a cell's share of it is the standard
    Gaussian measure of ``G^{-1} E_t``, so Gaussian directions mapped by ``G`` give the same
    estimate as uniform points (docs/theory.md, section 1). ``G`` is that map (float (d, d), or
    None when there is none), computed once by :func:`cell_volumes`. Returns ``(directions,
    G32)`` with ``G32`` the float32 ``G.T`` to right-multiply rows by, or None when ``G`` is a
    positive multiple of the identity (no map needed: the cells are scale-invariant).
    """
    if G is None or decoder.bias_ is not None:
        return False, None
    G = np.asarray(G, dtype=np.float64)
    if G.shape != (decoder.dim, decoder.dim):
        raise ValueError(f"support.origin_ellipsoid_map: returned shape {G.shape}, expected "
                         f"{(decoder.dim, decoder.dim)}")
    if not np.all(np.isfinite(G)):
        raise ValueError("support.origin_ellipsoid_map: returned a map with NaN or inf entries")
    diag = np.diag(G)
    if np.count_nonzero(G - np.diag(diag)) == 0 and np.all(diag == diag[0]) and diag[0] > 0:
        return True, None
    # a cone only sees directions: bring max|G| to [0.5, 1) by a power of two (exact), so that
    # float32 neither underflows (an ellipsoid of semi-axes 1e-50 mapped every direction to 0,
    # and token 0 took every tie) nor overflows (1e40) at any scale of the support
    g_max = float(np.abs(G).max())
    if g_max == 0.0:
        raise ValueError("support.origin_ellipsoid_map: returned the zero map")
    G = np.ldexp(G, -math.frexp(g_max)[1])
    return True, np.ascontiguousarray(G.T, dtype=np.float32)


#: Points per random block of :func:`cell_volumes`: block ``i`` draws its points from
#: ``task_seed(root, i)`` (child ``i`` of ``root.spawn``), whatever ``batch_size`` and the
#: executor, so those change the speed and never the counts. 8192, the earlier default
#: ``batch_size``, keeps the counts of a default run as they were.
SAMPLE_BLOCK = 8192

#: The most uniform samples one :func:`cell_volumes` call takes: 2**34 (1.7e10) points, 2**21
#: blocks. Past it the block list alone would fill the memory (10**30 samples hung, growing
#: memory); at SmolLM2's size 2**34 points are already about 1,000 CPU-hours.
MAX_SAMPLES = 2**34


def _count_blocks(blocks: tuple, *, decoder: Decoder, support, directions: bool, root,
                  G32: np.ndarray | None = None) -> np.ndarray:
    """One task of :func:`cell_volumes`: hits per token of the random blocks ``blocks``.

    ``blocks`` is a tuple of ``(i, m)``: block ``i`` of ``m`` points drawn from
    ``task_seed(root, i)``. Returns int64 (n_tokens,) summing to the points of all blocks.
    """
    counts = np.zeros(decoder.n_tokens, dtype=np.int64)
    for i, m in blocks:
        counts += _count_chunk(m, decoder=decoder, support=support, directions=directions,
                               seed=task_seed(root, i), G32=G32)
    return counts


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
        return _kernels.count_tokens(decoder.assign(X), decoder.n_tokens)
    X = np.asarray(support.sample(m, seed=rng))
    if X.shape != (m, decoder.dim):
        raise ValueError(f"support.sample: returned shape {X.shape}, expected {(m, decoder.dim)}")
    try:
        cells = decoder.assign(X)  # it checks the points (one pass); name where they came from
    except ValueError as exc:
        if "NaN or infinite" not in str(exc):
            raise
        raise ValueError("support.sample: returned NaN or infinite points (a support's samples "
                         "must be finite)") from None
    return _kernels.count_tokens(cells, decoder.n_tokens)


def _cone_dim(decoder, G) -> int:
    """Dimension ``k`` of the cones the rare-event estimator measures: ``d``, or the rank of
    ``G`` (its range, as :func:`embgeom._rare_event.prepare_cones` reduces it)."""
    if G is None:
        return int(decoder.dim)
    sv = np.linalg.svd(np.asarray(G, np.float64), compute_uv=False)
    return int(np.sum(sv > sv[0] * 1e-12)) if sv.size and sv[0] > 0 else 0


def _counts_suffice(counts, n: int, n_chains: int, level_prob: float,
                    target_se: float | None = None) -> np.ndarray:
    """bool: the uniform count's log-standard error is no larger than the one splitting would reach.

    The count's (delta method): ``sqrt((1 - p) / k)`` for ``k`` hits of ``n``, ``p = k / n``.
    Splitting's, for a share ``p`` reached in ``L = log p / log level_prob`` levels of
    ``n_chains`` chains each keeping a fraction ``level_prob`` (Cerou & Guyader 2007, the
    variance of adaptive multilevel splitting): ``sqrt(L (1 - level_prob) / (level_prob
    n_chains))`` for one run; with ``target_se`` splitting runs until it reaches ``target_se``
    (the smaller of the two is what it reaches). Tokens with no hit always go to splitting.
    With 20,000 samples and 128 chains the count wins down to shares of about 1e-3 (k of about
    20) without a target, about 3.5e-3 (k of about 70) at a target of 0.12 nats.
    """
    k = np.asarray(counts, np.float64)
    p = k / n
    with np.errstate(divide="ignore", invalid="ignore"):
        se_count = np.sqrt((1 - p) / k)
        levels = np.maximum(1.0, np.log(p) / math.log(level_prob))
    se_split = np.sqrt(levels * (1 - level_prob) / (level_prob * n_chains))
    if target_se is not None:
        se_split = np.minimum(se_split, target_se)
    return (k > 0) & (se_count <= se_split)


def _uniform_logs(counts, n, lower, upper):
    """Log figures of uniform counts: ``log(k/n)`` (``nan`` at k = 0), ``log lower``, ``log upper``."""
    with np.errstate(divide="ignore"):
        frac = np.where(counts > 0, np.log(np.maximum(counts, 1) / n), np.nan)
        return frac, np.log(lower), np.log(upper)


def _token_sample(tokens, n_tokens: int, root: np.random.SeedSequence) -> np.ndarray:
    """Token ids for the rare-event estimator: all, a seeded uniform sample, or given ids."""
    if isinstance(tokens, str):
        if tokens != "auto":
            raise ValueError(f"tokens: expected 'auto', None, an int or token ids, got {tokens!r}")
        tokens = None if n_tokens <= AUTO_ALL_TOKENS else AUTO_TOKEN_SAMPLE
    if tokens is None:
        return np.arange(n_tokens, dtype=np.int64)
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
        k = check_positive_int(tokens, "tokens")
        if k >= n_tokens:
            return np.arange(n_tokens, dtype=np.int64)
        rng = np.random.default_rng(task_seed(root, TOKEN_SAMPLE_KEY))
        return np.sort(rng.choice(n_tokens, size=k, replace=False)).astype(np.int64)
    ids = np.asarray(tokens)
    if ids.ndim == 0 or (ids.size and ids.dtype.kind not in "iu"):  # 2.5, True, [0.5, 1.0]
        raise TypeError("tokens: expected 'auto', None, an int or a non-empty 1-D array of token "
                        f"ids, got {type(tokens).__name__} {tokens!r}")
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("tokens: expected 'auto', None, an int or a non-empty 1-D array of token ids")
    if ids.min() < 0 or ids.max() >= n_tokens:
        raise ValueError(f"tokens: ids must lie in [0, {n_tokens})")
    return np.unique(ids).astype(np.int64)


#: Key of the token sample's stream among the root's children (the uniform blocks use keys
#: 0, 1, ... and the rare-event tokens the children of :data:`RARE_EVENT_KEY`).
TOKEN_SAMPLE_KEY = 2**31 - 1
#: Key of the rare-event streams: token ``t`` draws from child ``t`` of
#: ``task_seed(root, RARE_EVENT_KEY)``, apart from the uniform blocks' streams.
RARE_EVENT_KEY = "rare-event"
#: ``tokens="auto"``: every token up to this vocabulary size, else a seeded uniform sample.
AUTO_ALL_TOKENS = 4096
#: Size of that sample: enough for lambda and the histogram (the spread of log-shares across
#: tokens, several nats, sets their interval; issue 16).
AUTO_TOKEN_SAMPLE = 1000


def _check_cell_volume_args(decoder, support, n_samples, batch_size, confidence, interval,
                            method, n_chains, tokens, target_se, rare_event_options, *,
                            advice: str = "use method='uniform' or 'auto'"):
    """The arguments of :func:`cell_volumes` checked before any sampling (its Raises).

    Returns ``(n_samples, batch_size, confidence, n_chains, target_se, G, why_not,
    rare_event_options)``: ``G`` the support's origin-ellipsoid map (read once: the direction
    map and the cones use it), ``why_not`` why the rare-event estimator does not apply (None
    where it does), the options checked against ``n_chains``.
    """
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder: expected an embgeom.cells.Decoder, got {type(decoder).__name__}")
    n_samples = check_positive_int(n_samples, "n_samples")
    if n_samples > MAX_SAMPLES:
        raise ValueError(f"n_samples: expected at most 2**34 ({MAX_SAMPLES:.3g}) uniform samples "
                         f"per call, got {n_samples:.3g}; split the work over calls with "
                         "different seeds and add the counts")
    batch_size = check_positive_int(batch_size, "batch_size")
    from sklearn.utils.validation import check_is_fitted

    if hasattr(type(support), "origin_ellipsoid_map") and hasattr(type(support), "fit"):
        check_is_fitted(support)  # an unfitted Support: NotFittedError, not "not a Support"
    if not all(hasattr(support, a) for a in ("dim", "sample", "origin_ellipsoid_map")):
        raise TypeError(
            "support: expected a Support with .dim, .sample and .origin_ellipsoid_map, got "
            f"{type(support).__name__}"
        )
    if isinstance(support.dim, bool) or not isinstance(support.dim, (int, np.integer)):
        raise TypeError(f"support.dim: expected an int, got {type(support.dim).__name__} "
                        f"{support.dim!r}")
    if int(support.dim) != decoder.dim:
        raise ValueError(f"support: has dimension {support.dim}, the decoder's hidden size is d={decoder.dim}")
    if not isinstance(interval, str) or interval not in ("clopper-pearson", "wilson"):
        raise ValueError(f"interval: expected 'clopper-pearson' or 'wilson', got {interval!r}")
    confidence = check_probability(confidence, "confidence", open_right=True)
    if not isinstance(method, str) or method not in ("auto", "uniform", "rare-event"):
        raise ValueError(f"method: expected 'auto', 'uniform' or 'rare-event', got {method!r}")
    n_chains = check_positive_int(n_chains, "n_chains")
    if not (isinstance(tokens, str) or tokens is None):  # bad ids are refused for every method
        _token_sample(tokens, decoder.n_tokens, np.random.SeedSequence(0))
    G = support.origin_ellipsoid_map()
    why_not = None
    if method != "uniform" and (decoder.bias_ is not None or G is None):
        why_not = ("the decoder has a bias" if decoder.bias_ is not None else
                   f"the support ({type(support).__name__}) is not an origin-centred ellipsoid")
        if method == "rare-event":
            raise ValueError(f"method: 'rare-event' needs cells that are cones through the support's "
                             f"centre, but {why_not}; {advice}")
    if target_se is not None:
        target_se = check_positive(target_se, "target_se")
    if method != "uniform" and why_not is None:
        rare_event_options = _check_rare_event_options(rare_event_options, n_chains, confidence,
                                                       target_se)
    return n_samples, batch_size, confidence, n_chains, target_se, G, why_not, rare_event_options


def _keep_counts(logs: dict, summary: dict, ids, counted, counts, n_samples: int, lower, upper,
                 n_tokens: int) -> None:
    """Give the sampled tokens whose uniform count is the tighter estimate (``counted``) their
    count's log figures and ``token_method`` "uniform"; record the sample in ``summary``."""
    if counted.any():
        c_ids = ids[counted]
        lf, llo, lhi = _uniform_logs(counts[c_ids], n_samples, lower[c_ids], upper[c_ids])
        logs["log_fractions"][c_ids], logs["log_lower"][c_ids] = lf, llo
        logs["log_upper"][c_ids] = lhi
        logs["token_method"][c_ids] = "uniform"
    summary["n_by_counts"] = int(counted.sum())
    summary["token_sample"] = int(ids.size)
    summary["sample_is_all"] = bool(ids.size == n_tokens)


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
    method: str = "auto",
    tokens="auto",
    n_chains: int = 128,
    target_se: float | None = 0.12,
    rare_event_options: dict | None = None,
    executor="local",
    n_jobs: int | None = None,
) -> CellVolumes:
    """Monte Carlo volume fraction of every decoder cell inside a support.

    Points are drawn uniformly in ``support`` in blocks of :data:`SAMPLE_BLOCK` = 8192 (never
    all at once), assigned with :meth:`Decoder.assign` (blocked product + numba running argmax)
    and counted with a numba kernel. Block ``i`` draws from child ``i`` of the root
    ``SeedSequence`` of ``seed`` (:func:`embgeom.parallel.task_seed`; the caller's
    SeedSequence is not advanced), so the counts depend on ``seed`` and ``n_samples`` only:
    not on ``batch_size``, the executor, the number of workers, timing or threads.

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
    seed : None, int, array_like of int, SeedSequence, BitGenerator or Generator
        Anything ``numpy.random.default_rng`` takes (:func:`embgeom._validation.seed_sequence`;
        a Generator is advanced by one ``spawn``, as a draw would advance it). ``None``: fresh
        OS entropy. Every draw descends from its root ``SeedSequence`` (spawn key included):
        uniform block ``i`` from ``task_seed(root, i)``, the token sample from
        ``task_seed(root, TOKEN_SAMPLE_KEY)`` and rare-event token ``t`` from child ``t`` of
        ``task_seed(root, RARE_EVENT_KEY)``. The result keeps the root (``CellVolumes.seed``):
        passing it again reproduces the run bit for bit.
    batch_size : int, default 8192
        Points per task, rounded to whole blocks of :data:`SAMPLE_BLOCK` (at least one): the
        grouping of the blocks into tasks, which changes the speed, not the counts.
    confidence : float, default 0.95
    interval : {"clopper-pearson", "wilson"}
    progress : bool, default True
        tqdm progress bar (tasks).
    method : {"auto", "uniform", "rare-event"}, default "auto"
        ``"uniform"``: the counts above only. ``"rare-event"``: also each token's log-share by
        multilevel splitting (:func:`embgeom._rare_event.log_cone_gaussian_measure`), which
        needs a decoder without bias and an origin-centred ellipsoidal support (origin ball,
        final-norm shell without bias, ellipsoid centred at 0), where every cell is a cone.
        ``"auto"``: rare-event where it applies, uniform elsewhere (``estimator`` says which,
        ``extra["rare_event"]`` why); within the token sample, a token whose uniform count
        already gives a log-standard error no larger than splitting would reach (``target_se``,
        or one run of ``n_chains`` chains when ``target_se`` is None; with 20,000 samples and
        the defaults, shares above about 3.5e-3) keeps its count (``token_method`` "uniform";
        ``extra["rare_event"]["n_by_counts"]`` counts them) and is not split.
        ``"rare-event"`` splits every sampled token. With either, cones of at most 2 dimensions
        are not split but measured exactly (``token_method`` "exact"), counts or not.
    tokens : "auto", None, int or array_like of int, default "auto"
        Tokens given a rare-event estimate: ``None`` every token, an int a seeded uniform
        sample of that many (from ``seed``; an int of at least the vocabulary's size is every
        token, as ``None``, so that one setting serves models of every size), or the ids
        themselves. ``"auto"``: every token up
        to ``AUTO_ALL_TOKENS`` tokens, else a sample of ``AUTO_TOKEN_SAMPLE``.
    n_chains : int, default 128
        Rare-event chains per block (a multiple of ``n_groups``, 16 by default, with at least 2
        chains per group: 32 or more; at most 2**20). Each token gets one block, and more while
        ``target_se`` is not met.
    target_se : float or None, default 0.12
        Target standard error of each rare-event log-share, in **nats** (> 0; the interval's
        half-width is about twice it). A token whose error at one block is larger gets more
        blocks of ``n_chains`` chains: a run sized from its pilot's error, and a run of the
        blocks still missing if the error is still above (seeds spawned from its own stream),
        averaged in ``p``, up to ``rare_event_options["max_runs"]`` (32) blocks; small shares
        need more (the error of one block grows like ``sqrt(-log p / n_chains)``), big ones
        stay at one. ``extra["rare_event_n_runs"]`` holds each token's blocks, the pilot
        included (int64 per token, 0 where not split). ``None``: one run per token (the cheapest, errors of 0.3-0.6 nats for shares
        ``e^-10`` to ``e^-35`` at 128 chains).
    rare_event_options : dict, optional
        More keywords for :func:`embgeom._rare_event.log_cone_gaussian_measure`.
    executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
        Where the tasks run (:mod:`embgeom.parallel`); the decoder and the support are shipped
        once (``ray.put``). A name starts and afterwards closes its executor.
    n_jobs : int, optional
        Worker processes of the local executor (scikit-learn's convention: ``None`` or 1 one
        after the other in this process, ``-1`` every CPU); only with ``executor="local"``
        (:class:`embgeom.parallel.LocalExecutor`). The results are the same for every value:
        each block and each token draws from its own seed.

    Returns
    -------
    CellVolumes
        The uniform fields, and ``log_fractions``/``log_lower``/``log_upper``/``token_method``.

    Raises
    ------
    TypeError
        ``decoder`` not a Decoder, ``support`` without ``dim``/``sample``/``origin_ellipsoid_map``,
        bad seed or counts
        types.
    ValueError
        ``n_samples <= 0`` or above ``MAX_SAMPLES`` (2**34), ``n_chains <= 0``, ``target_se`` not a positive number, ``n_jobs``
        0 or given with an Executor instance or Ray, support of another dimension, the support's
        samples of the wrong shape or not finite, an unknown ``method``, ``method="rare-event"``
        with a bias or a support whose cells are not cones through its centre, bad ``tokens``.
    """
    n_samples, batch_size, confidence, n_chains, target_se, G, why_not, rare_event_options = \
        _check_cell_volume_args(decoder, support, n_samples, batch_size, confidence, interval,
                                method, n_chains, tokens, target_se, rare_event_options)
    root = seed_sequence(seed)
    try:
        log_vol = float(support.log_volume)
    except (AttributeError, RuntimeError):
        log_vol = float("nan")
    directions, G32 = _direction_map(decoder, G)
    t0 = time.perf_counter()
    blocks = [(i, min(SAMPLE_BLOCK, n_samples - s)) for i, s in enumerate(range(0, n_samples, SAMPLE_BLOCK))]
    per_task = max(1, round(batch_size / SAMPLE_BLOCK))
    tasks = {k: (tuple(blocks[j : j + per_task]),) for k, j in enumerate(range(0, len(blocks), per_task))}
    estimator = "uniform" if method == "uniform" or why_not else "rare-event"
    logs = {}
    with executor_scope(executor, n_jobs) as ex:  # one scope (one Ray start) for both passes
        if estimator == "rare-event" and hasattr(ex, "prepare"):
            ex.prepare(_rare_event_chunk)  # the pool's server starts while the counts run
        out = ex.map_keyed(_count_blocks, tasks, shared={"decoder": decoder, "support": support},
                           kwargs={"directions": directions, "G32": G32, "root": root},
                           progress=progress, desc="cell volumes")
        counts = np.zeros(decoder.n_tokens, dtype=np.int64)
        for c in out.values():  # integer sums: exact in any order
            counts += c
        lower, upper = binomial_interval(counts, n_samples, confidence, interval)
        extra = {"batch_size": batch_size, "sample_block": SAMPLE_BLOCK, "executor": ex.name}
        if estimator == "rare-event":
            ids = _token_sample(tokens, decoder.n_tokens, root)
            counted = np.zeros(ids.size, bool)
            if method == "auto" and _cone_dim(decoder, G) > EXACT_MAX_DIM:  # else exact angles
                counted = _counts_suffice(counts[ids], n_samples, n_chains,
                                          (rare_event_options or {}).get("level_prob", 0.5),
                                          target_se)
            logs, extra["rare_event"] = _rare_event_logs(
                decoder, G, ids[~counted], task_seed(root, RARE_EVENT_KEY),
                n_chains=n_chains, confidence=confidence, target_se=target_se,
                options=rare_event_options, progress=progress, executor=ex)
            extra["rare_event_n_runs"] = logs.pop("n_runs")
            extra["rare_event_std_err"] = logs.pop("std_err")
    if estimator == "rare-event":
        _keep_counts(logs, extra["rare_event"], ids, counted, counts, n_samples, lower, upper,
                     decoder.n_tokens)
    elif why_not is not None:
        extra["rare_event"] = f"not applicable: {why_not}; uniform sampling only"
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
        seed=_copy_seed(root),
        seconds=time.perf_counter() - t0,
        extra=extra,
        estimator=estimator,
        **logs,
    )


#: Most tokens per rare-event task (each token has its own seed, so the chunking changes no result).
RARE_EVENT_CHUNK = 64
#: Rare-event tasks per pool worker, at least (fewer tokens per task where needed).
TASKS_PER_WORKER = 16


def _ex_workers(executor) -> int:
    """Worker processes of a local executor (1 for a name, Ray or a serial one)."""
    return int(getattr(executor, "n_workers", 1)) if not isinstance(executor, str) else 1


def _rare_event_chunk_size(n_ids: int, workers: int) -> int:
    """Tokens per rare-event task: :data:`RARE_EVENT_CHUNK`, or fewer so that a pool of
    ``workers`` gets about :data:`TASKS_PER_WORKER` tasks each (token costs vary tenfold: small
    tasks balance the load, and a worker's tasks share one Gram buffer). Changes no result."""
    if workers <= 1:
        return RARE_EVENT_CHUNK
    return max(1, min(RARE_EVENT_CHUNK, math.ceil(n_ids / (TASKS_PER_WORKER * workers))))


def _rare_event_chunk(ids, *, cones, root, settings, kw):
    """One rare-event task: :func:`embgeom._rare_event.measure_cones` on a chunk of token ids,
    reading the cone set-up prepared once per call."""
    from ._rare_event import _GramBuffer
    from .parallel import worker_state

    # a pool worker keeps one Gram buffer for all its tasks (a fresh one page-faults its used
    # corner again: about 0.1 s per task); a serial call frees its buffer when it returns
    state = worker_state()
    gram = None if state is None else state.setdefault("rare_event_gram", _GramBuffer())
    return measure_cones(cones, np.asarray(ids, dtype=np.int64), root, settings, progress=False,
                         gram_buffer=gram, **kw)


def _concat_measures(parts: list) -> ConeMeasure:
    """Join per-chunk :class:`ConeMeasure` results (token order kept)."""
    first = parts[0]
    arrays = {f: np.concatenate([getattr(p, f) for p in parts])
              for f in ("token_ids", "log_share", "log_lower", "log_upper", "std_err", "side",
                        "n_levels", "n_constraints_used", "n_full_checks", "log_check_fraction",
                        "seconds", "n_runs")}
    return ConeMeasure(**arrays, confidence=first.confidence, params=first.params)


#: keys of ``rare_event_options`` that cell_volumes sets itself
_RARE_EVENT_OWN = ("W", "seed", "confidence", "n_chains", "target_se", "G", "token_ids",
                   "progress")


def _check_rare_event_options(options, n_chains: int, confidence: float,
                              target_se: float | None = None) -> dict:
    """``rare_event_options`` as a dict of the estimator's tuning keywords, checked together with
    ``n_chains`` and ``confidence`` before any sampling (ValueError/TypeError)."""
    import inspect

    from ._rare_event import _check_settings, log_cone_gaussian_measure

    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"rare_event_options must be a dict or None, got {type(options).__name__}")
    params = inspect.signature(log_cone_gaussian_measure).parameters
    allowed = [k for k in params if k not in _RARE_EVENT_OWN]
    for key in options:
        if key in _RARE_EVENT_OWN:
            raise ValueError(f"rare_event_options: {key!r} is set by cell_volumes itself")
        if key not in allowed:
            raise ValueError(f"rare_event_options: unknown option {key!r}; expected one of {allowed}")
    checked = inspect.signature(_check_settings).parameters
    settings = {k: options.get(k, params[k].default) for k in checked}
    settings.update(n_chains=n_chains, confidence=confidence, target_se=target_se)
    _check_settings(**settings)  # e.g. n_chains not a multiple of n_groups: now, not after the uniform pass
    return dict(options)


def _rare_event_logs(decoder, G, ids, seed, *, n_chains, confidence, options, progress,
                     executor="local", target_se=None):
    """Rare-event log figures for ``ids``; ``nan`` / "not estimated" for the other tokens.

    The cone set-up (:func:`embgeom._rare_event.prepare_cones`: ``W`` checked and scaled, the
    range of ``G``, ``W G`` and its row norms) is built once and put once on ``executor``;
    token chunks of :data:`RARE_EVENT_CHUNK` run as keyed tasks reading it. Token ``t`` draws
    from child ``t`` of the SeedSequence ``seed``, so the figures are the same for every
    executor and chunking.
    """
    import inspect

    from ._rare_event import _check_settings

    opts = dict(options or {})  # checked by cell_volumes before the uniform pass
    V = decoder.n_tokens
    if ids.size == 0:  # every sampled token was resolved by its count
        return {"log_fractions": np.full(V, np.nan), "log_lower": np.full(V, np.nan),
                "log_upper": np.full(V, np.nan),
                "token_method": np.full(V, "not estimated", dtype="<U13"),
                "n_runs": np.zeros(V, dtype=np.int64), "std_err": np.full(V, np.nan)}, \
            {"n_chains": n_chains, "target_se": target_se}
    params = inspect.signature(log_cone_gaussian_measure).parameters
    opt = {k: opts.get(k, params[k].default) for k in params if k not in _RARE_EVENT_OWN}
    opt.update(n_chains=n_chains, confidence=confidence, target_se=target_se)
    checked = [k for k in inspect.signature(_check_settings).parameters if k != "seed"]
    settings = _check_settings(seed=seed, **{k: opt[k] for k in checked})
    kw = {"move": opt["move"], "working_set": opt["working_set"], "full_check": bool(opt["full_check"])}
    cones = prepare_cones(decoder.W_, G)  # once: validation, scaling, range of G, W G, row norms
    chunk = _rare_event_chunk_size(ids.size, _ex_workers(executor))
    tasks = {k: (tuple(int(t) for t in ids[j:j + chunk]),)
             for k, j in enumerate(range(0, ids.size, chunk))}
    with executor_scope(executor) as ex:
        out = ex.map_keyed(_rare_event_chunk, tasks, shared={"cones": ex.put(cones)},
                           kwargs={"root": seed, "settings": settings, "kw": kw},
                           progress=progress, desc="rare-event cells")
    r = _concat_measures([out[k] for k in tasks])
    log_f, log_lo, log_hi = (np.full(V, np.nan) for _ in range(3))
    method = np.full(V, "not estimated", dtype="<U13")
    log_f[ids], log_lo[ids], log_hi[ids] = r.log_share, r.log_lower, r.log_upper
    method[ids] = np.select([r.side == "empty", r.side == "exact"], ["empty", "exact"],
                            "rare-event")
    n_runs = np.zeros(V, dtype=np.int64)
    n_runs[ids] = r.n_runs
    std_err = np.full(V, np.nan)
    std_err[ids] = r.std_err
    summary = {**r.to_dict(), "token_sample": int(ids.size), "sample_is_all": bool(ids.size == V)}
    if target_se is not None:
        missed = int(np.count_nonzero(np.isfinite(r.log_share) & (r.std_err > target_se)))
        summary["n_tokens_above_target_se"] = missed
        if missed:
            import warnings

            warnings.warn(
                f"target_se: {missed} of {ids.size} split tokens stopped at max_runs="
                f"{opt['max_runs']} blocks of {n_chains} chains with a standard error above "
                f"target_se={target_se} nats (their intervals are wider; raise n_chains or "
                "rare_event_options['max_runs'] to reach it)", RuntimeWarning, stacklevel=3)
    return {"log_fractions": log_f, "log_lower": log_lo, "log_upper": log_hi,
            "token_method": method, "n_runs": n_runs, "std_err": std_err}, summary



# --------------------------------------------------------------------------------------------
# every cell of the vocabulary, resumable
# --------------------------------------------------------------------------------------------
#: Codes of ``token_method`` in the ``.npz`` of :func:`vocabulary_cell_volumes`.
_METHOD_CODES = ("not estimated", "rare-event", "uniform", "empty", "exact")  # append only


def _fingerprint(decoder: Decoder, G) -> str:
    """SHA-256 of what the cells and their shares depend on: ``W`` (float32 bytes), the bias,
    and the support's origin-ellipsoid map ``G`` up to scale (float32 bytes of ``G / max|G|``)."""
    import hashlib

    h = hashlib.sha256()
    W = np.ascontiguousarray(decoder.W_, dtype=np.float32)
    h.update(repr(W.shape).encode())
    h.update(W.tobytes())
    h.update(b"bias:" + (b"none" if decoder.bias_ is None else
                         np.ascontiguousarray(decoder.bias_, np.float32).tobytes()))
    # the cells are cones: their shares of G B do not change when G is scaled, so G enters up
    # to scale (divided by its largest entry: r I of any radius r gives the same I exactly)
    G = np.asarray(G, np.float64)
    h.update(b"G:" + np.ascontiguousarray(G / np.abs(G).max(), dtype=np.float32).tobytes())
    return h.hexdigest()


def _save_npz(path, arrays: dict, settings: dict) -> None:
    """Write ``arrays`` and the JSON ``settings`` to ``path`` atomically (temp file + rename)."""
    import json
    import os

    tmp = f"{path}.tmp.npz"
    np.savez_compressed(tmp, settings=np.array(json.dumps(settings)), **arrays)
    os.replace(tmp, path)


def _open_npz(path):
    """``np.load(path)`` of a ``.npz`` (no pickles), or ``ValueError`` naming ``path``."""
    import zipfile

    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        # EOFError: an empty file; BadZipFile: a .npz cut short or not a zip at all
        raise ValueError(f"path: {path} is not a .npz of vocabulary_cell_volumes (not a numpy "
                         "archive)") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"path: {path} is not a .npz of vocabulary_cell_volumes (a single array)")
    return z


#: Arrays every ``.npz`` of :func:`vocabulary_cell_volumes` holds (``std_err`` came later and
#: may be missing from older files).
_VOCABULARY_ARRAYS = ("counts", "done", "log_fractions", "log_lower", "log_upper",
                      "token_method", "n_runs")


def _read_vocabulary_npz(path) -> tuple[dict, dict]:
    """``(settings, arrays)`` of a ``.npz`` of :func:`vocabulary_cell_volumes`; any other file
    (not a numpy archive, no or foreign settings, arrays missing or unreadable) is one
    ``ValueError`` naming ``path`` (``FileNotFoundError`` when there is none)."""
    import json
    import zipfile
    import zlib

    z = _open_npz(path)
    with z:
        if "settings" not in z.files:
            raise ValueError(f"path: {path} is not a file of vocabulary_cell_volumes (no settings)")
        try:
            settings = json.loads(str(z["settings"]))
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error):
            settings = None  # not JSON (json.JSONDecodeError is a ValueError) or unreadable
        if not isinstance(settings, dict):
            raise ValueError(f"path: {path} is not a file of vocabulary_cell_volumes (its "
                             "settings are not a JSON object)")
        if settings.get("kind") != "vocabulary_cell_volumes":
            raise ValueError(f"path: {path} is not a file of vocabulary_cell_volumes")
        missing = [k for k in _VOCABULARY_ARRAYS if k not in z.files]
        if missing:
            raise ValueError(f"path: {path} is not a file of vocabulary_cell_volumes (no "
                             f"{', '.join(missing)})")
        try:
            arrays = {k: z[k] for k in z.files if k != "settings"}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise ValueError(f"path: {path} is not a readable file of vocabulary_cell_volumes "
                             f"({type(e).__name__}: {e})") from None
    return settings, arrays


def _check_vocabulary_path(path) -> str:
    """``path`` as a str, checked before any work: not empty, not a folder, in a folder that
    exists and takes a new file (else the run would fail at its first save, after the whole
    uniform pass)."""
    import os

    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or path-like, got {type(path).__name__}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p:
        raise ValueError("path: expected the .npz file to write, got an empty path")
    if os.path.isdir(p):
        raise ValueError(f"path: {p} is a folder; expected the .npz file to write (e.g. "
                         f"{os.path.join(p, 'cells.npz')})")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.exists(folder):
        raise ValueError(f"path: the folder {folder} of {p} does not exist; create it first")
    if not os.path.isdir(folder):
        raise ValueError(f"path: {folder} (the folder of {p}) is not a folder")
    import tempfile

    try:  # the saves write a temporary file beside path, then rename it
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".embgeom-", suffix=".probe"):
            pass
    except OSError as e:
        raise ValueError(f"path: cannot write in the folder {folder} of {p} "
                         f"({e.strerror or e})") from None
    return p


def load_vocabulary_cell_volumes(path, decoder: Decoder | None = None, support=None) -> CellVolumes:
    """The :class:`CellVolumes` kept in a ``.npz`` of :func:`vocabulary_cell_volumes`.

    Parameters
    ----------
    path : str or path-like
    decoder, support : optional
        Both or neither. When given, the file must have been made for them (same ``W``, bias
        and support map ``G`` up to scale: a SHA-256 fingerprint), else ``ValueError``: a file
        of another model or support is never read as this one's. The shares are those of
        directions, so a rescaled support reads the same shares, and ``support_log_volume``
        (hence ``log_volumes``) is then the given support's, not the file's.

    Returns
    -------
    CellVolumes
        ``estimator="rare-event"``; tokens not done yet (an unfinished run) are
        ``"not estimated"``. ``extra["vocabulary"]`` holds the file's settings, including
        ``n_done`` and ``complete``.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not a file of :func:`vocabulary_cell_volumes`, or made for another decoder or support.
    """
    settings, a = _read_vocabulary_npz(path)
    if (decoder is None) != (support is None):
        raise ValueError("decoder, support: pass both (to check that the file was made for "
                         "them) or neither")
    if decoder is not None:
        G = support.origin_ellipsoid_map()
        if G is None or _fingerprint(decoder, G) != settings["fingerprint"]:
            raise ValueError(f"path: {path} was made for another decoder or support "
                             "(fingerprint of W, bias and G differs)")
        # the shares are scale-free; the volume is the given support's (G up to scale)
        settings = {**settings, "support_log_volume": float(support.log_volume)}
    return _vocabulary_result(a, settings)


def _vocabulary_result(a: dict, settings: dict) -> CellVolumes:
    """A :class:`CellVolumes` from the arrays and settings of the ``.npz``."""
    counts = a["counts"].astype(np.int64)
    n = int(settings["n_samples"])
    lower, upper = binomial_interval(counts, n, settings["confidence"], settings["interval"])
    done = a["done"].astype(bool)
    method = np.asarray(_METHOD_CODES)[a["token_method"].astype(np.int64)]
    method[~done] = "not estimated"
    logs = {k: np.where(done, a[k].astype(np.float64), np.nan)
            for k in ("log_fractions", "log_lower", "log_upper")}
    info = dict(settings["rare_event"])
    info.update(token_sample=int(done.sum()), sample_is_all=bool(done.all()),
                n_by_counts=int((method == "uniform").sum()))
    root = np.random.SeedSequence(settings["seed_entropy"], spawn_key=tuple(settings["seed_spawn_key"]))
    return CellVolumes(
        fractions=counts / n, counts=counts, n_samples=n, lower=lower, upper=upper,
        confidence=settings["confidence"], interval=settings["interval"],
        support_log_volume=float(settings["support_log_volume"]), sampling="directions",
        seed=root, seconds=float(settings.get("seconds", 0.0)), estimator="rare-event",
        extra={"rare_event": info, "rare_event_n_runs": a["n_runs"].astype(np.int64),
               "rare_event_std_err": (np.where(done, a["std_err"].astype(np.float64), np.nan)
                                      if "std_err" in a else np.full(counts.size, np.nan)),
               "vocabulary": {k: v for k, v in settings.items() if k != "rare_event"}},
        token_method=method, **logs)


def vocabulary_cell_volumes(decoder: Decoder, support, path, n_samples: int = 20_000, seed=0, *,
                            chunk_size: int = 2048, n_chains: int = 128,
                            target_se: float | None = 0.12, confidence: float = 0.95,
                            interval: str = "clopper-pearson", rare_event_options: dict | None = None,
                            max_chunks: int | None = None, n_jobs: int | None = None,
                            executor="local", progress: bool = True) -> CellVolumes:
    """Every token's cell share, in chunks saved to ``path`` as they finish (resumable).

    The same estimate as ``cell_volumes(decoder, support, n_samples, seed, tokens=None,
    method="auto", ...)`` (to float32; every token draws from its own seed, so the chunking
    changes nothing): the uniform pass once, then the tokens whose count is not the tighter
    estimate by rare-event splitting, ``chunk_size`` tokens at a time. After each chunk the
    ``.npz`` is rewritten (temp file + rename: a run killed at any moment leaves the last
    finished chunk); a rerun with the same arguments reads it and goes on from there. The file
    keeps, per token, the log-share and its interval (float32, nats), the estimator that made
    it, the splitting runs taken and the uniform count, with the settings and a fingerprint of
    ``W``, bias and the support's map ``G``, so a file is never read for another model or
    support (:func:`load_vocabulary_cell_volumes`).

    Parameters
    ----------
    decoder : Decoder
        Without bias (the cells must be cones).
    support : Support
        An origin-centred ellipsoid (origin ball, final-norm shell without bias).
    path : str or path-like
        The ``.npz`` to write (and to resume from).
    n_samples : int, default 20000
        Uniform points of the count pass.
    seed : int >= 0 or numpy.random.SeedSequence, default 0
        Root seed (recorded in the file; ``None`` is refused: a resumed run must draw the same).
    chunk_size : int, default 2048
        Tokens per saved chunk.
    n_chains, target_se, confidence, interval, rare_event_options
        As in :func:`cell_volumes`.
    max_chunks : int, optional
        Stop after this many new chunks (a bounded step of a long run).
    n_jobs, executor, progress
        As in :func:`cell_volumes` (``n_jobs=-1``: every CPU).

    Returns
    -------
    CellVolumes
        As :func:`load_vocabulary_cell_volumes` returns it (tokens of unfinished chunks
        ``"not estimated"``).

    Raises
    ------
    TypeError, ValueError
        As :func:`cell_volumes`; a decoder with a bias or a support whose cells are not cones
        through its centre; ``seed=None``; ``path`` empty, a folder, or in a folder that does not
        exist or takes no new file (read-only, full); ``path`` holding a file that is not one of this function's, or one of other
        settings (another model, support, seed or budget: move it away). All checked before
        any work.
    """
    if seed is None:
        raise ValueError("seed: expected an int >= 0 or a SeedSequence (a resumed run must draw "
                         "what the first one drew), got None")
    if isinstance(seed, (np.random.Generator, np.random.BitGenerator)):
        raise TypeError(f"seed: expected an int >= 0 or a SeedSequence, got a "
                        f"{type(seed).__name__} (each use advances it, so a resumed run would "
                        "not draw what the first one drew)")
    n_samples, _, confidence, n_chains, target_se, G, why_not, options = _check_cell_volume_args(
        decoder, support, n_samples, 8192, confidence, interval, "rare-event", n_chains, None,
        target_se, rare_event_options,
        advice="vocabulary_cell_volumes splits every cell; for these cells use "
               "cell_volumes(..., method='uniform')")
    path = _check_vocabulary_path(path)
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    if max_chunks is not None:
        max_chunks = check_positive_int(max_chunks, "max_chunks")
    root = seed_sequence(seed)
    V = decoder.n_tokens
    settings = {"kind": "vocabulary_cell_volumes", "fingerprint": _fingerprint(decoder, G),
                "n_tokens": V, "n_samples": n_samples, **_seed_record(root),
                "n_chains": n_chains, "target_se": target_se, "confidence": confidence,
                "interval": interval, "rare_event_options": options, "chunk_size": chunk_size,
                "support": type(support).__name__}
    t0 = time.perf_counter()
    resumed = _vocabulary_resume(path, settings)  # a file of others is refused before any work
    with executor_scope(executor, n_jobs) as ex:
        a, settings = resumed if resumed is not None else _vocabulary_state(
            path, settings, decoder, support, n_samples, root, ex, confidence, interval, progress)
        # the shares are those of the directions (the fingerprint takes G up to scale), the
        # volume is this support's: a resumed run with a rescaled support keeps the shares
        settings["support_log_volume"] = float(support.log_volume)
        counted = _counts_suffice(a["counts"], n_samples, n_chains,
                                  options.get("level_prob", 0.5), target_se)
        todo = [j for j in range(0, V, chunk_size) if not a["done"][j:j + chunk_size].all()]
        for j in todo[:max_chunks]:
            ids = np.arange(j, min(V, j + chunk_size), dtype=np.int64)
            split = ids[~counted[ids]]
            logs, summary = _rare_event_logs(
                decoder, G, split, task_seed(root, RARE_EVENT_KEY), n_chains=n_chains,
                confidence=confidence, target_se=target_se, options=options, progress=progress,
                executor=ex)
            _vocabulary_chunk(a, ids, counted, logs, n_samples, confidence, interval)
            missed = int(settings.get("rare_event", {}).get("n_tokens_above_target_se", 0))
            settings["rare_event"] = {k: v for k, v in summary.items()
                                      if k not in ("token_sample", "sample_is_all")} \
                if split.size else settings.get("rare_event", summary)
            if target_se is not None:  # over every chunk so far, not the last one only
                settings["rare_event"]["n_tokens_above_target_se"] = missed + int(
                    summary.get("n_tokens_above_target_se", 0) if split.size else 0)
            settings["seconds"] = float(settings.get("seconds", 0.0) + time.perf_counter() - t0)
            t0 = time.perf_counter()
            settings["n_done"] = int(a["done"].sum())
            settings["complete"] = bool(a["done"].all())
            _save_npz(path, a, settings)
    return _vocabulary_result(a, settings)


def _vocabulary_resume(path: str, settings: dict):
    """``(arrays, settings)`` of the file at ``path`` when it is a run of these settings, None
    when there is no file; ``ValueError`` naming ``path`` for any other file."""
    import json
    import os

    fixed = ("kind", "fingerprint", "n_tokens", "n_samples", "seed_entropy", "seed_spawn_key",
             "n_chains", "target_se", "confidence", "interval", "rare_event_options", "chunk_size")
    if not os.path.exists(path):
        return None
    old, arrays = _read_vocabulary_npz(path)
    diff = [k for k in fixed if json.dumps(old.get(k)) != json.dumps(settings[k])]
    if diff:
        raise ValueError(f"path: {path} holds a run of other settings ({', '.join(diff)} "
                         "differ); move it away or pass its settings")
    # files written before the standard errors were kept: nan (read from the interval)
    arrays.setdefault("std_err", np.full(arrays["counts"].size, np.nan, np.float32))
    return arrays, old


def _vocabulary_state(path: str, settings: dict, decoder, support, n_samples, root, ex,
                      confidence, interval, progress):
    """A fresh state of a run at ``path`` (no file there yet): the uniform pass done and
    saved."""
    cv = cell_volumes(decoder, support, n_samples, root, confidence=confidence, interval=interval,
                      method="uniform", progress=progress, executor=ex)
    V = decoder.n_tokens
    arrays = {"counts": cv.counts.astype(np.int64), "done": np.zeros(V, bool),
              "log_fractions": np.full(V, np.nan, np.float32),
              "log_lower": np.full(V, np.nan, np.float32), "log_upper": np.full(V, np.nan, np.float32),
              "token_method": np.zeros(V, np.int8), "n_runs": np.zeros(V, np.int16),
              "std_err": np.full(V, np.nan, np.float32)}
    settings = {**settings, "support_log_volume": float(cv.support_log_volume), "n_done": 0,
                "complete": False, "seconds": float(cv.seconds), "rare_event": {}}
    _save_npz(path, arrays, settings)
    return arrays, settings


def _vocabulary_chunk(a: dict, ids, counted, logs: dict, n_samples, confidence, interval) -> None:
    """Write one finished chunk into the arrays: split tokens from ``logs``, counted ones from
    their uniform count."""
    split = ids[~counted[ids]]
    codes = {m: i for i, m in enumerate(_METHOD_CODES)}
    for k in ("log_fractions", "log_lower", "log_upper"):
        a[k][split] = logs[k][split]
    a["token_method"][split] = [codes[str(m)] for m in logs["token_method"][split]]
    a["n_runs"][split] = logs["n_runs"][split]
    a["std_err"][split] = logs["std_err"][split]
    c_ids = ids[counted[ids]]
    if c_ids.size:
        lo, hi = binomial_interval(a["counts"][c_ids], n_samples, confidence, interval)
        lf, llo, lhi = _uniform_logs(a["counts"][c_ids], n_samples, lo, hi)
        a["log_fractions"][c_ids], a["log_lower"][c_ids], a["log_upper"][c_ids] = lf, llo, lhi
        a["token_method"][c_ids] = codes["uniform"]
    a["done"][ids] = True
