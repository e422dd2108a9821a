"""Rare-event cell shares (embgeom._rare_event) against cones whose Gaussian measure is known exactly.

Every case is rotated by a random orthogonal matrix so that no axis is special. Exact shares:
- orthant cell: rows ``0`` and ``-e_1 .. -e_k``; the cell of row 0 is ``{x_i >= 0, i <= k}``,
  share ``2^-k`` (k = 40: 9.1e-13; k = 50: 8.9e-16);
- cross-polytope: rows ``+-e_i`` in d dimensions, each cell ``1 / (2 d)`` by symmetry;
- regular simplex: the d + 1 centred vertices, each cell ``1 / (d + 1)``;
- 2-D sectors: unit rows at angles ``phi_i``, the cell of row i is the arc between the bisectors
  with its neighbours, share ``(phi_{i+1} - phi_{i-1}) / (4 pi)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import special_ortho_group

from embgeom import _rare_event, _rare_kernels
from embgeom._rare_event import log_cone_gaussian_measure
from embgeom.cells import Decoder


def _rotated(W, seed):
    d = W.shape[1]
    if d == 1:
        return W
    return W @ special_ortho_group.rvs(d, random_state=seed).T


def orthant(k, d, seed=0, n_redundant=0):
    """Row 0's cell is the orthant {x_i >= 0, i < k} (then rotated); share 2^-k.

    ``n_redundant`` extra rows ``-sum_i lambda_i e_i`` (lambda >= 0) are implied by the facets:
    they enlarge the vocabulary without changing row 0's cell.
    """
    rows = [np.zeros(d), *(-np.eye(d)[:k])]
    if n_redundant:
        lam = np.abs(np.random.default_rng(seed).standard_normal((n_redundant, k)))
        R = np.zeros((n_redundant, d))
        R[:, :k] = -lam
        rows = np.vstack([np.vstack(rows), R])
    return _rotated(np.vstack(rows), seed), k * math.log(0.5)


def cross_polytope(d, seed=0):
    return _rotated(np.vstack([np.eye(d), -np.eye(d)]), seed), -math.log(2 * d)


def simplex(d, seed=0):
    E = np.eye(d + 1) - 1.0 / (d + 1)  # centred vertices of the standard simplex, in R^(d+1)
    U, _, _ = np.linalg.svd(E.T)
    W = E @ U[:, :d]  # the same vertices in the d-dimensional hyperplane they span
    return _rotated(W, seed), -math.log(d + 1)


# -------------------------------------------------------------------------------- kernels
def test_ess_angles_uniform_on_the_feasible_arcs():
    # one constraint p cos + q sin + c >= 0 with R > c: infeasible arc of length 2 acos(c / R)
    rng = np.random.default_rng(0)
    p, q, c = 0.3, -1.1, 0.2
    n = 20_000
    P = np.full((n, 1), p)
    Q = np.full((n, 1), q)
    th = _rare_kernels.ess_angles(P, Q, np.array([c]), rng.random(n))
    vals = p * np.cos(th) + q * np.sin(th) + c
    assert np.all(vals >= -1e-12)
    R = math.hypot(p, q)
    feasible = 2 * math.pi - 2 * math.acos(c / R)
    # uniform on the feasible set: a histogram over [0, 2 pi) is flat where feasible
    hist, edges = np.histogram(th, bins=40, range=(0, 2 * math.pi))
    g = p * np.cos(edges) + q * np.sin(edges) + c
    inside = (g[:-1] > 0) & (g[1:] > 0)  # bins wholly in the feasible set
    width = edges[1] - edges[0]
    expected = n * width / feasible
    assert np.allclose(hist[inside], expected, rtol=0.15)


def test_hmc_keeps_the_orthant_gaussian():
    rng = np.random.default_rng(1)
    k, d, n = 12, 20, 4000
    Rm = special_ortho_group.rvs(d, random_state=3)
    A = np.ascontiguousarray(np.eye(d)[:k] @ Rm.T)
    Z = rng.standard_normal((n, d))
    Z[:, :k] = np.abs(Z[:, :k])
    X = np.ascontiguousarray(Z @ Rm.T)  # exact draws of N(0, I) on the orthant
    for _ in range(5):
        V = rng.standard_normal((n, d))
        P, Q = np.ascontiguousarray(X @ A.T), np.ascontiguousarray(V @ A.T)
        b = _rare_kernels.hmc_trajectories(X, V, P, Q, A, A @ A.T, np.zeros(k), math.pi / 2, 10_000)
        assert b.mean() > 1  # it does bounce
        assert (X @ A.T).min() > -1e-9  # and stays inside
        assert np.allclose(P, X @ A.T, atol=1e-9)
    Y = X @ Rm
    assert abs(Y[:, :k].mean() - math.sqrt(2 / math.pi)) < 0.02  # half-normal mean
    assert abs(Y[:, k:].var() - 1.0) < 0.05


def test_fold_smallest_margins_matches_numpy():
    rng = np.random.default_rng(2)
    Z = rng.standard_normal((7, 50)).astype(np.float32)
    zt = rng.standard_normal(7).astype(np.float32)
    inv = np.abs(rng.standard_normal(50)) + 0.1
    inv[5] = 0.0
    val = np.full((7, 3), np.inf)
    idx = np.full((7, 3), -1, dtype=np.int64)
    _rare_kernels.fold_smallest_margins(Z[:, :20].copy(), zt, inv[:20], 0, val, idx)
    _rare_kernels.fold_smallest_margins(Z[:, 20:].copy(), zt, inv[20:], 20, val, idx)
    M = (zt[:, None].astype(np.float64) - Z.astype(np.float64)) * inv
    M[:, 5] = np.inf
    order = np.argsort(M, axis=1, kind="stable")[:, :3]
    assert np.array_equal(idx, order)
    assert np.allclose(val, np.take_along_axis(M, order, 1))


def test_scan_paths_match_numpy():
    """The transposed fold and the fused few-point kernel give the k smallest margins, as the
    row-major fold does; the cone's scan takes either path (few points or many) with one answer."""
    from embgeom._rare_event import FUSED_SCAN_POINTS, _Cone

    rng = np.random.default_rng(3)
    V, d, n, k = 300, 9, 6, 4
    WG = rng.standard_normal((V, d)).astype(np.float32)
    X = rng.standard_normal((n, d)).astype(np.float32)
    inv = np.abs(rng.standard_normal(V)) + 0.1
    inv[[5, 77]] = 0.0
    zt = X @ WG[0]
    M = (zt[:, None].astype(np.float64) - (X.astype(np.float64) @ WG.T.astype(np.float64))) * inv
    M[:, [5, 77]] = np.inf
    order = np.argsort(M, axis=1, kind="stable")[:, :k]
    val = np.full((n, k), np.inf)
    idx = np.full((n, k), -1, dtype=np.int64)
    for v0 in (0, 128):
        ZT = np.ascontiguousarray(WG[v0:v0 + 128 if v0 == 0 else V] @ X.T)
        _rare_kernels.fold_smallest_margins_t(ZT, zt, inv[v0:v0 + ZT.shape[0]], v0, val, idx)
    assert np.array_equal(idx, order)
    assert np.allclose(val, np.take_along_axis(M, order, 1), atol=1e-5)
    val2 = np.full((n, k), np.inf)
    idx2 = np.full((n, k), -1, dtype=np.int64)
    WG_ro = WG.copy()
    WG_ro.setflags(write=False)  # the pool's shared W G is read-only
    _rare_kernels.scan_smallest_margins(WG_ro, X, zt, inv, val2, idx2)
    assert np.array_equal(idx2, order)
    assert np.allclose(val2, val, atol=1e-5)
    cone = _Cone(WG, np.einsum("ij,ij->i", WG, WG, dtype=np.float64), WG, 0)
    few, _ = cone.scan(X[:FUSED_SCAN_POINTS], 3)
    many, _ = cone.scan(X, 3)
    assert np.allclose(few, many[:FUSED_SCAN_POINTS], atol=1e-5)


# -------------------------------------------------------------------------------- truth
@pytest.mark.parametrize(
    "case",
    ["sector", "cross8", "simplex5", "orthant10_16", "orthant40_64", "orthant50_64"],
)
def test_known_shares(case):
    if case == "sector":
        phi = np.array([0.0, 0.4, 1.9, 3.0, 4.4])
        W = np.stack([np.cos(phi), np.sin(phi)], 1)
        ext = np.concatenate([phi[-1:] - 2 * math.pi, phi, phi[:1] + 2 * math.pi])
        truth = np.log((ext[2:] - ext[:-2]) / (4 * math.pi))
        tokens = np.arange(5)
    else:
        if case == "cross8":
            W, lt = cross_polytope(8)
        elif case == "simplex5":
            W, lt = simplex(5)
        else:
            k, d = (int(x) for x in case[len("orthant"):].split("_"))
            W, lt = orthant(k, d)
        tokens = np.array([0])
        truth = np.array([lt])
    r = log_cone_gaussian_measure(W, tokens, seed=7)
    err = r.log_share - truth
    if case == "sector":  # a planar cone is measured exactly: its angle (float32 rows)
        assert np.all(r.side == "exact") and np.all(r.n_runs == 0)
        assert np.all(np.abs(err) <= 1e-6), err
        assert np.array_equal(r.log_lower, r.log_share) and np.array_equal(r.log_upper, r.log_share)
        return
    assert np.all(np.abs(err) <= 0.3), (case, err)
    assert np.all(np.abs(err) <= 4 * r.std_err), (case, err, r.std_err)  # coverage: see below
    assert np.all(r.side == "two-sided")
    if case.startswith("orthant"):
        assert r.n_levels[0] >= -truth[0] / math.log(2) * 0.7  # about one level per halving


def test_coverage_over_seeds():
    W, lt = orthant(20, 32, seed=1)  # 9.5e-7
    r = [log_cone_gaussian_measure(W, [0], n_chains=256, seed=s) for s in range(20)]
    err = np.array([x.log_share[0] - lt for x in r])
    cover = np.array([x.log_lower[0] <= lt <= x.log_upper[0] for x in r])
    assert cover.sum() >= 17, err
    assert abs(err.mean()) < 0.15  # no bias beyond noise (sd of the mean ~0.07 here)
    assert np.sqrt(np.mean(err**2)) < 0.45


def test_full_working_set_resolves_a_small_last_step():
    """A working set capped below the cell's facets (10 of 16: the cell's share of the cone of 10
    constraints is 2^-6) is finished by splitting levels on the margin over all of W: every seed
    resolved, within noise (one check of the chains left 6 of 20 seeds with no hit and the rest
    0.6 nats high)."""
    W, lt = orthant(16, 24, seed=3)
    r = [log_cone_gaussian_measure(W, [0], n_chains=128, seed=s, max_constraints=10, probe_k=2)
         for s in range(12)]
    assert all(x.side[0] == "two-sided" and x.n_constraints_used[0] == 10 for x in r)
    # the levels over all of W measured the cell's share of the working-set cone (2^-6)
    check = np.array([x.log_check_fraction[0] for x in r])
    assert abs(check.mean() - 6 * math.log(0.5)) < 0.5, check
    err = np.array([x.log_share[0] - lt for x in r])
    cover = np.mean([x.log_lower[0] <= lt <= x.log_upper[0] for x in r])
    assert cover >= 0.75, (cover, err)
    assert abs(err.mean()) < 0.6 and np.sqrt(np.mean(err**2)) < 1.0, err


@pytest.mark.slow
@pytest.mark.parametrize("k,d", [(10, 16), (30, 48), (40, 64)])
def test_coverage_50_seeds(k, d):
    W, lt = orthant(k, d, seed=k)
    r = [log_cone_gaussian_measure(W, [0], seed=s) for s in range(50)]
    err = np.array([x.log_share[0] - lt for x in r])
    cover = np.mean([x.log_lower[0] <= lt <= x.log_upper[0] for x in r])
    assert cover >= 0.9, (cover, err)
    assert np.sqrt(np.mean(err**2)) <= 0.3


def test_uniform_cross_check_random_cells():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((12, 4)) * rng.uniform(0.5, 1.5, (12, 1))
    G = rng.standard_normal((4, 4))
    X = rng.standard_normal((200_000, 4))
    idx = Decoder(W).assign(X @ G.T)
    counts = np.bincount(idx, minlength=12)
    r = log_cone_gaussian_measure(W, None, G, n_chains=256, seed=3)
    hit = counts > 200
    assert hit.sum() >= 6
    p = counts[hit] / X.shape[0]
    se_mc = np.sqrt((1 - p) / (p * X.shape[0]))
    diff = r.log_share[hit] - np.log(p)
    assert np.all(np.abs(diff) <= 3 * np.hypot(r.std_err[hit], se_mc)), diff
    empty = r.side == "empty"
    assert np.all(counts[empty] == 0)  # cells proven empty get no uniform hit
    assert np.all(r.log_share[empty] == -np.inf)
    # the shares of all cells sum to one
    fin = np.isfinite(r.log_share)
    p_hat = np.exp(r.log_share[fin])
    assert abs(p_hat.sum() - 1.0) <= 3 * np.sqrt(np.sum((p_hat * r.std_err[fin]) ** 2))


# -------------------------------------------------------------------------------- working set
def test_working_set_with_redundant_rows():
    W, lt = orthant(15, 24, seed=2, n_redundant=3000)
    r = log_cone_gaussian_measure(W, [0], max_constraints=256, seed=4)
    assert r.side[0] == "two-sided"
    assert r.n_constraints_used[0] <= 256 < W.shape[0] - 1
    assert r.n_full_checks[0] > 0
    assert abs(r.log_share[0] - lt) <= min(0.3, 4 * r.std_err[0])

def test_auto_working_set_threshold_is_not_the_cap():
    """The cap's default rose to 4,096, the "auto" threshold stayed at 2,048 (or the cap, if
    lower): an orthant with 2,500 redundant rows takes a working set, and sizes its cap at
    4,096 without touching it; with working_set=False every constraint is in from the start."""
    W, lt = orthant(6, 8, seed=3, n_redundant=2500)
    n_cons = W.shape[0] - 1
    assert _rare_event.AUTO_WORKING_SET < n_cons < 4096
    auto = log_cone_gaussian_measure(W, [0], n_chains=128, seed=1)
    assert auto.n_full_checks[0] > 0 and auto.n_constraints_used[0] < n_cons
    assert abs(auto.log_share[0] - lt) <= min(0.3, 4 * auto.std_err[0])
    # a cap below the threshold is the threshold, as before
    low = log_cone_gaussian_measure(W, [0], n_chains=128, seed=1, max_constraints=64)
    assert low.n_full_checks[0] > 0 and low.n_constraints_used[0] <= 64
    every = log_cone_gaussian_measure(W, [0], n_chains=128, seed=1, working_set=False)
    assert every.n_full_checks[0] == 0 and every.n_constraints_used[0] == n_cons
    assert abs(every.log_share[0] - lt) <= min(0.3, 4 * every.std_err[0])


def test_without_a_working_set_every_constraint_is_in_whatever_the_cap():
    """working_set=False used to cap its constraints at max_constraints and drop the rest,
    still calling the estimate two-sided: an orthant of share 2^-10 behind 600 redundant rows,
    capped at 5, read -3.45 nats instead of -6.93 (a new user's trial)."""
    W, lt = orthant(10, 12, seed=4, n_redundant=600)
    r = log_cone_gaussian_measure(W, [0], n_chains=128, seed=2, working_set=False,
                                  max_constraints=5)
    assert r.n_constraints_used[0] == W.shape[0] - 1 and r.side[0] == "two-sided"
    assert abs(r.log_share[0] - lt) <= min(0.4, 4 * r.std_err[0])


def test_an_empty_cone_with_every_constraint_in_is_proved_before_any_level():
    """A row inside the hull of the others has an empty cell. With every constraint in (a
    small vocabulary) the LP runs first: 0 levels. It used to run after 64 levels, whose
    trajectories of up to 100,000 reflections took 40 s per cell in 3 dimensions."""
    E = np.eye(4)
    W = np.vstack([E, -E, 0.1 * (E[0] + E[1])])
    r = log_cone_gaussian_measure(W, [8, 0], n_chains=256, seed=0)
    assert r.side.tolist() == ["empty", "two-sided"]
    assert r.log_share[0] == -np.inf and r.n_levels[0] == 0
    assert abs(r.log_share[1] - math.log(1 / 8)) <= 4 * r.std_err[1]


def test_a_negative_seed_is_refused_by_name():
    W, _ = orthant(3, 4)
    with pytest.raises(ValueError, match="seed: expected an int >= 0"):
        log_cone_gaussian_measure(W, [0], n_chains=32, seed=-1)


def test_ess_moves_warn_that_they_err_low():
    W, lt = orthant(6, 8, seed=1)
    with pytest.warns(RuntimeWarning, match="move='ess'"):
        r = log_cone_gaussian_measure(W, [0], n_chains=64, seed=0, move="ess")
    assert np.isfinite(r.log_share[0])



def test_check_screen_keeps_the_scan_verdict():
    """A full check screened by known rows (earlier chains' cutting rows) gives every point the
    scan's verdict, scans only the points that pass the screen, and a screened-out point's
    first margin is its true margin on that row."""
    from embgeom._rare_event import _Cone

    rng = np.random.default_rng(12)
    W = rng.standard_normal((400, 6)).astype(np.float32)
    X = rng.standard_normal((3000, 6))
    t = int(np.bincount(Decoder(W).assign(X.astype(np.float32))).argmax())
    cone = _Cone(W, np.einsum("ij,ij->i", W, W, dtype=np.float64), W, t)
    full, _ = cone.scan(X, 4)
    near = np.unique(cone.scan(X[full[:, 0] < 0], 1)[1][:, 0])  # rows that cut points off
    known = np.unique(rng.choice(near, max(1, near.size // 2), replace=False))
    val, ids, scanned = cone.check(X, 4, known)
    assert np.array_equal(val[:, 0] >= 0, full[:, 0] >= 0)  # the verdicts
    assert np.all(scanned[full[:, 0] >= 0]) and 0 < (~scanned).sum() < (full[:, 0] < 0).sum()
    np.testing.assert_allclose(val[scanned], full[scanned], atol=1e-5)  # float32 products
    out = ~scanned
    assert np.all(np.isin(ids[out, 0], known))
    margins = np.einsum("ij,ij->i", X[out], W[t] - W[ids[out, 0]]) * cone.inv_norm[ids[out, 0]]
    np.testing.assert_allclose(val[out, 0], margins, atol=1e-4)


def test_later_runs_start_from_the_working_set(monkeypatch):
    """With a working set, a pilot run chooses it (probes, rejected checks) and the counted runs
    start from it without probes: the only probes are the pilot's (run 0, the same draws as a
    one-run call), and the counted runs' average is unbiased for p (log of the mean of p over
    seeds within noise of the truth) with honest intervals."""
    from embgeom import _rare_event

    W, lt = orthant(15, 24, seed=2, n_redundant=3000)
    sizes = []
    scan = _rare_event._Cone.scan

    def counting(self, X, k):
        sizes.append(X.shape[0])
        return scan(self, X, k)

    monkeypatch.setattr(_rare_event._Cone, "scan", counting)
    one = log_cone_gaussian_measure(W, [0], n_chains=128, max_constraints=256, seed=4)
    probes_one, sizes[:] = sum(n <= 4 for n in sizes), []
    many = log_cone_gaussian_measure(W, [0], n_chains=128, max_constraints=256, seed=4, target_se=0.1)
    assert many.n_runs[0] >= 4 and many.side[0] == "two-sided"
    assert probes_one >= 4 and sum(n <= 4 for n in sizes) == probes_one  # run 0's probes only
    monkeypatch.undo()
    assert abs(many.log_share[0] - lt) <= min(0.3, 4 * many.std_err[0])
    r = [log_cone_gaussian_measure(W, [0], n_chains=128, max_constraints=256, seed=s, target_se=0.25)
         for s in range(40)]
    err = np.array([x.log_share[0] - lt for x in r])
    cover = np.mean([x.log_lower[0] <= lt <= x.log_upper[0] for x in r])
    log_mean_p = err.max() + np.log(np.mean(np.exp(err - err.max())))
    assert abs(log_mean_p) < 0.12, (log_mean_p, err)
    assert cover >= 0.85, (cover, err)


def test_subset_without_full_check_is_an_upper_bound():
    W, lt = orthant(10, 16, seed=3, n_redundant=500)
    # cap the working set below the 10 facets: the subset cone is larger than the cell
    r = log_cone_gaussian_measure(W, [0], max_constraints=5, working_set=True, full_check=False, seed=1)
    assert r.side[0] == "upper"
    assert r.log_share[0] > lt + 1.0
    full = log_cone_gaussian_measure(W, [0], max_constraints=64, working_set=True, seed=1)
    assert full.side[0] == "two-sided"
    assert abs(full.log_share[0] - lt) <= 0.3


def test_membership_matches_the_decoder():
    from embgeom._rare_event import _Cone

    rng = np.random.default_rng(8)
    W = rng.standard_normal((300, 6)).astype(np.float32)
    G = rng.standard_normal((6, 6))
    WG = (W.astype(np.float64) @ G).astype(np.float32)
    X = rng.standard_normal((2000, 6))
    idx = Decoder(W).assign((X @ G.T).astype(np.float32))
    t = int(np.bincount(idx).argmax())
    cone = _Cone(WG, np.einsum("ij,ij->i", WG, WG, dtype=np.float64), W, t)
    val, _ = cone.scan(X, 2)
    assert np.array_equal(val[:, 0] >= 0, idx == t)


# -------------------------------------------------------------------------------- API
def test_per_token_seeds_do_not_depend_on_the_batch():
    W, _ = cross_polytope(4)
    a = log_cone_gaussian_measure(W, [2, 5], n_chains=64, seed=11)
    b = log_cone_gaussian_measure(W, [5], n_chains=64, seed=11)
    assert a.log_share[1] == b.log_share[0]
    c = log_cone_gaussian_measure(W, [5], n_chains=64, seed=12)
    assert c.log_share[0] != b.log_share[0]


def test_duplicate_rows_lower_id_takes_the_cell():
    W, _ = cross_polytope(3)
    W = np.vstack([W, W[1]])  # token 6 duplicates token 1
    r = log_cone_gaussian_measure(W, [1, 6], n_chains=128, seed=0)
    assert r.side[1] == "empty" and r.log_share[1] == -np.inf and r.log_upper[1] == -np.inf
    assert abs(r.log_share[0] + math.log(6)) < 0.3  # the tie is not a constraint for token 1


def test_single_token_has_the_whole_space():
    r = log_cone_gaussian_measure(np.ones((1, 3)), [0], n_chains=32, seed=0)
    assert r.log_share[0] == 0.0


@pytest.mark.parametrize(
    "kw,exc,word",
    [
        ({"n_chains": 0}, ValueError, "n_chains"),
        ({"n_chains": 30}, ValueError, "n_chains"),
        ({"n_groups": 1}, ValueError, "n_groups"),
        ({"level_prob": 1.0}, ValueError, "level_prob"),
        ({"move": "gibbs"}, ValueError, "move"),
        ({"working_set": "yes"}, ValueError, "working_set"),
        ({"token_ids": [9]}, ValueError, "token_ids"),
        ({"token_ids": [0.5]}, TypeError, "token_ids"),
        ({"G": np.eye(4)}, ValueError, "G"),
        ({"seed": 1.5}, TypeError, "seed"),
    ],
)
def test_bad_input(kw, exc, word):
    W, _ = cross_polytope(3)
    with pytest.raises(exc, match=word):
        log_cone_gaussian_measure(W, **kw)


def test_nan_in_W():
    W, _ = cross_polytope(3)
    W[0, 0] = np.nan
    with pytest.raises(ValueError, match="W"):
        log_cone_gaussian_measure(W)


# -------------------------------------------------------------------------------- cell_volumes
def _supports_for(d):
    from embgeom.supports import Ball, Ellipsoid, FinalNormShell

    rng = np.random.default_rng(9)
    Q = special_ortho_group.rvs(d, random_state=9)
    shape = Q @ np.diag(1.0 / rng.uniform(0.3, 3.0, d) ** 2) @ Q.T
    gain = rng.uniform(0.3, 3.0, d)
    return {
        "ball": Ball.from_params(np.zeros(d), 2.0),
        "ellipsoid": Ellipsoid.from_params(np.zeros(d), shape),
        "rmsnorm": FinalNormShell.from_params("rmsnorm", gain),
        "layernorm": FinalNormShell.from_params("layernorm", gain),
    }


@pytest.mark.parametrize("name", ["ball", "ellipsoid", "rmsnorm", "layernorm"])
def test_cell_volumes_rare_event_matches_uniform_sampling(name):
    from embgeom.volumes import cell_volumes

    rng = np.random.default_rng(4)
    W = rng.standard_normal((10, 4)).astype(np.float32)
    support = _supports_for(4)[name]
    cv = cell_volumes(Decoder(W), support, 100_000, seed=2, progress=False, n_chains=256,
                      method="rare-event")  # every token split, for the cross-check
    assert cv.estimator == "rare-event"
    assert set(cv.token_method) <= {"rare-event", "empty"}
    hit = cv.counts > 300
    p = cv.fractions[hit]
    se_mc = np.sqrt((1 - p) / (p * cv.n_samples))
    se_re = (cv.log_upper[hit] - cv.log_lower[hit]) / (2 * 2.13)  # t(15) half-width
    diff = cv.log_fractions[hit] - np.log(p)
    assert np.all(np.abs(diff) <= 3 * np.hypot(se_re, se_mc)), diff
    assert np.all(cv.counts[cv.token_method == "empty"] == 0)


def test_cell_volumes_token_sample_and_fallback():
    from embgeom.supports import Ball, Box
    from embgeom.volumes import cell_volumes

    W, _ = cross_polytope(5)
    dec = Decoder(W)
    cv = cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), 2000, seed=0, progress=False,
                      tokens=4, n_chains=64, method="rare-event")
    est = cv.token_method == "rare-event"
    assert est.sum() == 4 and np.all(cv.token_method[~est] == "not estimated")
    assert np.all(np.isnan(cv.log_fractions[~est])) and np.all(np.isfinite(cv.log_fractions[est]))
    assert np.all(np.abs(cv.log_fractions[est] + math.log(10)) < 0.6)
    assert cv.extra["rare_event"]["token_sample"] == 4
    import json

    json.dumps(cv.to_dict())  # the summary stays JSON-able with the rare-event record
    # the same seed draws the same token sample
    cv2 = cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), 2000, seed=0, progress=False,
                       tokens=4, n_chains=64, method="rare-event")
    assert np.array_equal(cv2.token_method, cv.token_method)
    # a box: cells are not cones through its centre -> uniform only, said so
    box = Box.from_params(-np.ones(5), np.ones(5))
    cvb = cell_volumes(dec, box, 2000, seed=0, progress=False)
    assert cvb.estimator == "uniform" and "not applicable" in cvb.extra["rare_event"]
    assert np.all(cvb.token_method == "uniform")
    assert np.array_equal(np.isnan(cvb.log_fractions), cvb.counts == 0)
    with pytest.raises(ValueError, match="method"):
        cell_volumes(dec, box, 100, method="rare-event", progress=False)
    with pytest.raises(ValueError, match="method"):
        cell_volumes(Decoder(W, np.ones(10)), Ball.from_params(np.zeros(5), 1.0), 100, method="rare-event", progress=False)
    with pytest.raises(ValueError, match="method"):
        cell_volumes(dec, box, 100, method="splitting", progress=False)
    with pytest.raises(ValueError, match="n_chains"):
        cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), 100, n_chains=0, progress=False)
    with pytest.raises(ValueError, match="n_samples"):
        cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), 0, progress=False)
    with pytest.raises(ValueError, match="tokens"):
        cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), 100, tokens=[99], progress=False)


def test_histogram_of_rare_event_log_shares(tmp_path):
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    W, _ = cross_polytope(3)
    dec = Decoder(np.vstack([W, np.zeros((2, 3))]))  # the two zero rows have empty cells
    cv = cell_volumes(dec, Ball.from_params(np.zeros(3), 1.0), 500, seed=0, progress=False, n_chains=64)
    assert list(cv.token_method[-2:]) == ["empty", "empty"] and np.all(cv.log_fractions[-2:] == -np.inf)
    ax = cv.histogram(path=tmp_path / "h.png")
    assert not any("0 hits" in t.get_text() for t in ax.texts)  # no zero-hit bar
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["6 tokens; 2 proven empty, not drawn"]
    assert sum(p.get_height() for p in ax.patches) == 6
    # nats on a linear count axis, the estimator and its budget in the title
    assert ax.get_yscale() == "linear" and "nats" in ax.get_xlabel()
    # (every token here was counted, so the title gives the budget but no blocks per token)
    assert ax.get_title() == ("decoder cell volumes: rare-event splitting, runs of 64 chains until "
                              "se 0.12 nats; 6 big cells by their uniform count of 500 samples")
    assert len(ax.patches) == 5  # sqrt(6) -> at least 5 bins, not 50
    xs = [p.get_x() for p in ax.patches]
    assert min(xs) == pytest.approx(float(cv.log_fractions[:6].min()))  # nats, not log10
    # a token sample: the legend says how many of how many (it once said "sample of |V|")
    cs = cell_volumes(dec, Ball.from_params(np.zeros(3), 1.0), 500, seed=0, progress=False,
                      n_chains=64, tokens=[0, 2, 4, 6])
    labels = cs.histogram().get_legend_handles_labels()[1]
    assert labels == ["3 of a 4-token sample of 8; 1 proven empty, not drawn"]
    # every sampled token drawn: not "3 of a 3-token sample of 8"
    cs = cell_volumes(dec, Ball.from_params(np.zeros(3), 1.0), 500, seed=0, progress=False,
                      n_chains=64, tokens=[0, 2, 4])
    assert cs.histogram().get_legend_handles_labels()[1] == ["a 3-token sample of 8"]


def test_a_token_count_above_the_vocabulary_is_every_token():
    """tokens=1000 on a 6-token decoder is documented as every token: the same shares, draw for
    draw, as tokens=None (and a sample of 3 is a strict, seeded subset)."""
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    W, _ = cross_polytope(3)
    ball = Ball.from_params(np.zeros(3), 1.0)
    kw = dict(seed=5, progress=False, n_chains=32, method="rare-event", target_se=None)
    every = cell_volumes(Decoder(W), ball, 200, tokens=None, **kw)
    many = cell_volumes(Decoder(W), ball, 200, tokens=1000, **kw)
    np.testing.assert_array_equal(many.log_fractions, every.log_fractions)
    assert np.all(np.isfinite(every.log_fractions))
    few = cell_volumes(Decoder(W), ball, 200, tokens=3, **kw)
    assert np.isfinite(few.log_fractions).sum() == 3


def test_scale_of_W_and_G_changes_no_share():
    """A bias-free cone does not change when W or G is scaled: the estimator brings both to unit
    scale by powers of two, so W * 2^100 (1e30, whose products overflowed float32 and gave every
    share 0) or 2^-530 (1e-160) gives the same figures, draw for draw."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((50, 8))
    G = np.diag(rng.uniform(0.5, 2.0, 8))
    ref = log_cone_gaussian_measure(W, [0, 1, 2], G, n_chains=64, seed=0).log_share
    assert np.all(np.isfinite(ref))
    for s in (2.0**-530, 2.0**-150, 2.0**100, 2.0**530):
        for g in (2.0**-300, 1.0, 2.0**300):
            r = log_cone_gaussian_measure(W * s, [0, 1, 2], G * g, n_chains=64, seed=0).log_share
            np.testing.assert_array_equal(r, ref)


def test_any_scale_of_the_support_changes_no_share():
    """A support scaled by s (not a power of two: 1e-160, 1e-3, 1e3, 1e160) has the same cones:
    G's scale is divided out exactly, so an Ellipsoid (rotated axes) or a final-norm shell gives
    the same shares draw for draw. Dividing by a power of two only left s = 1e3 and s = 1 one
    ulp apart in float32 and the chains on different paths (-10.19 vs -10.35 nats)."""
    from embgeom.supports import Ellipsoid, FinalNormShell
    from embgeom.volumes import cell_volumes

    rng = np.random.default_rng(1)
    W = rng.standard_normal((20, 4)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    gain = rng.uniform(0.5, 2.0, 4)
    kw = dict(seed=0, progress=False, method="rare-event", tokens=[10, 3])

    def shares(support):
        return cell_volumes(Decoder(W), support, 2000, **kw).log_fractions[[10, 3]]

    for make in (lambda s: Ellipsoid.from_params(np.zeros(4), semi_axes=np.array([1, 2, 3, 0.5]) * s,
                                                 axes=Q),
                 lambda s: FinalNormShell.from_params("rmsnorm", gain * s)):
        ref = shares(make(1.0))
        assert np.all(np.isfinite(ref))
        for s in (1e-160, 1e-3, 1e3, 1e160):
            np.testing.assert_array_equal(shares(make(s)), ref)


def test_tiny_working_set_still_resolves():
    """Caps of 1 to 4 constraints: the levels over all of W adapt their HMC time instead of
    stalling on ties for 400 levels (they left the cell unresolved); max_levels=1 is a clean
    'unresolved', not an error."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((50, 8)).astype(np.float32)
    full = log_cone_gaussian_measure(W, [0, 1], n_chains=64, seed=0)
    for cap in (1, 2, 4):
        r = log_cone_gaussian_measure(W, [0, 1], n_chains=64, seed=0, max_constraints=cap)
        assert list(r.side) == ["two-sided", "two-sided"] and np.all(r.n_levels < 60)
        assert np.all(np.abs(r.log_share - full.log_share) < 4 * np.hypot(r.std_err, full.std_err) + 0.3)
    r = log_cone_gaussian_measure(W, [0], n_chains=64, seed=0, max_constraints=1, max_levels=1)
    assert r.side[0] == "unresolved" and np.isnan(r.log_share[0])


def test_auto_keeps_the_count_where_it_is_tighter():
    """Issue 22: big cells were split under method="auto" and came out worse than counting.
    The cross-polytope in d = 5 has 10 cells of share exactly 1/10: with 20,000 samples the
    count's log-error is about 0.02 nats, so auto keeps every count (token_method "uniform"),
    where splitting at 128 chains was off by up to ~0.3 nats; a tiny cell still gets split."""
    from embgeom.supports import Ball
    from embgeom.volumes import _counts_suffice, cell_volumes

    W, _ = cross_polytope(5)
    cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(5), 1.0), 20_000, seed=0,
                      progress=False)
    assert cv.estimator == "rare-event" and list(cv.token_method) == ["uniform"] * 10
    np.testing.assert_array_equal(cv.log_fractions, np.log(cv.counts / 20_000))
    assert np.all(np.abs(cv.log_fractions - np.log(0.1)) < 0.1)
    assert cv.extra["rare_event"]["n_by_counts"] == 10
    lam = cv.cell_volume_rate(n_boot=0)  # the rate sees every sampled token
    assert lam.rate == pytest.approx(np.log(10), abs=0.05)
    # the rule, by hand: 20 hits of 20,000 (se 0.22) vs 10 levels of 128 chains (se 0.28)
    assert _counts_suffice([20], 20_000, 128, 0.5)[0]
    assert not _counts_suffice([5], 20_000, 128, 0.5)[0]  # se 0.45 vs 0.31: split
    assert not _counts_suffice([0], 20_000, 128, 0.5)[0]
    # forced splitting still splits them all
    cs = cell_volumes(Decoder(W), Ball.from_params(np.zeros(5), 1.0), 2_000, seed=0,
                      progress=False, method="rare-event", n_chains=64)
    assert list(cs.token_method) == ["rare-event"] * 10


@pytest.mark.parametrize("k,d,n_redundant,n_seeds", [(20, 32, 0, 150), (15, 24, 3000, 60)])
def test_no_bias_at_the_default_budget(k, d, n_redundant, n_seeds):
    """Issue 22: at 128 chains (cell_volumes' default) the estimates sat ~+0.11 nats above the
    truth (+0.16 with a working set): every chain was moved after each level (sequential Monte
    Carlo), whose quantile-placed levels make the product of fractions too large by about
    (1 + 1/(N/2 - 1))^L, more than the first-order correction removed. Kill-and-copy (adaptive
    multilevel splitting, the level at the largest killed value) is unbiased for p: the log of
    the mean of p over seeds must be within noise of the truth (about 0.035 and 0.045 nats
    here), and the mean log-error near -var/2 (one run's log is low by half its variance)."""
    W, lt = orthant(k, d, seed=k, n_redundant=n_redundant)
    err = np.array([log_cone_gaussian_measure(W, [0], n_chains=128, seed=s).log_share[0] - lt
                    for s in range(n_seeds)])
    log_mean_p = err.max() + np.log(np.mean(np.exp(err - err.max())))
    assert abs(log_mean_p) < 0.12, log_mean_p
    assert abs(err.mean() + err.var() / 2) < 0.12, (err.mean(), err.var())


def test_default_budget_adapts_per_token():
    """Issue 22: at one run of 128 chains the log-error of a share of 2^-30 has an sd of about
    0.5 nats (it grows like sqrt(-log p / n_chains)). cell_volumes' default (target_se = 0.12
    nats) gives such a token more runs until its error is met, so the default is within 0.3
    nats of the truth; a big cell keeps one run, or its count under method="auto"."""
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    for s in range(3):
        W, lt = orthant(30, 32, seed=s)
        cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(32), 1.0), 2_000, seed=s,
                          tokens=[0], progress=False)
        n_runs = cv.extra["rare_event_n_runs"]
        assert cv.token_method[0] == "rare-event" and 8 <= n_runs[0] <= 32, n_runs[0]
        assert abs(cv.log_fractions[0] - lt) <= 0.3, (s, cv.log_fractions[0] - lt)
        assert cv.log_upper[0] - cv.log_lower[0] < 4 * 0.12 * 1.3  # the target, met
        assert n_runs[1:].sum() == 0  # the other tokens were not split
    # big cells: one run when forced to split (share 1/2), none under auto (their counts)
    W, _ = orthant(1, 4)
    ball = Ball.from_params(np.zeros(4), 1.0)
    cv = cell_volumes(Decoder(W), ball, 2_000, seed=0, method="rare-event", progress=False)
    assert cv.extra["rare_event_n_runs"].tolist() == [1, 1]
    W, _ = cross_polytope(5)
    cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(5), 1.0), 20_000, seed=0, progress=False)
    assert cv.extra["rare_event_n_runs"].tolist() == [0] * 10
    # no target: one run each, the cap bounds the runs, and the target is validated
    W, _ = orthant(12, 12)
    ball = Ball.from_params(np.zeros(12), 1.0)
    one = cell_volumes(Decoder(W), ball, 500, seed=0, tokens=[0], target_se=None, progress=False)
    assert one.extra["rare_event_n_runs"][0] == 1
    capped = cell_volumes(Decoder(W), ball, 500, seed=0, tokens=[0], progress=False,
                          rare_event_options={"max_runs": 2})
    assert capped.extra["rare_event_n_runs"][0] == 2
    # the first run is the one-run estimate's; the cap's two runs are reproducible
    again = cell_volumes(Decoder(W), ball, 500, seed=0, tokens=[0], progress=False,
                         rare_event_options={"max_runs": 2})
    assert again.log_fractions[0] == capped.log_fractions[0] != one.log_fractions[0]
    # a tiny target (its square's ratio overflowed: OverflowError) runs to the cap and says so
    for tiny in (1e-3, 1e-160, 5e-324):
        with pytest.warns(RuntimeWarning, match="max_runs=2"):
            t = cell_volumes(Decoder(W), ball, 500, seed=0, tokens=[0], progress=False,
                             target_se=tiny, rare_event_options={"max_runs": 2})
        assert t.log_fractions[0] == capped.log_fractions[0]
    for bad in (0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="target_se"):
            cell_volumes(Decoder(W), ball, 100, seed=0, target_se=bad, progress=False)
    with pytest.raises(ValueError, match="max_runs"):
        log_cone_gaussian_measure(W, [0], n_chains=32, target_se=0.1, max_runs=0)


def test_working_set_copy_shares_rows_and_is_frozen():
    """A counted run's working set (``_Constraints.copy``) shares the pilot's rows and Gram
    matrix instead of copying them, owns its shifts (all ``inf``: lowering them leaves the
    pilot's alone), and refuses to take a constraint (its domains are fixed before it draws)."""
    from embgeom._rare_event import _Cone, _Constraints

    rng = np.random.default_rng(3)
    W = rng.standard_normal((300, 5)).astype(np.float32)
    cone = _Cone(W, np.einsum("ij,ij->i", W, W, dtype=np.float64), W, 0)
    cs = _Constraints(cone, capacity=64, gram=True)
    assert cs.add(np.arange(1, 21)) == 20
    cs.lower_shifts(0.5)
    new = cs.copy()
    assert new.M == 20 and new.A is not None and np.shares_memory(new.A, cs.A)
    np.testing.assert_array_equal(new.gram, cs.A @ cs.A.T)
    assert np.all(np.isinf(new.shift)) and np.all(cs.shift == 0.5)
    new.lower_shifts(0.1)
    assert np.all(cs.shift == 0.5) and np.all(new.shift == 0.1)
    with pytest.raises(RuntimeError, match="fixed before it draws"):
        new.add(np.array([30]))
    assert cs.add(np.array([30])) == 1 and new.M == 20  # the pilot's set may still grow
    assert not new.in_S[30] and cs.in_S[30]


def _thin_wedge(s: float = 8192.0, d: int = 2, seed: int = 1):
    """Rows ``(1, 0), (0.5, +-s)`` (float32-exact) padded to ``d`` and rotated: the cell of row 0
    is the wedge ``x_1 >= (s / 0.5) |x_2|`` (times R^(d-2)), share ``atan(0.5 / s) / pi``,
    4,000 times thinner than wide at s = 8192."""
    W = np.zeros((3, d))
    W[:, :2] = [[1.0, 0.0], [0.5, s], [0.5, -s]]
    if d > 2:
        W = W @ special_ortho_group.rvs(d, random_state=seed).T
    return W, math.log(math.atan(0.5 / s) / math.pi)


@pytest.mark.parametrize("d", [16])
def test_thin_wedge_share(d):
    """A cone far thinner than wide: a quarter-turn HMC trajectory reflects ~13,000 times, past
    MAX_BOUNCES. Trajectories stopped at the cap (the earlier kernel) put the share at -27 nats
    against -10.85 with a confident interval; rejected ones with a shortened time recover it."""
    W, truth = _thin_wedge(d=d)
    for seed in range(2):
        r = log_cone_gaussian_measure(W, [0], n_chains=128, target_se=0.12, seed=seed)
        assert r.side[0] == "two-sided"
        assert abs(r.log_share[0] - truth) < 0.4
        assert r.log_lower[0] - 0.1 <= truth <= r.log_upper[0] + 0.1


def test_hmc_rejects_trajectories_past_the_cap():
    """A trajectory that needs more than ``max_bounces`` reflections leaves its chain where it
    started (X and P restored exactly: a rejected Metropolis step), and one that needs fewer
    moves it; both stay inside the polyhedron."""
    W, _ = _thin_wedge()
    A = np.array([[1.0, 0.0]]) - W[1:]
    A = A / np.linalg.norm(A, axis=1)[:, None]
    rng = np.random.default_rng(0)
    X = np.tile([1.0, 0.0], (50, 1)) * rng.uniform(0.5, 2.0, (50, 1))
    X0 = X.copy()
    V = rng.standard_normal((50, 2))
    P = np.ascontiguousarray(X @ A.T)
    P0 = P.copy()
    Q = np.ascontiguousarray(V @ A.T)
    b = _rare_kernels.hmc_trajectories(X, V, P, Q, A, A @ A.T, np.zeros(2), math.pi / 2, 50)
    stuck = b >= 50
    assert stuck.sum() >= 45  # ~13,000 reflections are needed for a quarter turn
    np.testing.assert_array_equal(X[stuck], X0[stuck])
    np.testing.assert_array_equal(P[stuck], P0[stuck])
    short, V2 = X0.copy(), rng.standard_normal((50, 2))
    b2 = _rare_kernels.hmc_trajectories(short, V2, np.ascontiguousarray(X0 @ A.T),
                                        np.ascontiguousarray(V2 @ A.T), A, A @ A.T, np.zeros(2),
                                        1e-4, 50)
    assert np.all(b2 < 50) and not np.array_equal(short, X0)
    assert np.all(short @ A.T >= -1e-9)


def test_a_cone_too_thin_for_the_moves_is_warned_about(monkeypatch):
    """Past seven halvings of the HMC time the chains hardly mix: a wedge 2^16 times thinner
    than wide is then estimated 0.45 nats low (seed 0) and must say so; at 2^13 (estimate
    within 0.05 nats) no warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_cone_gaussian_measure(_thin_wedge(d=8)[0], [0], n_chains=128, target_se=0.12, seed=0)
    # with reflections capped at 1,000 whatever they cost (the cap before _bounce_cap)
    monkeypatch.setattr(_rare_event, "MAX_BOUNCES_CHEAP", _rare_event.MAX_BOUNCES)
    with pytest.warns(RuntimeWarning, match="the cone of token 0 is too thin for the HMC moves"):
        log_cone_gaussian_measure(_thin_wedge(s=2.0**16, d=8)[0], [0], n_chains=128, seed=0)


def test_cheap_reflections_get_a_higher_cap():
    """A 2^13 wedge rotated into 16-d has 2 constraints: a trajectory may reflect 100,000
    times, so the chains mix (at 1,000: 0.15 nats low on average, coverage 0.65 over 20
    seeds); the cap falls to 1,000 with SmolLM2-sized working sets."""
    assert _rare_event._bounce_cap(2, 16) == _rare_event.MAX_BOUNCES_CHEAP
    assert _rare_event._bounce_cap(2000, 576) == _rare_event.MAX_BOUNCES
    assert _rare_event._bounce_cap(100, 576) == 2_000_000 // 676
    W, truth = _thin_wedge(d=16)
    err, cover = [], []
    for seed in range(6):
        r = log_cone_gaussian_measure(W, [0], n_chains=128, target_se=0.12, seed=seed)
        err.append(r.log_share[0] - truth)
        cover.append(r.log_lower[0] <= truth <= r.log_upper[0])
    assert abs(np.mean(err)) < 0.12, err
    assert sum(cover) >= 5, err


@pytest.mark.parametrize("s", [2.0, 8192.0, 2.0**16, 2.0**20, 2.0**40, 2.0**100])
def test_planar_cones_are_measured_exactly(s):
    """In 2-D a cone's share is its angle: the wedge ``atan(0.5 / s) / pi`` to float64
    rounding at any thinness (splitting's moves stop mixing from s = 2^16, and a difference
    of nearly opposite normal angles would keep no digit of a 2^-100 wedge), its neighbours
    the two half-planes less half the wedge each, every figure side "exact", no run, no warning."""
    import warnings

    W, truth = _thin_wedge(s=s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = log_cone_gaussian_measure(W, None, seed=0)
    share0 = math.atan(0.5 / s) / math.pi
    expect = [truth, math.log((1 - share0) / 2), math.log((1 - share0) / 2)]
    np.testing.assert_allclose(r.log_share, expect, rtol=0, atol=1e-12)
    assert list(r.side) == ["exact"] * 3 and r.n_runs.tolist() == [0, 0, 0]
    assert np.array_equal(r.std_err, np.zeros(3))


def test_planar_cone_corner_cases():
    """A regular 7-gon of rows: every cell 1/7 (float32 rows: 1e-7); one row: all of R^2; two
    rows: half-planes; an interior row: empty; 1-D rows 1, 2, 3: half-lines and the origin;
    a G of rank 2 in d = 5 reduces to a planar cone, the angle of the rows of W G."""
    th = 2 * np.pi * np.arange(7) / 7
    r = log_cone_gaussian_measure(np.c_[np.cos(th), np.sin(th)], None, seed=0)
    np.testing.assert_allclose(r.log_share, math.log(1 / 7), atol=1e-6)
    assert log_cone_gaussian_measure(np.array([[1.0, 0.0]]), None).log_share[0] == 0.0
    two = log_cone_gaussian_measure(np.array([[1.0, 0.0], [0.0, 1.0]]), None).log_share
    np.testing.assert_allclose(two, math.log(0.5), atol=1e-15)
    box = np.array([[1.0, 0], [-1, 0], [0, 1], [0, -1], [0.1, 0.1]])
    r = log_cone_gaussian_measure(box, [4])
    assert r.log_share[0] == -np.inf and r.side[0] == "empty"
    r = log_cone_gaussian_measure(np.array([[1.0], [2.0], [3.0]]), None)
    np.testing.assert_allclose(r.log_share, [math.log(0.5), -np.inf, math.log(0.5)])
    assert list(r.side) == ["exact", "empty", "exact"]
    rng = np.random.default_rng(0)
    W = rng.standard_normal((9, 5))
    G = rng.standard_normal((5, 2)) @ rng.standard_normal((2, 5))  # rank 2
    r = log_cone_gaussian_measure(W, None, G=G, seed=0)
    assert set(r.side) <= {"exact", "empty"}
    # the same cells in the plane: W G's rows in an orthonormal basis of G's range
    U, sv, _ = np.linalg.svd(G)
    r2 = log_cone_gaussian_measure(W @ (U[:, :2] * sv[:2]), None, seed=0)
    np.testing.assert_allclose(r.log_share, r2.log_share, atol=1e-6)
    assert abs(np.logaddexp.reduce(r.log_share)) < 1e-6  # the cells tile the plane


def test_planar_cells_agree_with_counts_and_tile_the_plane():
    """A random 40 x 2 decoder: ``cell_volumes`` gives every token its exact angle (token_method
    "exact", even where the count would do), the shares sum to 1, and each agrees with a
    200,000-point uniform count within 4 binomial standard errors (a cross-check by another
    method; the counts do not enter the exact figures)."""
    from embgeom.cells import Decoder
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    W = np.random.default_rng(5).standard_normal((40, 2))
    ball = Ball.from_params(np.zeros(2), 2.0)
    cv = cell_volumes(Decoder(W), ball, 200_000, seed=1, progress=False)
    est = cv.token_method != "empty"
    assert set(cv.token_method) <= {"exact", "empty"} and est.sum() >= 5
    assert abs(np.logaddexp.reduce(cv.log_fractions[est])) < 1e-9
    p = np.exp(cv.log_fractions[est])
    se = np.sqrt(p * (1 - p) / cv.n_samples)
    assert np.all(np.abs(cv.fractions[est] - p) <= 4 * se + 1e-12)
    assert np.all(cv.counts[~est] == 0)


def test_planar_cones_at_extreme_ratios():
    """A trial's cases, each once wrong (truths from exact hull geometry of the float32 rows):
    distinct rows far smaller than the largest, or differing far below it, are distinct cells,
    not ties; normals whose float angles round alike are put in order exactly, so an empty
    cell gets no share; differences of rows 60 binary orders apart are taken exactly; an origin
    ball of radius 3 gives the shares of W itself (no second float32 rounding of 3 W); nearly
    collinear rows cost O(V log V), not O(V^2) exact products."""
    from embgeom.cells import Decoder
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    h, q = math.log(0.5), math.log(0.25)
    np.testing.assert_allclose(
        log_cone_gaussian_measure(np.array([[1.0, 0], [0, 1e-20], [0, -1e-20]])).log_share,
        [h, q, q], rtol=0, atol=1e-12)
    r = log_cone_gaussian_measure(np.array([[1.0, 0], [0.5, 1e20], [0.5, -1e20], [-1, 0]]), [3])
    assert abs(r.log_share[0] - -46.79096666) < 1e-6
    r = log_cone_gaussian_measure(np.array([[0.0, 0], [-1, 1e-25], [1, -0.5e-25], [1, -2e-25]]))
    np.testing.assert_allclose(r.log_share, [-np.inf, h, q, q], rtol=0, atol=1e-12)
    r = log_cone_gaussian_measure(np.array([[0.0, 0], [-1, 1e-25], [1, -0.5e-25], [2, -4e-25]]),
                                  [0])
    assert r.log_share[0] == -np.inf and r.side[0] == "empty"
    r = log_cone_gaussian_measure(np.array([[-0.5, 0.5], [0.5, -0.5], [2.0**-60, 2.0**-60]]), [2])
    assert abs(r.log_share[0] - -42.04041354) < 1e-6
    a = np.float32(0.7015565037727356)
    W = np.array([[-1, a], [0, np.nextafter(a, np.float32(2))], [1, a], [0, -1]], np.float32)
    cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(2), 3.0), 1000, seed=0,
                      progress=False)
    assert abs(cv.log_fractions[1] - -17.78026222) < 1e-6
    np.testing.assert_array_equal(cv.log_fractions, log_cone_gaussian_measure(W).log_share)
    x = np.sort(np.random.default_rng(0).uniform(-1, 1, 3000))
    r = log_cone_gaussian_measure(np.c_[x, 1e-10 * x**2], [1500])  # took minutes
    assert np.isfinite(r.log_share[0]) and r.side[0] == "exact"


def test_unmet_target_se_warns_and_says_how_many():
    # an orthant of share 2^-12 in d = 12 at 16 chains and one counted run: se ~ 1 nat, far
    # above 0.01, so the call must say the target was not met instead of returning quietly
    from embgeom._rare_event import log_cone_gaussian_measure

    W = np.vstack([np.zeros(12), -np.eye(12)])
    with pytest.warns(RuntimeWarning, match=r"target_se: 1 of 1 tokens"):
        r = log_cone_gaussian_measure(W, [0], n_chains=16, n_groups=4, target_se=0.01,
                                      max_runs=1, seed=3)
    assert r.std_err[0] > 0.01


def test_float32_W_near_unit_scale_is_used_as_it_is():
    """A float32 W within 2^+-16 of unit scale is not copied to be rescaled (prepare_cones), and
    one far from it is: either way a power of two changes no share, draw for draw."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((60, 6))
    W = (3.0 * W / np.linalg.norm(W, axis=1, keepdims=True)).astype(np.float32)  # all argmaxable
    assert _rare_event.prepare_cones(W).WG32 is W  # max|W| in [1, 4): no copy
    assert _rare_event.prepare_cones(W * np.float32(2.0**-40)).WG32 is not W
    ref = log_cone_gaussian_measure(W, [0, 5, 9], n_chains=64, seed=1).log_share
    assert np.all(np.isfinite(ref))
    for s in (2.0**-40, 2.0**-10, 2.0**12, 2.0**40):
        r = log_cone_gaussian_measure(W * np.float32(s), [0, 5, 9], n_chains=64, seed=1).log_share
        np.testing.assert_array_equal(r, ref)


def test_tokens_measured_together_equal_tokens_alone():
    """The working sets of one call's tokens share one Gram buffer (_GramBuffer), each token
    overwriting the last one's corner: a token's figures must not depend on the tokens measured
    before it in the same call. 2,500 rows, so every cone has a working set (over 2,048)."""
    rng = np.random.default_rng(4)
    W = rng.standard_normal((2500, 6))
    W = (W / np.linalg.norm(W, axis=1, keepdims=True)).astype(np.float32)  # every cell non-empty
    tokens = [7, 1200, 33, 2499]
    together = log_cone_gaussian_measure(W, tokens, n_chains=64, seed=5, target_se=0.3)
    assert np.all(together.n_constraints_used > 0) and np.all(np.isfinite(together.log_share))
    for i, t in enumerate(tokens):
        alone = log_cone_gaussian_measure(W, [t], n_chains=64, seed=5, target_se=0.3)
        assert alone.log_share[0] == together.log_share[i]
        assert alone.std_err[0] == together.std_err[i]
        assert alone.n_runs[0] == together.n_runs[i]
