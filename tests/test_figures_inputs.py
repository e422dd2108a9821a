"""The figure helpers' input checks (a new user's pass): every bad argument is one TypeError or
ValueError that names it, before anything is drawn, and the edge values that are valid draw
without a warning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from embgeom.report.figures import (plot_accessible_fraction, plot_cell_shares,
                                    plot_hidden_norms, plot_linear_law, plot_support_volumes)

PNG = b"\x89PNG\r\n\x1a\n"
_SUMMARY = {"per_length": [{"length": L, "r2_max": 2.0, "r2_mean": 1.0, "rinf_max": 0.5}
                           for L in (1, 2, 4)]}
_CURVE = {"lengths": [1, 2, 4, 8], "accessibility": [1.0, 0.9, 0.4, 0.0],
          "lower": [0.8, 0.6, 0.2, 0.0], "upper": [1.0, 1.0, 0.6, 0.2]}


def _refused(tmp_path, err, match, fn, *args, **kwargs):
    with pytest.raises(err, match=match):
        fn(*args, tmp_path / "f.png", **kwargs)
    assert not (tmp_path / "f.png").exists()


def _drawn_quietly(fn, *args, **kwargs) -> str:
    """The helper's path, with any warning (numpy's overflow, matplotlib's) an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fn(*args, **kwargs)
    with open(out, "rb") as f:
        assert f.read(8) == PNG
    return out


# ------------------------------------------------------- 1. plot_linear_law's m_max


@pytest.mark.parametrize("m_max, err, match", [
    (10**6 + 1, ValueError, r"m_max: expected at most 10\*\*6 prompt vectors .* got 1e\+06"),
    (10**9, ValueError, r"m_max: expected at most 10\*\*6 .* got 1e\+09"),
    (10**400, ValueError, r"m_max: expected at most 10\*\*6 .* an integer of 401 digits"),
    (0, ValueError, r"m_max: expected an integer >= 1, got 0"),
    (-3, ValueError, r"m_max: expected an integer >= 1"),
    (2.0, TypeError, r"m_max: expected an integer, got float"),
    (True, TypeError, r"m_max: expected an integer, got bool"),
    ("8", TypeError, r"m_max: expected an integer, got str"),
])
def test_linear_law_m_max_is_a_bounded_integer(m_max, err, match, tmp_path):
    """m_max = 10**9 built billion-point lines and ran out of memory."""
    _refused(tmp_path, err, match, plot_linear_law, {"ball": 3.0}, m_max=m_max)


def test_linear_law_large_m_max_draws_a_grid(tmp_path):
    from embgeom.report import figures

    kept = []
    orig = figures._save
    figures._save = lambda fig, path: kept.append(fig) or orig(fig, path)
    try:
        _drawn_quietly(plot_linear_law, {"ball": 3.0, "box": 4.0}, tmp_path / "ll", m_max=10**6)
    finally:
        figures._save = orig
    x = kept[0].axes[0].get_lines()[0].get_xdata()
    assert len(x) == figures._LAW_POINTS and x[0] == 1 and x[-1] == 10**6
    kept.clear()


# ------------------------------------------------------------ 2. plot_hidden_norms


@pytest.mark.parametrize("summary, err, match", [
    ([1, 2], TypeError, r"summary: expected the dict of embgeom.report.hidden_state_summary"),
    (None, TypeError, r"summary: expected the dict"),
    ({"per_length": {"length": 1}}, TypeError, r"summary\['per_length'\]: expected a list of dicts"),
    ({"per_length": "rows"}, TypeError, r"summary\['per_length'\]: expected a list of dicts"),
    ({"per_length": [3.0]}, TypeError, r"summary\['per_length'\]\[0\]: expected a dict with length"),
    ({"per_length": [{"length": 1}]}, ValueError,
     r"summary\['per_length'\]\[0\]: expected keys length, r2_max, r2_mean and rinf_max, missing "
     r"r2_max, r2_mean, rinf_max"),
    ({"per_length": [dict(_SUMMARY["per_length"][0], r2_max="2")]}, TypeError,
     r"summary\['per_length'\]\[0\]\['r2_max'\]: expected a real number, got str"),
    ({"per_length": [dict(_SUMMARY["per_length"][0], length=0)]}, ValueError,
     r"summary\['per_length'\]\[0\]\['length'\]: expected a number > 0"),
    ({"per_length": [dict(_SUMMARY["per_length"][0], rinf_max=math.nan)]}, ValueError,
     r"summary\['per_length'\]\[0\]\['rinf_max'\]: expected a finite number"),
])
def test_hidden_norms_names_a_bad_summary(summary, err, match, tmp_path):
    """A list gave AttributeError ('list' object has no attribute 'get'), a short row KeyError."""
    _refused(tmp_path, err, match, plot_hidden_norms, summary)


@pytest.mark.parametrize("radius, err, match", [
    ("10", TypeError, r"certified_radius: expected a real number, got str"),
    (True, TypeError, r"certified_radius: expected a real number, got bool"),
    (math.inf, ValueError, r"certified_radius: expected a finite number, got inf"),
    (math.nan, ValueError, r"certified_radius: expected a finite number"),
    (0.0, ValueError, r"certified_radius: expected a number > 0"),
    (-1.0, ValueError, r"certified_radius: expected a number > 0"),
])
def test_hidden_norms_certified_radius_is_a_finite_positive_real(radius, err, match, tmp_path):
    _refused(tmp_path, err, match, plot_hidden_norms, _SUMMARY, certified_radius=radius)


def test_hidden_norms_draws_valid_input(tmp_path):
    assert _drawn_quietly(plot_hidden_norms, _SUMMARY, tmp_path / "h",
                          certified_radius=np.float32(5.0)) == str(tmp_path / "h.png")
    assert plot_hidden_norms({"per_length": []}, tmp_path / "none.png") is None
    assert plot_hidden_norms({}, tmp_path / "none.png") is None


# ------------------------------------------------------------- 3. plot_cell_shares


@pytest.mark.parametrize("kwargs, err, match", [
    ({"n_samples": "many"}, TypeError, r"n_samples: expected an integer, got str 'many'"),
    ({"n_samples": -5}, ValueError, r"n_samples: expected an integer >= 1, got -5"),
    ({"n_samples": 0}, ValueError, r"n_samples: expected an integer >= 1"),
    ({"n_samples": 1e5}, TypeError, r"n_samples: expected an integer, got float"),
    ({"vocab_size": 10**30}, ValueError,
     r"vocab_size: expected at most 10\*\*9 tokens .* got 1e\+30"),
    ({"vocab_size": 10**400}, ValueError, r"vocab_size: expected at most 10\*\*9 .* 401 digits"),
    ({"vocab_size": True}, TypeError, r"vocab_size: expected an integer, got bool"),
    ({"log_lower": [-0.5, -1.0], "log_upper": [-2.0, -0.5]}, ValueError,
     r"log_lower: expected log_lower <= log_upper for every cell, got 1 interval\(s\) upside "
     r"down, the first at index 0: log_lower -0.5 > log_upper -2.0"),
    ({"unresolved": ["no", "no"]}, TypeError,
     r"unresolved: expected booleans .* got dtype <U2"),
    ({"unresolved": [0, 1]}, TypeError, r"unresolved: expected booleans"),
    ({"estimator": 3}, TypeError, r"estimator: expected a str"),
])
def test_cell_shares_refuses_bad_arguments(kwargs, err, match, tmp_path):
    _refused(tmp_path, err, match, plot_cell_shares, [-1.0, -2.0], **kwargs)


@pytest.mark.parametrize("shares", [["-1.0", "-2.0"], [True, False], [-1.0, "x"]])
def test_cell_shares_refuses_strings_and_bools_as_numbers(shares, tmp_path):
    """numpy parsed ["-1.0", "-2.0"] as floats, and True as 1.0."""
    _refused(tmp_path, ValueError, r"log_shares: expected an array of log-shares \(nats\)",
             plot_cell_shares, shares)


def test_cell_shares_draws_valid_edges(tmp_path):
    # numpy bools, equal ends, NaN ends of an unresolved token, the largest vocabulary
    _drawn_quietly(plot_cell_shares, [-1.0, -2.0, np.nan], tmp_path / "c",
                   log_lower=[-1.0, -3.0, np.nan], log_upper=[-1.0, -1.5, -4.0],
                   unresolved=np.array([False, False, True]), n_samples=np.int64(100),
                   vocab_size=10**9)


# --------------------------------------------------------- 4. plot_support_volumes


@pytest.mark.parametrize("value", ["1.0", True, np.bool_(False), None, [1.0], 10**400])
def test_support_volumes_refuses_a_log_volume_that_is_not_a_real(value, tmp_path):
    """"1.0" was parsed and True drawn as a bar of 1 nat."""
    rows = [{"name": "x", "log_volume": value, "valid": True}]
    _refused(tmp_path, ValueError, r"rows\[0\]: expected a real log_volume \(nats\), got "
                                   rf"{type(value).__name__}", plot_support_volumes, rows)


@pytest.mark.parametrize("values", [(1e308, -1e308), (1.7976931348623157e308,), (-1e308,),
                                    (1e308, -120.0, -math.inf), (1e20,), (-5e101, -4e101)])
def test_support_volumes_draws_huge_finite_log_volumes_without_warnings(values, tmp_path):
    """A log-volume of 1e308 nats is finite: it failed with 'Axis limits cannot be NaN or Inf'
    (and near it numpy overflowed inside matplotlib); it is drawn in units of 10**k nats."""
    from embgeom.report import figures

    kept = []
    orig = figures._save
    figures._save = lambda fig, path: kept.append(fig) or orig(fig, path)
    rows = [{"name": f"s{i}", "log_volume": v, "valid": np.bool_(i % 2 == 0)}
            for i, v in enumerate(values)]
    try:
        _drawn_quietly(plot_support_volumes, rows, tmp_path / "s")
    finally:
        figures._save = orig
    ax = kept[0].axes[0]
    lo, hi = ax.get_xlim()
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
    big = max(abs(v) for v in values if math.isfinite(v))
    assert ("units of 1e" in ax.get_xlabel()) == (big > 1e100)


def test_support_volumes_keeps_ordinary_limits(tmp_path):
    from embgeom.report import figures

    kept = []
    orig = figures._save
    figures._save = lambda fig, path: kept.append(fig) or orig(fig, path)
    try:
        plot_support_volumes([{"name": "a", "log_volume": -120.0, "valid": True},
                              {"name": "b", "log_volume": -80, "valid": False}], tmp_path / "s")
    finally:
        figures._save = orig
    ax = kept[0].axes[0]
    assert ax.get_xlim() == pytest.approx((-126.0, -68.0))
    assert ax.get_xlabel() == "log-volume (nats); smaller = tighter bound"


@pytest.mark.parametrize("valid", ["no", "yes", 1, 0, None, "False"])
def test_support_volumes_valid_must_be_a_bool(valid, tmp_path):
    """valid="no" was truthy: a rejected support drawn as valid."""
    rows = [{"name": "x", "log_volume": -1.0, "valid": valid}]
    _refused(tmp_path, TypeError, r"rows\[0\]\['valid'\]: expected True or False, "
                                  rf"got {type(valid).__name__}", plot_support_volumes, rows)


def test_support_volumes_rows_must_be_a_list(tmp_path):
    _refused(tmp_path, TypeError, r"rows: expected a list of dicts", plot_support_volumes,
             {"name": "x", "log_volume": 1.0, "valid": True})
    _refused(tmp_path, TypeError, r"rows: expected a list of dicts", plot_support_volumes, 3)


# ------------------------------------------------------ 5. plot_accessible_fraction


@pytest.mark.parametrize("m_values, err, match", [
    (4, TypeError, r"m_values: expected a sequence of integers >= 1 \(a list or tuple\), got int"),
    ("12", TypeError, r"m_values: expected a sequence of integers >= 1 .* got str"),
    (np.int64(2), TypeError, r"m_values: expected a sequence .* got int64"),
    ({1: 1}, TypeError, r"m_values: expected a sequence .* got dict"),
    ((1, 2.5), TypeError, r"m_values\[1\]: expected an integer, got float"),
    ((1, True), TypeError, r"m_values\[1\]: expected an integer, got bool"),
    ((1, 0), ValueError, r"m_values\[1\]: expected an integer >= 1, got 0"),
    (range(1, 66), ValueError, r"m_values: expected at most 64 values \(one panel each\), got 65"),
])
def test_accessible_fraction_m_values_is_a_sequence(m_values, err, match, tmp_path):
    """m_values=4 failed with "'int' object is not iterable"."""
    _refused(tmp_path, err, match, plot_accessible_fraction, {"ball": (20.0, None)}, 100,
             m_values=m_values)


@pytest.mark.parametrize("measured, err, match", [
    ([_CURVE], TypeError, r"measured: expected a dict m -> "),
    ({1: [1, 2]}, TypeError, r"measured\[1\]: expected a dict with lengths"),
    ({True: _CURVE}, ValueError, r"measured: expected keys m, integers >= 1"),
    ({1: {"lengths": [1, 2]}}, ValueError,
     r"measured\[1\]: expected keys lengths, accessibility, lower and upper, missing "
     r"accessibility, lower, upper"),
    ({1: dict(_CURVE, lower=[0.1])}, ValueError,
     r"measured\[1\]\['lower'\]: expected a list of 4 values \(one per length\), got shape \(1,\)"),
    ({1: dict(_CURVE, accessibility=[1.0, 0.9, 1.5, 0.0])}, ValueError,
     r"measured\[1\]\['accessibility'\]: expected fractions in \[0, 1\], got 1.5"),
    ({"1": dict(_CURVE, lengths=[0, 2, 4, 8])}, ValueError,
     r"measured\['1'\]\['lengths'\]: expected finite lengths > 0, got 0.0"),
    ({1: dict(_CURVE, upper=["1", "1", "1", "1"])}, ValueError,
     r"measured\[1\]\['upper'\]: expected an array of fractions"),
])
def test_accessible_fraction_names_a_bad_measurement(measured, err, match, tmp_path):
    """A list entry gave AttributeError ('list' object has no attribute 'get')."""
    _refused(tmp_path, err, match, plot_accessible_fraction, {"ball": (20.0, None)}, 100,
             m_values=(1,), measured=measured)


def test_accessible_fraction_draws_numpy_measurements(tmp_path):
    c = {k: np.asarray(v) for k, v in _CURVE.items()}  # arrays: `if v.get("lengths")` was ambiguous
    out = plot_accessible_fraction({"ball": (20.0, None)}, 100, tmp_path / "a", m_values=[1],
                                   measured={"1": c, 2: None, 4: {"lengths": []}})
    assert out == str(tmp_path / "a.png")


# ----------------------------------------------------------- 6. plot_linear_law c_emp


@pytest.mark.parametrize("c_emp, err, match", [
    ("x", TypeError, r"c_emp: expected a dict with c_emp, .* or None, got str"),
    ([2.0], TypeError, r"c_emp: expected a dict"),
    ({"c_emp": 0.0}, ValueError, r"c_emp\['c_emp'\]: expected a number > 0"),
    ({"c_emp": 2.0, "converged": "no"}, TypeError,
     r"c_emp\['converged'\]: expected True or False, or None, got str 'no'"),
    ({"c_emp": 2.0, "converged": 1}, TypeError, r"c_emp\['converged'\]: expected True or False"),
    ({"c_emp": 2.0, "n50": [1]}, TypeError, r"c_emp\['n50'\]: expected a dict m -> "),
    ({"c_emp": 2.0, "n50": {"1": 3.0}}, TypeError,
     r"c_emp\['n50'\]\['1'\]: expected a dict with n50, lower and upper"),
    ({"c_emp": 2.0, "n50": {"one": {"n50": 3.0}}}, ValueError,
     r"c_emp\['n50'\]: expected keys m, integers >= 1 .* got 'one'"),
    ({"c_emp": 2.0, "n50": {1: {"n50": "3"}}}, TypeError,
     r"c_emp\['n50'\]\[1\]\['n50'\]: expected a real number, got str"),
    ({"c_emp": 2.0, "n50": {1: {"n50": 3.0, "upper": math.inf}}}, ValueError,
     r"c_emp\['n50'\]\[1\]\['upper'\]: expected a finite number"),
])
def test_linear_law_names_a_bad_c_emp(c_emp, err, match, tmp_path):
    """c_emp="x" gave AttributeError ('str' object has no attribute 'get'); converged="no" was
    truthy, so an unconverged C_emp was written as exact."""
    _refused(tmp_path, err, match, plot_linear_law, {"ball": 3.0}, c_emp=c_emp)


@pytest.mark.parametrize("slopes, reference", [
    ({"ball": 0.0}, None), ({"ball": 0.0, "box": 0}, None), ({}, {"cube": 0.0}),
    ({"ball": 0.0, "box": 3.0}, {"cube": 0.0}),
])
def test_linear_law_slope_zero_draws_without_warnings(slopes, reference, monkeypatch, tmp_path):
    """A slope of 0 (a one-point support) lies below the log y axis: its line is empty (no
    "Data has no positive values" warning), its legend entry stays."""
    from embgeom.report import figures

    kept = []
    orig = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: kept.append(fig) or orig(fig, path))
    _drawn_quietly(plot_linear_law, slopes, tmp_path / "ll", reference=reference)
    labels = kept[0].axes[0].get_legend_handles_labels()[1]
    assert any("C = 0 " in lab for lab in labels)


def test_linear_law_takes_bools_of_numpy_and_none(tmp_path):
    for conv in (np.True_, False, None):
        _drawn_quietly(plot_linear_law, {"ball": 3.0}, tmp_path / "ll", m_max=4,
                       c_emp={"c_emp": 2.0, "converged": conv,
                              "n50": {"1": {"n50": 2.0, "lower": 1.5, "upper": None},
                                      2: {"n50": None}}})
