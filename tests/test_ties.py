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
