"""Every LP of the cells layer is scale-free: the same answers from W x 1e-30 to W x 1e30.

Dividing all logits by one positive number changes no cell, so the exact scan, the Chebyshev
centre and the emptiness checks must give the same verdicts at every scale of W (and of a
bias scaled with it). Before the rows were brought to unit scale, HiGHS got coefficients near
1e30 from about W x 1e20 up and a planted interior token came out "undecided" (issue 21).
"""

from __future__ import annotations

import numpy as np
import pytest

from embgeom.cells import Decoder

SCALES = [1e-30, 1e-20, 1e-8, 1.0, 1e8, 1e20, 1e30]


def _planted(seed=0, V=40, d=6):
    """Rows on a sphere plus row V: an interior point of their hull (0.3 x their mean + a
    small offset), unargmaxable with b = 0 (Gordan)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    inner = 0.3 * W[:5].mean(0)
    return np.vstack([W, inner]).astype(np.float32), V


@pytest.mark.parametrize("scale", SCALES)
def test_planted_interior_token_at_every_scale(scale):
    W, planted = _planted()
    dec = Decoder((W.astype(np.float64) * scale))
    res = dec.unargmaxable(progress=False)
    assert res.n_unargmaxable == 1 and int(res.tokens[0]) == planted, res.status[:3]
    assert res.undecided.size == 0


@pytest.mark.parametrize("scale", SCALES)
def test_with_bias_scaled_alike(scale):
    """A bias that hides token 0 (b_0 very negative) and the planted row: both decided the same
    at every scale of (W, b)."""
    W, planted = _planted(seed=1)
    b = np.zeros(W.shape[0])
    b[0] = -50.0
    dec = Decoder(W.astype(np.float64) * scale, b * scale)
    ref = Decoder(W.astype(np.float64), b).unargmaxable(progress=False)
    res = dec.unargmaxable(progress=False)
    np.testing.assert_array_equal(res.tokens, ref.tokens)
    assert res.undecided.size == 0


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_chebyshev_center_is_scale_free(scale):
    W, _ = _planted(seed=2)
    h1, r1 = Decoder(W.astype(np.float64)).chebyshev_center(3, radius=1.0)
    hs, rs = Decoder(W.astype(np.float64) * scale).chebyshev_center(3, radius=1.0)
    np.testing.assert_allclose(hs, h1, rtol=1e-6, atol=1e-9)
    assert rs == pytest.approx(r1, rel=1e-6)
    assert Decoder(W).assign(h1[None])[0] == 3
