"""Decoder cells: kernels vs numpy, blocked assignment vs brute force, exact unargmaxable scan."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import ConvexHull

from embgeom import _kernels
from embgeom.cells import Decoder
from embgeom.supports import Ball, Box


def dyadic(rng, shape, lo=-4, hi=4):
    """Small multiples of 1/8: products and sums are exact in float32, so ties are exact."""
    return (rng.integers(lo, hi + 1, size=shape) / 8.0).astype(np.float32)


def brute_argmax(H, W, b=None):
    z = H.astype(np.float64) @ W.astype(np.float64).T
    if b is not None:
        z += b.astype(np.float64)
    return np.argmax(z, axis=1)  # first maximum: lowest id


# ------------------------------------------------------------------------ kernels vs numpy
def test_running_argmax_kernel_matches_numpy():
    rng = np.random.default_rng(0)
    N, V, vb = 37, 50, 16
    L = dyadic(rng, (N, V), -3, 3)  # many ties
    b = dyadic(rng, V, -1, 1)
    bv = np.full(N, -np.inf, np.float32)
    bi = np.zeros(N, np.int64)
    for v0 in range(0, V, vb):
        _kernels.running_argmax_update(np.ascontiguousarray(L[:, v0 : v0 + vb]), b[v0 : v0 + vb], v0, bv, bi)
    z = L.astype(np.float64) + b
    np.testing.assert_array_equal(bi, np.argmax(z, axis=1))
    np.testing.assert_array_equal(bv, z.max(axis=1))


@pytest.mark.parametrize("with_bias", [True, False])
def test_argmax_fold_matches_numpy_and_numba_kernel(with_bias):
    # what Decoder.assign folds with: numpy argmax per block, ties to the lowest id across blocks
    rng = np.random.default_rng(2)
    N, V, vb = 37, 50, 16
    L = dyadic(rng, (N, V), -3, 3)  # many ties, inside and across blocks
    b = dyadic(rng, V, -1, 1) if with_bias else np.zeros(V, np.float32)
    bv, bi = np.full(N, -np.inf, np.float32), np.zeros(N, np.int64)
    kv, ki = bv.copy(), bi.copy()
    for v0 in range(0, V, vb):
        blk = np.ascontiguousarray(L[:, v0 : v0 + vb])
        _kernels.running_argmax_update(blk.copy(), b[v0 : v0 + vb], v0, kv, ki)
        assert not _kernels.argmax_fold(blk, b[v0 : v0 + vb], v0, bv, bi, add_bias=with_bias)
    z = L.astype(np.float64) + b
    np.testing.assert_array_equal(bi, np.argmax(z, axis=1))
    np.testing.assert_array_equal(bv, z.max(axis=1))
    np.testing.assert_array_equal(bi, ki)
    # a NaN logit (an overflowed product) is reported, not folded in silently
    blk = np.ascontiguousarray(L[:, :vb])
    blk[3, 5] = np.nan
    assert _kernels.argmax_fold(blk, b[:vb], 0, np.full(N, -np.inf, np.float32), np.zeros(N, np.int64))


def test_running_top2_kernel_matches_numpy():
    rng = np.random.default_rng(1)
    N, V, vb = 41, 33, 7
    L = dyadic(rng, (N, V), -3, 3)
    b = np.zeros(V, np.float32)
    b1 = np.full(N, -np.inf, np.float32)
    b2 = np.full(N, -np.inf, np.float32)
    i1 = np.full(N, -1, np.int64)
    i2 = np.full(N, -1, np.int64)
    for v0 in range(0, V, vb):
        _kernels.running_top2_update(np.ascontiguousarray(L[:, v0 : v0 + vb]), b[v0 : v0 + vb], v0, b1, i1, b2, i2)
    order = np.argsort(-L, axis=1, kind="stable")  # ties: lower id first
    np.testing.assert_array_equal(i1, order[:, 0])
    np.testing.assert_array_equal(i2, order[:, 1])
    srt = -np.sort(-L, axis=1)
    np.testing.assert_array_equal(b1, srt[:, 0])
    np.testing.assert_array_equal(b2, srt[:, 1])


def test_count_and_topk_kernels():
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 13, size=1000).astype(np.int64)
    np.testing.assert_array_equal(_kernels.count_tokens(idx, 13), np.bincount(idx, minlength=13))
    with pytest.raises(ValueError):
        _kernels.count_tokens(np.array([0, 13], np.int64), 13)
    S = rng.standard_normal((5, 40))
    own = np.array([0, 3, 39, 7, 7], np.int64)
    got = _kernels.topk_competitors(S, own, 6)
    for i in range(5):
        s = S[i].copy()
        s[own[i]] = -np.inf
        np.testing.assert_array_equal(got[i], np.argsort(-s)[:6])


# ------------------------------------------------------------------------ assignment
@pytest.mark.parametrize("blocks", [(7, 5), (512, 2048), (1, 1)])
def test_assign_equals_bruteforce_with_ties_and_bias(blocks):
    rng = np.random.default_rng(3)
    V, d, N = 29, 6, 300
    W = dyadic(rng, (V, d), -1, 1)
    W[20] = W[5]  # an exact duplicate row
    H = dyadic(rng, (N, d), -1, 1)
    b = np.zeros(V, np.float32)
    b[11] = 0.0625  # a bias that shifts one cell (exact in float32)
    for bias in (None, b):
        dec = Decoder(W, bias, point_block=blocks[0], vocab_block=blocks[1])
        ref = brute_argmax(H, W, bias)
        np.testing.assert_array_equal(dec.assign(H), ref)
        # the ties really happen in this data, and they went to the lowest id
        z = H.astype(np.float64) @ W.astype(np.float64).T + (0 if bias is None else b)
        assert ((z == z.max(axis=1, keepdims=True)).sum(axis=1) > 1).sum() > 10
    # the biased cell grew
    assert (Decoder(W, b).assign(H) == 11).sum() > (Decoder(W).assign(H) == 11).sum()


def test_assign_random_float_data_and_float64_input():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((300, 20)).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    H = rng.standard_normal((500, 20))
    dec = Decoder(W, b, point_block=64, vocab_block=100)
    got = dec.assign(H)
    z = H.astype(np.float32).astype(np.float64) @ W.astype(np.float64).T + b
    ref = z.argmax(axis=1)
    srt = np.sort(z, axis=1)
    clear = srt[:, -1] - srt[:, -2] > 1e-4  # away from float32 rounding ties
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(got[clear], ref[clear])
    np.testing.assert_array_equal(dec.assign(H[:1][0]), ref[:1])  # a single (d,) vector


def test_margins_match_numpy():
    rng = np.random.default_rng(5)
    W = dyadic(rng, (17, 4))
    H = dyadic(rng, (200, 4))
    dec = Decoder(W, point_block=13, vocab_block=4)
    z = -np.sort(-(H.astype(np.float64) @ W.astype(np.float64).T), axis=1)
    np.testing.assert_array_equal(dec.margins(H), (z[:, 0] - z[:, 1]).astype(np.float32))
    assert (dec.margins(H) == 0).any()  # ties give margin 0


def test_nearest_vs_argmax():
    rng = np.random.default_rng(6)
    d = 8
    H = rng.standard_normal((2000, d))
    # equal norms (a signed permutation frame, exactly unit): the partitions agree
    W = np.vstack([np.eye(d), -np.eye(d), np.eye(d)[::-1] * 1.0]).astype(np.float32)[: 2 * d]
    dec = Decoder(W)
    np.testing.assert_array_equal(dec.assign(H, "nearest"), dec.assign(H))
    # unequal norms: they differ, and "nearest" is the Euclidean nearest row
    W2 = (rng.standard_normal((40, d)) * rng.uniform(0.2, 3.0, size=(40, 1))).astype(np.float32)
    dec2 = Decoder(W2)
    near = dec2.assign(H, method="nearest")
    dist = np.linalg.norm(H[:, None, :] - W2.astype(np.float64)[None], axis=2)
    srt = np.sort(dist, axis=1)
    clear = srt[:, 1] - srt[:, 0] > 1e-4
    np.testing.assert_array_equal(near[clear], dist.argmin(axis=1)[clear])
    assert (near != dec2.assign(H)).mean() > 0.2


def test_from_unembedding_drops_padding():
    class U:
        weight = np.arange(12, dtype=np.float32).reshape(6, 2)
        bias = None
        vocab_size = 4
        padded_rows = 2

    assert Decoder.from_unembedding(U()).n_tokens == 4
    assert Decoder.from_unembedding(U(), keep_padded=True).n_tokens == 6
    with pytest.raises(TypeError, match="Unembedding"):
        Decoder.from_unembedding(object())


# ------------------------------------------------------------------------ bad input
def test_bad_input():
    W = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="W"):
        Decoder(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="W"):
        Decoder(np.array([[1.0, np.inf]]))
    with pytest.raises(ValueError, match="W"):
        Decoder(np.zeros((0, 3), np.float32))
    with pytest.raises(TypeError, match="float16"):
        Decoder(W.astype(np.float16))
    with pytest.raises(TypeError, match="W"):
        Decoder(np.eye(3, dtype=np.int64))
    with pytest.raises(ValueError, match="bias"):
        Decoder(W, np.zeros(4))
    dec = Decoder(W)
    with pytest.raises(ValueError, match="H"):
        dec.assign(np.ones((2, 4)))
    with pytest.raises(ValueError, match="H"):
        dec.assign(np.array([[np.nan, 0, 0]]))
    with pytest.raises(ValueError, match="H"):
        dec.margins(np.array([[np.inf, 0, 0]]))
    with pytest.raises(TypeError, match="H"):
        dec.assign(np.ones((2, 3), np.float16))
    with pytest.raises(TypeError, match="H"):
        dec.assign(np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match="method"):
        dec.assign(np.ones((2, 3)), method="voronoi")
    # finite float64 that overflows float32: no longer refused, the cell is scale-free (a tie
    # between the three unit rows: the lowest id)
    np.testing.assert_array_equal(dec.assign(np.full((1, 3), 1e39)), [0])
    np.testing.assert_array_equal(dec.assign(np.array([[1e39, 2e39, -1e39]])), [1])
    with pytest.raises(ValueError, match="W: 3 nonzero entries are below float32's normal range"):
        Decoder(np.eye(3) * 1e-46)  # was stored as an all-zero W, every point in cell 0
    with pytest.raises(ValueError, match="bias: 1 nonzero entries"):
        Decoder(W, np.array([0.0, 1e-40, 1.0]))
    with pytest.raises(ValueError, match="dimension"):
        dec.unargmaxable(Ball.from_params(None, 1.0, dim=4), progress=False)
    with pytest.raises(ValueError, match="t"):
        dec.chebyshev_center(3)


# ------------------------------------------------------------------------ exact scan
def planted(d, V, seed):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d))
    W[3] = 0.5 * W[0] + 0.3 * W[1] + 0.2 * W[2]  # strictly inside the hull of the others
    W[4] = 0.2 * W[3]  # even deeper
    W[9] = W[8]  # an exact duplicate: only the lower id can win
    return W.astype(np.float32)


@pytest.mark.parametrize("d", [2, 3])
def test_unargmaxable_equals_hull_vertices(d):
    W = planted(d, 40, seed=d)
    res = Decoder(W).unargmaxable(progress=False)
    verts = {8 if v == 9 else int(v) for v in ConvexHull(W.astype(np.float64)).vertices}
    expected = sorted(set(range(40)) - verts)  # includes 9: the duplicate never wins
    np.testing.assert_array_equal(res.tokens, expected)
    assert 3 in res.tokens and 4 in res.tokens
    assert res.status_of(9) == "duplicate"
    assert res.n_undecided == 0
    # brute force: dense random directions hit exactly the argmaxable tokens
    H = np.random.default_rng(0).standard_normal((100_000, d))
    hit = np.unique(Decoder(W).assign(H))
    assert set(hit.tolist()) <= set(range(40)) - set(res.tokens.tolist())


def test_cutting_plane_lp_alone_matches_hull():
    # the LP path on its own, started from a single constraint so the cutting planes must work
    from embgeom.cells._region import _region
    from embgeom.cells._scan import _lp_token

    W = planted(4, 60, seed=11)[np.r_[0:9, 10:60]]  # drop the duplicate
    W64 = W.astype(np.float64)
    dec = Decoder(W)
    region = _region(dec, None, W64, None)
    verts = set(ConvexHull(W64).vertices.tolist())
    iters = []
    for t in range(W.shape[0]):
        st, y, it = _lp_token(region, t, np.array([(t + 1) % W.shape[0]]), 1e-9, 60.0, 4)
        iters.append(it)
        assert st == ("lp_witness" if t in verts else "lp_empty"), t
        if y is not None:
            assert dec.assign(y)[0] == t
    assert max(iters) > 2  # constraints were really added
    res = dec.unargmaxable(progress=False)
    np.testing.assert_array_equal(res.tokens, sorted(set(range(W.shape[0])) - verts))


def test_unargmaxable_with_bias_vs_sampling_and_chebyshev():
    rng = np.random.default_rng(7)
    W = rng.standard_normal((25, 2)).astype(np.float32)
    b = rng.standard_normal(25).astype(np.float32)
    b[5] = -50.0  # its cell is pushed out of any reasonable region but not necessarily empty
    dec = Decoder(W, b)
    res = dec.unargmaxable(progress=False)
    # brute force over several scales of the plane
    H = np.concatenate([rng.standard_normal((100_000, 2)) * s for s in (0.3, 1, 3, 10, 100)])
    hit = set(np.unique(dec.assign(H)).tolist())
    empty = set(res.tokens.tolist())
    assert hit.isdisjoint(empty)
    # every token declared argmaxable has a positive-depth Chebyshev ball in a large box,
    # and its centre is assigned to it
    for t in sorted(set(range(25)) - empty):
        c, r = dec.chebyshev_center(t, radius=1e3)
        assert r > 0 and dec.assign(c)[0] == t
    for t in empty:
        assert dec.chebyshev_center(t, radius=1e3)[1] <= 1e-7


def test_unargmaxable_in_a_box_vs_sampling():
    rng = np.random.default_rng(8)
    W = rng.standard_normal((30, 2)).astype(np.float32)
    b = (0.5 * rng.standard_normal(30)).astype(np.float32)
    box = Box.from_params(np.array([-0.5, -1.0]), np.array([1.0, 0.25]))
    dec = Decoder(W, b)
    res = dec.unargmaxable(box, progress=False)
    hit = set(np.unique(dec.assign(box.sample(300_000, seed=1))).tolist())
    empty = set(res.tokens.tolist())
    assert hit.isdisjoint(empty)
    # tokens argmaxable in the box: their Chebyshev ball inside the box is positive
    for t in sorted(set(range(30)) - empty):
        c, r = dec.chebyshev_center(t, box)
        assert r > 0 and box.contains(c)[0] and dec.assign(c)[0] == t
    assert len(empty) > len(set(dec.unargmaxable(progress=False).tokens.tolist()))


def test_chebyshev_center_cross_polytope():
    d = 3
    W = np.vstack([np.eye(d), -np.eye(d)]).astype(np.float32)
    c, r = Decoder(W).chebyshev_center(0)
    # cell of +e1 in [-1, 1]^3: centre (c, 0, 0) with c / sqrt(2) = 1 - c
    assert r == pytest.approx(np.sqrt(2) - 1, abs=1e-7)
    np.testing.assert_allclose(c, [2 - np.sqrt(2), 0, 0], atol=1e-6)


def test_unargmaxable_unsupported_support():
    class Odd:
        dim = 2
        shape = "cone"

    with pytest.raises(TypeError, match="support"):
        Decoder(np.eye(2, dtype=np.float32)).unargmaxable(Odd(), progress=False)
    # an origin-centred ball without bias reduces to the whole space
    W = planted(2, 20, seed=3)
    dec = Decoder(W)
    np.testing.assert_array_equal(
        dec.unargmaxable(Ball.from_params(None, 2.0, dim=2), progress=False).tokens, dec.unargmaxable(progress=False).tokens
    )


@pytest.mark.realmodel
def test_real_smollm2_assignment(smollm2_unembedding, smollm2_hidden):
    u = smollm2_unembedding
    H, _ = smollm2_hidden
    dec = Decoder.from_unembedding(u)
    got = dec.assign(H)
    z = H.astype(np.float64) @ dec.W_.astype(np.float64).T
    srt = np.sort(z, axis=1)
    clear = srt[:, -1] - srt[:, -2] > 1e-3
    np.testing.assert_array_equal(got[clear], z.argmax(axis=1)[clear])
    m = dec.margins(H)
    np.testing.assert_allclose(m[clear], (srt[:, -1] - srt[:, -2])[clear], rtol=1e-3, atol=1e-3)


def test_from_unembedding_uses_the_models_logit_scale():
    """A Cohere-style logit_scale s: margins are s times the unscaled ones, cells unchanged."""
    from types import SimpleNamespace

    rng = np.random.default_rng(3)
    W = rng.standard_normal((20, 4)).astype(np.float32)
    H = rng.standard_normal((50, 4))
    s = np.float32(0.0625)
    u = SimpleNamespace(weight=W, bias=None, vocab_size=20, padded_rows=0,
                        effective_weight_bias=lambda: (W * s, None))
    scaled, plain = Decoder.from_unembedding(u), Decoder(W)
    np.testing.assert_array_equal(scaled.assign(H), plain.assign(H))
    np.testing.assert_allclose(scaled.margins(H), s * plain.margins(H), rtol=1e-5, atol=1e-7)


def test_scratch_buffer_is_per_thread_reused_and_not_pickled():
    """The logits buffer kept between calls: reused by a thread, private to it (two threads
    assigning different points at once get numpy's answers), and left out of a pickle."""
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    W = rng.standard_normal((3000, 16)).astype(np.float32)
    dec = Decoder(W, point_block=64, vocab_block=1000)
    X = [rng.standard_normal((700, 16)).astype(np.float32) for _ in range(8)]
    want = [(x @ W.T).argmax(axis=1) for x in X]
    dec.assign(X[0])
    first = dec._scratch.buf
    dec.assign(X[1])
    assert dec._scratch.buf is first and first.size == 64 * 1000
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(dec.assign, X * 4))
    for g, w in zip(got, want * 4):
        np.testing.assert_array_equal(g, w)
    dec2 = pickle.loads(pickle.dumps(dec))
    assert "_scratch" not in dec2.__dict__ or not hasattr(dec2._scratch, "buf")
    np.testing.assert_array_equal(dec2.assign(X[2]), want[2])


@pytest.mark.realmodel
def test_real_smollm2_near_duplicate_token_is_decided(smollm2_unembedding):
    # SmolLM2's tokens 7-16 have rows 1e-3 to 8e-3 apart (10, 13, 15, 16 exact copies of 8).
    # The LP's absolute margin is bounded by those near-duplicates at every cutting-plane
    # iteration (1.3e-4), so the point HiGHS returns never beat every row: token 8 stayed
    # "undecided" after 21 iterations and the 300 s limit (the longest phase of the report).
    # The relaxation repair of the LP point proves it argmaxable in a few seconds.
    from embgeom.cells._rows import STATUS_NAMES

    dec = Decoder.from_unembedding(smollm2_unembedding)
    res = dec.unargmaxable(tokens=[7, 8, 9, 10], lp_time_limit=60.0, progress=False)
    names = [STATUS_NAMES[s] for s in res.status[[7, 8, 9, 10]]]
    assert names[1] == "lp_witness"
    assert names[3] == "duplicate"  # row 10 is row 8's exact copy
    assert res.n_undecided == 0


def test_repair_witness_proves_a_cone_and_refuses_empty_and_bias():
    from embgeom.cells import _scan
    from embgeom.cells._region import _Region

    rng = np.random.default_rng(3)
    d = 24
    Wr = rng.standard_normal((400, d))
    Wr[1:6] = Wr[0] + 1e-3 * rng.standard_normal((5, d))  # token 0's near-duplicates
    box = dict(lb=-np.ones(d), ub=np.ones(d), R=None, name="none", directions=True)
    region = _Region(Wr=Wr, c=None, homog=False, **box)
    gam = 4.0 * 2.0**-53 * (d + 2) * float(np.linalg.norm(Wr, axis=1).max())
    y = _scan._repair_witness(region, 0, rng.standard_normal(d), err_per_norm=gam)
    assert y is not None and np.all(np.abs(y) <= 1.0)
    m = (Wr[0] - Wr) @ y
    assert np.all(m[1:] > 0)  # token 0 wins strictly against every row: a true witness
    # a row inside the hull of others (a cone with no interior): no point is returned
    Wr_e = Wr.copy()
    Wr_e[0] = 0.5 * (Wr[10] + Wr[11])
    region_e = _Region(Wr=Wr_e, c=None, homog=False, **box)
    assert _scan._repair_witness(region_e, 0, rng.standard_normal(d), err_per_norm=gam) is None
    # with a bias the cells are not cones: the repair does not apply
    region_b = _Region(Wr=Wr, c=np.zeros(400), homog=True, **box)
    assert _scan._repair_witness(region_b, 0, rng.standard_normal(d), err_per_norm=gam) is None


def _hits(W, H):
    """Tokens that win strictly (float64 logits) at some row of H."""
    Z = H @ W.astype(np.float64).T
    top = np.argsort(Z, axis=1)[:, -2:]
    strict = Z[np.arange(len(Z)), top[:, 1]] > Z[np.arange(len(Z)), top[:, 0]]
    return set(top[strict, 1].tolist())


@pytest.mark.parametrize("tol", [1e-9, 0.0])
def test_rows_one_ulp_apart_are_not_declared_empty(tol):
    # Rows 0 and 60 differ by one float32 ulp in an entry of 1e-3 (|w_0 - w_60| = 1.2e-10):
    # they split row 0's cone at y_0 = 0, so both cells have room. With the LP's absolute
    # margin (bounded by 1.2e-10, below HiGHS's 1e-7 tolerance) both were "lp_empty", even
    # at tol = 0; the depth is now measured on unit rows.
    rng = np.random.default_rng(8)
    W = rng.standard_normal((60, 4)).astype(np.float32)
    W[0, 0] = np.float32(1e-3)
    x = W[0].copy()
    x[0] = np.nextafter(x[0], np.float32(1))
    W = np.vstack([W, x[None]])
    hits = _hits(W, rng.standard_normal((200_000, 4)))
    assert {0, 60} <= hits  # the truth: both win somewhere
    res = Decoder(W).unargmaxable(tol=tol, progress=False)
    assert res.n_undecided == 0
    arg = set(np.flatnonzero(np.isin(res.status, [0, 1])).tolist())
    assert {0, 60} <= arg
    assert hits <= arg  # no token seen winning is called empty


@pytest.mark.parametrize("rotated", [False, True])
def test_bias_free_box_about_the_origin_answers_as_free_space(rotated):
    # A lopsided box with the origin strictly inside ([-1e-3, 1e3]^4) meets every cone with an
    # interior, so its verdicts are the free space's; its own LP once left cells "undecided".
    rng = np.random.default_rng(8)
    d = 4
    W = rng.standard_normal((60, d)).astype(np.float32)
    W[59] = 0.5 * (W[3] + W[7])  # a row inside the hull: empty everywhere
    W[0, 0] = np.float32(1e-3)  # and a row one ulp from row 0 (see the test above)
    x = W[0].copy()
    x[0] = np.nextafter(x[0], np.float32(1))
    W = np.vstack([W, x[None]])
    R = None
    if rotated:
        R, _ = np.linalg.qr(rng.standard_normal((d, d)))
    box = Box.from_params(-1e-3 * np.ones(d), 1e3 * np.ones(d), rotation=R)
    free = Decoder(W).unargmaxable(progress=False)
    res = Decoder(W).unargmaxable(box, progress=False)
    assert res.n_undecided == 0
    np.testing.assert_array_equal(np.isin(res.status, [0, 1]), np.isin(free.status, [0, 1]))
    assert res.status[59] == 2  # lp_empty
    assert np.isin(res.status[[0, 60]], [0, 1]).all()


def test_box_off_the_origin_keeps_its_own_constraints():
    # The free-space shortcut needs the origin strictly inside: in the box [0.5, 1]^2 only
    # the cones that meet the positive quadrant's corner region are argmaxable.
    ang = np.linspace(0, 2 * np.pi, 24, endpoint=False)
    W = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    box = Box.from_params(np.array([0.5, 0.5]), np.array([1.0, 1.0]))
    res = Decoder(W).unargmaxable(box, progress=False)
    rng = np.random.default_rng(0)
    H = rng.uniform(0.5, 1.0, size=(100_000, 2))
    truth = _hits(W, H)
    arg = set(np.flatnonzero(np.isin(res.status, [0, 1])).tolist())
    assert arg == truth and 0 < len(truth) < 24


def test_chebyshev_center_of_a_duplicate_row_agrees_with_the_scan():
    """Rows equal to t's were skipped as "no constraint": a duplicate of a lower id (ties go to
    the lowest id) reported the twin's depth 0.45 for an empty cell, and a twin with a larger
    bias (which wins everywhere) was ignored. The exact scan calls both unargmaxable."""
    W = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [-1.0, -1.0]], dtype=np.float32)
    dec = Decoder(W)
    assert dec.unargmaxable(progress=False).tokens.tolist() == [2]
    c0, r0 = dec.chebyshev_center(0)
    c2, r2 = dec.chebyshev_center(2)
    assert r0 > 0.4 and r2 == 0.0
    np.testing.assert_array_equal(c2, c0)  # it ties at the twin's deepest point
    biased = Decoder(W, bias=np.array([0.0, 0.0, 1.0, 0.0], dtype=np.float32))
    assert biased.unargmaxable(progress=False).tokens.tolist() == [0]
    c, r = biased.chebyshev_center(0)
    assert r == -np.inf and c.tolist() == [0.0, 0.0]
    assert biased.chebyshev_center(2)[1] > 0
    # inside the hull of the others (bias-free): depth 0 at the apex, not -0.0
    _, r = Decoder(np.array([[1, 0], [0, 1], [0.3, 0.3], [-1, -1]], dtype=np.float32)).chebyshev_center(2)
    assert r == 0.0 and np.copysign(1.0, r) == 1.0
