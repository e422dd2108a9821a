"""End to end on the real default model: the report's keys, files and headline numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from embgeom.report import build_report, hidden_state_summary


@pytest.mark.realmodel
def test_report_end_to_end_on_smollm2(smollm2, tmp_path):
    out = tmp_path / "rep"
    rep = build_report(smollm2, out, quick=True, lengths=[4, 8], n_per_length=16,
                       n_cell_samples=4000, seed=3, progress=False)
    def refuse(constant):
        raise ValueError(f"report.json holds {constant}: not strict JSON")

    on_disk = json.loads((out / "report.json").read_text(), parse_constant=refuse)
    for key in ("model", "hidden_states", "supports", "cells", "bounds", "settings", "timings_s"):
        assert key in on_disk
    m, h, b = on_disk["model"], on_disk["hidden_states"], on_disk["bounds"]
    assert (m["hidden_size"], m["vocab_size"], m["tied"]) == (576, 49152, True)
    assert h["n"] == 32 and h["dim"] == 576
    assert 0 < h["rinf_max"] <= h["r2_max"]
    assert -1 <= h["cos_min"] <= h["cos_mean"] <= 1
    assert [r["length"] for r in h["per_length"]] == [4, 8]
    # Theorem 4.5 for the cube, computed here by hand: C = d log(1 + 2r/eps) / log|V| with
    # eps = r 2^-11, so C = 576 log(1 + 2^12) / log 49152 whatever r is.
    assert b["eps"]["paper"] == pytest.approx(h["rinf_max"] * 2.0**-11, rel=1e-12)
    assert b["slope"]["cube"] == pytest.approx(576 * math.log1p(2.0**12) / math.log(49152),
                                               rel=1e-9)
    # every valid support bounds at most the cube's count; the final-norm shell is certified
    assert on_disk["supports"]["final_norm"]["heldout_contained"] == 1.0
    assert b["heldout_valid"]["final_norm"] is True
    assert b["slope"]["final_norm"] < b["slope"]["cube"]
    assert b["tightest"] in b["heldout_valid"] and b["heldout_valid"][b["tightest"]]
    assert b["n_star"]["m"][:3] == [1, 2, 3]
    np.testing.assert_allclose(b["n_star"]["cube"][:3], b["slope"]["cube"] * np.arange(1, 4))
    # the cells: fractions on disk, summing to one, the top list sorted
    f = np.load(out / on_disk["cells"]["fractions_path"])
    assert f.shape == (49152,) and f.sum() == pytest.approx(1.0, abs=1e-9)
    top = on_disk["cells"]["top"]
    assert len(top) == 20 and all(a["fraction"] >= z["fraction"] for a, z in zip(top, top[1:]))
    assert top[0]["fraction"] == pytest.approx(f.max())
    for png in ("hidden_norms.png", "supports_log_volume.png", "cell_volumes.png",
                "accessible_fraction.png"):
        assert (out / png).stat().st_size > 1000, png
    md = (out / "report.md").read_text()
    assert "## Packing bounds" in md and "## Decoder cells" in md and "## Supports" in md
    assert rep["summary_lines"][0].startswith("embgeom report: smollm2-135m")


def test_hidden_state_summary_known_values():
    H = np.array([[3.0, 4.0], [0.0, -2.0], [1.0, 0.0]])
    s = hidden_state_summary(H, np.array([1, 1, 2]), max_cos_points=10)
    assert s["r2_max"] == 5.0 and s["rinf_max"] == 4.0
    # cosines: (3,4)·(0,-2) = -8/10, (3,4)·(1,0) = 3/5, (0,-2)·(1,0) = 0
    assert s["cos_min"] == pytest.approx(-0.8) and s["cos_mean"] == pytest.approx((-0.8 + 0.6) / 3)
    assert [r["n"] for r in s["per_length"]] == [2, 1]
    with pytest.raises(ValueError, match="H"):
        hidden_state_summary(np.array([[np.nan, 1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="lengths"):
        hidden_state_summary(H, np.array([1, 2]))
    with pytest.raises(TypeError, match="float16"):
        hidden_state_summary(H.astype(np.float16))


def test_report_refuses_a_file_as_out(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("")
    with pytest.raises(ValueError, match="out_dir"):
        build_report("smollm2-135m", f)
