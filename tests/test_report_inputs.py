"""Inputs that do not describe one model are refused with errors naming the argument.

A new-user trial found that :func:`embgeom.report.bounds_report_section` took mismatched
inputs silently (a vocabulary of another size than the cell shares, supports of another
dimension than the hidden size, an ``rinf`` of another scale than the supports, ``valid`` names
of no support, empty ``m_values``), that confidence levels were refused with messages naming
different intervals, and that the decoder's float32-underflow message gave advice that changes
the cells. Each test here would fail on the behaviour found.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from embgeom.bounds import log_packing_number, n_star, precision_eps
from embgeom.cells import Decoder
from embgeom.report import bounds_report_section
from embgeom.report.figures import plot_accessible_fraction
from embgeom.supports import Ball, Box

D, V = 16, 200


@pytest.fixture(scope="module")
def W():
    return np.random.default_rng(0).standard_normal((V, D))


@pytest.fixture(scope="module")
def ball():
    return Ball.from_params(np.zeros(D), 1.0)


@pytest.fixture(scope="module")
def cells(W, ball):
    from embgeom.volumes import cell_volumes

    return cell_volumes(Decoder(W), ball, 4000, seed=0, method="uniform", progress=False)


def _section(tmp_path, ball, **kw):
    args = dict(unembedding_facts={"hidden_size": D, "vocab_size": V},
                supports={"ball_origin": ball}, rinf=1.0, out_dir=tmp_path)
    args.update(kw)
    return bounds_report_section(**args)


# ------------------------------------------------------------------------ vocabulary size


def test_bounds_section_refuses_cell_shares_of_another_vocabulary(tmp_path, ball, cells):
    assert cells.fractions.size == V
    # the matching sizes give a rate of this vocabulary (the control)
    sec = _section(tmp_path, ball, fractions=cells, k_max=4)
    assert sec["rate"]["vocab_size"] == V and sec["slope_refined"]["ball_origin"] > 0
    with pytest.raises(ValueError, match=r"fractions: a CellVolumes of 200 tokens, but "
                                         r"unembedding_facts\['vocab_size'\] is 500"):
        _section(tmp_path, ball, unembedding_facts={"hidden_size": D, "vocab_size": 500},
                 fractions=cells)
    f150 = np.random.default_rng(1).dirichlet(np.ones(150))
    with pytest.raises(ValueError, match=r"fractions: cell shares of 150 tokens, but "
                                         r"unembedding_facts\['vocab_size'\] is 200"):
        _section(tmp_path, ball, fractions=f150)
    with pytest.raises(ValueError, match=r"unembedding_facts\['vocab_size'\]: expected an "
                                         r"integer >= 2"):
        _section(tmp_path, ball, unembedding_facts={"hidden_size": D, "vocab_size": 1})


# ------------------------------------------------------------------------ hidden size


def test_bounds_section_refuses_supports_of_another_dimension(tmp_path, ball):
    sec = _section(tmp_path, ball)
    # the cube's closed form is d log(1 + 2^12) / log|V|: proportional to the hidden size given
    assert sec["slope"]["cube"] == pytest.approx(D * math.log(1 + 2**12) / math.log(V))
    with pytest.raises(ValueError, match=r"supports\['ball_origin'\]: dimension 16 differs from "
                                         r"unembedding_facts\['hidden_size'\] = 32"):
        _section(tmp_path, ball, unembedding_facts={"hidden_size": 32, "vocab_size": V})
    # any support of another dimension, not only the first
    box8 = Box.from_params(-np.ones(8), np.ones(8))
    with pytest.raises(ValueError, match=r"supports\['box'\]: dimension 8"):
        _section(tmp_path, ball, supports={"ball_origin": ball, "box": box8})


# ------------------------------------------------------------------------ rinf vs the supports


def test_bounds_section_refuses_an_rinf_of_another_scale_than_the_supports(tmp_path, ball):
    # why the trial saw C ~ 0: at eps = 1e160 2^-11 the unit ball fits inside one precision
    # cell, so its rigorous log P is ~6.6e-156 nats (correct, in logs, no underflow) and C ~ 0
    eps = precision_eps(1e160, 11)
    assert 0 <= log_packing_number(ball, eps) < 1e-150
    with pytest.raises(ValueError, match=r"rinf: at eps = rinf 2\^-11 = 4\.883e\+156 .*"
                                         r"\['ball_origin'\] hold at most one distinguishable"):
        _section(tmp_path, ball, rinf=1e160)
    # a conformal or extra support of the wrong scale is refused too (not only the tightest)
    tiny = Ball.from_params(np.zeros(D), 1e-6)
    with pytest.raises(ValueError, match=r"rinf: .*\['tiny'\]"):
        _section(tmp_path, ball, supports={"ball_origin": ball, "tiny": tiny}, rinf=1.0)
    # at the supports' scale the bound is well above 0: eps = 1 (12.4 nats, the Steiner term,
    # below the eps/2-ball count 16 log 3)
    sec = _section(tmp_path, ball, rinf=2.0**11)
    assert sec["log_packing"]["ball_origin"] == log_packing_number(ball, 1.0)
    assert 10 < sec["log_packing"]["ball_origin"] < D * math.log(3.0)
    assert sec["tightest"] == "ball_origin" and sec["slope"]["ball_origin"] > 2


# ------------------------------------------------------------------------ valid


def test_bounds_section_refuses_valid_names_of_no_support(tmp_path, ball):
    assert _section(tmp_path, ball, valid=["ball_origin"])["tightest"] == "ball_origin"
    assert _section(tmp_path, ball, valid=["cube"])["tightest"] == "cube"
    with pytest.raises(ValueError, match=r"valid: \['nope'\] name no support; .*"
                                         r"\['ball_origin', 'cube'\]"):
        _section(tmp_path, ball, valid=["nope"])
    with pytest.raises(ValueError, match=r"valid: \['nope'\]"):
        _section(tmp_path, ball, valid=["ball_origin", "nope"])
    # a bare string is a collection of characters, not of names
    with pytest.raises(TypeError, match="valid: expected a collection of support names"):
        _section(tmp_path, ball, valid="ball_origin")


# ------------------------------------------------------------------------ m_values


def test_bounds_section_refuses_empty_or_bad_m_values(tmp_path, ball):
    sec = _section(tmp_path, ball, m_values=[2, 4])
    assert sec["n_star"]["m"] == [2, 4]
    assert sec["n_star"]["cube"] == pytest.approx([2 * sec["slope"]["cube"],
                                                   4 * sec["slope"]["cube"]])
    with pytest.raises(ValueError, match=r"m_values: expected at least one number of prompt"):
        _section(tmp_path, ball, m_values=[])
    with pytest.raises(ValueError, match=r"m_values: expected distinct numbers .* \[2, 2\]"):
        _section(tmp_path, ball, m_values=[2, 2])
    with pytest.raises(TypeError, match=r"supports: expected a dict of name -> fitted Support"):
        _section(tmp_path, ball, supports=[ball])
    with pytest.raises(ValueError, match=r"m_values: expected an integer >= 1, got 0"):
        _section(tmp_path, ball, m_values=[1, 0])
    with pytest.raises(TypeError, match=r"m_values: expected an integer"):
        _section(tmp_path, ball, m_values=[1.5])
    with pytest.raises(TypeError, match=r"m_values: expected a sequence"):
        _section(tmp_path, ball, m_values=3)
    # the public functions underneath: an empty m is a value error there too
    with pytest.raises(ValueError, match=r"m: expected at least one number of prompt vectors"):
        n_star([], 10.0, V)
    with pytest.raises(ValueError, match=r"m_values: expected at least one"):
        plot_accessible_fraction({"ball": (10.0, None)}, V, tmp_path / "a.png", m_values=[])


# ------------------------------------------------------------------------ confidence levels


def _confidence_calls():
    from embgeom.cramming.analysis import HorizonCurve, fit_slope, n50

    curve = {"lengths": [4, 8, 16], "successes": [4, 2, 0], "trials": [4, 4, 4]}
    hc = HorizonCurve(n_mem=1, horizons=np.array([3, 5, 8, 9]), censored=np.zeros(4, bool),
                      max_length=16, n_targets=4, n_boot=0)
    return {
        "n50": lambda c: n50(curve, n_boot=0, confidence=c),
        "fit_slope": lambda c: fit_slope({1: 10.0, 2: 21.0, 4: 39.0}, confidence=c),
        "HorizonCurve.n50": lambda c: hc.n50(confidence=c),
    }


@pytest.mark.parametrize("which", ["n50", "fit_slope", "HorizonCurve.n50"])
def test_confidence_messages_name_the_interval_enforced(which):
    call = _confidence_calls()[which]
    call(0.9)  # a level inside works
    for c in (0, 1, 1.5):
        # one interval for every refused value, and it is the one enforced: 1 is refused
        with pytest.raises(ValueError, match=re.escape(f"confidence: expected a number in "
                                                       f"(0, 1), got {float(c)}")):
            call(c)


def test_report_supports_levels_are_refused_as_documented(tmp_path):
    from embgeom.report import supports_report_section

    H = np.random.default_rng(0).standard_normal((60, 4))
    Ht = np.random.default_rng(1).standard_normal((40, 4))
    for kw, name in ((dict(heldout_min=1.0), "heldout_min"), (dict(confidence=1.0), "confidence")):
        with pytest.raises(ValueError, match=re.escape(f"{name}: expected a number in (0, 1), "
                                                       "got 1.0")):
            supports_report_section(H, tmp_path, shapes=("ball",), heldout=Ht, **kw)
    # nothing was fitted or written before the refusal
    assert not any(tmp_path.iterdir())


def test_cell_volumes_confidence_message_is_one_interval(W, ball):
    from embgeom.volumes import cell_volumes

    for c in (0, 1, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"confidence: expected a number in (0, 1), "
                                                       f"got {float(c)}")):
            cell_volumes(Decoder(W), ball, 100, seed=0, confidence=c, method="uniform",
                         progress=False)


# ------------------------------------------------------------------------ decoder underflow


def test_decoder_underflow_message_gives_advice_that_keeps_the_cells(W):
    rng = np.random.default_rng(2)
    b = rng.standard_normal(V)
    # the trial's case: no common factor can bring W (~1) and b (~1e-100) into float32 together
    with pytest.raises(ValueError) as ei:
        Decoder(W, b * 1e-100)
    msg = str(ei.value)
    assert msg.startswith("bias: 200 nonzero entries are below float32's normal range")
    assert "same positive factor" in msg and "no such s exists" in msg
    assert "Rescale bias" not in msg and "bias-free" not in msg
    # a common factor exists: the message names one, and it keeps every cell
    b1 = b.copy()
    b1[3] = 1e-40
    with pytest.raises(ValueError, match=r"bias: 1 nonzero entries .* same positive factor") as ei:
        Decoder(W, b1)
    k = int(re.search(r"s = 2\*\*(-?\d+)", str(ei.value)).group(1))
    s = 2.0**k
    dec = Decoder(W * s, b1 * s)
    H = rng.standard_normal((500, D)) * 0.3
    np.testing.assert_array_equal(dec.assign(H), np.argmax(H @ W.T + b1, axis=1))
    # the old advice, rescaling the bias alone, moves the cells
    assert np.any(Decoder(W, b1 * s).assign(H) != dec.assign(H))
    # bias-free: a factor on W alone is right, and the message does not mention a bias
    with pytest.raises(ValueError, match=r"W: 3200 nonzero .* Multiply W by a positive factor: "
                                         r"the cells of a bias-free decoder are cones") as ei:
        Decoder(W * 1e-46)
    assert "bias" not in str(ei.value).split("bias-free")[0]
    # W too small with a bias: W and the bias together
    with pytest.raises(ValueError, match=r"W: 3200 nonzero .* Multiply W and bias by the same "
                                         r"positive factor s .* E\.g\. s = 2\*\*"):
        Decoder(W * 1e-46, b)
