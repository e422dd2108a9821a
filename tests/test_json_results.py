"""Strict JSON for every public result type of supports and bounds (issue 21, item 5).

The project's rule (embgeom/_json.py): NaN, +inf and -inf become ``null``, never a string and
never a bare ``NaN``. Each ``to_dict`` goes through :func:`embgeom._json.to_jsonable`, so
``json.dumps(obj.to_dict(), allow_nan=False)`` must succeed, also when fields are not finite.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math

import numpy as np
import pytest

from embgeom import bounds, supports
from embgeom.supports import (
    Ball,
    Box,
    Cone,
    ContainmentCheck,
    Ellipsoid,
    FinalNormShell,
    containment_check,
    fit_support,
)


def _rng():
    return np.random.default_rng(11)


def _rate():
    V = 12
    f = np.random.default_rng(0).dirichlet(np.ones(V))
    return bounds.cell_volume_rate(f, 4)


def _rate_not_finite():
    # a rate with proven-empty cells drawn: log_median -inf, the rate +inf; log_total not computed
    r = _rate()
    lm = r.log_median.copy()
    lm[-1] = -np.inf
    return dataclasses.replace(r, rate=math.inf, log_median=lm, log_median_low=lm.copy(),
                               rate_bracket=(math.inf, math.inf), rate_ci=(1.0, math.inf),
                               log_total=math.nan)


def _instances():
    """Instances of every public result type with a ``to_dict``, some with non-finite fields."""
    H = _rng().standard_normal((40, 3)) + 3.0
    fresh = _rng().standard_normal((30, 3)) + 3.0
    return {
        Ball: [Ball().fit(H), Ball(solver="cvxpy").fit(H), Ball.from_params(None, 1.0, dim=3),
               fit_support(H, "ball", calibrate=0.2)],
        Ellipsoid: [Ellipsoid().fit(H), Ellipsoid(solver="cvxpy").fit(H),
                    Ellipsoid(ridge=0.5).fit(np.repeat(H[:1], 3, axis=0))],
        Cone: [Cone().fit(H), Cone(solver="cvxpy").fit(H), Cone.from_params(np.ones(3), 0.5, 2.0)],
        Box: [Box().fit(H), Box(rotation="pca").fit(H), Box.from_params(np.zeros(3), np.ones(3))],
        FinalNormShell: [FinalNormShell.from_params("rmsnorm", np.array([1.0, 2.0, 0.5])),
                         FinalNormShell.from_params("layernorm", np.ones(3), bias=np.zeros(3))],
        ContainmentCheck: [containment_check(Ball().fit(H), fresh),
                           ContainmentCheck(n=0, n_inside=0, share=math.nan, lower_bound=-math.inf,
                                            confidence=0.95, min_share=0.99, valid=False, tol=math.inf)],
        bounds.CellVolumeRate: [_rate(), _rate_not_finite()],
    }


def _public_result_types():
    """Classes exported by supports and bounds whose instances carry a ``to_dict``."""
    out = set()
    for mod in (supports, bounds):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) and callable(getattr(obj, "to_dict", None)) and not inspect.isabstract(obj):
                out.add(obj)
    return out


_NON_FINITE_TEXT = {"inf", "-inf", "+inf", "nan", "NaN", "Infinity", "-Infinity"}


def _non_finite_paths(obj, where="$"):
    """Where a non-finite number, or one written as text (``"inf"``), sits in ``obj``."""
    if isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
        yield where
    elif isinstance(obj, str) and obj in _NON_FINITE_TEXT:
        yield where
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _non_finite_paths(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _non_finite_paths(v, f"{where}[{i}]")


INSTANCES = _instances()


def test_every_public_result_type_is_covered():
    # a new result type in supports or bounds must be added to _instances
    assert _public_result_types() <= set(INSTANCES), _public_result_types() - set(INSTANCES)


@pytest.mark.parametrize("kind", list(INSTANCES), ids=lambda c: c.__name__)
def test_to_dict_is_strict_json(kind):
    for obj in INSTANCES[kind]:
        d = obj.to_dict()
        text = json.dumps(d, allow_nan=False)  # raises on NaN/inf
        assert json.loads(text) == d  # plain JSON types only: a round trip changes nothing
        assert not list(_non_finite_paths(d)), list(_non_finite_paths(d))


def test_non_finite_fields_become_null():
    H = _rng().standard_normal((40, 3)) + 3.0
    ball = Ball(solver="cvxpy").fit(H)
    assert math.isnan(ball.gap_)  # cvxpy gives no certificate
    assert ball.to_dict()["gap"] is None
    cone = Cone.from_params(np.ones(3), 0.5, 2.0)
    assert math.isnan(cone.paper_half_angle_)
    d = cone.to_dict()
    assert d["paper_half_angle"] is None and d["paper_log_volume"] is None
    chk = INSTANCES[ContainmentCheck][1].to_dict()
    assert chk["share"] is None and chk["lower_bound"] is None and chk["tol"] is None and chk["n"] == 0
    r = _rate_not_finite().to_dict()
    assert r["rate"] is None and r["log_median"][-1] is None and r["log_median_low"][-1] is None
    assert r["rate_bracket"] == [None, None] and r["rate_ci"] == [1.0, None] and r["log_total"] is None
    assert all(isinstance(v, float) for v in r["log_median"][:-1])


def test_calibrated_set_carries_its_calibration():
    H = _rng().standard_normal((60, 3))
    d = fit_support(H, "ellipsoid", calibrate=0.2).to_dict()
    assert d["calibration"]["alpha"] == 0.2 and d["calibration"]["rank"] >= 1
    assert "calibration" not in Ellipsoid().fit(H).to_dict()
