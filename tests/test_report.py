"""The report: its sections, the answer block, validity evidence, strict JSON, figures; end to
end on a tiny random Llama and (marked realmodel) on SmolLM2."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from embgeom.cells import Decoder
from embgeom.report import (
    bounds_report_section,
    build_report,
    cells_report_section,
    duplicate_rows,
    hidden_state_summary,
    read_cram_summary,
    supports_report_section,
)
from embgeom.report._markdown import md_table
from embgeom.supports import Ball, Box, clopper_pearson_lower
from embgeom.volumes import cell_volumes

ROOT = Path(__file__).resolve().parents[1]


def _refuse(constant):
    raise ValueError(f"report.json holds {constant}: not strict JSON")


def _strict(path) -> dict:
    return json.loads(Path(path).read_text(), parse_constant=_refuse)


def _cross_polytope(d):
    return np.vstack([np.eye(d), -np.eye(d)]).astype(np.float32)


# --------------------------------------------------------------------------- geometry does no I/O


GEOMETRY = [*sorted((ROOT / "embgeom" / "supports").glob("*.py")),
            *sorted((ROOT / "embgeom" / "bounds").glob("*.py")),
            *sorted((ROOT / "embgeom" / "cells").glob("*.py")), ROOT / "embgeom" / "volumes.py"]


@pytest.mark.parametrize("path", GEOMETRY, ids=lambda p: str(p.relative_to(ROOT)))
def test_geometry_modules_do_not_import_matplotlib_or_write(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "matplotlib" for a in node.names), path
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "matplotlib", path
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in ("savefig", "write_text", "to_csv"), (path, node.func.attr)
            if node.func.attr == "save":  # numpy.save writes a file
                assert not (isinstance(node.func.value, ast.Name) and node.func.value.id == "np"), path


def test_importing_geometry_loads_no_matplotlib():
    code = ("import sys, embgeom.supports, embgeom.bounds, embgeom.cells, embgeom.volumes; "
            "print('matplotlib' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_geometry_modules_keep_no_moved_names():
    # the report's names live in embgeom.report only: no module __getattr__ keeps them alive
    # in the geometry layers (a package never released needs no compatibility layer)
    import embgeom.bounds as B
    import embgeom.supports as S
    import embgeom.volumes as Vol

    for mod, name in ((B, "bounds_report_section"), (B, "plot_accessible_fraction"),
                      (S, "supports_report_section"), (Vol, "cells_report_section")):
        assert "__getattr__" not in vars(mod), mod.__name__
        with pytest.raises(AttributeError):
            getattr(mod, name)


# --------------------------------------------------------------------------- small pieces


def test_md_table_drops_empty_columns():
    t = md_table(["a", "b", "c"], [[1, None, "-"], [2, None, 3]], drop_empty=True)
    assert t.splitlines()[0] == "| a | c |" and t.splitlines()[2] == "| 1 | - |"
    t = md_table(["a", "b"], [[1, None]], drop_empty=True)
    assert "b" not in t.splitlines()[0]
    assert md_table(["a", "b"], [[1, None]]).splitlines()[0] == "| a | b |"


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


def test_report_refuses_a_missing_cram_summary_before_loading(tmp_path):
    with pytest.raises(FileNotFoundError, match="cram_summary"):
        build_report("no-such-model-name", tmp_path / "r", cram_summary=tmp_path / "nope.json")


# --------------------------------------------------------------------------- supports section


def _norm(d, gain=2.0):
    return types.SimpleNamespace(norm=types.SimpleNamespace(
        kind="rmsnorm", weight=np.full(d, gain, dtype=np.float32), bias=None, eps=1e-6))


def test_supports_section_fits_volumes_and_figure(tmp_path):
    rng = np.random.default_rng(1)
    H = rng.standard_normal((150, 5)) + 1
    sec = supports_report_section(H, tmp_path, unembedding=_norm(5), rinf=float(np.abs(H).max()))
    json.dumps(sec, allow_nan=False)
    for name in ("ball", "ball_origin", "ellipsoid", "cone", "box", "box_pca", "final_norm", "cube"):
        assert math.isfinite(sec[name]["log_volume"]), name
    assert sec["ellipsoid"]["log_volume"] < sec["ball"]["log_volume"] <= sec["ball_origin"]["log_volume"]
    assert sec["cube"]["log_volume"] == pytest.approx(5 * math.log(2 * np.abs(H).max()))
    assert (tmp_path / sec["figures"]["log_volume"]).stat().st_size > 1000
    assert sec["heldout"] is None and "heldout_valid" not in sec["ball"]
    with pytest.raises(ValueError, match="unknown"):
        supports_report_section(H, tmp_path, shapes=("sphere",))


def test_supports_section_validity_needs_the_lower_bound(tmp_path):
    """Validity is the one-sided 95% Clopper-Pearson lower bound >= 0.99: 300 fresh points all
    inside pass, 2 misses in 300 (share 0.993, which the old ">= 99%" rule passed) fail."""
    rng = np.random.default_rng(0)
    H = rng.standard_normal((200, 5))
    box = Box().fit(H)
    inside = box.sample(300, seed=1)
    sec, fitted = supports_report_section(H, tmp_path, shapes=("box", "ball"), heldout=inside,
                                          unembedding=_norm(5, gain=100.0), return_supports=True)
    e = sec["box"]
    assert e["heldout"]["n_inside"] == 300 and e["heldout_valid"] is True
    assert e["heldout_lower"] == pytest.approx(clopper_pearson_lower(300, 300))
    # the final-norm shell is certified whatever the sample says
    assert sec["final_norm"]["kind"] == "certified" and sec["final_norm"]["heldout_valid"] is True
    two_out = inside.copy()
    two_out[:2] = 50.0
    sec = supports_report_section(H, tmp_path, shapes=("box",), heldout=two_out)
    e = sec["box"]
    assert e["heldout_contained"] == pytest.approx(298 / 300) and e["heldout_valid"] is False
    assert e["heldout_lower"] == pytest.approx(clopper_pearson_lower(298, 300)) and e["heldout_lower"] < 0.99
    assert sec["heldout"]["not_valid"] == ["box"] and sec["heldout"]["min_points"] == 299
    with pytest.raises(ValueError, match="heldout"):
        supports_report_section(H, tmp_path, shapes=("ball",), heldout=np.ones((3, 4)))


def test_supports_section_bad_input_writes_nothing(tmp_path):
    H = np.random.default_rng(0).standard_normal((30, 4))
    with pytest.raises(ValueError, match="heldout"):
        supports_report_section(H, tmp_path / "s", shapes=("ball",), heldout=np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="calibration"):
        supports_report_section(H, tmp_path / "s", shapes=("ball",), calibration=np.ones((3, 5)))
    assert not (tmp_path / "s").exists()


def test_supports_section_conformal_shapes(tmp_path):
    """A tight fit that misses fresh points becomes valid once calibrated."""
    rng = np.random.default_rng(3)
    H, cal, fresh = (rng.standard_normal((n, 4)) for n in (60, 199, 2000))
    sec, fitted = supports_report_section(H, tmp_path, shapes=("ball", "box"), heldout=fresh,
                                          calibration=cal, alpha=0.005, return_supports=True)
    for name in ("ball", "box"):
        c = sec[name + "_conformal"]
        assert c["kind"] == "conformal" and c["of"] == name
        assert c["calibration"]["rank"] == 199 and c["calibration"]["n_calibration"] == 199
        scale = c["calibration"]["scale"]
        assert scale == pytest.approx(fitted[name].gauge(cal).max())
        assert c["log_volume"] == pytest.approx(sec[name]["log_volume"] + 4 * math.log(scale))
    assert sec["ball"]["heldout_valid"] is False  # 60 points: the ball misses fresh ones
    assert sec["ball_conformal"]["heldout_contained"] > sec["ball"]["heldout_contained"]
    # a conformal set the validity rule rejects: the report says why (coverage >= 1 - alpha on
    # average is not a 95% lower bound >= 0.99), once, naming the sets
    from embgeom.report._supports import supports_markdown

    sec = supports_report_section(H, tmp_path, shapes=("ball",), heldout=fresh,
                                  calibration=cal, alpha=0.02)
    md = supports_markdown(sec, H.shape)
    if "ball_conformal" in sec["heldout"]["not_valid"]:
        assert "Why 1 conformal set is marked not valid (ball_conformal)" in md
    else:
        assert "conformal set" not in md.split("Conformal calibration")[1].split("\n\n")[1]
    sec["heldout"]["not_valid"] = ["ball", "ball_conformal"]  # as 4 of 6 in SmolLM2's report
    md = supports_markdown(sec, H.shape)
    assert "Why 1 conformal set is marked not valid (ball_conformal)" in md
    assert "the 95% lower bound on the fresh share to reach 0.99" in md
    sec["heldout"]["not_valid"] = ["ball"]
    assert "Why" not in supports_markdown(sec, H.shape)
    # too small a calibration sample for the level: recorded, not raised
    sec = supports_report_section(H, tmp_path, shapes=("ball",), calibration=cal[:50], alpha=0.01)
    assert "at least 99" in sec["ball"]["calibration_error"] and "ball_conformal" not in sec


# --------------------------------------------------------------------------- cells section


class _Tok:
    def convert_ids_to_tokens(self, ids):
        return [f"tok{i}" for i in ids]


def test_cells_section_unargmaxable_and_duplicates(tmp_path):
    W = np.vstack([_cross_polytope(3), [[0.1, 0.1, 0.0]], [[1.0, 0.0, 0.0]]]).astype(np.float32)
    # token 6 lies inside the hull (LP-empty); token 7 repeats row 0 (duplicate)
    out = cells_report_section(Decoder(W), Ball.from_params(None, 1.0, dim=3), 2000, 0,
                               tmp_path / "rep", _Tok(), progress=False)
    json.dumps(out, allow_nan=False)
    un = out["unargmaxable"]
    assert un["n_unargmaxable"] == 2 and un["unargmaxable"] == [6, 7]
    assert out["duplicates"]["n_duplicates"] == 1
    assert out["duplicates"]["pairs"] == [{"token_id": 7, "same_row_as": 0, "token": "tok7",
                                           "same_row_as_token": "tok0"}]
    f = np.load(tmp_path / "rep" / out["fractions_path"])
    assert f.shape == (8,) and f[6] == 0 and f[7] == 0 and f.sum() == pytest.approx(1.0)
    assert out["n_unresolved"] == 2 and out["unresolved_share"] == 2 / 8
    assert (tmp_path / "rep" / out["figure"]).stat().st_size > 1000
    from embgeom.report._cells import unargmaxable_sentence

    s = unargmaxable_sentence(out)
    assert "2:" in s and "1 exact duplicate" in s and "1 with an empty cell" in s
    quick = dict(out, unargmaxable=None)
    assert "at least 1" in unargmaxable_sentence(quick) and "7 = 0" in unargmaxable_sentence(quick)


def test_duplicate_rows_with_bias():
    W = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    assert duplicate_rows(Decoder(W))["n_duplicates"] == 2
    # a different bias makes the rows distinct
    d = duplicate_rows(Decoder(W, np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float32)))
    assert d["n_duplicates"] == 1 and d["pairs"][0] == {"token_id": 3, "same_row_as": 0}


# --------------------------------------------------------------------------- bounds section


def test_bounds_section_values_table_and_figures(tmp_path):
    d, V = 16, 500
    rng = np.random.default_rng(0)
    ball = Ball.from_params(np.zeros(d), 4.0)
    sup = {"ball": ball, "ball_conformal": ball.scaled(1.1),
           "box": Box.from_params(-np.ones(d), 2 * np.ones(d)),
           "broken": types.SimpleNamespace(shape="torus")}
    f = rng.dirichlet(np.ones(V))
    sec = bounds_report_section({"hidden_size": d, "vocab_size": V}, sup, rinf=2.0, fractions=f,
                                published_c_emp=1.0, out_dir=tmp_path,
                                valid={"cube", "box", "ball_conformal"},
                                reasons={"ball": "holds 3 of 300 fresh hidden states"})
    json.dumps(sec, allow_nan=False)
    assert sec["eps"]["paper"] == 2.0 / 2048 and sec["eps"]["dtype"] == 2.0 * 2.0**-24
    assert sec["slope"]["cube"] == pytest.approx(d * math.log(1 + 2 * 2.0 / sec["eps"]["paper"]) / math.log(V))
    assert set(sec["slope"]) == {"cube", "ball", "ball_conformal", "box"} and "broken" in sec["errors"]
    # the conformal ball is the ball scaled by 1.1: every volumetric term moves, C grows
    assert sec["slope"]["ball_conformal"] > sec["slope"]["ball"]
    lam = sec["rate_lambda"]
    assert lam > math.log(V) and sec["lambda_usable"] is True  # no zero shares
    assert sec["slope_refined"]["box"] == pytest.approx(sec["slope"]["box"] * math.log(V) / lam)
    assert sec["ratio"]["box"] == pytest.approx(sec["slope"]["box"])
    # tightest: the smallest log P among the valid ones only (the raw ball is not valid)
    valid = {"cube", "box", "ball_conformal"}
    assert sec["tightest"] == min(valid, key=sec["log_packing"].get)
    assert sec["heldout_valid"]["ball"] is False
    # the ball's paper formula counts eps/2-balls; the rigorous bound counts eps-cubes: smaller
    assert "ball" in sec["paper_exceeds_rigorous"] and sec["binding_term"]["ball"].startswith("vinf")
    md = sec["markdown"]
    header = next(ln for ln in md.splitlines() if ln.startswith("| support | shape"))
    assert "C conformal" in header and "C / C_emp" in header
    ball_row = next(ln for ln in md.splitlines() if ln.startswith("| ball |"))
    assert f"{sec['slope']['ball_conformal']:.4g}" in ball_row
    assert "NO: ball: holds 3 of 300" in md and "C paper formula exceeds C rigorous" in md
    for key in ("linear_law", "accessible_fraction"):
        assert (tmp_path / sec["figures"][key]).stat().st_size > 1000
    # with most cells unresolved lambda is reported, not used
    f0 = f.copy()
    f0[:300] = 0.0
    f0 /= f0.sum()
    sec = bounds_report_section({"hidden_size": d, "vocab_size": V}, {"box": sup["box"]}, rinf=2.0,
                                fractions=f0, n_samples=1000, out_dir=tmp_path)
    assert sec["lambda_usable"] is False and "60.0% of the cells are unresolved" in sec["lambda_note"]
    assert "C refined" not in sec["markdown"].split("\n\n")[2]  # the column is dropped


# --------------------------------------------------------------------------- end to end, tiny


@pytest.fixture(scope="module")
def tiny_loaded():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.adapters import LoadedModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # two duplicate rows of lower ids: 20 = 3, 30 = 3
        model.lm_head.weight[20] = model.lm_head.weight[3]
        model.lm_head.weight[30] = model.lm_head.weight[3]
    return LoadedModel(model=model, tokenizer=None, name="tiny-llama", source=Path("tiny"),
                       source_dtype="float32 (random init)")


def _fake_cram(path: Path, c_emp: float) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    summary = {"model": "tiny-llama", "fit": {"c_emp": c_emp, "c_emp_lower": 0.9 * c_emp,
                                              "c_emp_upper": 1.1 * c_emp, "r2_uncentred": 0.99},
               "n50": {"1": {"n50": c_emp, "lower": 0.8 * c_emp, "upper": 1.2 * c_emp},
                       "2": {"n50": 2 * c_emp, "lower": None, "upper": 2.5 * c_emp}}}
    (path / "cram_summary.json").write_text(json.dumps(summary))
    return path


def test_report_end_to_end_on_a_tiny_model(tiny_loaded, tmp_path):
    out = tmp_path / "rep"
    cram = _fake_cram(tmp_path / "cram", 2.0)
    rep = build_report(tiny_loaded, out, lengths=[2, 4], n_per_length=40, heldout_lengths=[3, 5],
                       n_heldout_per_length=150, n_calibration_per_length=50, n_cell_samples=3000,
                       cram_summary=cram, seed=0, progress=False)
    disk = _strict(out / "report.json")
    assert list(disk)[:6] == ["embgeom_version", "created", "platform", "settings", "answer", "model"]
    ans, b, sup = disk["answer"], disk["bounds"], disk["supports"]
    # provenance of the three samples (conftest's $EMBGEOM_CACHE may already hold them)
    src = disk["hidden_states"]["sources"]
    assert [(k, v["seed"], v["lengths"]) for k, v in src.items()] == [
        ("fit", 0, [2, 4]), ("heldout", 1, [3, 5]), ("calibration", 2, [2, 4])]
    assert all(v["cache"] in ("hit", "written") and Path(v["path"]).is_file()
               for v in src.values()), src
    assert "Provenance: fit (seed 0): " in (out / "report.md").read_text()
    # the held-out rule, recomputed from the counts
    for name, e in sup.items():
        if isinstance(e, dict) and e.get("heldout"):
            ho = e["heldout"]
            assert ho["n"] == 300
            assert ho["lower_bound"] == pytest.approx(clopper_pearson_lower(ho["n_inside"], 300))
            if e["kind"] != "certified":
                assert e["heldout_valid"] == (ho["lower_bound"] >= 0.99), name
    # the bound is the smallest valid log P, and the sentence says why it is valid
    valid = [k for k, v in b["heldout_valid"].items() if v]
    assert ans["bound"]["support"] == b["tightest"] == min(valid, key=b["log_packing"].get)
    assert ans["bound"]["slope"] == pytest.approx(b["slope"][b["tightest"]])
    s = ans["bound"]["sentence"]
    assert f"C = {b['slope'][b['tightest']]:.4g}" in s and "eps = r_inf 2^-11" in s
    assert ("by construction" in s) if b["tightest"] == "final_norm" else (
        "fresh hidden states (prompt lengths 3, 5; seed 1), one-sided 95% lower bound" in s)
    # every rejected support is listed with its evidence
    rejected = {r["support"] for r in ans["rejected"]}
    assert rejected == {k for k, e in sup.items() if isinstance(e, dict) and "kind" in e
                        and e["kind"] != "certified" and e.get("heldout_valid") is False}
    # conformal shapes sit beside the raw fits
    assert "ball_conformal" in b["slope"] and sup["ball_conformal"]["calibration"]["n_calibration"] == 100
    # C_emp from the cram summary, and the ratio
    assert ans["c_emp"]["measured"] and ans["c_emp"]["value"] == 2.0
    assert ans["c_emp"]["ratio"] == pytest.approx(ans["bound"]["slope"] / 2.0)
    # a per-length summary without a budget sweep: C_emp is stated as a lower bound, with
    # how it was measured
    c_line = next(line for line in ans["lines"] if line.startswith("- **C_emp**"))
    assert ans["c_emp"]["converged"] is None and ans["c_emp"]["kind"] == "per-length"
    assert c_line.startswith("- **C_emp** >= 2 ") and "lower bound on the model's capacity" in c_line
    assert "no budget sweep" in c_line and "upper bound on the bound's looseness" in c_line
    # the two planted duplicates are found, and the exact scan names them as the cause
    assert disk["cells"]["duplicates"]["n_duplicates"] == 2
    assert ans["unargmaxable"]["count"] >= 2 and "20 = 3" in ans["unargmaxable"]["sentence"]
    # report.md opens with the answer; every figure exists and is named in report.md
    md = (out / "report.md").read_text()
    assert md.index("## Answer") < md.index("## Model") < md.index("## Packing bounds")
    for line in ans["lines"]:
        assert line in md
    for f in disk["figures"].values():
        assert (out / f).stat().st_size > 1000 and f in md
    assert set(disk["figures"]) == {"hidden_norms", "supports_log_volume", "cell_volumes",
                                    "cell_histogram", "accessible_fraction", "linear_law"}
    # the estimated tokens' log-shares are saved next to the figures, as the section says
    z = np.load(out / disk["cells"]["log_shares_path"])
    assert z["token_ids"].size == disk["cells"]["n_estimated"]
    # each share says which estimator made it, as the CellVolumes does
    assert set(z["token_method"]) <= {"rare-event", "uniform", "exact", "empty"}
    # the bounds table calls a ratio over a not-converged C_emp what it is: an upper bound
    assert "| C / C_emp (at most) |" in md
    # lambda names the support its cell shares come from and their budget; when the bound's
    # support is another, the line says so
    lam = ans["lambda"]
    assert lam["support"] == disk["cells"]["support"]
    if lam["usable"]:
        l_line = next(line for line in ans["lines"] if line.startswith("- **lambda**"))
        assert f"from the cell shares in support `{lam['support']}`" in l_line
        assert "chains per run" in l_line and lam["budget"] in l_line
        assert (f"the bound's support is `{ans['bound']['support']}`" in l_line) == (
            ans["bound"]["support"] != lam["support"])
    assert np.all(z["log_lower"][np.isfinite(z["log_shares"])] <= z["log_shares"][np.isfinite(z["log_shares"])])
    # one-line tables, no all-empty column
    for ln in md.splitlines():
        if ln.startswith("| support | shape"):
            assert "| — |" not in ln
    assert rep["summary_lines"][1].startswith("  - Model: tiny-llama")


def test_read_cram_summary(tmp_path):
    p = _fake_cram(tmp_path / "c", 3.0)
    s = read_cram_summary(p)
    assert s["c_emp"] == 3.0 and s["n50"]["2"]["lower"] is None
    with pytest.raises(ValueError, match="not 'other'"):
        read_cram_summary(p, "other")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not an `embgeom cram` summary"):
        read_cram_summary(tmp_path / "bad.json")
    from embgeom.report import find_cram_summary

    assert find_cram_summary("tiny-llama", search_dirs=("c",), root=tmp_path)["c_emp"] == 3.0
    assert find_cram_summary("tiny-llama", search_dirs=("nothing",), root=tmp_path) is None


# --------------------------------------------------------------------------- the real model


@pytest.mark.realmodel
def test_report_end_to_end_on_smollm2(smollm2, tmp_path):
    out = tmp_path / "rep"
    rep = build_report(smollm2, out, quick=True, lengths=[4, 8], n_per_length=16,
                       heldout_lengths=[6], n_heldout_per_length=40, n_calibration_per_length=0,
                       n_cell_samples=4000, seed=3, progress=False)
    on_disk = _strict(out / "report.json")
    for key in ("answer", "model", "hidden_states", "supports", "cells", "bounds", "settings",
                "figures", "timings_s"):
        assert key in on_disk
    m, h, b = on_disk["model"], on_disk["hidden_states"], on_disk["bounds"]
    assert (m["hidden_size"], m["vocab_size"], m["tied"]) == (576, 49152, True)
    assert h["n"] == 32 and h["dim"] == 576
    assert 0 < h["rinf_max"] <= h["r2_max"] <= h["certified_radius"]
    assert -1 <= h["cos_min"] <= h["cos_mean"] <= 1
    assert [r["length"] for r in h["per_length"]] == [4, 8]
    # Theorem 4.5 for the cube, computed here by hand: C = d log(1 + 2r/eps) / log|V| with
    # eps = r 2^-11, so C = 576 log(1 + 2^12) / log 49152 whatever r is.
    assert b["eps"]["paper"] == pytest.approx(h["rinf_max"] * 2.0**-11, rel=1e-12)
    assert b["slope"]["cube"] == pytest.approx(576 * math.log1p(2.0**12) / math.log(49152),
                                               rel=1e-9)
    # 40 fresh states can never make a fitted support valid; the final-norm shell is certified
    assert on_disk["supports"]["final_norm"]["heldout_contained"] == 1.0
    assert b["heldout_valid"]["final_norm"] is True and b["tightest"] == "final_norm"
    assert b["slope"]["final_norm"] < b["slope"]["cube"]
    ans = on_disk["answer"]
    assert ans["bound"]["support"] == "final_norm" and "by construction" in ans["bound"]["sentence"]
    # SmolLM2's 11 duplicate rows (special tokens and three subwords) are named as the cause
    assert on_disk["cells"]["duplicates"]["n_duplicates"] == 11
    assert "at least 11" in ans["unargmaxable"]["sentence"]
    # lambda comes from the rare-event log-shares of the seeded token sample (no zero filling),
    # with its bootstrap interval; non-uniform cells put it above log|V| (Jensen)
    r = b["rate"]
    assert r["token_sample"] and r["zero_fill"] == "none" and 0 < r["n_tokens_used"] < 49152
    assert r["rate_ci"][0] <= b["rate_lambda"] <= r["rate_ci"][1]
    assert ans["lambda"]["usable"] and b["rate_lambda"] > math.log(49152)
    # ... and the answer says whose shares they are: the origin ball's, not the bound's shell
    l_line = next(line for line in ans["lines"] if line.startswith("- **lambda**"))
    assert "from the cell shares in support `ball_origin` (a seeded sample of " in l_line
    assert "the bound's support is `final_norm`, whose shares may differ" in l_line
    assert "ball" in ans["paper_vs_rigorous"] or "final_norm" in ans["paper_vs_rigorous"]
    assert b["n_star"]["m"][:3] == [1, 2, 3]
    np.testing.assert_allclose(b["n_star"]["cube"][:3], b["slope"]["cube"] * np.arange(1, 4))
    f = np.load(out / on_disk["cells"]["fractions_path"])
    assert f.shape == (49152,) and f.sum() == pytest.approx(1.0, abs=1e-9)
    top = on_disk["cells"]["top"]
    assert len(top) == 20 and all(a["fraction"] >= z["fraction"] for a, z in zip(top, top[1:]))
    for png in on_disk["figures"].values():
        assert (out / png).stat().st_size > 1000, png
    md = (out / "report.md").read_text()
    assert md.index("## Answer") < md.index("## Packing bounds")
    assert rep["summary_lines"][0].startswith("embgeom report: smollm2-135m")


def test_cell_shares_title_counts_unresolved_among_the_cells_drawn():
    """2 unresolved of a 1,000-token sample is 0.2% of the sample (it once read 0.0%: 2/|V|)."""
    from embgeom.report.figures import _cell_shares_title

    t = _cell_shares_title("rare-event", None, 2, 1000, 49152)
    assert t.endswith("\n0.2% of the sampled cells unresolved")
    assert _cell_shares_title("uniform Monte Carlo", 100_000, 34124, 49152, 49152).endswith(
        ", 100,000 samples\n69.4% of cells unresolved")
    assert "\n" not in _cell_shares_title("rare-event", None, 0, 1000, 49152)


def test_accessibility_vs_bound_and_linear_law_figures(tmp_path):
    """The measured P(h >= n) is drawn on the bound's axes; the linear law has both panels."""
    from matplotlib.image import imread

    from embgeom.report import figures

    measured = {"1": {"lengths": [1, 2, 3, 4], "accessibility": [1, 1, 0.5, 0],
                      "lower": [0.7, 0.7, 0.2, 0], "upper": [1, 1, 0.8, 0.3]}}
    p = figures.plot_accessible_fraction({"ball (log|V|)": (500.0, None)}, 1000,
                                         tmp_path / "af.png", m_values=(1, 2),
                                         measured=measured)
    a = imread(p)
    assert a.shape[0] > 0.8 * a.shape[1]  # a top panel above the one row of cliff panels
    c = {"c_emp": 2.0, "c_emp_lower": 1.5, "c_emp_upper": 2.5,
         "n50": {"1": {"n50": 2.5, "lower": 2.0, "upper": 3.0}, "2": {"n50": 4.0}}}
    wide = imread(figures.plot_linear_law({"ball": 70.0}, tmp_path / "ll.png", c_emp=c))
    narrow = imread(figures.plot_linear_law({"ball": 70.0}, tmp_path / "ll0.png"))
    assert wide.shape[1] > 1.3 * narrow.shape[1]  # the measured panel beside the law
    with pytest.raises(ValueError, match="curves"):
        figures.plot_accessible_fraction({}, 1000, tmp_path / "x.png")


def _captured_figure(monkeypatch):
    """figures._save replaced: the figure is kept (and closed by the caller's test)."""
    from embgeom.report import figures

    kept = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: kept.append(fig) or str(path))
    return kept


def test_cell_histogram_keeps_the_bulk_readable_beside_one_far_token():
    """One cell 30 nats below the rest (SmolLM2 has one at -41 nats) used to squash every other
    token into a bin or two: it is a hatched bar past the edge, with its value written."""
    from embgeom.report.figures import plot_cell_histogram
    from embgeom.volumes import CellVolumes

    def rare_event_volumes(x):  # the fields the histogram reads, of a real result type
        V = x.size
        return CellVolumes(
            fractions=np.zeros(V), counts=np.zeros(V, np.int64), n_samples=1000,
            lower=np.zeros(V), upper=np.full(V, 3e-3), confidence=0.95,
            interval="clopper-pearson", support_log_volume=float("nan"), sampling="directions",
            seed=np.random.SeedSequence(0), seconds=0.0, extra={"rare_event": {"n_chains": 128}},
            log_fractions=x, log_lower=x - 0.1, log_upper=np.minimum(x + 0.1, 0.0),
            token_method=np.array(["rare-event"] * V), estimator="rare-event")

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-11.0, 1.0, 300), [-41.0]])
    ax = plot_cell_histogram(rare_event_volumes(x))
    bulk = [p for p in ax.patches if not p.get_hatch()]
    far = [p for p in ax.patches if p.get_hatch()]
    assert sum(p.get_height() for p in bulk) == 300 and len(far) == 1
    assert far[0].get_height() == 1
    assert min(p.get_x() for p in bulk) == pytest.approx(x[:300].min())  # the bulk spans the axis
    labels = ax.get_legend_handles_labels()[1]
    assert labels[1] == "1 token far below (the most extreme at -41.0 nats), axis not to scale"
    assert any(t.get_text() == "-41.0" for t in ax.texts)
    # few tokens: every one to scale, no fence
    ax = plot_cell_histogram(rare_event_volumes(x[-10:]))
    assert not any(p.get_hatch() for p in ax.patches)
    assert min(p.get_x() for p in ax.patches) == pytest.approx(-41.0)


def test_accessible_fraction_cliff_panels_are_in_nats(monkeypatch, tmp_path):
    from embgeom.report import figures

    kept = _captured_figure(monkeypatch)
    figures.plot_accessible_fraction({"ball": (500.0, None)}, 1000, tmp_path / "a.png",
                                     m_values=(1, 2))
    fig = kept[0]
    lower = fig.axes[1:]
    assert [a.get_ylabel() for a in lower] == ["log fraction, bound (nats)"] * 2
    assert lower[0].get_ylim()[0] == pytest.approx(-23.0)
    y = lower[0].get_lines()[0].get_ydata()
    # past n* the bound falls log|V| = 6.91 nats per token (not log10|V| = 3 decades)
    assert np.diff(y[y < -1e-9])[:3] == pytest.approx([-math.log(1000)] * 3)
    assert "log|V| = 6.91 nats per token" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="depth_nats"):
        figures.plot_accessible_fraction({"ball": (500.0, None)}, 1000, tmp_path / "a.png",
                                         depth_nats=0)


def test_linear_law_draws_close_slopes_as_one_band_and_lists_each(monkeypatch, tmp_path):
    """Valid supports with C = 298-318 coincided as lines on the log axis: the tightest is the
    line, the rest the band they span, and every C is written out."""
    from embgeom.report import figures

    kept = _captured_figure(monkeypatch)
    slopes = {"ellipsoid": 318.2, "ball": 298.4, "box": 305.0}
    figures.plot_linear_law(slopes, tmp_path / "ll.png")
    ax = kept[0].axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:2] == ["the bound, ball: C = 298.4 (tightest valid support)",
                          "3 valid supports: C = 298.4 to 318.2"]
    listing = [t.get_text() for t in ax.texts if t.get_text().startswith("valid supports")][0]
    assert listing.splitlines()[1:] == ["  ball: 298.4", "  box: 305", "  ellipsoid: 318.2"]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), 298.4 * np.arange(1, 9))


def test_cell_histogram_title_names_the_splitting_budget_that_ran():
    """Under cell_volumes' default target_se the tokens take several blocks of chains; the
    title said "128 chains per token" whatever ran (a new user's trial)."""
    W = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    ball = Ball.from_params(np.zeros(4), 1.0)
    cv = cell_volumes(Decoder(W), ball, 500, seed=0, method="rare-event", progress=False)
    runs = cv.extra["rare_event_n_runs"][cv.token_method == "rare-event"]
    title = cv.histogram().get_title()
    assert "runs of 128 chains until se 0.12 nats" in title
    assert f"({runs.min()}-{runs.max()} blocks per token, pilot included)" in title
    one = cell_volumes(Decoder(W), ball, 500, seed=0, method="rare-event", progress=False,
                       target_se=None)
    assert "one run of 128 chains per token" in one.histogram().get_title()


def test_report_wording_names_the_pilot_and_the_supports_left_out():
    """A new-user pass read "one run per token" beside total_runs = 2 per token (the pilot is a
    run too), and could not tell why box_pca was missing from the paper-vs-rigorous sentence."""
    from embgeom.report._bounds import paper_vs_rigorous_sentence
    from embgeom.report._cells import splitting_budget

    phrase = splitting_budget({"rare_event": {"n_tokens": 10, "n_by_counts": 0, "token_sample": 10,
                                              "target_se": None, "n_chains": 128,
                                              "median_interval_width": 2.0}})
    assert "one counted run per token, after a pilot run" in phrase
    sec = {"paper_exceeds_rigorous": ["ball", "box"],
           "binding_term": {"ball": "vinf_ball", "box": "vinf_box", "box_pca": "paper"},
           "slope_paper_formula": {"ball": 3.0, "box": 2.0, "box_pca": 1.0, "ball_conformal": 1.0}}
    s = paper_vs_rigorous_sentence(sec, 576)
    assert s.startswith("C paper formula exceeds C rigorous for ball, box:")
    assert s.endswith("For box_pca the paper's formula is at or below the rigorous bound, so they "
                      "are not listed.")


def test_accessible_fraction_panels_follow_the_measured_m(monkeypatch, tmp_path):
    """The lower panels were drawn at m = 1, 2, 4, 8 beside a measurement at m = 1, 2, 3: a
    reader looked for the m = 3 panel and found m = 4 and 8 without points."""
    from embgeom.report import _bounds as B

    seen = []

    def fake(curves, V, path, *, m_values, measured=None, **kw):
        seen.append(tuple(m_values))
        return str(path)

    monkeypatch.setattr(B.figures, "plot_accessible_fraction", fake)
    monkeypatch.setattr(B.figures, "plot_linear_law", lambda *a, **k: str(tmp_path / "l.png"))
    curve = {"lengths": [1, 2], "accessibility": [1.0, 0.5], "lower": [0.8, 0.2], "upper": [1.0, 0.8]}
    for measured, want in (({"1": curve, "3": curve, "2": curve, "4": None}, (1, 2, 3)),
                           (None, (1, 2, 4, 8))):
        c_emp = None if measured is None else {"curves": measured}
        B._bounds_figures(tmp_path, {"ball": 500.0}, {"ball": 40.0}, ["ball"], "ball", 1000,
                          None, c_emp, {"ball": True}, 8)
        assert seen[-1] == want


def test_linear_law_band_leaves_out_the_cube_and_certified_bars_are_marked(monkeypatch, tmp_path):
    """The L-inf cube's C (far above the fitted supports') stretched the linear-law band over
    the plot; the certified final-norm bar looked like a fitted one."""
    from embgeom.report import _bounds as B

    laws = []
    monkeypatch.setattr(B.figures, "plot_accessible_fraction", lambda *a, **k: str(tmp_path / "a.png"))
    monkeypatch.setattr(B.figures, "plot_linear_law",
                        lambda law, path, **k: laws.append(dict(law)) or str(path))
    lp = {"ball": 500.0, "box": 520.0, "cube": 4000.0}
    B._bounds_figures(tmp_path, lp, {"ball": 40.0, "box": 42.0, "cube": 300.0},
                      ["ball", "box", "cube"], "ball", 1000, None, None,
                      {"ball": True, "box": True, "cube": True}, 8)
    assert laws[-1] == {"ball": 40.0, "box": 42.0}
    B._bounds_figures(tmp_path, lp, {"ball": 40.0, "box": 42.0, "cube": 300.0}, ["cube"], "cube",
                      1000, None, None, {"ball": False, "box": False, "cube": True}, 8)
    assert laws[-1] == {"cube": 300.0}  # alone, it is the bound

    from embgeom.report import figures

    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, target: drawn.setdefault("fig", fig) and str(target))
    rows = [{"name": "final_norm", "log_volume": -900.0, "valid": True, "kind": "certified"},
            {"name": "ball", "log_volume": -1000.0, "valid": True, "kind": "fit"}]
    figures.plot_support_volumes(rows, tmp_path / "s.png")
    ax = drawn["fig"].axes[0]
    hatches = [p.get_hatch() for p in ax.patches]
    assert hatches == ["xx", ""] or hatches == ["xx", None]
