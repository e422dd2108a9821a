"""Strict JSON for the result types outside supports and bounds (issue 21, item 5): cells,
volumes, the rare-event measure, cramming's results and the horizons, with non-finite fields.

Each ``to_dict`` must go through the one converter (embgeom/_json.py: NaN and +-inf become
null), so ``json.dumps(..., allow_nan=False)`` succeeds and no non-finite number or "inf"
string is left.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embgeom.cells import Decoder
from embgeom.supports import Ball
from embgeom.volumes import cell_volumes


def _strict(d):
    text = json.dumps(d, allow_nan=False)
    assert '"inf"' not in text and '"nan"' not in text.lower()
    return json.loads(text)


def test_cells_and_volumes_results():
    W = np.vstack([np.eye(3), -np.eye(3), np.zeros((1, 3))]).astype(np.float32)  # a dead row
    dec = Decoder(W)
    _strict(dec.unargmaxable(progress=False).to_dict())
    cv = cell_volumes(dec, Ball.from_params(np.zeros(3), 1.0), 500, seed=0, progress=False,
                      n_chains=32, method="rare-event")
    assert np.isneginf(cv.log_fractions[-1])  # the proven-empty cell
    d = _strict(cv.to_dict())
    assert d  # a summary came out
    cu = cell_volumes(dec, Ball.from_params(np.zeros(3), 1.0), 50, seed=0, progress=False,
                      method="uniform")
    assert cu.n_zero >= 1
    _strict(cu.to_dict())


def test_rare_event_measure_with_nothing_resolved():
    from embgeom._rare_event import log_cone_gaussian_measure

    W = np.vstack([np.eye(2), -np.eye(2), np.zeros((1, 2))]).astype(np.float32)
    r = log_cone_gaussian_measure(W, np.array([4]), None, n_chains=32, seed=0, progress=False)
    d = _strict(r.to_dict())
    assert d["median_log_share"] is None and d["n_resolved"] == 0


def test_cramming_results():
    from embgeom.cramming import AccessibilityCurve, CramResult, HorizonCurve

    res = CramResult(np.array([True]), np.array([False]), np.array([3]), np.array([np.nan]),
                     np.array([1.0]), np.zeros((1, 1, 4), np.float32), 1, 2, "float32", "cpu",
                     0.1, best_accuracy=np.array([np.inf]), stop_reason=np.array(["steps"]))
    d = _strict(res.to_dict())
    assert d["targets"][0]["loss"] is None and d["targets"][0]["best_accuracy"] is None
    c = AccessibilityCurve(1, np.array([1, 2]), np.array([1, 0]), np.array([1, 0]),
                           np.array([1, 1]), {"x": float("nan")})
    _strict(c.to_dict())
    h = HorizonCurve.from_records([{"target_index": 0, "horizon": 2, "cpu_s": float("nan")}],
                                  n_mem=1, max_length=4, settings={"x": float("inf")})
    d = _strict(h.to_dict())
    assert d["settings"]["x"] is None
