"""The plot helpers' contract: the path returned is the path written (one rule for all of them,
:func:`embgeom.report.figures._figure_path`), and bad input is refused naming the argument."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest

from embgeom.cells import Decoder
from embgeom.copying.plots import plot_copy_accuracy
from embgeom.cramming.plots import plot_accessibility, plot_n50
from embgeom.report.figures import (plot_accessible_fraction, plot_cell_histogram,
                                    plot_cell_shares, plot_hidden_norms, plot_linear_law,
                                    plot_support_volumes)
from embgeom.supports import Ball
from embgeom.volumes import cell_volumes

PNG = b"\x89PNG\r\n\x1a\n"

_ROWS = [{"name": "ball", "log_volume": -120.0, "valid": True, "kind": "fit"},
         {"name": "cube", "log_volume": -80.0, "valid": False, "kind": "cube"}]
_EVAL = {"lengths": [1, 2, 3, 4], "exact_match": [1.0, 1.0, 0.5, 0.0],
         "exact_match_count": [8, 8, 4, 0], "n_eval": 8, "per_token": [1.0, 1.0, 0.8, 0.4]}
_CURVE = {"lengths": [1, 2, 4, 8], "accessibility": [1.0, 0.9, 0.4, 0.0],
          "lower": [0.8, 0.6, 0.2, 0.0], "upper": [1.0, 1.0, 0.6, 0.2]}


@pytest.fixture(scope="module")
def cv():
    d = 3
    W = np.vstack([np.eye(d), -np.eye(d)]).astype(np.float32)
    return cell_volumes(Decoder(W), Ball.from_params(None, 1.0, dim=d), 600, seed=0,
                        progress=False, method="uniform")


HELPERS = {
    "hidden_norms": lambda p: plot_hidden_norms(
        {"per_length": [{"length": L, "r2_max": 2.0, "r2_mean": 1.0, "rinf_max": 0.5}
                        for L in (1, 2, 4)]}, p),
    "support_volumes": lambda p: plot_support_volumes(_ROWS, p),
    "cell_shares": lambda p: plot_cell_shares(np.log(np.full(8, 1 / 8)), p),
    "accessible_fraction": lambda p: plot_accessible_fraction({"ball": (20.0, None)}, 100, p,
                                                              m_values=(1,)),
    "linear_law": lambda p: plot_linear_law({"ball": 3.0}, p, m_max=2),
    "accessibility": lambda p: plot_accessibility({1: _CURVE}, p),
    "n50": lambda p: plot_n50({1: {"n50": 3.0, "lower": 2.0, "upper": 4.0}}, None, p),
    "copy_accuracy": lambda p: plot_copy_accuracy(_EVAL, 2, p),
}


# ------------------------------------------------------------------ 1. the path written


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_returns_the_path_written(name, tmp_path):
    (tmp_path / "sub").mkdir()
    out = HELPERS[name](tmp_path / "sub" / "noext")
    assert str(out) == str(tmp_path / "sub" / "noext.png")
    assert (tmp_path / "sub" / "noext.png").read_bytes()[:8] == PNG
    assert not (tmp_path / "sub" / "noext").exists()
    # a folder that does not exist is refused, and none is created (a typo in it made folders
    # nobody asked for)
    with pytest.raises(ValueError, match=r"path: the folder .*new.deeper' does not exist"):
        HELPERS[name](tmp_path / "new" / "deeper" / "f.png")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_bad_paths_are_refused_naming_path(name, tmp_path):
    with pytest.raises(ValueError, match=r"path: expected a file name, got the existing dir"):
        HELPERS[name](tmp_path)
    assert not (tmp_path.parent / (tmp_path.name + ".png")).exists()
    with pytest.raises(ValueError, match=r"path: .*\(a directory\)"):
        HELPERS[name](str(tmp_path / "new") + "/")
    with pytest.raises(TypeError, match=r"path: expected a str or path-like file name, got int"):
        HELPERS[name](5)
    with pytest.raises(ValueError, match=r"path: expected a file name ending in one of"):
        HELPERS[name](tmp_path / "run.v2")


def test_the_suffix_names_the_format_whatever_savefig_format_says(tmp_path):
    with matplotlib.rc_context({"savefig.format": "pdf"}):
        out = plot_support_volumes(_ROWS, tmp_path / "a")
    assert out == str(tmp_path / "a.png") and (tmp_path / "a.png").read_bytes()[:8] == PNG
    out = plot_support_volumes(_ROWS, tmp_path / "b.PDF")
    assert out == str(tmp_path / "b.PDF")
    assert (tmp_path / "b.PDF").read_bytes()[:4] == b"%PDF"


def test_histogram_follows_the_rule(cv, tmp_path):
    cv.histogram(path=tmp_path / "h")
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match=r"path: expected a file name, got the existing dir"):
        cv.histogram(path=tmp_path)
    assert not (tmp_path.parent / (tmp_path.name + ".png")).exists()


# --------------------------------------------------------------- 4. histogram arguments


def test_histogram_refuses_bad_path_and_ax(cv):
    with pytest.raises(TypeError, match=r"path: expected a str or path-like file name, got int"):
        cv.histogram(path=5)
    with pytest.raises(TypeError, match=r"ax: expected a matplotlib Axes"):
        cv.histogram(ax="x")
    with pytest.raises(TypeError, match=r"ax: expected a matplotlib Axes"):
        plot_cell_histogram(cv, ax=object())
    with pytest.raises(ValueError, match=r"bins: expected an integer >= 1"):
        cv.histogram(bins=0)


@pytest.mark.parametrize("bad", [[-1.0, -2.0], np.log(np.full(8, 1 / 8)), None, {"counts": [1]}])
def test_histogram_refuses_what_is_not_a_cell_volumes(bad, tmp_path):
    """A plain list of log-shares gave AttributeError: 'list' object has no attribute 'counts'."""
    with pytest.raises(TypeError, match=r"cv: expected an embgeom.volumes.CellVolumes .* got "
                                        rf"{type(bad).__name__}; for bare log-shares use "
                                        r"plot_cell_shares"):
        plot_cell_histogram(bad, path=tmp_path / "h.png")
    assert not (tmp_path / "h.png").exists()


# ------------------------------------------------------ 2. plot_accessible_fraction lengths


def test_accessible_fraction_huge_cliff_names_curves(tmp_path):
    with pytest.raises(ValueError, match=r"curves\['ball'\]: expected a cliff n\*\(m\) below "
                                         r"2\*\*52 tokens"):
        plot_accessible_fraction({"ball": (1e300, None)}, 1000, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"curves\['ball'\]: expected a cliff"):
        plot_accessible_fraction({"ball": (10.0, 1e-300)}, 1000, tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()


def test_accessible_fraction_names_curves_for_bad_entries(tmp_path):
    with pytest.raises(ValueError, match=r"curves\['c'\]: log_packing: expected a finite"):
        plot_accessible_fraction({"c": (-1.0, None)}, 1000, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"curves\['c'\]: rate: expected a finite"):
        plot_accessible_fraction({"c": (10.0, math.inf)}, 1000, tmp_path / "a.png")
    with pytest.raises(TypeError, match=r"curves\['c'\]: expected a pair"):
        plot_accessible_fraction({"c": 3.0}, 1000, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"measured: expected keys m, integers >= 1"):
        plot_accessible_fraction({"c": (10.0, None)}, 1000, tmp_path / "a.png",
                                 measured={0: _CURVE})


def test_accessible_fraction_far_apart_cliffs_are_drawn(tmp_path):
    # cliffs at ~2 and ~1.4e9 tokens: the lower panels' lengths were every integer between
    # (8 GB); they are now a grid that keeps both kinks
    from embgeom.report.figures import _lengths_around

    out = plot_accessible_fraction({"ball": (10.0, None), "big": (1e10, None)}, 1000,
                                   tmp_path / "a", m_values=(1,))
    assert out == str(tmp_path / "a.png") and (tmp_path / "a.png").stat().st_size > 1000
    starts, ends = [1.5, 1.4e9], [4.8, 1.4e9 + 3.3]
    n = _lengths_around(starts, ends)
    assert n.dtype == np.int64 and n.size < 5000 and np.all(np.diff(n) > 0) and n[0] >= 1
    assert {1, 2, 4, 5, 1_400_000_000, 1_400_000_004} <= set(n.tolist())
    assert np.array_equal(_lengths_around([10.0], [13.0]), np.arange(8, 16))  # as before: padded by 4% and a token


# -------------------------------------------------------------------- 3. plot_cell_shares


@pytest.mark.parametrize("kwargs, match", [
    ({"log_shares": []}, r"log_shares: expected a non-empty 1-D array .* got shape \(0,\)"),
    ({"log_shares": np.zeros((2, 3))}, r"log_shares: expected a non-empty 1-D array .* \(2, 3\)"),
    ({"log_shares": [-1.0, -2.0], "log_lower": [-3.0], "log_upper": [0.0, 0.0]},
     r"log_lower: expected shape \(2,\), one value per log-share, got \(1,\)"),
    ({"log_shares": [-1.0, -2.0], "log_lower": [-3.0, -3.0], "log_upper": [0.0, 0.0, 0.0]},
     r"log_upper: expected shape \(2,\)"),
    ({"log_shares": [-1.0, -np.inf], "log_upper": [0.0]}, r"log_upper: expected shape \(2,\)"),
    ({"log_shares": [-1.0, -2.0], "unresolved": [True]}, r"unresolved: expected shape \(2,\)"),
    ({"log_shares": [-1.0, -2.0], "vocab_size": 0},
     r"vocab_size: expected an integer >= 2, got 0 \(the number of log_shares"),
    ({"log_shares": [-1.0, -2.0], "vocab_size": 1}, r"vocab_size: expected an integer >= 2"),
    ({"log_shares": ["a", "b"]}, r"log_shares: expected an array of log-shares"),
    # out of the domain: a share above 1, or nothing resolved to draw
    ({"log_shares": [np.inf, -1.0]},
     r"log_shares: expected log-shares <= 0 \(nats; a share is at most 1\), got max inf"),
    ({"log_shares": [0.5, -1.0]}, r"log_shares: expected log-shares <= 0 .* got max 0.5"),
    ({"log_shares": [-1.0, -2.0], "log_lower": [-2.0, -3.0], "log_upper": [0.0, np.inf]},
     r"log_upper: expected log-shares <= 0 .* got max inf"),
    ({"log_shares": [-1.0, -2.0], "log_lower": [np.inf, -3.0], "log_upper": [0.0, 0.0]},
     r"log_lower: expected log-shares <= 0"),
    ({"log_shares": [np.nan, np.nan]},
     r"log_shares: expected at least one resolved cell .* got none of 2 \(2 NaN, 0 -inf\)"),
    ({"log_shares": [np.nan, -np.inf, np.nan]}, r"log_shares: expected at least one resolved cell"),
    ({"log_shares": [-1.0, -2.0], "unresolved": [True, True]},
     r"log_shares: expected at least one resolved cell"),
    ({"log_shares": [np.nan, -2.0], "unresolved": [False, False]},
     r"log_shares: expected a finite log-share for every token not flagged in unresolved, "
     r"got nan for 1 of them"),
])
def test_cell_shares_refuses_bad_input(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        plot_cell_shares(path=tmp_path / "c.png", **kwargs)
    assert not (tmp_path / "c.png").exists()


def test_cell_shares_vocab_size_must_be_an_integer(tmp_path):
    with pytest.raises(TypeError, match=r"vocab_size: expected an integer"):
        plot_cell_shares([-1.0, -2.0], tmp_path / "c.png", vocab_size=10.5)


def test_cell_shares_draws_shares_at_the_edge_of_the_domain(tmp_path):
    # a share of 1 (log 0), one unresolved NaN beside a resolved cell, an upper end of log 1
    out = plot_cell_shares([0.0, -1.0, np.nan], tmp_path / "c", log_lower=[-0.1, -2.0, np.nan],
                           log_upper=[0.0, -0.5, -3.0])
    assert out == str(tmp_path / "c.png") and (tmp_path / "c.png").read_bytes()[:8] == PNG


# ------------------------------------------------------------------- 6. plot_linear_law


@pytest.mark.parametrize("kwargs, err, match", [
    ({"slopes": {"ball": math.nan}}, ValueError, r"slopes\['ball'\]: expected a finite number, got nan"),
    ({"slopes": {"ball": math.inf}}, ValueError, r"slopes\['ball'\]: expected a finite number"),
    ({"slopes": {"ball": -3.0}}, ValueError, r"slopes\['ball'\]: expected a number >= 0, got -3.0"),
    ({"slopes": {"ball": "3"}}, TypeError, r"slopes\['ball'\]: expected a real number, got str"),
    ({"slopes": {"ball": True}}, TypeError, r"slopes\['ball'\]: expected a real number, got bool"),
    ({"slopes": {"ball": None}}, TypeError, r"slopes\['ball'\]: expected a real number"),
    ({"slopes": {"ball": 3.0}, "reference": {"cube": math.nan}}, ValueError,
     r"reference\['cube'\]: expected a finite number"),
    ({"slopes": {}, "reference": {"cube": "x"}}, TypeError, r"reference\['cube'\]: expected a real"),
    ({"slopes": [3.0]}, TypeError, r"slopes: expected a dict of label -> slope C .* got list"),
    ({"slopes": {"ball": 3.0}, "c_emp": {"c_emp": math.nan}}, ValueError,
     r"c_emp\['c_emp'\]: expected a finite number"),
    ({"slopes": {"ball": 3.0}, "c_emp": {"c_emp": "2"}}, TypeError, r"c_emp\['c_emp'\]: expected a real"),
    ({"slopes": {"ball": 3.0}, "c_emp": {"c_emp": 2.0, "c_emp_lower": -1.0}}, ValueError,
     r"c_emp\['c_emp_lower'\]: expected a number > 0"),
])
def test_linear_law_refuses_slopes_that_are_not_numbers(kwargs, err, match, tmp_path):
    """A NaN slope was drawn silently (an empty line and "C = nan"); a string one failed with
    numpy's words (ufunc 'multiply' did not contain a loop)."""
    with pytest.raises(err, match=match):
        plot_linear_law(path=tmp_path / "ll.png", **kwargs)
    assert not (tmp_path / "ll.png").exists()


def test_linear_law_takes_numpy_and_integer_slopes(tmp_path):
    out = plot_linear_law({"ball": np.float32(3.5), "box": 4}, tmp_path / "ll", m_max=2,
                          reference={"cube": np.int64(9)}, c_emp={"c_emp": np.float64(2.0)})
    assert (tmp_path / "ll.png").read_bytes()[:8] == PNG and out == str(tmp_path / "ll.png")


# ---------------------------------------------------------------- 5. plot_support_volumes


def test_support_volumes_draws_non_finite_rows_outside_the_limits(tmp_path):
    rows = _ROWS + [{"name": "flat", "log_volume": -math.inf, "valid": True},
                    {"name": "nan", "log_volume": math.nan, "valid": False}]
    out = plot_support_volumes(rows, tmp_path / "s.png")
    assert out == str(tmp_path / "s.png") and (tmp_path / "s.png").stat().st_size > 1000
    rows = [{"name": "flat", "log_volume": -math.inf, "valid": True}]
    assert plot_support_volumes(rows, tmp_path / "t.png") == str(tmp_path / "t.png")


def test_support_volumes_names_rows_and_the_missing_key(tmp_path):
    with pytest.raises(ValueError, match=r"rows\[1\]: expected keys name, log_volume and valid, "
                                         r"missing log_volume"):
        plot_support_volumes([_ROWS[0], {"name": "x", "valid": True}], tmp_path / "s.png")
    with pytest.raises(ValueError, match=r"rows\[0\]: .*missing name, valid"):
        plot_support_volumes([{"log_volume": 1.0}], tmp_path / "s.png")
    with pytest.raises(ValueError, match=r"rows\[0\]: expected a real log_volume"):
        plot_support_volumes([{"name": "x", "log_volume": "big", "valid": True}],
                             tmp_path / "s.png")
    with pytest.raises(TypeError, match=r"rows\[0\]: expected a dict"):
        plot_support_volumes([("x", 1.0, True)], tmp_path / "s.png")
    with pytest.raises(ValueError, match=r"rows: expected at least one support"):
        plot_support_volumes([], tmp_path / "s.png")


def test_cramming_plots_name_empty_and_incomplete_inputs(tmp_path):
    from embgeom.cramming.plots import plot_accessibility, plot_n50

    with pytest.raises(ValueError, match="n50_by_m: expected at least one m"):
        plot_n50({}, None, tmp_path / "n50.png")
    with pytest.raises(ValueError, match=r"n50_by_m\[1\]: missing key\(s\) \['n50'\]"):
        plot_n50({1: {"lower": 3}}, None, tmp_path / "n50.png")
    with pytest.raises(ValueError, match="curves: expected at least one m"):
        plot_accessibility({}, tmp_path / "acc.png")
    with pytest.raises(ValueError, match=r"curves\[2\]: missing key\(s\) \['lower', 'upper'\]"):
        plot_accessibility({2: {"lengths": [4, 8], "accessibility": [1.0, 0.5]}}, tmp_path / "acc.png")
    ok = plot_accessibility({2: {"lengths": [4, 8], "accessibility": [1.0, 0.5], "lower": [0.7, 0.2],
                                 "upper": [1.0, 0.8]}}, tmp_path / "acc")
    assert ok.endswith("acc.png") and (tmp_path / "acc.png").stat().st_size > 0
    assert plot_n50({1: {"n50": 20.0}, 2: {"n50": 41.0}}, None, tmp_path / "n50.png").endswith("n50.png")


def test_copy_plot_names_an_incomplete_evaluation(tmp_path):
    with pytest.raises(ValueError, match=r"evaluation: missing key\(s\) \['exact_match_count', 'n_eval'"):
        plot_copy_accuracy({"lengths": [1, 2], "exact_match": [1.0, 0.5]}, 2, tmp_path / "c.png")
    with pytest.raises(TypeError, match="evaluation: expected the dict"):
        plot_copy_accuracy([1, 2], 2, tmp_path / "c.png")
    ev = {"lengths": [1, 2, 3], "exact_match": [1.0, 0.5, 0.0], "exact_match_count": [8, 4, 0],
          "n_eval": 8, "per_token": [1.0, 0.8, 0.4]}
    assert plot_copy_accuracy(ev, 2, tmp_path / "c").name == "c.png"
