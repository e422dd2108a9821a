"""Monte Carlo cell volumes: analytic cases, interval coverage, exact 2-d sectors, report section."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.spatial import ConvexHull
from scipy.special import gammaln

from embgeom.cells import Decoder
from embgeom.supports import Ball, Box
from embgeom.volumes import SAMPLE_BLOCK, binomial_interval, cell_volumes


class TinyBall:
    """A minimal stand-in following the Support contract (dim, sample, log_volume) only."""

    def __init__(self, d, r=1.0):
        self.dim = d
        self.r = r
        self.log_volume = 0.5 * d * np.log(np.pi) - gammaln(d / 2 + 1) + d * np.log(r)

    def sample(self, n, seed=None):
        rng = np.random.default_rng(seed)
        g = rng.standard_normal((n, self.dim))
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        return self.r * g * rng.uniform(size=(n, 1)) ** (1.0 / self.dim)

    def origin_ellipsoid_map(self):
        return None  # no fast path: the estimator samples this stand-in's points


def cross_polytope(d):
    return np.vstack([np.vstack([e, -e]) for e in np.eye(d)]).astype(np.float32)


@pytest.mark.parametrize("d", [3, 8])
def test_cross_polytope_fractions(d):
    dec = Decoder(cross_polytope(d))
    truth = 1.0 / (2 * d)
    for support in (Ball.from_params(None, 2.0, dim=d), Box.from_params(-np.ones(d), np.ones(d)), TinyBall(d)):
        cv = cell_volumes(dec, support, 20_000, seed=1, progress=False)
        assert cv.counts.sum() == 20_000 and cv.counts.dtype == np.int64
        assert cv.fractions.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.all((cv.lower <= cv.fractions) & (cv.fractions <= cv.upper))
        np.testing.assert_allclose(cv.fractions, truth, atol=5 * np.sqrt(truth * (1 - truth) / 20_000))
    assert cell_volumes(dec, Ball.from_params(None, 2.0, dim=d), 10, seed=0, progress=False).sampling == "directions"
    assert cell_volumes(dec, Box.from_params(-np.ones(d), np.ones(d)), 10, seed=0, progress=False).sampling == "support"


@pytest.mark.parametrize("method", ["clopper-pearson", "wilson"])
def test_interval_coverage_over_50_seeds(method):
    d = 3
    dec = Decoder(cross_polytope(d))
    truth = 1.0 / (2 * d)
    cover = []
    for seed in range(50):
        cv = cell_volumes(dec, Ball.from_params(None, 1.0, dim=d), 400, seed=seed, interval=method, progress=False)
        cover.append((cv.lower[0] <= truth) & (truth <= cv.upper[0]))
    assert np.mean(cover) >= 0.90


def test_d2_random_w_exact_sectors():
    # with b = 0 the cell of a hull vertex is its normal cone: the exterior angle / (2 pi)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((12, 2))
    hull = ConvexHull(W)
    v = hull.vertices  # counter-clockwise in 2-d
    exact = np.zeros(12)
    for i, t in enumerate(v):
        e_in = W[t] - W[v[i - 1]]
        e_out = W[v[(i + 1) % v.size]] - W[t]
        ang = np.arctan2(e_in[0] * e_out[1] - e_in[1] * e_out[0], e_in @ e_out)
        exact[t] = ang / (2 * np.pi)
    assert exact.sum() == pytest.approx(1.0)
    dec = Decoder(W.astype(np.float32))
    n = 200_000
    cv = cell_volumes(dec, Ball.from_params(None, 1.0, dim=2), n, seed=4, progress=False)
    # W rounded to float32 moves the boundaries by ~1e-7: negligible against 5 sigma
    sigma = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(cv.fractions - exact) <= 5 * sigma + 1e-12)
    assert np.all(cv.counts[exact == 0] == 0)
    # the square is not rotation invariant (other fractions), but interior tokens stay empty
    cvb = cell_volumes(dec, Box.from_params(-np.ones(2), np.ones(2)), 20_000, seed=5, progress=False)
    assert np.all(cvb.counts[exact == 0] == 0)


def test_seeding_chunks_and_log_volumes():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    b = rng.standard_normal(30).astype(np.float32)
    dec = Decoder(W, b)
    box = Box.from_params(-np.ones(4), 2 * np.ones(4))
    n = 20_000
    a = cell_volumes(dec, box, n, seed=7, batch_size=1000, progress=False)
    # issue 12 kind 7: the stream depends on the seed only; batch_size changes the speed
    for bs in (8192, 20_000, 3):
        c = cell_volumes(dec, box, n, seed=7, batch_size=bs, progress=False)
        np.testing.assert_array_equal(a.counts, c.counts)
    # blocks of SAMPLE_BLOCK points, block i the support's own draws from SeedSequence child i:
    # recount by hand
    sizes = [SAMPLE_BLOCK, SAMPLE_BLOCK, n - 2 * SAMPLE_BLOCK]
    children = np.random.SeedSequence(7).spawn(3)
    X = np.vstack([box.sample(m, seed=np.random.default_rng(ch)) for m, ch in zip(sizes, children)])
    np.testing.assert_array_equal(a.counts, np.bincount(dec.assign(X), minlength=30))
    # any seed default_rng takes; the caller's SeedSequence is not advanced
    ss = np.random.SeedSequence(7)
    np.testing.assert_array_equal(cell_volumes(dec, box, n, seed=ss, progress=False).counts, a.counts)
    assert ss.n_children_spawned == 0
    arr = cell_volumes(dec, box, 3000, seed=[7, 1], progress=False).counts
    want = np.bincount(dec.assign(box.sample(3000, seed=np.random.default_rng(np.random.SeedSequence([7, 1]).spawn(1)[0]))),
                       minlength=30)
    np.testing.assert_array_equal(arr, want)
    g = np.random.default_rng(5)
    g1 = cell_volumes(dec, box, 3000, seed=g, progress=False).counts
    g2 = cell_volumes(dec, box, 3000, seed=g, progress=False).counts  # the Generator moved on
    assert g1.sum() == g2.sum() == 3000 and not np.array_equal(g1, g2)
    with pytest.raises(TypeError, match="seed"):
        cell_volumes(dec, box, 10, seed=1.5, progress=False)
    lv = a.log_volumes
    hit = a.counts > 0
    np.testing.assert_allclose(lv[hit], np.log(a.fractions[hit]) + box.log_volume)
    assert np.all(np.isnan(lv[~hit]))  # unresolved, not empty: nan, not -inf
    assert a.support_log_volume == pytest.approx(4 * np.log(3.0))


def _orthant(d):
    """Token 0's cell is the positive orthant (logit 0 against -x_i): share exactly 2^-d."""
    return Decoder(np.vstack([np.zeros(d), -np.eye(d)]).astype(np.float32))


def _rare(dec, seed, tokens=None, n_chains=64, n_samples=512):
    ball = Ball.from_params(np.zeros(dec.dim), 1.0)
    return cell_volumes(dec, ball, n_samples, seed=seed, method="rare-event", tokens=tokens,
                        n_chains=n_chains, progress=False)


def _logs(cv):
    return np.stack([cv.log_fractions, cv.log_lower, cv.log_upper])


def test_log_volumes_follow_the_rare_event_shares():
    # a cell of share 2^-12 gets no hit in 512 uniform points, but a finite rare-event share:
    # its log-volume is that share times vol(S), not -inf (it was -inf, as if it were empty)
    dec = _orthant(12)
    cv = _rare(dec, 3, tokens=[0], n_samples=512)
    assert cv.counts[0] == 0 and cv.n_zero >= 1
    assert np.isfinite(cv.log_fractions[0])
    ball = Ball.from_params(np.zeros(12), 1.0)
    assert cv.log_volumes[0] == pytest.approx(cv.log_fractions[0] + ball.log_volume, rel=1e-12)
    assert abs(cv.log_fractions[0] - (-12 * math.log(2.0))) < 1.0
    est = cv.token_method != "not estimated"
    np.testing.assert_array_equal(est, np.arange(13) == 0)


def test_rare_event_draws_descend_from_the_seed():
    # issue 22: the rare-event estimator ran every seed as seed 0 (seed_entropy recorded 0)
    from embgeom._rare_event import log_cone_gaussian_measure
    from embgeom.parallel import task_seed
    from embgeom.volumes import RARE_EVENT_KEY

    dec = _orthant(5)
    a = _rare(dec, 1)
    assert a.estimator == "rare-event" and np.all(a.token_method == "rare-event")
    np.testing.assert_array_equal(_logs(a), _logs(_rare(dec, 1)))  # same seed: bit for bit
    for s1, s2 in ((1, 2), ([1, 2], [3, 4]), tuple(np.random.SeedSequence(5).spawn(2)),
                   (np.random.SeedSequence(5), np.random.SeedSequence(5).spawn(1)[0])):
        # every token's figures move with the seed (the estimate itself takes discrete values,
        # (1/2)^levels times the last level's fraction, so two seeds may share it; its
        # interval, from the groups' spread, does not)
        x1, x2 = _logs(_rare(dec, s1)), _logs(_rare(dec, s2))
        assert np.all(np.any(x1 != x2, axis=0)), (s1, s2)
    # the recorded root reruns the run, as the object and from its JSON record
    child = np.random.SeedSequence(9).spawn(3)[2]
    c = _rare(dec, child)
    assert c.seed.spawn_key == (2,)
    np.testing.assert_array_equal(_logs(_rare(dec, c.seed)), _logs(c))
    rec = json.loads(json.dumps(c.to_dict()))
    assert rec["seed_entropy"] == child.entropy and rec["seed_spawn_key"] == [2]
    again = np.random.SeedSequence(rec["seed_entropy"], spawn_key=rec["seed_spawn_key"])
    np.testing.assert_array_equal(_logs(_rare(dec, again)), _logs(c))
    # by hand: token t draws from child t of task_seed(root, RARE_EVENT_KEY), whatever the
    # other tokens estimated
    root = task_seed(child, RARE_EVENT_KEY)
    G = Ball.from_params(np.zeros(5), 1.0).origin_ellipsoid_map()
    # (and its extra runs, at cell_volumes' default target_se, from that stream's children)
    ref = log_cone_gaussian_measure(dec.W_, [0, 3], G, n_chains=64, seed=root, target_se=0.12)
    assert ref.log_share.tolist() == c.log_fractions[[0, 3]].tolist()
    assert ref.n_runs.tolist() == c.extra["rare_event_n_runs"][[0, 3]].tolist()
    assert _rare(dec, child, tokens=[3]).log_fractions[3] == c.log_fractions[3]
    # an int seed of the estimator itself is the SeedSequence of that int (as before)
    r7 = log_cone_gaussian_measure(dec.W_, [0], n_chains=64, seed=7)
    assert r7.log_share[0] == log_cone_gaussian_measure(
        dec.W_, [0], n_chains=64, seed=np.random.SeedSequence(7)).log_share[0]
    assert r7.params["seed_entropy"] == 7 and r7.params["seed_spawn_key"] == []
    with pytest.raises(TypeError, match="seed"):
        log_cone_gaussian_measure(dec.W_, [0], n_chains=64, seed=1.5)


def test_rare_event_replicates_spread_as_their_intervals_say():
    # 20 seeds on the orthant of d = 10 (log-share -10 log 2 = -6.93 nats exactly) at the default
    # budget: the estimates must differ, scatter about as much as the reported standard error
    # (half-width / t_{0.975, 15}, 16 groups) says, and cover the truth about as often as 95%.
    # Measured: sd 0.29 nats against a median reported se of 0.34 (ratio 0.86), 20 of 20
    # covered, mean error -0.06 nats. Seeds that were ignored give sd 0 and fail.
    from scipy import stats

    d, n_seeds = 10, 20
    dec = _orthant(d)
    truth = -d * np.log(2.0)
    est, se, covered = [], [], 0
    for s in range(n_seeds):
        cv = _rare(dec, s, tokens=[0], n_chains=128, n_samples=256)
        x, lo, hi = cv.log_fractions[0], cv.log_lower[0], cv.log_upper[0]
        est.append(x)
        se.append((hi - lo) / (2 * stats.t.ppf(0.975, 15)))
        covered += bool(lo <= truth <= hi)
    est, se = np.array(est), np.array(se)
    assert np.unique(np.stack([est, se]), axis=1).shape[1] == n_seeds  # 20 distinct runs
    ratio = est.std(ddof=1) / np.median(se)
    assert 0.4 <= ratio <= 2.5, ratio
    assert covered >= 16, covered  # P(<= 15 of 20) is 0.26% at the nominal 95%
    assert abs(est.mean() - truth) <= 4 * np.median(se) / np.sqrt(n_seeds), est.mean() - truth


def test_binomial_interval_zero_hits_and_bounds():
    lo, hi = binomial_interval(np.array([0, 5, 100]), 100)
    assert lo[0] == 0 and hi[0] == pytest.approx(1 - 0.025 ** (1 / 100))
    assert hi[2] == 1.0 and lo[2] == pytest.approx(0.025 ** (1 / 100))
    lw, hw = binomial_interval(np.array([0, 5, 100]), 100, method="wilson")
    assert hw[0] > 0 and lw[1] < 0.05 < hw[1]
    with pytest.raises(ValueError):
        binomial_interval(np.array([101]), 100)


def test_histogram_and_top(tmp_path):
    dec = Decoder(np.vstack([cross_polytope(3), np.zeros((2, 3), np.float32)]))  # 2 empty cells
    cv = cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 3000, seed=0, progress=False,
                      method="uniform")
    assert cv.n_zero == 2 and cv.upper[-1] > 0
    path = tmp_path / "h.png"
    ax = cv.histogram(path=path)
    assert path.stat().st_size > 1000
    assert any("0 hits" in t.get_text() for t in ax.texts)
    top = cv.top(3)
    assert [r["count"] for r in top] == sorted(cv.counts)[::-1][:3]
    assert cv.top_share(0.01) == pytest.approx(cv.counts.max() / 3000)
    json.dumps(cv.to_dict())


def test_bad_input():
    dec = Decoder(cross_polytope(3))
    with pytest.raises(ValueError, match="n_samples"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 0, progress=False)
    with pytest.raises(ValueError, match="n_samples"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), -5, progress=False)
    with pytest.raises(TypeError, match="n_samples"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 10.0, progress=False)
    with pytest.raises(ValueError, match="dimension"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=4), 10, progress=False)
    with pytest.raises(TypeError, match="support"):
        cell_volumes(dec, object(), 10, progress=False)
    with pytest.raises(TypeError, match="decoder"):
        cell_volumes(cross_polytope(3), Ball.from_params(None, 1.0, dim=3), 10, progress=False)
    with pytest.raises(ValueError, match="interval"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 10, interval="normal", progress=False)

    ball3 = Ball.from_params(None, 1.0, dim=3)
    with pytest.raises(ValueError, match=r"rare_event_options: unknown option 'n_chain'; expected one of \['n_groups'"):
        cell_volumes(dec, ball3, 10, rare_event_options={"n_chain": 8}, progress=False)
    with pytest.raises(ValueError, match="rare_event_options: 'seed' is set by cell_volumes"):
        cell_volumes(dec, ball3, 10, rare_event_options={"seed": 1}, progress=False)
    # the estimator's own settings are checked before the uniform pass (10^7 points not drawn)
    with pytest.raises(ValueError, match=r"n_chains: expected a multiple of n_groups=16 with >= 2 chains per group \(so 32, 48, ...\), got 16"):
        cell_volumes(dec, ball3, 10**7, n_chains=16, progress=False)
    with pytest.raises(ValueError, match=r"level_prob: expected a number in \(0, 1\)"):
        cell_volumes(dec, ball3, 10**7, rare_event_options={"level_prob": 1.0}, progress=False)
    with pytest.raises(TypeError, match="rare_event_options must be a dict"):
        cell_volumes(dec, ball3, 10, rare_event_options=[("n_groups", 4)], progress=False)

    class NaNSupport(TinyBall):
        def sample(self, n, seed=None):
            return np.full((n, self.dim), np.nan)

    with pytest.raises(ValueError, match="NaN"):
        cell_volumes(Decoder(cross_polytope(3), np.zeros(6)), NaNSupport(3), 10, progress=False)


def test_origin_ellipsoid_directions_match_the_exact_sector_shares():
    """An origin-centred ellipsoid G B with a bias-free decoder: Gaussian directions mapped by G.
    The cell of +e1 in the 2-d cross polytope is the cone |x2| <= x1; in the ellipse with
    semi-axes (a, b) its share is atan(a / b) / pi (map to the unit disc)."""
    from embgeom.supports import Ellipsoid, FinalNormShell

    a, b, n = 2.0, 1.0, 40_000
    dec = Decoder(cross_polytope(2))  # rows +e1, -e1, +e2, -e2
    ell = Ellipsoid.from_params(np.zeros(2), np.diag([1 / a**2, 1 / b**2]))
    truth = np.array([np.arctan(a / b), np.arctan(a / b), np.arctan(b / a), np.arctan(b / a)]) / np.pi
    cv = cell_volumes(dec, ell, n, seed=0, progress=False)
    assert cv.sampling == "directions"
    np.testing.assert_allclose(cv.fractions, truth, atol=5 * np.sqrt(0.25 / n))
    # the RMSNorm shell with gains (a, b) has the same solid: same shares
    shell = FinalNormShell.from_params("rmsnorm", np.array([a, b]))
    cs = cell_volumes(dec, shell, n, seed=1, progress=False)
    assert cs.sampling == "directions"
    np.testing.assert_allclose(cs.fractions, truth, atol=5 * np.sqrt(0.25 / n))
    # an off-centre ellipsoid has no G: the estimator samples the support's points
    assert cell_volumes(dec, Ellipsoid.from_params(np.ones(2), np.eye(2)), 10, seed=0,
                        progress=False).sampling == "support"


def test_unfitted_support_and_bad_token_ids_are_named():
    """A fresh user's cases: an unfitted Ball is NotFittedError (not "not a Support"), and bad
    token ids are refused whatever the method (they were ignored when rare-event did not run)."""
    from sklearn.exceptions import NotFittedError

    dec = Decoder(np.eye(3, dtype=np.float32))
    with pytest.raises(NotFittedError):
        cell_volumes(dec, Ball(), 100, progress=False)
    ball = Ball.from_params(None, 1.0, dim=3)
    for method in ("uniform", "auto"):
        with pytest.raises(ValueError, match="tokens"):
            cell_volumes(dec, ball, 100, method=method, tokens=[-1], progress=False)
    box = Box.from_params(-np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="tokens"):
        cell_volumes(dec, box, 100, tokens=[5], progress=False)


def test_top_share_baseline_of_equal_cells():
    # the baseline of top_share: equal cells read more than q by chance. Fewer samples than the
    # ceil(q |V|) largest cells: they hold every sample, exactly 1; many samples: close to q.
    from embgeom.volumes import CellVolumes

    def cv(V, n):
        c = np.zeros(V, np.int64)
        c[0] = n
        return CellVolumes(fractions=c / n, counts=c, n_samples=n, lower=np.zeros(V),
                           upper=np.ones(V), confidence=0.95, interval="clopper-pearson",
                           support_log_volume=0.0, sampling="directions",
                           seed=np.random.SeedSequence(3), seconds=0.0)

    assert cv(1000, 10).top_share_if_equal(0.01) == 1.0
    assert cv(100, 10**6).top_share_if_equal(0.01) == pytest.approx(0.01, abs=5e-4)
    # SmolLM2's quick report: 10,000 samples over 49,152 cells read about 0.1, not 0.01
    b = cv(49152, 10_000).top_share_if_equal(0.01)
    assert 0.08 < b < 0.12
    assert b == cv(49152, 10_000).top_share_if_equal(0.01)  # seeded from the result's seed
    one = cv(49152, 10_000)
    assert one.top_share_if_equal(0.01) == one.top_share_if_equal(0.01) == b  # and again
    assert one.seed.n_children_spawned == 0  # the result's seed is not advanced
    with pytest.raises(ValueError, match="n_draws"):
        cv(10, 10).top_share_if_equal(0.01, n_draws=0)


def test_cell_volumes_neither_holds_nor_advances_the_callers_seed_sequence():
    dec = Decoder(cross_polytope(3))
    ss = np.random.SeedSequence(7)
    cv = cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 500, seed=ss, progress=False)
    a = cv.top_share_if_equal(0.1)
    assert cv.top_share_if_equal(0.1) == a
    assert ss.n_children_spawned == 0 and cv.seed is not ss
    assert (cv.seed.entropy, cv.seed.spawn_key) == (ss.entropy, ss.spawn_key)
    again = cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 500, seed=cv.seed, progress=False)
    np.testing.assert_array_equal(again.counts, cv.counts)


def test_top_share_baseline_refuses_absurd_draws():
    from embgeom.volumes import CellVolumes

    c = np.zeros(50, np.int64)
    c[0] = 20
    cv = CellVolumes(fractions=c / 20, counts=c, n_samples=20, lower=np.zeros(50),
                     upper=np.ones(50), confidence=0.95, interval="clopper-pearson",
                     support_log_volume=0.0, sampling="directions",
                     seed=np.random.SeedSequence(3), seconds=0.0)
    with pytest.raises(ValueError, match="n_draws: expected at most 10000"):
        cv.top_share_if_equal(0.1, n_draws=10**9)


@pytest.mark.parametrize("scale", [1e-160, 1e-50, 1e40, 1e160])
def test_origin_ellipsoid_counts_do_not_depend_on_its_scale(scale):
    """A cell's share of an origin-centred ellipsoid is that of its directions: scaling the
    ellipsoid by any positive factor changes no count. The float32 map of the directions used
    to underflow at 1e-50 (every point at 0, token 0 taking every tie: share 1) and to overflow
    at 1e40 (NaN points); it is now scaled by a power of two first."""
    import warnings

    from embgeom import Ellipsoid

    rng = np.random.default_rng(0)
    dec = Decoder(rng.standard_normal((200, 16)))
    Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    ax = np.linspace(0.5, 2.0, 16)
    ref = cell_volumes(dec, Ellipsoid.from_params(np.zeros(16), semi_axes=ax, axes=Q), 20000,
                       seed=0, method="uniform", progress=False)
    assert (ref.counts > 0).sum() > 50
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cell_volumes(dec, Ellipsoid.from_params(np.zeros(16), semi_axes=ax * scale, axes=Q),
                           20000, seed=0, method="uniform", progress=False)
    np.testing.assert_array_equal(got.counts, ref.counts)


def test_an_unreachable_target_se_is_reported():
    """Tokens that stop at max_runs above target_se are counted in extra['rare_event'] and
    warned about (the trial found them silent); a reachable target warns of nothing."""
    import warnings

    rng = np.random.default_rng(1)
    dec = Decoder(rng.standard_normal((40, 4)))
    ball = Ball.from_params(np.zeros(4), 1.0)
    kw = dict(method="rare-event", tokens=[0, 1, 2], n_chains=32, progress=False,
              rare_event_options={"max_runs": 2})
    with pytest.warns(RuntimeWarning, match=r"target_se: \d of 3 split tokens stopped at "
                                            r"max_runs=2 blocks of 32 chains") as rec:
        cv = cell_volumes(dec, ball, 1000, 0, target_se=1e-3, **kw)
    measured = int(np.isfinite(cv.log_fractions[[0, 1, 2]]).sum())  # an empty cell has no error
    msgs = [str(w.message) for w in rec if str(w.message).startswith("target_se:")]
    assert measured >= 2 and len(msgs) == 1 and f"{measured} of 3" in msgs[0]
    assert cv.extra["rare_event"]["n_tokens_above_target_se"] == measured
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cv = cell_volumes(dec, ball, 1000, 0, target_se=5.0, **kw)
    assert not [w for w in rec if str(w.message).startswith("target_se:")]
    assert cv.extra["rare_event"]["n_tokens_above_target_se"] == 0


def test_rare_event_rate_with_an_empty_cell_warns_nothing_and_keeps_it_empty():
    """An empty cell (a duplicate row: the lower id takes every tie) among rare-event tokens:
    the bias shift reads standard errors of the rare-event tokens only, so the empty cell's
    -inf - -inf makes no RuntimeWarning, its log-share stays -inf and the shifted tokens move
    up by se^2 / 2 (the CI end-to-end run showed the warning)."""
    import warnings

    W = np.vstack([np.zeros(4), -np.eye(4), -np.eye(4)[:1]]).astype(np.float32)  # 5 = 1
    cv = _rare(Decoder(W), 3, tokens=np.arange(6))
    assert cv.token_method[5] == "rare-event" or np.isneginf(cv.log_fractions[5])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        x, lo, hi = cv._debiased_log_shares(np.arange(6))
        cv.cell_volume_rate(4, n_boot=0)
    assert np.isneginf(x[5]) and np.isneginf(cv.log_fractions[5])
    rare = np.isfinite(cv.log_fractions) & (cv.token_method == "rare-event")
    assert rare.any() and np.all(x[rare] >= cv.log_fractions[rare])


@pytest.mark.parametrize("arg", ["interval", "method"])
def test_cell_volumes_choices_are_strings(arg):
    """np.array(['wilson']) passed `not in (...)` (numpy's == gave a truthy one-element array)."""
    dec = Decoder(cross_polytope(3))
    value = {"interval": "wilson", "method": "uniform"}[arg]
    with pytest.raises(ValueError, match=f"{arg}: expected"):
        cell_volumes(dec, Ball.from_params(None, 1.0, dim=3), 100, seed=0, progress=False,
                     **{arg: np.array([value])})


def test_duck_support_bad_dim_and_non_finite_samples_name_the_support():
    dec = Decoder(cross_polytope(3))

    class NaNBall(TinyBall):
        def sample(self, n, seed=None):
            X = super().sample(n, seed)
            X[0, 0] = np.nan
            return X

    with pytest.raises(ValueError, match="support.sample: returned NaN or infinite points"):
        cell_volumes(dec, NaNBall(3), 100, seed=0, progress=False)
    for bad in (3.0, 4.7, "3", True):
        s = TinyBall(3)
        s.dim = bad
        with pytest.raises(TypeError, match="support.dim: expected an int"):
            cell_volumes(dec, s, 100, seed=0, progress=False)
    s = TinyBall(3)
    s.dim = np.int64(3)  # a numpy int is an int
    assert cell_volumes(dec, s, 100, seed=0, progress=False).counts.sum() == 100
