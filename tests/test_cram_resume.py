"""Resume files, output paths, progress defaults and the L-BFGS preset of embgeom.cramming
(issue 21, leftovers), on a tiny random Llama.

What can be wrong, and is checked here:
- a ``jsonl`` path that is a folder (or lies below a file) fails with a raw OSError after work
  has started, instead of a ValueError naming the argument before any;
- a bad line of a resume file (not JSON, a key missing, a field of the wrong type or range,
  settings edited) is skipped silently or trusted; only a torn last line is the expected case;
- the entry points draw tqdm bars into a log file;
- the L-BFGS preset never moves the memory vectors (its line search had no evaluation left).
"""

from __future__ import annotations

import io
import json
import sys
import warnings

import numpy as np
import pytest
import torch

from embgeom import cramming
from embgeom.cramming import (
    ResumeRecordWarning,
    accessibility_curve,
    horizons,
    mixed_curves,
    run_cram,
    run_horizons,
)
from embgeom.cramming import _horizon_run, _horizons

VOCAB, D = 96, 48


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=2 * D,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, initializer_range=0.3,
                      tie_word_embeddings=False, bos_token_id=1, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


class _Stop(Exception):
    pass


def _boom(*a, **k):
    raise AssertionError("work started before the arguments were checked")


def _fake_cram(calls=None, threshold=3):
    """cram's stand-in: every target of length <= threshold * m succeeds; records each call."""
    def fake(model, targets, n_mem, **kw):
        B, n = np.asarray(targets).shape
        if calls is not None:
            calls.append((B, kw.get("progress")))
        m = np.broadcast_to(np.asarray(n_mem), (B,))  # mixed batches pass one m per row
        ok = n <= threshold * m
        return cramming.CramResult(
            success_teacher_forced=ok, success_generation=ok, steps=np.full(B, 7, np.int64),
            loss=np.zeros(B), accuracy=ok.astype(float),
            memory=np.zeros((B, int(m.max()), D), np.float32), n_mem=int(m.max()), length=n,
            dtype="float32", device="cpu", wall_s=0.0)
    return fake


# ------------------------------------------------------------------ 1. paths, before any work


@pytest.mark.parametrize("fn", ["accessibility_curve", "mixed_curves", "horizons"])
def test_jsonl_that_is_a_folder_is_refused_before_any_work(tiny, tmp_path, monkeypatch, fn):
    monkeypatch.setattr(cramming._curve, "cram", _boom)
    monkeypatch.setattr(_horizons, "sample_targets", _boom)
    call = {
        "accessibility_curve": lambda j: accessibility_curve(tiny, 1, [2], 2, jsonl=j,
                                                             progress=False),
        "mixed_curves": lambda j: mixed_curves(tiny, {1: [2]}, 2, jsonl=j, progress=False),
        "horizons": lambda j: horizons(tiny, 1, n_targets=2, max_length=3, jsonl=j),
    }[fn]
    with pytest.raises(ValueError, match=r"^jsonl: .* is a folder; expected the path of a JSONL"):
        call(tmp_path)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"^jsonl: .*file' exists and is not a folder"):
        call(f / "c.jsonl")
    with pytest.raises(TypeError, match="^jsonl: expected a file path or None"):
        call(3)
    with pytest.raises(ValueError, match="^jsonl: expected a file path"):
        call("  ")
    if fn == "horizons":  # its batch checkpoints go to <jsonl>.ckpt/
        (tmp_path / "h.jsonl.ckpt").write_text("x")
        with pytest.raises(ValueError, match=r"^jsonl: .*h\.jsonl\.ckpt.* is not a folder"):
            call(tmp_path / "h.jsonl")
    assert not list(tmp_path.glob("*.jsonl"))


def test_out_dir_that_is_a_file_or_holds_a_folder_named_like_the_jsonl(tiny, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(_horizon_run, "horizons", _boom)
    monkeypatch.setattr(cramming._run, "_sweep", _boom)
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="^out_dir: .* exists and is not a folder"):
        run_horizons(tiny, [1], f, n_targets=2, max_length=3, progress=False)
    with pytest.raises(ValueError, match="^out_dir: .* exists and is not a folder"):
        run_cram(tiny, [1], f, lengths=[2], n_targets=2, progress=False)
    d = tmp_path / "d"
    (d / "horizons.jsonl").mkdir(parents=True)
    (d / "cram.jsonl").mkdir()
    with pytest.raises(ValueError, match=r"^out_dir: .*horizons\.jsonl' is a folder"):
        run_horizons(tiny, [1], d, n_targets=2, max_length=3, progress=False)
    with pytest.raises(ValueError, match=r"^out_dir: .*cram\.jsonl' is a folder"):
        run_cram(tiny, [1], d, lengths=[2], n_targets=2, progress=False)


# ------------------------------------------------------------------ 2. bad lines of a resume file

HKW = dict(n_targets=3, max_length=5, protocol="adam", steps_per_length=20, batch_size=1,
           n_boot=0, check_generation=False)


@pytest.fixture(scope="module")
def horizon_file(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("h") / "h.jsonl"
    hc = horizons(tiny, 1, jsonl=path, **HKW)
    return path.read_text().splitlines(), hc


def _edited(line: str, **changes) -> str:
    return json.dumps({**json.loads(line), **changes})


@pytest.fixture
def counted_batches(monkeypatch):
    runs = []
    real = _horizons._run_adam_batch

    def counting(su, T, seeds, state, **kw):
        runs.append(T.shape[0])
        return real(su, T, seeds, state, **kw)

    monkeypatch.setattr(_horizons, "_run_adam_batch", counting)
    return runs


@pytest.mark.parametrize("case", ["not JSON", "not an object", "no horizon", "horizon as text",
                                  "horizon above max_length", "negative steps",
                                  "censored against stop_reason", "unknown stop_reason",
                                  "settings edited"])
def test_a_bad_horizon_line_warns_with_its_line_number_and_its_target_runs_again(
        tiny, horizon_file, tmp_path, counted_batches, case):
    lines, whole = horizon_file
    r = json.loads(lines[1])
    bad = {
        "not JSON": '{"settings_hash": "1069', "not an object": "[1, 2, 3]",
        "no horizon": json.dumps({k: v for k, v in r.items() if k != "horizon"}),
        "horizon as text": _edited(lines[1], horizon=str(r["horizon"])),
        "horizon above max_length": _edited(lines[1], horizon=6),
        "negative steps": _edited(lines[1], steps=-5),
        "censored against stop_reason": _edited(lines[1], censored=not r["censored"]),
        "unknown stop_reason": _edited(lines[1], stop_reason="tired"),
        "settings edited": _edited(lines[1], settings={**r["settings"], "steps_per_length": 21}),
    }[case]
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([lines[0], bad, lines[2]]) + "\n")
    with pytest.warns(ResumeRecordWarning, match=r"h\.jsonl, line 2: .*(not trusted|skipped)"):
        hc = horizons(tiny, 1, jsonl=path, **HKW)
    assert counted_batches == [1]  # only target 1's batch, the others are trusted
    np.testing.assert_array_equal(hc.horizons, whole.horizons)
    assert [rec["steps"] for rec in hc.records] == [rec["steps"] for rec in whole.records]


def test_a_torn_last_horizon_line_is_removed_silently(tiny, horizon_file, tmp_path,
                                                      counted_batches):
    lines, whole = horizon_file
    path = tmp_path / "h.jsonl"
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:50])  # cut mid-write
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hc = horizons(tiny, 1, jsonl=path, **HKW)
        assert counted_batches == [1]
        now = [json.loads(x) for x in path.read_text().splitlines()]  # the fragment is gone
        assert [x["target_index"] for x in now] == [0, 1, 2]
        assert now[:2] == [json.loads(x) for x in lines[:2]]
        horizons(tiny, 1, jsonl=path, **HKW)  # and the repaired file reads without a warning
    assert counted_batches == [1]
    np.testing.assert_array_equal(hc.horizons, whole.horizons)


@pytest.mark.parametrize("case", ["garbage", "no success_teacher_forced", "steps as text",
                                  "negative steps", "accuracy above 1", "length 0",
                                  "settings edited", "a whole record that is tampered"])
def test_a_bad_per_length_line_warns_and_its_target_runs_again(tiny, tmp_path, monkeypatch,
                                                               case):
    calls = []
    monkeypatch.setattr(cramming._curve, "cram", _fake_cram(calls))
    J = tmp_path / "c.jsonl"
    accessibility_curve(tiny, 1, [4], 3, batch_size=1, jsonl=J, progress=False)
    lines = J.read_text().splitlines()
    r = json.loads(lines[0])
    bad = {
        "garbage": "garbage",
        "no success_teacher_forced": json.dumps(
            {k: v for k, v in r.items() if k != "success_teacher_forced"}),
        "steps as text": _edited(lines[0], steps="7"),
        "negative steps": _edited(lines[0], steps=-1),
        "accuracy above 1": _edited(lines[0], accuracy=1.5),
        "length 0": _edited(lines[0], length=0),
        "settings edited": _edited(lines[0], settings={**r["settings"], "seed": 1}),
        "a whole record that is tampered": _edited(lines[0], success_teacher_forced=1),
    }[case]
    J.write_text("\n".join([bad, *lines[1:]]) + "\n")
    with pytest.warns(ResumeRecordWarning, match=r"c\.jsonl, line 1: "):
        c = accessibility_curve(tiny, 1, [4], 3, batch_size=1, jsonl=J, progress=False)
    assert [b for b, _ in calls] == [1, 1, 1, 1]  # three first, then target 0 again
    assert c.successes.tolist() == [0] and c.trials.tolist() == [3]


def test_a_record_of_the_first_format_is_still_trusted(tiny, tmp_path, monkeypatch):
    """Records written before stop_reason, precision and best_accuracy existed resume."""
    calls = []
    monkeypatch.setattr(cramming._curve, "cram", _fake_cram(calls))
    J = tmp_path / "c.jsonl"
    accessibility_curve(tiny, 1, [2], 2, jsonl=J, progress=False)
    old = [json.dumps({k: v for k, v in json.loads(x).items()
                       if k not in ("stop_reason", "precision", "best_accuracy")})
           for x in J.read_text().splitlines()]
    J.write_text("\n".join(old) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        c = accessibility_curve(tiny, 1, [2], 2, jsonl=J, progress=False)
    assert len(calls) == 1 and c.successes.tolist() == [2]


# ------------------------------------------------------------------ 3. progress follows the tty


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_run_horizons_draws_bars_only_on_a_terminal(tiny, tmp_path, monkeypatch):
    seen = []

    def fake(model, m, **kw):
        seen.append(kw["progress"])
        raise _Stop

    monkeypatch.setattr(_horizon_run, "horizons", fake)
    for stream, want in ((io.StringIO(), False), (_Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        with pytest.raises(_Stop):
            run_horizons(tiny, [1], tmp_path / "o", n_targets=2, max_length=3)
        with pytest.raises(_Stop):  # an explicit choice wins
            run_horizons(tiny, [1], tmp_path / "o", n_targets=2, max_length=3,
                         progress=not want)
    assert seen == [False, True, True, False]
    with pytest.raises(TypeError, match="^progress: expected True or False"):
        run_horizons(tiny, [1], tmp_path / "o", progress="yes")


def test_per_length_runs_draw_bars_only_on_a_terminal(tiny, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cramming._curve, "cram", _fake_cram(calls))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    accessibility_curve(tiny, 1, [2], 2)
    mixed_curves(tiny, {1: [2]}, 2)
    run_cram(tiny, [1], tmp_path / "o", lengths=[2], n_targets=2, adaptive=False, plot=False)
    assert [p for _, p in calls] == [False, False, False]
    assert sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", _Tty())
    accessibility_curve(tiny, 1, [2], 2)
    assert calls[-1][1] is True


# ------------------------------------------------------------------ 4. the L-BFGS preset


def test_lbfgs_preset_crams_on_the_tiny_model(tiny, monkeypatch):
    """torch.optim.LBFGS(max_iter=1) defaults to max_eval = 1, leaving its strong-Wolfe line
    search max_ls = 0: every step was t = 0 and both horizons were 0 at the initial loss. With
    line-search evaluations the preset crams (horizons 4 and 2 here, against 1 and 2 for
    'adam' at the same budget) and keeps to the per-length budget (one past it at most)."""
    import torch.optim.lbfgs as torch_lbfgs

    max_ls = []
    real = torch_lbfgs._strong_wolfe

    def spy(*a, **k):
        max_ls.append(k["max_ls"])
        return real(*a, **k)

    monkeypatch.setattr(torch_lbfgs, "_strong_wolfe", spy)
    hc = horizons(tiny, 1, n_targets=2, max_length=6, protocol="lbfgs", steps_per_length=30,
                  n_boot=0, check_generation=True)
    assert hc.horizons.min() >= 1, hc.horizons  # was [0, 0]
    assert max(max_ls) == _horizons._LBFGS_MAX_EVAL - 1 and min(max_ls) >= 0
    for r in hc.records:
        assert r["stop_reason"] == "budget" and r["generation_ok"]
        assert all(s <= 30 + 1 for _, s in r["lengths_steps"]), r["lengths_steps"]
        assert r["steps"] == sum(s for _, s in r["lengths_steps"])
