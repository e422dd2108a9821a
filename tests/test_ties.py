"""Exact duplicate rows tie exactly: the lowest id wins, however the product is blocked.

Rows 5-9 are exact copies of rows 0-4. The blocked float32 product can round a copy's logit
1 ulp above its original's in some rows of a block (issue 21: ``assign`` returned the copy's
id for some points). The documented rule is ties to the lowest id, so every point's token lies
in 0-4, equals the float64 argmax of the distinct rows, and the runner-up is the copy (margin 0).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from embgeom.cells import Decoder


def _W(d=33, seed=0, n_extra=20):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((5, d)).astype(np.float32)
    extra = rng.standard_normal((n_extra, d)).astype(np.float32) * 0.5
    return np.vstack([base, base, extra])  # rows 5-9 copy rows 0-4


# (d, extra rows, point_block, vocab_block); (48, 0, 33, default) is the case, where
# OpenBLAS's blocked product put copies 1 ulp ahead for 10 of 5,000 points before the fix
@pytest.mark.parametrize("d,n_extra,pb,vb", [(48, 0, 33, 16384), (48, 0, 4096, 16384),
                                             (33, 20, 7, 3), (33, 20, 64, 6), (33, 20, 1, 1)])
def test_copies_never_win_and_tie_exactly(d, n_extra, pb, vb):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((5, d)).astype(np.float32)
    W = np.vstack([base, base, rng.standard_normal((n_extra, d)).astype(np.float32)])
    H = rng.standard_normal((5000, d)).astype(np.float32)
    dec = Decoder(W, point_block=pb, vocab_block=vb)
    t = dec.assign(H)
    distinct = np.vstack([W[:5], W[10:]]).astype(np.float64)
    ids = np.r_[np.arange(5), np.arange(10, 10 + n_extra)]
    ref = ids[np.argmax(H.astype(np.float64) @ distinct.T, axis=1)]
    np.testing.assert_array_equal(t, ref)
    v1, i1, v2, i2 = dec.top2(H)
    np.testing.assert_array_equal(i1, t)
    won_base = t < 5
    np.testing.assert_array_equal(i2[won_base], t[won_base] + 5)  # the copy is the runner-up
    assert np.all(dec.margins(H)[won_base] == 0.0) and np.all(v1[won_base] == v2[won_base])
    assert np.all(dec.margins(H)[~won_base] > 0)


def test_copies_with_bias_and_pickle():
    W = _W(seed=2)
    b = np.random.default_rng(3).standard_normal(W.shape[0]).astype(np.float32)
    b[5:10] = b[:5]  # full duplicates (row and bias)
    b[9] += 1.0  # row 9 copies row 4's w but not its bias: not a duplicate
    H = np.random.default_rng(4).standard_normal((2000, W.shape[1])).astype(np.float32)
    dec = pickle.loads(pickle.dumps(Decoder(W, b, vocab_block=4)))
    t = dec.assign(H)
    assert not np.isin(t, [5, 6, 7, 8]).any()
    z = H.astype(np.float64) @ W.T.astype(np.float64) + b
    z[:, 5:9] = -np.inf  # exact copies never win
    np.testing.assert_array_equal(t, np.argmax(z, axis=1))
    assert (t == 9).any()  # the bias-shifted copy of row 4 does win where it should


def _distinct_rows_reference(W, bias=None):
    """Per token, the lowest id with the same bytes (``-0.0`` as ``+0.0``): a dict of row bytes."""
    key = np.ascontiguousarray(W + np.float32(0.0))
    if bias is not None:
        key = np.hstack([key, (np.asarray(bias, np.float32) + np.float32(0.0))[:, None]])
    seen, rep = {}, []
    for t, row in enumerate(key):
        rep.append(seen.setdefault(row.tobytes(), t))
    rep = np.array(rep, dtype=np.int64)
    return np.flatnonzero(rep == np.arange(rep.size)), rep


def _rows_with_copies(seed=0, n=300, d=17):
    """Rows with exact copies, a -0.0 copy of a +0.0 row, and rows one word (or one bit) apart."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((n, d)).astype(np.float32)
    W[rng.integers(0, n, 40)] = W[rng.integers(0, n, 40)]  # exact copies, any order of ids
    W[7, 3], W[8] = 0.0, W[7]
    W[8, 3] = -0.0  # equal to row 7 under the decoder's arithmetic
    W[9] = W[10]
    W[9, 0] = np.nextafter(W[10, 0], np.float32(np.inf))  # one ulp apart: distinct
    W[11] = -W[12]  # sign bits only
    return W


@pytest.mark.parametrize("with_bias", [False, True])
def test_distinct_rows_is_the_bytewise_grouping(with_bias):
    from embgeom.cells import distinct_rows

    W = _rows_with_copies()
    bias = None
    if with_bias:
        bias = np.zeros(W.shape[0], np.float32)
        bias[[20, 21]] = 1.0  # breaks any copy among them
        bias[8] = -0.0
    uniq, rep = distinct_rows(W, bias)
    ref_uniq, ref_rep = _distinct_rows_reference(W, bias)
    np.testing.assert_array_equal(rep, ref_rep)
    np.testing.assert_array_equal(uniq, ref_uniq)
    assert rep[8] == 7 and rep[9] == 9 and rep[11] == 11
    assert uniq.size < W.shape[0] - 20  # the copies were found


def test_distinct_rows_resolves_hash_collisions_exactly(monkeypatch):
    """Every row hashed alike (the worst collision) still groups the rows bytewise."""
    from embgeom.cells import _rows, distinct_rows

    W = _rows_with_copies(seed=1)
    expect = _distinct_rows_reference(W)
    monkeypatch.setattr(_rows, "_row_hashes", lambda words: np.zeros(words.shape[0], np.uint64))
    uniq, rep = distinct_rows(W)
    np.testing.assert_array_equal(rep, expect[1])
    np.testing.assert_array_equal(uniq, expect[0])


def test_row_hash_separates_rows_one_word_apart():
    from embgeom.cells._rows import _row_hashes

    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**32, size=(1, 64), dtype=np.uint64).astype(np.uint32)
    variants = np.repeat(words, 64 * 3, axis=0)
    for i in range(64):  # the sign bit, the lowest bit and a whole word changed
        variants[3 * i, i] ^= np.uint32(1 << 31)
        variants[3 * i + 1, i] ^= np.uint32(1)
        variants[3 * i + 2, i] = ~variants[3 * i + 2, i]
    h = _row_hashes(np.vstack([words, variants]))
    assert np.unique(h).size == h.size
