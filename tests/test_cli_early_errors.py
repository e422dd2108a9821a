"""The CLI refuses bad arguments early, and leaves no empty --out behind.

What needs no model is refused by the parser (exit 2, the flag named, one message style);
what needs the model (a token id against the vocabulary, a length against the context
length) right after it loads, before --out is created; a run that fails anyway removes the
empty folders it created. The model here is a tiny random Llama put in place of
``embgeom.adapters.load_model``: no real model is loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from embgeom import cli
from embgeom.cli import build_parser, main

HUGE = "100000000000000000000000000000"  # 1e29, the new-user pass's --cell-samples


@pytest.fixture(autouse=True)
def _restore_progress_env(monkeypatch):
    """main() switches the libraries' bars off through the environment: undo it after each test."""
    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(var, raising=False)


def _run(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr().err


class _PastTheChecks(Exception):
    """The run got to its work (or, for a check that needs no model, to the model)."""


@pytest.fixture
def no_model(monkeypatch):
    """A parse-time check loads no model and starts no work: loading one (or building the copy
    task's) ends the run at once."""
    import embgeom.adapters
    from embgeom.copying import _run as copy_run

    def load(*a, **k):
        raise _PastTheChecks("the model was loaded")

    monkeypatch.setattr(embgeom.adapters, "load_model", load)
    monkeypatch.setattr(copy_run, "make_copy_model", load)


def _parse_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Refused by the parser: no model, no folder
# ---------------------------------------------------------------------------------------------


def test_cell_samples_above_the_library_cap_is_a_parse_error(capsys, tmp_path, no_model):
    """`report --cell-samples 1e29` was refused after ~50 s, by the library, naming n_samples,
    with PNGs already written into --out."""
    out = tmp_path / "r"
    code, err = _parse_error(capsys, ["report", "--out", str(out), "--cell-samples", HUGE])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("embgeom report: error: argument --cell-samples: expected a positive "
                          f"integer <= 2**34, got '{HUGE}'"), err
    assert "n_samples" not in err and not out.exists()


def test_the_cell_samples_cap_is_the_librarys():
    from embgeom.volumes import MAX_SAMPLES

    assert cli.CELL_SAMPLES_LIMIT == MAX_SAMPLES
    ok = build_parser().parse_args(["report", "--cell-samples", str(MAX_SAMPLES)])
    assert ok.cell_samples == MAX_SAMPLES


# the caps each flag's help states (cli.PER_LENGTH_LIMIT, TARGETS_LIMIT, STEPS_LIMIT)
@pytest.mark.parametrize("argv, flag, limit", [
    (["report", "--n-per-length"], "--n-per-length", 2**20),
    (["cram", "--n-targets"], "--n-targets", 2**20),
    (["cram", "--steps"], "--steps", 2**30),
    (["cram", "--patience"], "--patience", 2**30),
    (["cram", "--horizons", "--steps-per-length"], "--steps-per-length", 2**30),
    (["cram", "--horizons", "--max-steps"], "--max-steps", 2**30),
    (["copy", "--steps"], "--steps", 2**30),
])
def test_counts_above_their_cap_are_parse_errors(capsys, tmp_path, no_model, argv, flag, limit):
    out = tmp_path / "o"
    code, err = _parse_error(capsys, [*argv, str(limit + 1), "--out", str(out)])
    assert code == 2 and f"error: argument {flag}: expected " in err, err
    assert f"got '{limit + 1}'" in err and not out.exists()
    assert getattr(build_parser().parse_args([*argv, str(limit), "--out", "x"]),
                   flag[2:].replace("-", "_")) == limit


def test_seed_errors_are_one_style(capsys, no_model):
    """`--seed -1` said "expected an integer in [0, 2**63), got -1", `--seed 1.5` "expected an
    integer >= 0, got '1.5'": one message, the text as typed."""
    errs = {s: _parse_error(capsys, ["cram", "--out", "x", "--seed", s])[1] for s in ("-1", "1.5")}
    for s, err in errs.items():
        assert err.startswith("embgeom cram: error: argument --seed: expected an integer in "
                              f"[0, 2**63), got '{s}' (see"), err
    assert errs["-1"].replace("'-1'", "V") == errs["1.5"].replace("'1.5'", "V")


def test_n_per_length_0_and_1_are_one_style(capsys, tmp_path, no_model):
    """`--n-per-length 0` was a parser error ("expected a positive integer, got 0"), `1` a
    library error after the argument checks ("--n-per-length: expected an integer >= 2")."""
    errs = {v: _parse_error(capsys, ["report", "--out", str(tmp_path / "r"), "--n-per-length",
                                     v]) for v in ("0", "1", "x")}
    for v, (code, err) in errs.items():
        assert code == 2 and err.startswith(
            "embgeom report: error: argument --n-per-length: expected an integer in "
            f"[2, 2**20], got '{v}'"), err
    assert not (tmp_path / "r").exists()


def test_copy_alphabet_1_is_a_parse_error_like_0(capsys, no_model):
    errs = [_parse_error(capsys, ["copy", "--out", "x", "--alphabet", v])[1] for v in ("0", "1")]
    assert all("argument --alphabet: expected an integer >= 2, got" in e for e in errs), errs


def test_a_very_long_number_is_quoted_short(capsys, no_model):
    code, err = _parse_error(capsys, ["report", "--lengths", "9" * 5000])
    assert code == 2 and "(5000 characters)" in err and len(err) < 300, err


def test_verbose_help_says_what_the_default_shows(capsys):
    """`report --help` said "-v ... (default: warnings only)" while the default level shows
    where the model and the hidden states came from (and the report's phases without bars)."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "warnings only" not in text
    assert "where the model and the hidden states came from" in text
    assert "phase lines when no progress bar is drawn" in text


# ---------------------------------------------------------------------------------------------
# Refused right after the model loads, before --out is created
# ---------------------------------------------------------------------------------------------

CONTEXT = 256  # the tiny model's max_position_embeddings
VOCAB = 128


@pytest.fixture(scope="module")
def tiny_loaded():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.adapters import LoadedModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=CONTEXT, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False, attn_implementation="eager")
    return LoadedModel(model=LlamaForCausalLM(cfg).eval(), tokenizer=None, name="tiny-llama",
                       source=Path("tiny-llama"), source_dtype="float32")


@pytest.fixture
def tiny(monkeypatch, tmp_path, tiny_loaded):
    """The tiny model in place of load_model; the working directory empty (no all_cells files
    or cram summaries found by 'auto'); the work itself (the sweep, the horizons, the report's
    sampling) replaced by a tripwire, so a run that gets past the checks ends at once."""
    import embgeom.adapters
    from embgeom.cramming import _horizon_run, _run
    from embgeom.report import _build

    loads = []

    def load(name, **kw):
        loads.append(name)
        return tiny_loaded

    def tripwire(*a, **k):
        raise _PastTheChecks

    monkeypatch.setattr(embgeom.adapters, "load_model", load)
    for module, name in ((_run, "_sweep"), (_horizon_run, "horizons"), (_build, "_sample_phase")):
        monkeypatch.setattr(module, name, tripwire)
    monkeypatch.chdir(tmp_path)
    return loads


@pytest.mark.parametrize("argv, head", [
    (["cram", "--lengths", "2", "--start-token", "10000000"],
     f"--start-token 10000000: not a token id of tiny-llama (its ids are 0 to {VOCAB - 1})"),
    (["cram", "--lengths", "2", "--start-token", str(VOCAB)], f"--start-token {VOCAB}:"),
    (["cram", "--mem", "100000", "--lengths", "2"],
     "--mem 100000: 1 start token + 100000 memory vectors leave no room for a target in the "
     f"context length of tiny-llama ({CONTEXT} tokens); give --mem <= {CONTEXT - 1}"),
    (["cram", "--mem", "100000"], "--mem 100000:"),  # the adaptive search: no lengths given
    (["cram", "--lengths", "2", "100000"],
     "--lengths 100000: 1 start token + 1 memory vector + a 100000-token target take 100001 "
     f"positions, more than the context length of tiny-llama ({CONTEXT} tokens); with --mem 1 "
     f"the longest target that fits is {CONTEXT - 1}"),
    (["cram", "--mem", "1", "9", "--lengths", "250", "--start-token", "none"],
     "--lengths 250: no start token + 9 memory vectors + a 250-token target take 258 positions"),
    (["cram", "--horizons", "--max-length", "100000"], "--max-length 100000:"),
    (["cram", "--horizons", "--start-token", "10000000"], "--start-token 10000000:"),
    (["cram", "--horizons", "--mem", "100000"], "--mem 100000:"),
    (["report", "--lengths", "4", "100000", "--no-cache"],
     f"--lengths 100000: longer than the context length of tiny-llama ({CONTEXT} tokens); "
     f"give lengths <= {CONTEXT}"),
])
def test_model_checks_name_the_flag_before_out_exists(capsys, tmp_path, tiny, argv, head):
    out = tmp_path / "deep" / "out"
    code, err = _run(capsys, [*argv, "--out", str(out)])
    assert tiny, "the model was not loaded: this check needs no model"
    assert code == 2 and f"embgeom {argv[0]}: error: {head}" in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "deep").exists()


def test_lengths_that_fit_pass_the_model_check(tiny_loaded):
    """The boundary: start token + m vectors + target, the last target token never fed
    (the library's count)."""
    check = cli._check_cram_against_model
    check([1], {1: CONTEXT - 1}, "auto", "--lengths")(tiny_loaded)
    check([1], {1: CONTEXT}, None, "--lengths")(tiny_loaded)  # no start token: one more
    check([CONTEXT - 1], {CONTEXT - 1: 1}, "auto", "--lengths")(tiny_loaded)
    check([1], {1: 1}, VOCAB - 1, "--lengths")(tiny_loaded)
    with pytest.raises(cli.UsageError, match=f"^--lengths {CONTEXT}: "):
        check([1], {1: CONTEXT}, "auto", "--lengths")(tiny_loaded)
    with pytest.raises(cli.UsageError, match=f"^--mem {CONTEXT}: "):
        check([CONTEXT], {CONTEXT: 1}, "auto", "--lengths")(tiny_loaded)
    cli._check_report_against_model([4, CONTEXT])(tiny_loaded)
    with pytest.raises(cli.UsageError, match=r"the size preset's"):
        cli._check_report_against_model([CONTEXT + 1], given=False)(tiny_loaded)


def test_the_library_hook_runs_before_anything_is_written(tmp_path, tiny_loaded):
    """``on_load`` of run_cram, run_horizons and build_report: called with the loaded model
    before the output folder exists; raising there leaves nothing behind."""
    from embgeom.cramming import run_cram, run_horizons
    from embgeom.report import build_report

    class Refused(Exception):
        pass

    def refuse(loaded):
        assert loaded is tiny_loaded
        raise Refused

    for name, call in (("c", lambda out: run_cram(tiny_loaded, [1], out, lengths=[2],
                                                   on_load=refuse)),
                       ("h", lambda out: run_horizons(tiny_loaded, [1], out, on_load=refuse)),
                       ("r", lambda out: build_report(tiny_loaded, out, quick=True,
                                                      cache_dir=None, on_load=refuse))):
        out = tmp_path / name
        with pytest.raises(Refused):
            call(out)
        assert not out.exists()


# ---------------------------------------------------------------------------------------------
# A run that fails after it created --out removes it while it is empty, and only then
# ---------------------------------------------------------------------------------------------


def _failing_cram(monkeypatch, exc=ValueError("boom")):
    from embgeom import cramming

    def fake(model, mems, out, **kw):
        Path(out).mkdir(parents=True, exist_ok=True)
        raise exc

    monkeypatch.setattr(cramming, "run_cram", fake)


@pytest.mark.parametrize("exc, rc", [(ValueError("boom"), 1), (OSError("disk full"), 2),
                                     (KeyboardInterrupt(), 130)])
def test_a_failed_run_removes_the_empty_folders_it_made(capsys, tmp_path, monkeypatch, exc, rc):
    _failing_cram(monkeypatch, exc)
    code, _ = _run(capsys, ["cram", "--lengths", "2", "--out", str(tmp_path / "a" / "b" / "c")])
    assert code == rc
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_keeps_a_folder_that_existed_or_holds_files(capsys, tmp_path, monkeypatch):
    _failing_cram(monkeypatch)
    mine = tmp_path / "mine"
    mine.mkdir()
    assert _run(capsys, ["cram", "--lengths", "2", "--out", str(mine)])[0] == 1
    assert mine.is_dir()
    # a folder this run made, with a file in it (a resume file, a figure): kept, parents too
    from embgeom import cramming

    def writes(model, mems, out, **kw):
        Path(out).mkdir(parents=True)
        (Path(out) / "cram.jsonl").write_text("{}\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(cramming, "run_cram", writes)
    out = tmp_path / "new" / "c"
    assert _run(capsys, ["cram", "--lengths", "2", "--out", str(out)])[0] == 130
    assert (out / "cram.jsonl").is_file()


def test_a_failed_copy_or_report_removes_its_empty_out(capsys, tmp_path, monkeypatch):
    from embgeom import copying, report

    def fails(*a, **kw):
        out = Path(a[1] if len(a) > 1 else a[0])  # build_report(model, out), run_copy(out)
        out.mkdir(parents=True)
        if kw.get("cache_dir") not in (None, "auto"):
            Path(kw["cache_dir"]).mkdir(parents=True)
        raise ValueError("boom")

    monkeypatch.setattr(copying, "run_copy", fails)
    monkeypatch.setattr(report, "build_report", fails)
    assert _run(capsys, ["copy", "--out", str(tmp_path / "c" / "d")])[0] == 1
    assert _run(capsys, ["report", "--cache-dir", str(tmp_path / "cache" / "x"), "--all-cells",
                         "none", "--cram-summary", "none", "--out", str(tmp_path / "r")])[0] == 1
    assert list(tmp_path.iterdir()) == []
