"""Switches are bools, bars follow the terminal, and the final-norm shell refuses what has no
surface: a new-user pass found ``progress="no"`` and ``solid="no"`` read as True (a string is
truthy), library bars drawn into log files, a LayerNorm shell in d = 1 or 2 giving NaN samples,
and ``log_area`` overflowing for gains spanning 1e-200..1e200."""

from __future__ import annotations

import io
import math
import sys
import warnings

import numpy as np
import pytest

import embgeom
from embgeom.cells import Decoder
from embgeom.supports import Ellipsoid, FinalNormShell
from embgeom.volumes import cell_volumes


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_string_switches_are_refused():
    H = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(TypeError, match="^progress: expected True or False, got str 'no'"):
        embgeom.fit_support(H, "ellipsoid", progress="no")
    with pytest.raises(TypeError, match="^progress: expected True or False"):
        Ellipsoid(progress="no").fit(H)
    shell = FinalNormShell.from_params("rmsnorm", np.ones(3))
    with pytest.raises(TypeError, match="^solid: expected True or False, got str 'no'"):
        shell.contains(H, solid="no")
    # numpy's bool is a bool
    assert shell.contains(np.full((1, 3), 0.5), solid=np.bool_(True)).tolist() == [True]
    assert shell.contains(np.full((1, 3), 0.5)).tolist() == [False]


@pytest.mark.parametrize("d", [1, 2])
def test_layernorm_shell_needs_three_dimensions(d):
    with pytest.raises(ValueError, match=f"^gain: a LayerNorm shell needs d >= 3, got d = {d}"):
        FinalNormShell.from_params("layernorm", np.ones(d))
    with pytest.raises(ValueError, match="LayerNorm shell needs d >= 3"):
        FinalNormShell(kind="layernorm").fit(np.ones((5, d)))
    FinalNormShell.from_params("layernorm", np.ones(3))  # d = 3: a circle, fine


def test_log_area_of_a_needle_ellipse_without_overflow():
    """d = 2, gains (1e-200, 1e200): semi-axes sqrt(2) g, an ellipse flattened to a segment of
    half-length a = sqrt(2) 1e200, whose perimeter is 4 a. ``s / smin`` overflowed (1e400)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shell = FinalNormShell.from_params("rmsnorm", [1e-200, 1e200])
        got = shell.log_area
    want = math.log(4 * math.sqrt(2)) + 200 * math.log(10)
    assert abs(got - want) < 0.03
    # scale-equivariant: g -> 1e150 g multiplies a (d-1)-area by 1e150^(d-1)
    g = np.logspace(-2, 2, 8)
    a = FinalNormShell.from_params("rmsnorm", g).log_area
    b = FinalNormShell.from_params("rmsnorm", g * 1e150).log_area
    assert abs(b - 7 * 150 * math.log(10) - a) < 1e-9


def test_library_bars_only_on_a_terminal(monkeypatch):
    """``progress=True`` (the library's default) draws where stderr is a terminal, and nothing
    into a log file or a pipe: one moving line there is tens of kilobytes of carriage returns."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((12, 3)).astype(np.float32)
    ball = embgeom.Ball.from_params(np.zeros(3), 1.0)
    for stream, drawn in ((io.StringIO(), False), (_Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        cell_volumes(Decoder(W), ball, 2000, seed=0, method="rare-event", tokens=[0, 1],
                     progress=True)
        assert bool(stream.getvalue()) is drawn, stream.getvalue()[:200]


def test_sizes_no_machine_holds_are_refused_up_front():
    """``sample(10**12)``, ``Ball(dim=10**10)``, ``n_chains=10**12`` and ``bins=10**9`` used to
    end in numpy's MemoryError (or minutes of paging, or a hang drawing bars): now a ValueError
    naming the argument, before anything is allocated or drawn."""
    from embgeom._validation import physical_memory_bytes

    assert physical_memory_bytes() is None or physical_memory_bytes() > 2**28
    ball = embgeom.Ball.from_params(np.zeros(4), 1.0)
    with pytest.raises(ValueError, match=r"^n: 1000000000000 needs an \(n, 4\) float64 array of 2.98e\+04 GiB"):
        ball.sample(10**12)
    assert ball.sample(3, seed=0).shape == (3, 4)
    for dim in (10**10, 10**30):
        with pytest.raises(ValueError, match="^dim: .* needs a float64 centre"):
            embgeom.Ball.from_params(None, 1.0, dim=dim)
    W = np.random.default_rng(0).standard_normal((12, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^n_chains: expected at most 2\*\*20"):
        cell_volumes(Decoder(W), ball.__class__.from_params(np.zeros(3), 1.0), 100, seed=0,
                     method="rare-event", tokens=[0], n_chains=10**12, progress=False)
    cv = cell_volumes(Decoder(W), embgeom.Ball.from_params(np.zeros(3), 1.0), 2000, seed=0,
                      progress=False)
    with pytest.raises(ValueError, match="^bins: expected at most 10000"):
        cv.histogram(bins=10**9)


def test_options_checked_whether_or_not_they_are_used():
    """``Box(min_width="a")`` fitted without a word when no side was degenerate, and
    ``log_multiset_count(5.0, [])`` called an empty list "not integers" (TypeError)."""
    from embgeom.bounds import log_multiset_count

    H = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises((TypeError, ValueError), match="^min_width"):
        embgeom.fit_support(H, "box", min_width="a")
    with pytest.raises(ValueError, match="^min_width"):
        embgeom.fit_support(H, "box", min_width=-1.0)
    box = embgeom.fit_support(H, "box", min_width=0.5)  # unused here: the box is the data's
    np.testing.assert_allclose(box.lower_, H.min(axis=0))
    with pytest.raises(ValueError, match="^n: expected at least one sequence length"):
        log_multiset_count(5.0, [])
    # C(n + P, n): multisets of at most n = 2 of P = 3 points, C(5, 2) = 10
    assert log_multiset_count(math.log(3.0), [2]).tolist() == pytest.approx([math.log(10.0)])
