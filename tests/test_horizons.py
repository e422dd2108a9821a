"""Per-target horizons by progressive cramming (embgeom.cramming.horizons), on tiny models.

What can be wrong, and is checked here:
- the horizon's memory vectors really cram the first h tokens (teacher-forced and greedy);
- with ``warm_start=False`` each length is a fresh per-length run, so the horizon equals the
  first failure of :func:`cram` run length by length with the same seed and budget;
- a run cut short and resumed from its checkpoint gives the uninterrupted run's records;
- P(h >= n) and n50 (median horizon) are computed right (hand-computed cases).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embgeom.cramming import (
    PROTOCOLS,
    CramProtocol,
    HorizonCurve,
    cram,
    greedy_generate,
    horizons,
    teacher_forced_accuracy,
)
from embgeom.cramming import _horizons
from embgeom._validation import seed_sequence

VOCAB, D = 96, 48


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _tiny(dtype=torch.float32, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=2 * D,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, initializer_range=0.3,
                      tie_word_embeddings=False, bos_token_id=1, attn_implementation="eager")
    return LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture(scope="module")
def tiny():
    return _tiny()


@pytest.fixture(scope="module")
def run(tiny):
    return horizons(tiny, 1, n_targets=8, max_length=12, protocol="adam", steps_per_length=80,
                    n_boot=100, seed=0)


# ------------------------------------------------------------------ HorizonCurve, by hand


def test_curve_accessibility_and_n50_by_hand():
    recs = [{"target_index": j, "horizon": h, "censored": False}
            for j, h in enumerate([3, 5, 5, 8])]
    c = HorizonCurve.from_records(recs, n_mem=1, max_length=8, n_boot=200)
    n, p, lo, hi = c.accessibility()
    np.testing.assert_array_equal(n, np.arange(1, 9))
    np.testing.assert_allclose(p, [1, 1, 1, 0.75, 0.75, 0.25, 0.25, 0.25])
    assert np.all(lo <= p) and np.all(p <= hi)
    r = c.n50()
    assert r["n50"] == 5.0 and not r["censored"]
    assert 3 <= r["lower"] <= 5 <= r["upper"] <= 8
    ac = c.as_accessibility_curve()
    np.testing.assert_array_equal(ac.successes, [4, 4, 4, 3, 3, 1, 1, 1])
    # a censored horizon at or below the median makes n50 a lower bound
    recs[0]["censored"] = True
    assert HorizonCurve.from_records(recs, n_mem=1, max_length=8).n50()["censored"]
    recs[0]["censored"], recs[3]["censored"] = False, True
    assert not HorizonCurve.from_records(recs, n_mem=1, max_length=8).n50()["censored"]


def test_curve_rejects_bad_records():
    with pytest.raises(ValueError, match="horizon"):
        HorizonCurve.from_records([{"target_index": 0}], n_mem=1, max_length=4)
    with pytest.raises(ValueError, match="no finished target"):
        HorizonCurve.from_records([], n_mem=1, max_length=4).n50()


# ------------------------------------------------------------------ protocols


def test_protocols_validate_and_have_sources():
    for name, p in PROTOCOLS.items():
        assert p.name == name and len(p.source) > 20
    with pytest.raises(ValueError, match="lr"):
        CramProtocol("x", "s", lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        CramProtocol("x", "s", betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="parametrisation"):
        CramProtocol("x", "s", algorithm="lbfgs", parametrisation="whitened")
    with pytest.raises(ValueError, match="protocol"):
        _horizons.get_protocol("no-such-optimiser")


def test_bad_arguments_are_named(tiny):
    with pytest.raises(ValueError, match="steps_per_length"):
        horizons(tiny, 1, n_targets=2, max_length=4, steps_per_length=0)
    with pytest.raises(ValueError, match="n_mem"):
        horizons(tiny, 0, n_targets=2, max_length=4)
    with pytest.raises(TypeError, match="protocol"):
        horizons(tiny, 1, n_targets=2, max_length=4, protocol=3)
    with pytest.raises(ValueError, match="precision"):
        horizons(tiny, 1, n_targets=2, max_length=4, precision="fp8")


# ------------------------------------------------------------------ the runs


def test_horizon_vectors_cram_their_prefix(tiny, run):
    T = run.targets
    assert run.complete and len(run.memory) == 8
    assert run.horizons.max() > run.horizons.min()  # a real spread at this budget
    for r in run.records:
        j, h = r["target_index"], r["horizon"]
        lengths = [L for L, _ in r["lengths_steps"]]
        assert lengths == sorted(set(lengths))  # each length tried once, growing
        if r["stop_reason"] == "budget":
            assert lengths[-1] == h + 1 and r["lengths_steps"][-1][1] == 80
        if h == 0:
            continue
        acc = teacher_forced_accuracy(tiny, run.memory[j][None], T[j : j + 1, :h])
        assert acc[0] == 1.0
        gen = greedy_generate(tiny, run.memory[j][None], h)
        assert (gen[0] == T[j, :h]).all() and r["generation_ok"]


@pytest.mark.parametrize("precision", ["bf16-autocast", "bf16-linear"])
def test_bf16_horizons_are_float32_horizons(tiny, precision, monkeypatch):
    """Under a bf16 precision every length a target grows past was confirmed by a float32
    forward: each recorded horizon's vector crams its prefix in float32 (teacher-forced), the
    record names the precision, and the optimisation steps did run in bf16."""
    seen = []
    real = _horizons._model_forward

    def spy(hf, x, keep, prec):
        seen.append(prec)
        return real(hf, x, keep, prec)

    monkeypatch.setattr(_horizons, "_model_forward", spy)
    r = horizons(tiny, 1, n_targets=4, max_length=8, protocol="adam", steps_per_length=80,
                 n_boot=0, seed=0, precision=precision)
    assert set(seen) == {precision, "float32"}
    assert {rec["settings"]["precision"] for rec in r.records} == {precision}
    assert r.horizons.max() >= 2
    for rec in r.records:
        j, h = rec["target_index"], rec["horizon"]
        if h:
            acc = teacher_forced_accuracy(tiny, r.memory[j][None], r.targets[j : j + 1, :h])
            assert acc[0] == 1.0


def test_accessibility_is_p_h_at_least_n(run):
    n, p, _, _ = run.accessibility()
    assert np.all(np.diff(p) <= 0)
    for L, pL in zip(n, p):
        assert pL == np.mean(run.horizons >= L)


def test_cold_start_equals_per_length_cram():
    """warm_start=False: each length a fresh run of the same budget from the same start, so
    the horizon is one less than the first length cram() fails (float64: no rounding flips)."""
    m = _tiny(torch.float64, seed=1)
    S = 60
    hc = horizons(m, 1, n_targets=4, max_length=8, protocol="adam", steps_per_length=S,
                  warm_start=False, check_generation=False, n_boot=0, batch_size=4)
    T = hc.targets
    for r in hc.records:
        j, h = r["target_index"], r["horizon"]
        seeds = [seed_sequence(0, _horizons._TAG_HORIZON, 1, j)]
        for k in range(1, min(h + 1, 8) + 1):
            res = cram(m, T[j : j + 1, :k], 1, steps=S, lr=1e-2, seed=seeds,
                       check_generation=False)
            assert bool(res.success[0]) == (k <= h), (j, k, h)
            if k <= h:  # the same number of updates to success
                assert int(res.steps[0]) == dict(map(tuple, r["lengths_steps"]))[k]


class _Stop(Exception):
    pass


def test_resume_from_checkpoint_equals_uninterrupted(tiny, tmp_path, monkeypatch):
    kw = dict(n_targets=4, max_length=10, protocol="progressive", steps_per_length=40,
              check_generation=False, n_boot=0, batch_size=4, checkpoint_every=5)
    whole = horizons(tiny, 1, jsonl=tmp_path / "a.jsonl", **kw)
    calls = {"n": 0}
    real = _horizons._adam_update

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 23:  # after 4 checkpoints, mid-interval
            raise _Stop
        return real(*a, **k)

    monkeypatch.setattr(_horizons, "_adam_update", flaky)
    with pytest.raises(_Stop):
        horizons(tiny, 1, jsonl=tmp_path / "b.jsonl", **kw)
    assert (tmp_path / "b.jsonl.ckpt" / "batch_0.pt").exists()
    calls["n"] = 0

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(_horizons, "_adam_update", counting)
    horizons(tiny, 1, jsonl=tmp_path / "c.jsonl", **kw)
    n_whole, calls["n"] = calls["n"], 0
    resumed = horizons(tiny, 1, jsonl=tmp_path / "b.jsonl", **kw)
    # it resumed from the checkpoint (step 20), not from the start: a checkpoint that failed to
    # load would restart the batch and give the same horizons, so count the updates
    assert calls["n"] == n_whole - 20
    np.testing.assert_array_equal(whole.horizons, resumed.horizons)
    for a, b in zip(whole.records, resumed.records):
        for key in ("horizon", "steps", "lengths_steps", "stop_reason", "loss_at_failure"):
            assert a[key] == b[key], key
    assert not (tmp_path / "b.jsonl.ckpt" / "batch_0.pt").exists()
    # a rerun finds every record and runs nothing
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    again = horizons(tiny, 1, jsonl=tmp_path / "b.jsonl", **kw)
    assert (tmp_path / "b.jsonl").read_text().splitlines() == lines
    np.testing.assert_array_equal(again.horizons, whole.horizons)
    for line in lines:
        json.loads(line)  # strict JSON


@pytest.mark.parametrize("name", ["cosine", "restarts", "whitened", "lowrank", "lbfgs"])
def test_every_preset_runs_and_crams(tiny, name):
    hc = horizons(tiny, 1, n_targets=2, max_length=6, protocol=name, steps_per_length=30,
                  n_boot=0, check_generation=True)
    for r in hc.records:
        assert r["protocol"] == name and r["stop_reason"] in _horizons.HORIZON_STOP_REASONS
        if r["horizon"]:
            assert r["generation_ok"]


# ------------------------------------------------------------------ the job and its summary


def test_budget_converged_rule():
    from embgeom.cramming import budget_converged

    r = budget_converged({1000: 10.0, 3000: 20.0, 10000: 21.5})
    assert r["converged"] and r["budgets"] == [3000, 10000] and abs(r["change"] - 0.075) < 1e-12
    r = budget_converged({3000: 20.0, 1000: 10.0, 10000: 22.5})  # order does not matter
    assert not r["converged"] and abs(r["change"] - 0.125) < 1e-12
    with pytest.raises(ValueError, match="two budgets"):
        budget_converged({1000: 3.0})
    with pytest.raises(ValueError, match="finite"):
        budget_converged({1000: 3.0, 3000: float("nan")})


def test_run_horizons_summary_is_read_by_the_report(tiny, tmp_path):
    from embgeom.cramming import run_horizons
    from embgeom.report import read_cram_summary

    s = run_horizons(tiny, [1, 2], tmp_path, n_targets=4, max_length={1: 8, 2: 12},
                     protocol="progressive", steps_per_length=40, n_boot=100, progress=False)
    assert s["kind"] == "horizons" and set(s["n50"]) == {"1", "2"}
    for m in ("1", "2"):
        h = np.array(s["horizons"][m]["horizons"])
        assert s["n50"][m]["n50"] == float(np.median(h))
        # the curve is P(h >= n) at every n
        c = s["curves"][m]
        np.testing.assert_allclose(c["accessibility"],
                                   [np.mean(h >= n) for n in c["lengths"]])
    assert (tmp_path / "cram_summary.md").read_text().startswith("# Cramming horizons")
    assert "lower bound" in (tmp_path / "cram_summary.md").read_text()
    json.loads((tmp_path / "cram_summary.json").read_text())
    r = read_cram_summary(tmp_path)
    assert r["n50"]["1"]["n50"] == s["n50"]["1"]["n50"]
    assert r["protocol"] == "progressive" and r["kind"] == "horizons"
    assert r["converged"] is None and r["target_source"] == "random-tokens"


def test_summarise_horizons_reads_whole_batches_of_a_run_in_progress(tiny, tmp_path):
    """summarise_horizons equals run_horizons' summary on a finished run; with records missing
    it keeps only whole batches of the first targets (a batch cut short would keep its short
    horizons and bias n50 low), drops an m with none, and refuses two runs in one file; the
    report prefers it (a horizons run) over a newer per-length summary and random tokens over
    words."""
    import os

    from embgeom.cramming import run_horizons, summarise_horizons
    from embgeom.report import find_cram_summary, read_cram_summary

    run = tmp_path / "run"
    s = run_horizons(tiny, [1, 2], run, n_targets=4, max_length={1: 8, 2: 12}, batch_size=2,
                     protocol="progressive", steps_per_length=40, n_boot=100, progress=False)
    jsonl = run / "horizons.jsonl"
    lines = [x for x in jsonl.read_text().splitlines() if x.strip()]
    full = summarise_horizons(run, n_boot=100, plot=False)
    assert full["settings"]["interim"] and full["settings"]["n_targets"] == {"1": 4, "2": 4}
    for m in ("1", "2"):
        assert full["n50"][m] == s["n50"][m]
        assert full["horizons"][m]["horizons"] == s["horizons"][m]["horizons"]
    assert full["fit"]["c_emp"] == s["fit"]["c_emp"]
    assert "interim" in (run / "cram_summary.md").read_text()

    # m = 1 lost target 3 (its batch 2-3 is not whole), m = 2 lost target 1 (no whole batch)
    recs = [json.loads(x) for x in lines]
    keep = [x for x, r in zip(lines, recs)
            if (r["n_mem"], r["target_index"]) not in ((1, 3), (2, 1))]
    part = tmp_path / "part"
    part.mkdir()
    (part / "horizons.jsonl").write_text("\n".join(keep) + "\n")
    p = summarise_horizons(part, n_boot=100, plot=False)
    h1 = [r["horizon"] for r in sorted(recs, key=lambda r: r["target_index"])
          if r["n_mem"] == 1][:2]
    assert p["settings"]["n_targets"] == {"1": 2} and set(p["n50"]) == {"1"}
    assert p["n50"]["1"]["n50"] == float(np.median(h1))
    assert p["fit"] is None and "two values of m" in p["fit_error"]

    other = json.loads(lines[0])
    other["settings_hash"] = "0" * 16
    other["target_index"] = 99
    (part / "horizons.jsonl").write_text("\n".join(keep + [json.dumps(other)]) + "\n")
    with pytest.raises(ValueError, match="different settings"):
        summarise_horizons(part, plot=False)
    with pytest.raises(FileNotFoundError, match="horizons.jsonl"):
        summarise_horizons(tmp_path / "nowhere")

    # the report's choice: a horizons summary over a newer per-length one, random tokens first
    per_length = json.loads((run / "cram_summary.json").read_text())
    per_length.update(kind="per-length")
    per_length["settings"] = {**per_length["settings"], "kind": "per-length"}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "cram_summary.json").write_text(json.dumps(per_length))
    words = json.loads((run / "cram_summary.json").read_text())
    words["settings"]["target_source"] = "wordlist"
    words["settings"]["n_targets"] = {"1": 40, "2": 40}
    (tmp_path / "words").mkdir()
    (tmp_path / "words" / "cram_summary.json").write_text(json.dumps(words))
    for d in ("old", "words"):  # newer than the horizons run's summary
        os.utime(tmp_path / d / "cram_summary.json", (2e9, 2e9))
    name = read_cram_summary(run)["model"]
    best = find_cram_summary(name, search_dirs=["."], root=tmp_path)
    assert best["source"] == str(tmp_path / "./run/cram_summary.json") or \
        Path(best["source"]).resolve() == (run / "cram_summary.json").resolve()
    assert best["interim"] and best["target_source"] == "random-tokens"


def test_run_horizons_per_m_target_counts_then_more_equals_one_run(tiny, tmp_path):
    """n_targets={1: 4, 2: 2} runs 4 and 2 targets; a second call at 4 for both resumes m = 1
    (no new record) and adds targets 2, 3 of m = 2, whose horizons equal a one-shot run's."""
    from embgeom.cramming import run_horizons

    kw = dict(max_length={1: 8, 2: 10}, protocol="progressive", steps_per_length=30,
              batch_size=2, n_boot=0, plot=False, progress=False)
    a = run_horizons(tiny, [1, 2], tmp_path / "a", n_targets={1: 4, 2: 2}, **kw)
    assert [len(a["horizons"][m]["horizons"]) for m in ("1", "2")] == [4, 2]
    assert a["settings"]["n_targets"] == {"1": 4, "2": 2}
    assert "4 (m = 1), 2 (m = 2) targets" in (tmp_path / "a" / "cram_summary.md").read_text()
    lines = (tmp_path / "a" / "horizons.jsonl").read_text().splitlines()
    b = run_horizons(tiny, [1, 2], tmp_path / "a", n_targets=4, **kw)
    assert b["settings"]["n_targets"] == 4
    assert (tmp_path / "a" / "horizons.jsonl").read_text().splitlines()[:len(lines)] == lines
    assert len((tmp_path / "a" / "horizons.jsonl").read_text().splitlines()) == len(lines) + 2
    one = run_horizons(tiny, [1, 2], tmp_path / "one", n_targets=4, **kw)
    for m in ("1", "2"):
        assert b["horizons"][m]["horizons"] == one["horizons"][m]["horizons"]
    with pytest.raises(ValueError, match="n_targets: no number of targets for m = \\[2\\]"):
        run_horizons(tiny, [1, 2], tmp_path / "c", n_targets={1: 2}, **kw)
    with pytest.raises(ValueError, match="n_targets"):
        run_horizons(tiny, [1], tmp_path / "d", n_targets={1: 0}, **kw)


# ------------------------------------------------------------------ per-length resume (issue 21)


def test_per_length_resume_of_a_torn_record_reruns_its_whole_batch(tiny, tmp_path):
    """The last record cut mid-write: the resumed file equals the uninterrupted one, record for
    record (the torn target is crammed again with its original batch partners, not alone)."""
    from embgeom.cramming import accessibility_curve

    kw = dict(steps=60, lr=1e-2, batch_size=4, check_generation=False, progress=False)
    path = tmp_path / "c.jsonl"
    accessibility_curve(tiny, 1, [6], 8, jsonl=path, **kw)
    whole = path.read_text().splitlines()
    keep = "\n".join(whole[:-1]) + "\n" + whole[-1][: len(whole[-1]) // 2]
    path.write_text(keep)  # the last target's line torn mid-write
    accessibility_curve(tiny, 1, [6], 8, jsonl=path, **kw)
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")
             and line.endswith("}")]
    a = {json.loads(x)["target_index"]: json.loads(x) for x in whole}
    b = {json.loads(x)["target_index"]: json.loads(x) for x in lines}
    assert sorted(b) == sorted(a)
    for j in a:
        for key in ("success_teacher_forced", "steps", "loss", "accuracy", "memory_norm"):
            assert a[j][key] == b[j][key], (j, key)


# ------------------------------------------------------------------ the CLI


def test_cli_protocol_names_match_the_presets():
    from embgeom import cli
    from embgeom.cramming import DEFAULT_PROTOCOL

    assert set(cli.CRAM_PROTOCOL_NAMES) == set(PROTOCOLS)
    assert cli.CRAM_DEFAULT_PROTOCOL == DEFAULT_PROTOCOL


def test_cli_cram_horizons(tiny, tmp_path, monkeypatch, capsys):
    from embgeom import cli
    from embgeom.cramming import _horizon_run

    monkeypatch.setattr(_horizon_run, "_load", lambda name: tiny)
    rc = cli.main(["cram", "--horizons", "--model", "tiny", "--out", str(tmp_path), "--mem", "1",
                   "--n-targets", "2", "--max-length", "5", "--steps-per-length", "20",
                   "--protocol", "adam", "-q"])
    assert rc == 0
    s = json.loads((tmp_path / "cram_summary.json").read_text())
    assert s["kind"] == "horizons" and s["settings"]["protocol"]["name"] == "adam"
    assert s["settings"]["steps_per_length"] == 20
    # per-length flags are refused with --horizons, and presets other than paper without it
    assert cli.main(["cram", "--horizons", "--model", "tiny", "--out", str(tmp_path),
                     "--steps", "10", "-q"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert cli.main(["cram", "--model", "tiny", "--out", str(tmp_path), "--protocol",
                     "progressive", "-q"]) == 2
    assert "--horizons" in capsys.readouterr().err
    assert cli.main(["cram", "--model", "tiny", "--out", str(tmp_path), "--max-length", "9",
                     "-q"]) == 2


def test_targets_longer_than_the_model_are_refused_by_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1,
                                   n_head=2, bos_token_id=1)).eval()
    with pytest.raises(ValueError, match="max_length: .* exceed the model's maximum"):
        horizons(m, 2, n_targets=1, max_length=20)
    with pytest.raises(ValueError, match="targets: .* exceed the model's maximum"):
        cram(m, np.ones((1, 20), np.int64), 1, steps=1)


def test_mixed_batches_resume_a_torn_record_with_the_same_partners(tiny, tmp_path):
    from embgeom.cramming import mixed_curves

    kw = dict(n_batches=2, steps=40, lr=1e-2, check_generation=False, progress=False)
    path = tmp_path / "m.jsonl"
    mixed_curves(tiny, {1: [4, 6], 2: [6]}, 3, jsonl=path, **kw)
    whole = path.read_text().splitlines()
    path.write_text("\n".join(whole[:-1]) + "\n" + whole[-1][:30])
    mixed_curves(tiny, {1: [4, 6], 2: [6]}, 3, jsonl=path, **kw)
    good = [x for x in path.read_text().splitlines() if x.startswith("{") and x.endswith("}")]
    key = lambda r: (r["n_mem"], r["length"], r["target_index"])  # noqa: E731
    a = {key(json.loads(x)): json.loads(x) for x in whole}
    b = {key(json.loads(x)): json.loads(x) for x in good}
    assert sorted(a) == sorted(b) and len(good) == len(whole)
    for k in a:
        assert (a[k]["loss"], a[k]["steps"], a[k]["memory_norm"]) == \
            (b[k]["loss"], b[k]["steps"], b[k]["memory_norm"]), k


# ------------------------------------------------------------------ a new user's findings


def test_bad_init_scale_and_job_arguments_are_named(tiny, tmp_path):
    from embgeom.cramming import run_horizons

    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="init_scale"):
            horizons(tiny, 1, n_targets=2, max_length=3, init_scale=bad)
    with pytest.raises(TypeError, match="init_scale"):
        horizons(tiny, 1, n_targets=2, max_length=3, init_scale="1")
    kw = dict(n_targets=2, max_length=3, steps_per_length=5, progress=False)
    with pytest.raises(ValueError, match="max_length: no length for m = \\[1\\]"):
        run_horizons(tiny, [1, 2], tmp_path / "a", **{**kw, "max_length": {2: 3}})
    with pytest.raises(TypeError, match="converged"):
        run_horizons(tiny, [1], tmp_path / "b", converged="yes", **kw)
    with pytest.raises(ValueError, match="c_theory"):
        run_horizons(tiny, [1], tmp_path / "c", c_theory=float("nan"), **kw)
    with pytest.raises(TypeError, match="plot"):
        run_horizons(tiny, [1], tmp_path / "d", plot="no", **kw)
    with pytest.raises(ValueError, match="out_dir"):
        run_horizons(tiny, [1], None, **kw)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "cram_summary.json").write_text('{"model": "x", "n50": {}}')
    with pytest.raises(ValueError, match="another run's cram_summary"):
        run_horizons(tiny, [1], tmp_path / "e", **kw)


def test_n50_is_a_lower_bound_when_a_censored_horizon_sets_the_median():
    recs = [{"target_index": i, "horizon": h, "censored": c}
            for i, (h, c) in enumerate([(3, False), (7, False), (8, True), (8, True)])]
    r = HorizonCurve.from_records(recs, n_mem=2, max_length=8).n50()
    assert r["n50"] == 7.5 and r["censored"]  # the upper middle horizon is censored
    recs[2]["censored"] = False
    assert not HorizonCurve.from_records(recs, n_mem=2, max_length=8).n50()["censored"]


def test_accessibility_refuses_lengths_never_tried():
    c = HorizonCurve.from_records([{"target_index": 0, "horizon": 3}], n_mem=1, max_length=8)
    with pytest.raises(ValueError, match="lengths"):
        c.accessibility([100])
    with pytest.raises(TypeError, match="lengths"):
        c.accessibility([2.7])
    assert "records" not in repr(c) and "memory" not in repr(c)


def _synthetic_horizons(folder, horizons_by_m, max_length=40):
    """A horizons.jsonl of hand-made records (no model): ``{m: [h, ...]}``, batch size 2."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for m, hs in horizons_by_m.items():
        st = {"kind": "horizons", "n_mem": m, "max_length": max_length, "batch_size": 2,
              "seed": 0, "protocol": {"name": "progressive", "lr": 0.1, "source": "a test"},
              "steps_per_length": 10}
        lines += [json.dumps({"kind": "horizon", "settings_hash": f"hash{m}", "n_mem": m,
                              "target_index": i, "horizon": h, "censored": False,
                              "settings": st}) for i, h in enumerate(hs)]
    (folder / "horizons.jsonl").write_text("\n".join(lines) + "\n")
    return lines


@pytest.mark.parametrize("key, value, match", [
    ("horizon", float("nan"), r"line 2 .*'horizon' must be an integer in \[0, max_length = 40\]"),
    ("horizon", "x", r"line 2 .*'horizon' must be an integer"),
    ("horizon", None, r"line 2 .*'horizon' must be an integer"),
    ("horizon", 10**9, r"line 2 .*'horizon' must be an integer in \[0, max_length = 40\]"),
    ("horizon", -5, r"line 2 .*'horizon'"),
    ("horizon", 7.0, r"line 2 .*'horizon'"),
    ("n_mem", 0, r"line 2 .*'n_mem' must be an integer >= 1, got 0"),
    ("target_index", -1, r"line 2 .*'target_index' must be an integer >= 0"),
    ("censored", "no", r"line 2 .*'censored' must be true or false"),
])
def test_summarise_horizons_names_the_line_of_a_record_that_cannot_be_right(
        tmp_path, key, value, match):
    from embgeom.cramming import summarise_horizons

    lines = _synthetic_horizons(tmp_path / "run", {1: [10, 12, 14, 16], 2: [20, 24]})
    s = summarise_horizons(tmp_path / "run", plot=False, n_boot=100)
    assert s["n50"]["1"]["n50"] == 13.0 and s["n50"]["2"]["n50"] == 22.0
    assert s["fit"]["c_emp"] == pytest.approx((13 * 1 + 22 * 2) / 5)  # through the origin
    bad = json.loads(lines[1])
    bad[key] = value
    lines[1] = json.dumps(bad)
    (tmp_path / "run" / "horizons.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=match):
        summarise_horizons(tmp_path / "run", plot=False, n_boot=100)


@pytest.mark.parametrize("kw, err, match", [
    ({"c_theory": float("nan")}, ValueError, "c_theory"),
    ({"c_theory": -1.0}, ValueError, "c_theory"),
    ({"c_theory": 0.0}, ValueError, "c_theory"),
    ({"c_theory": "300"}, TypeError, "c_theory"),
    ({"converged": "yes"}, TypeError, "converged"),
    ({"plot": "no"}, TypeError, "plot"),
])
def test_summarise_horizons_refuses_bad_arguments_before_writing(tmp_path, kw, err, match):
    """A bad c_theory used to be swallowed into fit_error, and cram_summary.json overwritten
    without C_emp (the newest summary, the one `embgeom report --cram-summary auto` reads)."""
    from embgeom.cramming import summarise_horizons

    _synthetic_horizons(tmp_path / "run", {1: [10, 12], 2: [20, 24]})
    with pytest.raises(err, match=match):
        summarise_horizons(tmp_path / "run", **kw)
    assert not (tmp_path / "run" / "cram_summary.json").exists()
    with pytest.raises(ValueError, match="out_dir"):
        summarise_horizons(None)
    with pytest.raises(TypeError, match="out_dir"):
        summarise_horizons(3)
    s = summarise_horizons(tmp_path / "run", plot=False, n_boot=100, c_theory=300.0)
    assert s["fit"]["c_emp"] == pytest.approx((11 + 22 * 2) / 5)


def test_cram_summary_md_puts_the_answer_first_and_collapses_runs_of_equal_rows(tmp_path):
    """A horizons table ran to the longest length tried (80 + 128 rows, most of them 16/16 or
    0/16), with n50 and C_emp last: the answer is now the first line, and runs of identical
    rows are one row ("1-9")."""
    from embgeom.cramming import summarise_horizons

    _synthetic_horizons(tmp_path / "run", {1: [10, 12, 14, 16], 2: [20, 24, 26, 30]})
    s = summarise_horizons(tmp_path / "run", plot=False, n_boot=100)
    md = (tmp_path / "run" / "cram_summary.md").read_text().splitlines()
    from embgeom.report._markdown import fmt

    r1, r2, fit = s["n50"]["1"], s["n50"]["2"], s["fit"]
    assert (r1["n50"], r2["n50"]) == (13.0, 25.0)
    assert md[2] == (f"**n50 (tokens, 95% interval)**: m = 1: 13 [{fmt(r1['lower'])}, "
                     f"{fmt(r1['upper'])}]; m = 2: 25 [{fmt(r2['lower'])}, {fmt(r2['upper'])}]. "
                     f"**C_emp = {fmt(fit['c_emp'])} tokens per vector [{fmt(fit['c_emp_lower'])}, "
                     f"{fmt(fit['c_emp_upper'])}]**.")
    assert fit["c_emp"] == pytest.approx((13 + 25 * 2) / 5)
    rows = [x.split(" | ")[0].lstrip("| ") for x in md if x.startswith("| ") and "/4" in x]
    # m = 1: lengths 1-10 all crammed, 11-12 3/4, 13-14 2/4, 15-16 1/4, 17-40 none
    assert rows[:5] == ["1-10", "11", "12", "13", "14"] and rows[6:8] == ["16", "17-40"]


def test_a_huge_max_length_is_refused_before_the_targets_are_drawn(tiny, monkeypatch):
    """max_length=1e7 or 1e9 drew the targets (seconds, gigabytes) before the position check."""
    def refuse(*args, **kwargs):
        raise AssertionError("targets drawn before the position check")

    monkeypatch.setattr(_horizons, "sample_targets", refuse)
    for n in (10**7, 10**9):
        with pytest.raises(ValueError, match=rf"^max_length: .*{n}-token target.* exceed the "
                                             r"model's maximum"):
            horizons(tiny, 1, n_targets=16, max_length=n)
    with pytest.raises(ValueError, match="^targets: .*200-token target.* exceed the model's"):
        horizons(tiny, 1, targets=np.ones((1, 200), np.int64))


def test_targets_must_be_two_dimensional(tiny):
    """A 1-D ``targets`` (the docstring says (B, n)) was read silently as one target."""
    for t in (np.array([1, 2]), [1, 2]):
        with pytest.raises(ValueError, match=r"^targets: expected a \(B, n\) array of token ids "
                                             r"\(one row per target\), got a 1-D array of 2 ids"):
            horizons(tiny, 1, targets=t)
    with pytest.raises(ValueError, match="^targets: "):
        horizons(tiny, 1, targets=np.ones((1, 2, 2), np.int64))
    hc = horizons(tiny, 1, targets=[[1, 2]], protocol="adam", steps_per_length=5, n_boot=0,
                  check_generation=False)
    assert hc.targets.shape == (1, 2) and len(hc.records) == 1


def test_max_batches_is_a_positive_int_or_none(tiny):
    """max_batches=0 ran nothing and returned an empty curve."""
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"^max_batches: expected a positive int "
                                             r"\(batches to run\) or None \(all\), got 0$"
                           if bad == 0 else "^max_batches: "):
            horizons(tiny, 1, n_targets=2, max_length=4, max_batches=bad)
    with pytest.raises(TypeError, match="^max_batches: "):
        horizons(tiny, 1, n_targets=2, max_length=4, max_batches=1.0)
    hc = horizons(tiny, 1, n_targets=2, max_length=2, batch_size=1, max_batches=1,
                  protocol="adam", steps_per_length=5, n_boot=0, check_generation=False)
    assert [r["target_index"] for r in hc.records] == [0]


def test_horizons_and_cram_under_a_callers_no_grad(tiny, run):
    """A caller inside ``torch.no_grad()`` (or a Ray worker a cancelled task left in one: the
    intermittent ``element 0 of tensors does not require grad`` of the killed-sweep test) gets
    the same horizons and the same cram result as outside it."""
    with torch.no_grad():
        again = horizons(tiny, 1, n_targets=8, max_length=12, protocol="adam",
                         steps_per_length=80, n_boot=100, seed=0)
        T = run.targets[:2, :6]
        inside = cram(tiny, T, 1, steps=40, seed=0)
    np.testing.assert_array_equal(again.horizons, run.horizons)
    outside = cram(tiny, T, 1, steps=40, seed=0)
    np.testing.assert_array_equal(inside.success_teacher_forced, outside.success_teacher_forced)
    np.testing.assert_allclose(inside.loss, outside.loss)
