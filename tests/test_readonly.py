"""Read-only and memory-mapped inputs (issue 21): every kernel that only reads takes them as
they are, with the figures of writable copies. A bias opened with ``np.load(mmap_mode="r")``
made ``margins`` and ``top2`` fail with numba's "No matching definition ... readonly array"."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from embgeom.cells import Decoder
from embgeom.supports import Ball
from embgeom.volumes import cell_volumes


@pytest.fixture
def mmapped(tmp_path):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((60, 6)).astype(np.float32)
    b = rng.standard_normal(60).astype(np.float32)
    np.save(tmp_path / "W.npy", W)
    np.save(tmp_path / "b.npy", b)
    Wm = np.load(tmp_path / "W.npy", mmap_mode="r")
    bm = np.load(tmp_path / "b.npy", mmap_mode="r")
    assert not Wm.flags.writeable and not bm.flags.writeable
    return W, b, Wm, bm


def test_decoder_methods_take_read_only_inputs(mmapped):
    W, b, Wm, bm = mmapped
    H = np.random.default_rng(1).standard_normal((500, 6)).astype(np.float32)
    Hr = H.copy()
    Hr.setflags(write=False)
    for bias, bias_m in ((None, None), (b, bm)):
        ref, dec = Decoder(W, bias), Decoder(Wm, bias_m)
        np.testing.assert_array_equal(dec.assign(Hr), ref.assign(H))
        np.testing.assert_array_equal(dec.margins(Hr), ref.margins(H))
        for x, y in zip(dec.top2(Hr), ref.top2(H)):
            np.testing.assert_array_equal(x, y)
        # the bias stays the caller's read-only buffer (no copy) through a pickle round trip
        back = pickle.loads(pickle.dumps(dec))
        np.testing.assert_array_equal(back.assign(Hr), ref.assign(H))


def test_cell_volumes_and_scan_take_read_only_inputs(mmapped):
    W, _, Wm, _ = mmapped
    ball = Ball.from_params(np.zeros(6), 1.0)
    a = cell_volumes(Decoder(Wm), ball, 3000, seed=0, progress=False, method="uniform")
    r = cell_volumes(Decoder(W), ball, 3000, seed=0, progress=False, method="uniform")
    np.testing.assert_array_equal(a.counts, r.counts)
    np.testing.assert_array_equal(Decoder(Wm).unargmaxable(progress=False).tokens,
                                  Decoder(W).unargmaxable(progress=False).tokens)
