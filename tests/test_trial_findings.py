"""A new user's findings (issue 21's reliability rules): each bad input is a clear error that
names the argument, raised before any work; never a raw error from deep inside torch or numpy,
a silently wrong number, or a file written where none was asked for. One section per kind."""

from __future__ import annotations

import gc
import io
import re
import sys
import warnings

import numpy as np
import pytest
import torch

from embgeom import adapters


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def _tiny_gpt2(n_positions: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=n_positions,
                         bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def tiny_llama():
    return _tiny_llama()


# ------------------------------------------------------------------ 1. sample_hidden_states


@pytest.mark.parametrize("lengths", [[4, 4], [3, 5, 3], (2, 2, 2)])
def test_repeated_lengths_are_refused(tiny_llama, lengths):
    """The draws of a length depend only on (seed, length): [4, 4] gave H[:2] == H[2:]."""
    with pytest.raises(ValueError, match=r"^lengths: expected distinct lengths"):
        adapters.sample_hidden_states(tiny_llama, lengths, 2, progress=False)


def test_distinct_lengths_still_sample(tiny_llama):
    H, L = adapters.sample_hidden_states(tiny_llama, [4, 5], 2, progress=False)
    assert H.shape == (4, 32) and L.tolist() == [4, 4, 5, 5]
    assert not np.array_equal(H[:2], H[2:])


def test_sample_progress_default_follows_the_terminal(tiny_llama, monkeypatch, capsys):
    """progress=None (the default): no bar when stderr is a pipe or a file."""
    import inspect

    assert inspect.signature(adapters.sample_hidden_states).parameters["progress"].default is None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    adapters.sample_hidden_states(tiny_llama, [4], 3, batch_size=1)
    assert sys.stderr.getvalue() == ""
    with pytest.raises(TypeError, match="^progress: expected True, False or None"):
        adapters.sample_hidden_states(tiny_llama, [4], 3, progress="yes")


# ------------------------------------------------------------------ 2. forward passes


@pytest.mark.parametrize("fn", [adapters.hidden_states, adapters.logits])
def test_input_longer_than_the_position_table_names_input_ids(fn):
    model = _tiny_gpt2(16)
    with pytest.raises(ValueError, match=r"^input_ids: 40 positions .* maximum position \(16"):
        fn(model, np.zeros((1, 40), dtype=np.int64))
    with pytest.raises(ValueError, match=r"^input_ids: 17 positions"):
        fn(model, np.zeros(17, dtype=np.int64))
    assert fn(model, np.zeros((1, 16), dtype=np.int64)).shape[0] == 1  # the limit itself runs


@pytest.mark.parametrize("fn", [adapters.hidden_states, adapters.logits])
@pytest.mark.parametrize("bad", [64, 1000, -1])
def test_token_ids_outside_the_vocabulary_name_input_ids(fn, bad):
    model = _tiny_gpt2(16)
    ids = np.array([[1, 2, bad]])
    with pytest.raises(ValueError, match=r"^input_ids: values must lie in \[0, 64\)"):
        fn(model, ids)


def test_ids_past_a_smaller_input_table_are_refused():
    """A head with more rows than the input table (a resized lm_head): the lookup's limit."""
    model = _tiny_gpt2(16)
    model.lm_head = torch.nn.Linear(32, 80, bias=False)
    with pytest.raises(ValueError, match=r"^input_ids: values must lie in \[0, 64\)"):
        adapters.logits(model, np.array([[1, 70]]))


# ------------------------------------------------------------------ 6/7. cache paths


def test_empty_cache_dir_is_refused(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^cache_dir: expected a folder path"):
        adapters.sample_hidden_states(tiny_llama, [4], 2, cache_dir="", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_that_is_a_file_is_refused(tiny_llama, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="^cache_dir: .* exists and is not a folder"):
        adapters.sample_hidden_states(tiny_llama, [4], 2, cache_dir=f, progress=False)


def test_embgeom_cache_that_is_a_file_names_the_variable(tiny_llama, tmp_path, monkeypatch):
    f = tmp_path / "f"
    f.write_text("x")
    monkeypatch.setenv("EMBGEOM_CACHE", str(f))
    with pytest.raises(ValueError, match="^EMBGEOM_CACHE: .* exists and is not a folder"):
        adapters.sample_hidden_states(tiny_llama, [4], 2, cache_dir="auto", progress=False)
    with pytest.raises(ValueError, match="^EMBGEOM_CACHE"):
        adapters.default_cache_dir()


def test_truncated_cache_file_is_closed(tiny_llama, tmp_path):
    H, _ = adapters.sample_hidden_states(tiny_llama, [4], 2, cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.npz")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        H2, _ = adapters.sample_hidden_states(tiny_llama, [4], 2, cache_dir=tmp_path,
                                              progress=False)
        gc.collect()
    kinds = [w.category for w in caught]
    assert ResourceWarning not in kinds, [str(w.message) for w in caught]
    assert RuntimeWarning in kinds
    np.testing.assert_array_equal(H, H2)


# ------------------------------------------------------------------ 4. cramming resume


def _cram_tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def cram_tiny():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _cram_tiny()
    torch.set_num_threads(old)


def _fake_cram(model, targets, n_mem, **kw):
    from embgeom import cramming

    B, n = np.asarray(targets).shape
    m = np.broadcast_to(np.asarray(n_mem), (B,))
    ok = n <= 3 * m
    return cramming.CramResult(
        success_teacher_forced=ok, success_generation=ok, steps=np.full(B, 7, np.int64),
        loss=np.zeros(B), accuracy=ok.astype(float),
        memory=np.zeros((B, int(m.max()), 48), np.float32), n_mem=int(m.max()), length=n,
        dtype="float32", device="cpu", wall_s=0.0)


HKW4 = dict(n_targets=6, max_length=4, protocol="adam", steps_per_length=5, batch_size=6,
            n_boot=0, check_generation=False)


def _resume_calls(tmp_path, run):
    """Run, spoil line 2, resume twice: ``(lines after each resume, ResumeRecordWarnings of
    each resume)``."""
    from embgeom.cramming import ResumeRecordWarning

    J = tmp_path / "r.jsonl"
    first = run(J)
    lines = J.read_text().splitlines()
    lines[1] = "garbage"
    J.write_text("\n".join(lines) + "\n")
    counts, warned, results = [], [], []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results.append(run(J))
        counts.append(len(J.read_text().splitlines()))
        warned.append([str(w.message) for w in caught
                       if issubclass(w.category, ResumeRecordWarning)])
    return first, results, counts, warned, J


def test_horizons_resume_writes_only_the_missing_target_and_warns_once(cram_tiny, tmp_path):
    """One bad line re-ran its batch of 6 and appended 6 records (11 lines for 6 targets)."""
    from embgeom.cramming import horizons

    first, (again, third), counts, warned, J = _resume_calls(
        tmp_path, lambda j: horizons(cram_tiny, 1, jsonl=j, **HKW4))
    assert counts == [7, 7]  # 5 valid + the garbage line + target 1's new record
    assert len(warned[0]) == 1 and "line 2: not a JSON line" in warned[0][0]
    assert warned[1] == []  # superseded: target 1 has a trusted record now
    recs = [__import__("json").loads(x) for x in J.read_text().splitlines() if x != "garbage"]
    assert sorted(r["target_index"] for r in recs) == list(range(6))
    np.testing.assert_array_equal(again.horizons, first.horizons)
    np.testing.assert_array_equal(third.horizons, first.horizons)
    assert [r["steps"] for r in again.records] == [r["steps"] for r in first.records]


@pytest.mark.parametrize("fn", ["accessibility_curve", "mixed_curves"])
def test_per_length_resume_warns_once_about_a_superseded_line(cram_tiny, tmp_path,
                                                             monkeypatch, fn):
    from embgeom import cramming

    monkeypatch.setattr(cramming._curve, "cram", _fake_cram)
    run = {
        "accessibility_curve": lambda j: cramming.accessibility_curve(
            cram_tiny, 1, [4], 6, batch_size=3, jsonl=j, progress=False).successes.tolist(),
        "mixed_curves": lambda j: cramming.mixed_curves(
            cram_tiny, {1: [2, 4]}, 3, n_batches=2, jsonl=j, progress=False)[1]
        .successes.tolist(),
    }[fn]
    first, results, counts, warned, _ = _resume_calls(tmp_path, run)
    assert counts == [7, 7]  # 6 records + the garbage line, one record per target
    assert len(warned[0]) == 1 and warned[1] == []
    assert results == [first, first]


def test_a_bad_line_of_another_key_still_warns_when_there_is_work(cram_tiny, tmp_path,
                                                                 monkeypatch):
    """Not superseded (its key has no trusted record): warned about, once per run with work."""
    import json

    from embgeom import cramming
    from embgeom.cramming import ResumeRecordWarning

    monkeypatch.setattr(cramming._curve, "cram", _fake_cram)
    J = tmp_path / "r.jsonl"
    cramming.accessibility_curve(cram_tiny, 1, [4], 2, jsonl=J, progress=False)
    lines = J.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "length": 0})  # a key no run writes
    J.write_text("\n".join(lines) + "\n")
    with pytest.warns(ResumeRecordWarning, match="line 1: length = 0"):
        cramming.accessibility_curve(cram_tiny, 1, [4], 2, jsonl=J, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeRecordWarning)  # nothing to run: no warning
        cramming.accessibility_curve(cram_tiny, 1, [4], 2, jsonl=J, progress=False)
    with pytest.warns(ResumeRecordWarning, match="line 1: length = 0"):  # work again: warned
        cramming.accessibility_curve(cram_tiny, 1, [4, 5], 2, jsonl=J, progress=False)


# ------------------------------------------------------------------ 5. bootstrap sizes


def _curve_dict():
    return {"lengths": [2, 4, 6, 8, 10], "successes": [8, 7, 4, 2, 0], "trials": [8] * 5}


@pytest.mark.parametrize("n_boot", [1, 2, 99])
def test_too_few_bootstrap_resamples_are_refused(n_boot):
    """n_boot=1 gave a '95%' interval with lower == upper."""
    from embgeom.cramming import HorizonCurve, n50

    with pytest.raises(ValueError, match=r"^n_boot: expected 0 \(no interval\) or at least 100"):
        n50(_curve_dict(), n_boot=n_boot)
    recs = [{"horizon": h, "target_index": j} for j, h in enumerate([3, 4, 5, 6])]
    with pytest.raises(ValueError, match="^n_boot: expected 0"):
        HorizonCurve.from_records(recs, n_mem=1, max_length=8, n_boot=n_boot)
    c = HorizonCurve.from_records(recs, n_mem=1, max_length=8, n_boot=0)
    c.n_boot = n_boot  # the attribute set by hand is checked where it is used
    with pytest.raises(ValueError, match="^n_boot: expected 0"):
        c.n50()
    with pytest.raises(ValueError, match="^n_boot"):
        n50(_curve_dict(), n_boot=-1)


def test_no_bootstrap_means_no_interval_not_nan():
    from embgeom.cramming import HorizonCurve, n50

    r = n50(_curve_dict(), n_boot=0)
    assert np.isfinite(r["n50"]) and r["lower"] is None and r["upper"] is None
    recs = [{"horizon": h, "target_index": j} for j, h in enumerate([3, 4, 5, 6])]
    h = HorizonCurve.from_records(recs, n_mem=1, max_length=8, n_boot=0).n50()
    assert h["n50"] == 4.5 and h["lower"] is None and h["upper"] is None
    r = n50(_curve_dict(), n_boot=100, seed=0)
    assert r["lower"] < r["n50"] < r["upper"]


def test_horizons_and_run_entry_points_refuse_a_small_n_boot_before_any_work(cram_tiny,
                                                                             tmp_path):
    from embgeom.cramming import horizons, run_cram, run_horizons

    with pytest.raises(ValueError, match="^n_boot: expected 0"):
        horizons(cram_tiny, 1, n_targets=2, max_length=3, n_boot=1)
    with pytest.raises(ValueError, match="^n_boot: expected 0"):
        run_cram(cram_tiny, [1], tmp_path / "c", lengths=[2], n_targets=2, n_boot=5,
                 progress=False)
    with pytest.raises(ValueError, match="^n_boot: expected 0"):
        run_horizons(cram_tiny, [1], tmp_path / "h", n_targets=2, max_length=3, n_boot=5,
                     progress=False)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ 3. the copy task


@pytest.fixture(scope="module")
def copy16():
    from embgeom import copying

    task = copying.CopyTask(alphabet=16, l_train=4)
    return copying.make_copy_model(task, hidden_size=8, num_layers=1, num_heads=2), task


def _no_work(monkeypatch):
    from embgeom.copying import _run

    def boom(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(_run, "make_copy_model", boom)
    monkeypatch.setattr(_run, "train_copy_model", boom)


@pytest.mark.parametrize("kw, match", [
    (dict(l_train=100000), r"^l_train, alphabet: a training step at l_train=100000 .* GiB"),
    (dict(max_length=10**6), r"^max_length: expected at most 16 x l_train"),
    (dict(l_train=4, max_length=10**8), r"^max_length: expected at most 16 x l_train = 64"),
    (dict(num_threads=0), r"^num_threads"),
    (dict(precision="fp7"), r"^precision: unknown float format 'fp7'"),
    (dict(n_eval=0), r"^n_eval"),
    (dict(hidden_size=10, num_heads=4), r"^hidden_size: must be divisible"),
    (dict(steps=0), r"^steps"),
    (dict(compare_bounds="yes"), r"^compare_bounds"),
])
def test_run_copy_checks_every_argument_before_any_work(tmp_path, monkeypatch, kw, match):
    from embgeom import copying

    _no_work(monkeypatch)
    out = tmp_path / "c_bad"
    with pytest.raises((ValueError, TypeError), match=match):
        copying.run_copy(out, steps=kw.pop("steps", 1), progress=False, **kw)
    assert not out.exists()  # no output folder left behind by a refused call


def test_run_copy_out_dir_that_is_a_file_or_empty(tmp_path, monkeypatch):
    from embgeom import copying

    _no_work(monkeypatch)
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="^out_dir: .* exists and is not a folder"):
        copying.run_copy(f, steps=1, progress=False)
    with pytest.raises(ValueError, match="^out_dir: .* exists and is not a folder"):
        copying.run_copy(f / "below", steps=1, progress=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^out_dir: expected a folder path, got an empty"):
        copying.run_copy("", steps=1, progress=False)
    with pytest.raises(TypeError, match="^out_dir"):
        copying.run_copy(None, steps=1, progress=False)


def test_compare_with_bounds_refuses_a_task_of_another_alphabet(copy16):
    from embgeom import copying

    model, _ = copy16
    ev = {"lengths": [1, 2], "exact_match_count": [3, 2], "n_eval": 4}
    for alphabet in (40, 8):
        with pytest.raises(ValueError, match=rf"^task: CopyTask\(alphabet={alphabet}\) has "
                                             r".* the model has 18.*alphabet 16"):
            copying.compare_with_bounds(model, copying.CopyTask(alphabet=alphabet, l_train=6), ev)
    with pytest.raises(ValueError, match=r"^task: CopyTask\(alphabet=40\)"):
        copying.evaluate_copy(model, copying.CopyTask(alphabet=40, l_train=6), [1],
                              progress=False)
    with pytest.raises(ValueError, match=r"^task: CopyTask\(alphabet=40\)"):
        copying.copy_hidden_states(model, copying.CopyTask(alphabet=40, l_train=6), [1])


@pytest.mark.parametrize("counts, match", [
    ([5, 2], r"counts in \[0, n_eval=4\].*\[5\]"),
    ([-1, 2], r"counts in \[0, n_eval=4\].*\[-1\]"),
    ([1.5, 2], r"whole counts"),
    ([float("nan"), 2], r"whole counts"),
    ([[1], [2]], r"one exact_match_count per length"),
])
def test_compare_with_bounds_refuses_impossible_counts(copy16, counts, match):
    from embgeom import copying

    model, task = copy16
    ev = {"lengths": [1, 2], "exact_match_count": counts, "n_eval": 4}
    with pytest.raises(ValueError, match=r"^evaluation.*" + match):
        copying.compare_with_bounds(model, task, ev)


def test_compare_with_bounds_precision_and_threads_named(copy16):
    from embgeom import copying

    model, task = copy16
    ev = {"lengths": [1, 2], "exact_match_count": [3, 2], "n_eval": 4}
    with pytest.raises(ValueError, match="^precision: unknown float format"):
        copying.compare_with_bounds(model, task, ev, precision="fp7")
    with pytest.raises(ValueError, match="^num_threads"):
        copying.evaluate_copy(model, task, [1], num_threads=0, progress=False)
    with pytest.raises(ValueError, match="^num_threads"):
        copying.train_copy_model(model, task, steps=1, num_threads=0, progress=False)


# ------------------------------------------------------------------ 6/7. the command line


def _cli(capsys, argv):
    from embgeom.cli import main

    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["cram", "--out", ""], "--out"),
    (["copy", "--out", ""], "--out"),
    (["report", "--model", "x", "--out", ""], "--out"),
    (["report", "--model", "x", "--cache-dir", ""], "--cache-dir"),
])
def test_cli_refuses_an_empty_path(capsys, tmp_path, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    code, err = _cli(capsys, argv)
    assert code == 2 and f"argument {flag}: expected a folder path, got an empty" in err, err
    assert list(tmp_path.iterdir()) == []


def test_cli_embgeom_cache_that_is_a_file_exits_2(capsys, tmp_path, monkeypatch):
    """Like --cache-dir <file>: one line naming EMBGEOM_CACHE, before the model loads (the
    report used to run on uncached, with a warning)."""
    f = tmp_path / "cachefile"
    f.write_text("x")
    monkeypatch.setenv("EMBGEOM_CACHE", str(f))
    code, err = _cli(capsys, ["report", "--model", "no-such-model", "--out",
                              str(tmp_path / "r")])
    assert code == 2 and "error: EMBGEOM_CACHE: " in err and str(f) in err, err
    assert len(err.strip().splitlines()) == 1
    # --no-cache does not read it
    code, err = _cli(capsys, ["report", "--model", "no-such-model", "--no-cache", "--out",
                              str(tmp_path / "r")])
    assert code == 2 and "EMBGEOM_CACHE" not in err and "--model" in err, err


def test_cli_warnings_are_one_line(capsys, tmp_path, monkeypatch):
    from embgeom import cramming

    def fake(model, mems, out, **kw):
        warnings.warn("the budget did not converge\n  (more detail)", RuntimeWarning)
        return {"summary_lines": ["ok"]}

    monkeypatch.setattr(cramming, "run_cram", fake)
    before = warnings.showwarning
    code, err = _cli(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 0
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == ["embgeom: warning: the budget did not converge (more detail)"], err
    assert warnings.showwarning is before  # main restores the caller's
    code, err = _cli(capsys, ["cram", "--out", str(tmp_path / "c"), "-q"])
    assert code == 0 and "warning" not in err  # -q hides warnings


def test_cli_log_lines_and_warnings_share_one_format():
    """A logged warning and a warnings.warn read alike: ``embgeom: warning: <one line>`` (the
    logger's lines used to say ``embgeom: WARNING:``)."""
    import logging

    from embgeom.cli import _LogFormatter

    record = logging.LogRecord("embgeom.report", logging.WARNING, __file__, 1,
                               "the cache entry %s is corrupt\n  rebuilt", ("x.npz",), None)
    assert _LogFormatter().format(record) == "embgeom: warning: the cache entry x.npz is corrupt rebuilt"
    record = logging.LogRecord("embgeom.report", logging.INFO, __file__, 1, "phase", (), None)
    assert _LogFormatter().format(record) == "embgeom: info: phase"


def test_importing_the_cli_leaves_warnings_alone():
    import importlib

    import embgeom.cli

    before = warnings.showwarning
    importlib.reload(embgeom.cli)
    assert warnings.showwarning is before


# ------------------------------------------------------------------ 7. ragged targets


def test_ragged_targets_name_targets(cram_tiny):
    from embgeom import cramming

    with pytest.raises(ValueError, match=r"^targets: expected targets of one common length.*"
                                         r"\[2, 1\]"):
        cramming.horizons(cram_tiny, 1, targets=[[1, 2], [3]])
    with pytest.raises(ValueError, match="^targets: "):
        cramming.horizons(cram_tiny, 1, targets=[[1, 2], 3])


def test_build_report_refuses_an_empty_out_dir(tmp_path, monkeypatch):
    from embgeom.report import build_report

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out_dir: expected a folder path"):
        build_report("smollm2-135m", "")
    assert list(tmp_path.iterdir()) == []


def test_an_all_zero_bias_is_no_bias():
    """Decoder(W, bias=zeros) has the cone cells of bias=None: rare-event splitting, which needs
    cones, used to refuse it ("the decoder has a bias") and "auto" fell back to counting."""
    from embgeom.cells import Decoder
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    W = np.vstack([np.eye(3), -np.eye(3)])
    zero = Decoder(W, bias=np.zeros(6))
    assert zero.bias_ is None and repr(zero).endswith("bias=None)")
    ball = Ball.from_params(np.zeros(3), 1.0)
    kw = dict(seed=0, progress=False, n_chains=1024, method="rare-event", target_se=None)
    a = cell_volumes(zero, ball, 200, **kw)
    b = cell_volumes(Decoder(W), ball, 200, **kw)
    np.testing.assert_array_equal(a.log_fractions, b.log_fractions)
    # the cross-polytope's six cells are equal: log(1/6), to about 0.03 nats at 1,024 chains
    np.testing.assert_allclose(a.log_fractions, np.log(1 / 6), atol=0.15)
    assert Decoder(W, bias=np.r_[np.zeros(5), 1e-3]).bias_ is not None  # one nonzero entry


def test_unargmaxable_with_no_tokens_says_empty():
    from embgeom.cells import Decoder

    dec = Decoder(np.vstack([np.eye(3), -np.eye(3)]))
    with pytest.raises(ValueError, match="tokens: expected a non-empty array"):
        dec.unargmaxable(tokens=[])
    with pytest.raises(TypeError, match="tokens: expected integers"):
        dec.unargmaxable(tokens=[1.0])
    with pytest.raises(ValueError, match=r"tokens: values must lie in \[0, 6\)"):
        dec.unargmaxable(tokens=[6])
    assert dec.unargmaxable(tokens=[0, 0, 5]).n_unargmaxable == 0


@pytest.mark.parametrize("shape, cls, options", [
    ("ball", "Ball", "['tol']"), ("box", "Box", "['min_width', 'rotation']")])
def test_fit_support_names_an_unknown_option(shape, cls, options):
    """fit_support(H, "ball", bogus=1) said "Ball.__init__() got an unexpected keyword"."""
    import embgeom

    H = np.random.default_rng(0).standard_normal((50, 4))
    with pytest.raises(TypeError, match=rf"fit_support: 'bogus' is not an option of "
                                        rf"shape='{shape}' \({cls}\); its further options are "
                                        rf"{re.escape(options)}"):
        embgeom.fit_support(H, shape, bogus=1)


# ------------------------------------------------------------------------------------------
# Session 2026-12-07's new-user pass: sizes beyond what an array holds, flags of the wrong
# type, integer parameters, and one error kind per argument kind
# ------------------------------------------------------------------------------------------
def _unit_decoder():
    from embgeom.cells import Decoder

    return Decoder(np.eye(3, dtype=np.float32))


def test_sizes_beyond_an_array_are_refused_before_any_work():
    from embgeom.supports import Ball
    from embgeom.volumes import MAX_SAMPLES, cell_volumes

    ball = Ball.from_params(None, 1.0, dim=3)
    # 10**30 samples hung, growing memory while it listed the blocks
    with pytest.raises(ValueError, match=r"n_samples: expected at most 2\*\*34"):
        cell_volumes(_unit_decoder(), ball, 10**30, progress=False)
    with pytest.raises(ValueError, match="n_samples"):
        cell_volumes(_unit_decoder(), ball, MAX_SAMPLES + 1, progress=False)
    # numpy's "Maximum allowed dimension exceeded" leaked from sample
    for n in (10**30, 2**62):
        with pytest.raises(ValueError, match=r"^n: .* needs an \(n, 3\) float64 array of .* GiB, more than"):
            ball.sample(n, seed=0)
    assert ball.sample(5, seed=0).shape == (5, 3)


def test_progress_must_be_a_bool():
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    ball = Ball.from_params(None, 1.0, dim=3)
    for bad in ("no", 0, None):  # "no" is truthy: it drew bars
        with pytest.raises(TypeError, match="progress: expected True or False"):
            cell_volumes(_unit_decoder(), ball, 100, progress=bad)
    assert cell_volumes(_unit_decoder(), ball, 100, progress=np.False_).counts.sum() == 100


def test_from_params_takes_integer_parameters_as_fit_does():
    from embgeom.supports import Ball, Box, Cone, Ellipsoid, FinalNormShell

    assert Ball.from_params([0, 0], 1).log_volume == pytest.approx(np.log(np.pi))
    box = Box.from_params([0, 0], [1, 2], rotation=np.eye(2, dtype=int))
    assert box.log_volume == pytest.approx(np.log(2.0))
    e = Ellipsoid.from_params([0, 0], semi_axes=[1, 2])
    assert e.log_volume == pytest.approx(np.log(2 * np.pi))
    # shape_matrix A: (x - c)^T A (x - c) <= 1, semi-axes 1 and 1/2
    assert Ellipsoid.from_params([0, 0], np.diag([1, 4])).log_volume == pytest.approx(
        np.log(np.pi / 2))
    assert Cone.from_params([1, 0], 0.5, 2.0).dim == 2
    assert FinalNormShell.from_params("rmsnorm", [1, 2]).dim == 2
    with pytest.raises(TypeError, match="center"):  # booleans stay refused
        Ball.from_params([True, False], 1.0)


def test_one_error_kind_per_argument_kind():
    from embgeom import bounds as B
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    ball = Ball.from_params(None, 1.0, dim=3)
    # a value of the wrong type is a TypeError, as n_samples=2.5 always was
    with pytest.raises(TypeError, match="dtype_or_bits"):
        B.precision_eps(1.0, 2.5)
    assert B.precision_eps(1.0, 24) == B.precision_eps(1.0, "float32") == 2.0**-24
    for bad in (2.5, True, [0.5, 1.0]):
        with pytest.raises(TypeError, match="tokens"):
            cell_volumes(_unit_decoder(), ball, 100, tokens=bad, progress=False)
    with pytest.raises(ValueError, match="tokens"):  # a right type, a wrong value
        cell_volumes(_unit_decoder(), ball, 100, tokens=[], progress=False)
    # an id where ids are asked for: say so (it said "expected an array with ndim in (1,)")
    with pytest.raises(TypeError, match=r"tokens: expected a 1-D array of token ids \(e.g. \[3\]"):
        _unit_decoder().unargmaxable(tokens=3)
    # one message for a negative seed, whichever seeding helper reads it
    from embgeom.parallel import task_seed

    for call in (lambda: ball.sample(3, seed=-1),
                 lambda: cell_volumes(_unit_decoder(), ball, 10, seed=-1, progress=False),
                 lambda: cell_volumes(_unit_decoder(), ball, 10, seed=[1, -1], progress=False),
                 lambda: task_seed(-1, 0)):
        with pytest.raises(ValueError, match=r"^seed: expected integers >= 0, got "):
            call()


def test_calibration_fraction_says_its_interval_once():
    from embgeom.supports import fit_support

    H = np.random.default_rng(0).standard_normal((40, 2))
    for f in (1.0, 0.0, 1.5):
        with pytest.raises(ValueError, match=r"calibration_fraction: expected a number in \(0, 1\),"):
            fit_support(H, "ball", calibrate=0.2, calibration_fraction=f)


def test_figures_do_not_create_folders(tmp_path):
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    cv = cell_volumes(_unit_decoder(), Ball.from_params(None, 1.0, dim=3), 300, seed=0,
                      progress=False)
    missing = tmp_path / "no" / "such" / "h.png"
    with pytest.raises(ValueError, match="path: the folder .* does not exist"):
        cv.histogram(path=missing)
    assert not (tmp_path / "no").exists()
    cv.histogram(path=tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0
