"""The CLI: bad input is one line and exit code 2 (checked before any work), an internal error
one line and exit code 1 (a traceback with --debug); the flags every command takes; outputs."""

from __future__ import annotations

import logging
import re
import pytest

from embgeom.cli import main


@pytest.fixture(autouse=True)
def _restore_progress_env(monkeypatch):
    """main() switches the libraries' bars off through the environment: undo it after each test."""
    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(var, raising=False)


def _run(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    return exc.value.code, err


def test_unknown_model_lists_known_names(capsys, caplog, tmp_path):
    with caplog.at_level(logging.INFO, logger="embgeom"):
        code, err = _run(capsys, ["report", "--model", "no-such-model", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "smollm2-135m" in err and "gemma-3-270m" in err
    assert "Traceback" not in err
    logged = [r.getMessage() for r in caplog.records]
    assert "load_model ..." in logged
    assert not any("load_model done" in m for m in logged)  # a phase that raised is not done


@pytest.mark.parametrize("argv, head", [
    (["--model", "no-such-model"], "--model: unknown model"),           # name_or_path inside
    (["--cram-summary", "/no/such/cram_summary.json"], "--cram-summary: no file"),
    # --n-per-length 1 is now the parser's (tests/test_cli_early_errors.py), like 0
])
def test_library_errors_name_the_flag(capsys, tmp_path, argv, head):
    """A library error that names its argument is reworded with the flag the user typed."""
    code, err = _run(capsys, ["report", "--out", str(tmp_path / "r"), *argv])
    assert code == 2 and f"embgeom report: error: {head}" in err, err


def test_out_pointing_at_a_file(capsys, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    code, err = _run(capsys, ["report", "--out", str(f)])
    assert code == 2 and "not a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["report", "--lengths", "0"],
    ["report", "--lengths", "-4"],
    ["report", "--n-per-length", "0"],
    ["report", "--cell-samples", "abc"],
    ["cram", "--mem", "0", "--out", "x"],
    ["copy", "--l-train", "0", "--out", "x"],
])
def test_non_positive_counts(capsys, argv):
    code, err = _run(capsys, argv)
    assert code == 2 and "Traceback" not in err
    assert "positive" in err or "invalid" in err or "expected an integer in [2," in err


@pytest.mark.parametrize("device", ["foo", "cuda:0"])
def test_cram_bad_device_fails_before_loading(capsys, tmp_path, device):
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, err = _run(capsys, ["cram", "--model", "smollm2-135m", "--device", device,
                              "--out", str(tmp_path / "c")])
    assert code == 2 and "device" in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_unknown_model_leaves_no_out_folder(capsys, tmp_path):
    code, _ = _run(capsys, ["report", "--model", "nope", "--out", str(tmp_path / "r")])
    assert code == 2 and not (tmp_path / "r").exists()


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("NONE", None), ("7", 7)])
def test_start_token_flag(text, value):
    from embgeom.cli import build_parser

    args = build_parser().parse_args(["cram", "--out", "x", "--start-token", text])
    assert args.start_token == value


@pytest.mark.parametrize("text", ["bos", "-1", "1.5"])
def test_bad_start_token_flag(capsys, text):
    code, err = _run(capsys, ["cram", "--out", "x", "--start-token", text])
    assert code == 2 and "start-token" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, adaptive", [
    (["--lengths", "2", "4"], False),
    (["--lengths", "2", "4", "--adaptive"], True),
    ([], True),
])
def test_cram_lengths_are_run_as_given(monkeypatch, tmp_path, argv, adaptive):
    """Explicit --lengths are run as given; the adaptive search only without them (or with
    --adaptive)."""
    from embgeom import cramming

    seen = {}

    def fake(model, mems, out, **kw):
        seen.update(kw)
        return {"summary_lines": ["ok"]}

    monkeypatch.setattr(cramming, "run_cram", fake)
    assert main(["cram", "--out", str(tmp_path / "c"), *argv]) == 0
    assert seen["adaptive"] is adaptive and seen["start_token"] == "auto"


# ------------------------------------------------------------------ cram: folders, options, protocol


def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      initializer_range=0.3, tie_word_embeddings=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def test_cram_read_only_out_is_one_line_before_loading(capsys, read_only_folder, monkeypatch):
    """Issue 12, kind 6: an --out folder that cannot be written is refused before the model is
    loaded, in one line with exit code 2."""
    from embgeom.cramming import _run as run_mod

    ro = read_only_folder
    monkeypatch.setattr(run_mod, "_load", lambda name: (_ for _ in ()).throw(
        AssertionError("the model was loaded before --out was checked")))
    for out in (ro, ro / "sub"):
        code, err = _run(capsys, ["cram", "--out", str(out), "--lengths", "2"])
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert "cannot write" in err and str(ro) in err


def test_cram_disk_errors_during_the_run_are_one_line(capsys, tmp_path, monkeypatch):
    import errno

    from embgeom import cramming

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "c" / "cram.jsonl"))

    monkeypatch.setattr(cramming, "run_cram", full)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c"), "--lengths", "2"])
    assert code == 2 and "No space left" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, word", [
    (["--weight-decay", "-1"], "weight-decay"),
    (["--weight-decay", "nan"], "weight-decay"),
    (["--patience", "0"], "patience"),
    (["--precision", "fp16"], "precision"),
    (["--protocol", "kuratov"], "protocol"),
    (["--protocol", "paper", "--model", "pythia-160m"], "model"),
    (["--protocol", "paper", "--adaptive"], "adaptive"),
    (["--adaptive"], "--adaptive: needs --lengths"),  # it changed nothing without them
    (["--executor", "ray", "--n-jobs", "2"], "--n-jobs: only with --executor local"),
    (["--protocol", "paper", "--mem", "7"], "--mem"),
])
def test_cram_bad_new_options(capsys, tmp_path, argv, word):
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c"), *argv])
    assert code == 2 and word in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_cram_options_reach_run_cram(monkeypatch, tmp_path):
    from embgeom import cramming

    seen = {}
    monkeypatch.setattr(cramming, "run_cram",
                        lambda model, mems, out, **kw: seen.update(kw, mems=mems) or {"summary_lines": ["ok"]})
    assert main(["cram", "--out", str(tmp_path / "c")]) == 0
    assert (seen["precision"], seen["weight_decay"], seen["patience"]) == ("float32", 0.0, None)
    assert (seen["mems"], seen["n_targets"], seen["steps"], seen["lr"], seen["device"]) == (
        [1], 8, 1000, 1e-2, "cpu")
    assert main(["cram", "--out", str(tmp_path / "c"), "--precision", "bf16-autocast",
                 "--weight-decay", "0.01", "--patience", "30"]) == 0
    assert (seen["precision"], seen["weight_decay"], seen["patience"]) == ("bf16-autocast", 0.01, 30)
    # the paper preset (device cuda: accepted here without a GPU), then the command line's
    monkeypatch.setattr("embgeom._hf.check_device", lambda d: d)
    assert main(["cram", "--out", str(tmp_path / "c"), "--protocol", "paper"]) == 0
    assert seen["mems"] == [1, 2, 3, 4] and seen["steps"] == 5000 and seen["patience"] == 2000
    assert seen["betas"] == (0.9, 0.9) and seen["weight_decay"] == 0.01 and seen["device"] == "cuda"
    assert seen["mixed_batches"] == 2 and seen["adaptive"] is False
    assert seen["protocol"]["name"] == "paper" and seen["protocol"]["overridden"] == []
    assert main(["cram", "--out", str(tmp_path / "c"), "--protocol", "paper", "--mem", "2",
                 "--steps", "100"]) == 0
    assert seen["mems"] == [2] and list(seen["lengths"]) == [2] and seen["steps"] == 100
    assert seen["protocol"]["overridden"] == ["mem", "steps"]
    assert main(["cram", "--out", str(tmp_path / "c"), "--protocol", "paper", "--start-token",
                 "none"]) == 0
    assert seen["start_token"] is None and seen["protocol"]["overridden"] == ["start_token"]


def test_cram_protocol_paper_runs_end_to_end_at_toy_scale(monkeypatch, tmp_path, capsys):
    """`embgeom cram --protocol paper` on a tiny random Llama (the preset's grid and step budget
    overridden to toy size, the rest the paper's: AdamW betas (0.9, 0.9), weight decay 0.01,
    bf16 autocast with float32 verdicts, mixed batches): the run ends, the summary records the
    protocol and every JSONL record its precision and stop reason."""
    import json

    import torch

    from embgeom.cramming import _run as run_mod

    tiny = _tiny_llama()
    monkeypatch.setattr(run_mod, "_load", lambda name: tiny)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path / "paper"
    try:
        code = main(["cram", "--protocol", "paper", "--model", "smollm2-135m", "--out", str(out),
                     "--mem", "1", "2", "--lengths", "2", "4", "--n-targets", "2", "--steps", "30",
                     "--patience", "10", "--device", "cpu"])
    finally:
        torch.set_num_threads(old)
    assert code == 0
    s = json.loads((out / "cram_summary.json").read_text())
    st = s["settings"]
    assert st["protocol"]["name"] == "paper" and st["protocol"]["model"] == "smollm2-135m"
    assert st["protocol"]["overridden"] == ["device", "lengths", "mem", "n_targets", "patience", "steps"]
    assert (st["precision"], st["weight_decay"], st["patience"], st["betas"]) == (
        "bf16-autocast", 0.01, 10, [0.9, 0.9])
    assert st["mixed_batches"] == 2 and st["steps"] == 30
    assert set(s["curves"]) == {"1", "2"} and all(c["trials"] == [2, 2] for c in s["curves"].values())
    recs = [json.loads(x) for x in (out / "cram.jsonl").read_text().splitlines()]
    assert len(recs) == 8
    assert {r["precision"] for r in recs} == {"bf16-autocast"}
    assert {r["stop_reason"] for r in recs} <= {"accuracy", "patience", "steps"}
    assert all(r["steps"] <= 30 for r in recs)
    assert all(r["settings"]["patience"] == 10 and r["settings"]["weight_decay"] == 0.01 for r in recs)
    assert "protocol paper" in (out / "cram_summary.md").read_text()


# ---------------------------------------------------------------------------------------------
# Conventions: --version, python -m embgeom, help text and defaults, -q/-v, --debug, outputs
# ---------------------------------------------------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import embgeom  # noqa: E402
from embgeom.cli import build_parser  # noqa: E402

COMMANDS = ("report", "cram", "copy")


def _subparsers():
    return build_parser()._subparsers._group_actions[0].choices


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"embgeom {embgeom.__version__}"


def test_python_dash_m_embgeom():
    out = subprocess.run([sys.executable, "-m", "embgeom", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"embgeom {embgeom.__version__}"


def test_top_level_help_imports_nothing_heavy():
    code = ("import sys\nfrom embgeom.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'torch', 'scipy') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_shows_its_default(command, capsys):
    sub = _subparsers()[command]
    for action in sub._actions:
        assert action.help and action.help.strip(), f"{command} {action.option_strings} has no help"
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in sub._actions:
        if action.default not in (None, False, 0, argparse_suppress()) and action.option_strings:
            assert f"(default: {action.default})" in text, (command, action.option_strings)
            # ... and once: a help text that names its default as well reads it twice
            assert len(re.findall(r"\bdefault\b", sub._get_formatter()._expand_help(action))) <= 1, (
                command, action.option_strings)
    for flag in ("--quiet", "--verbose", "--no-progress", "--debug", "--seed"):
        assert flag in text


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_only_the_commands_own_options(command, capsys):
    """`embgeom report --help` said "default 1 with --device cuda" (of --ray-num-gpus), but only
    `cram` has --device: every flag a command's help names is one of its own."""
    sub = _subparsers()[command]
    own = {o for action in sub._actions for o in action.option_strings}
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert named <= own, (command, sorted(named - own))
    gpus = {"report": "GPUs per Ray task (default 0)",
            "cram": "GPUs per Ray task (default 1 with --device cuda, else 0)"}.get(command)
    if gpus is not None:  # and the default it states is the one executor_from_args takes
        assert gpus in " ".join(text.split())


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


@pytest.mark.parametrize("command", COMMANDS)
def test_diagnostic_flags_on_every_command(command):
    args = build_parser().parse_args([command, "--out", "x", "-q", "--no-progress", "--debug"])
    assert args.quiet and args.no_progress and args.debug and args.verbose == 0
    args = build_parser().parse_args([command, "--out", "x", "-vv"])
    assert args.verbose == 2 and not args.quiet


def test_quiet_and_verbose_exclude_each_other(capsys):
    code, err = _run(capsys, ["copy", "--out", "x", "-q", "-v"])
    assert code == 2 and "exclude each other" in err


def _fake_cram(monkeypatch, body):
    from embgeom import cramming

    seen = {}

    def fake(model, mems, out, **kw):
        seen.update(kw)
        return body()

    monkeypatch.setattr(cramming, "run_cram", fake)
    return seen


def test_internal_error_is_one_line_exit_1(capsys, monkeypatch, tmp_path):
    """A ValueError from inside numpy is a bug, not bad input: exit 1, one line, --debug hint."""
    _fake_cram(monkeypatch, lambda: np.zeros(3) + np.zeros(4))
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 1 and "internal error" in err and "--debug" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_internal_error_other_kind(capsys, monkeypatch, tmp_path):
    _fake_cram(monkeypatch, lambda: {}["missing"])
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 1 and "internal error" in err and "KeyError" in err


def test_debug_reraises_with_traceback(monkeypatch, tmp_path):
    _fake_cram(monkeypatch, lambda: np.zeros(3) + np.zeros(4))
    with pytest.raises(ValueError, match="broadcast"):
        main(["cram", "--out", str(tmp_path / "c"), "--debug"])


def test_input_error_raised_by_embgeom_stays_a_usage_error(capsys, monkeypatch, tmp_path):
    from embgeom._validation import check_positive_int

    _fake_cram(monkeypatch, lambda: check_positive_int(0, "n_targets"))
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 2 and "--n-targets: expected an integer >= 1" in err and "internal" not in err


def test_oserror_during_work_is_one_line(capsys, monkeypatch, tmp_path):
    def boom():
        raise PermissionError(13, "Permission denied", str(tmp_path / "c" / "cram.jsonl"))

    _fake_cram(monkeypatch, boom)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 2 and "Permission denied" in err and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_out_under_a_file_fails_before_any_work(capsys, monkeypatch, tmp_path, command):
    from embgeom import copying, cramming, report

    called = []
    for mod, name in ((cramming, "run_cram"), (copying, "run_copy"), (report, "build_report")):
        monkeypatch.setattr(mod, name, lambda *a, **k: called.append(1))
    f = tmp_path / "file.txt"
    f.write_text("x")
    code, err = _run(capsys, [command, "--out", str(f / "sub")])
    assert code == 2 and "is a file" in err and "Traceback" not in err
    assert not called


def test_unwritable_out_fails_before_any_work(capsys, monkeypatch, tmp_path):
    """A folder that cannot be written (as a read-only one for a non-root user)."""
    import embgeom.cli as cli

    called = _fake_cram(monkeypatch, lambda: {"summary_lines": ["ok"]})

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.tempfile, "TemporaryFile", refuse)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 2 and "cannot write" in err and "Permission denied" in err
    assert not called and not (tmp_path / "c").exists()


def test_read_only_out_for_real(capsys, tmp_path):
    import os

    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the monkeypatched test covers the path")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, err = _run(capsys, ["copy", "--out", str(ro / "run")])
    finally:
        ro.chmod(0o755)
    assert code == 2 and "cannot write" in err


def test_progress_is_off_when_stderr_is_not_a_terminal(monkeypatch, tmp_path):
    seen = _fake_cram(monkeypatch, lambda: {"summary_lines": ["ok"]})
    assert main(["cram", "--out", str(tmp_path / "c")]) == 0
    assert seen["progress"] is False  # pytest captures stderr: not a terminal


def test_library_bars_are_switched_off_with_ours(monkeypatch, tmp_path):
    """transformers' and the GGUF loader's own bars (e.g. "Writing model shards") follow ours."""
    import os

    _fake_cram(monkeypatch, lambda: {"summary_lines": ["ok"]})
    assert main(["cram", "--out", str(tmp_path / "c")]) == 0
    assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def test_progress_helper():
    import io

    from embgeom._progress import progress_enabled, tqdm_kwargs

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress_enabled(True, Tty()) and not progress_enabled(False, Tty())
    assert not progress_enabled(True, io.StringIO())
    assert tqdm_kwargs(True, Tty())["disable"] is False
    assert tqdm_kwargs(True, io.StringIO())["disable"] is True


@pytest.mark.parametrize("flags, level", [([], logging.WARNING), (["-v"], logging.INFO),
                                          (["-vv"], logging.DEBUG), (["-q"], logging.ERROR)])
def test_log_levels(monkeypatch, tmp_path, flags, level):
    _fake_cram(monkeypatch, lambda: {"summary_lines": ["ok"]})
    root = logging.getLogger()
    old = root.level
    try:
        assert main(["cram", "--out", str(tmp_path / "c"), *flags]) == 0
        assert root.level == level
    finally:
        root.setLevel(old)


def test_copy_prints_a_table_and_the_json_path(capsys, monkeypatch, tmp_path):
    """No JSON on stdout (it used to be cut at 4,000 characters): a table and the file's path."""
    from embgeom import _json, copying

    out = tmp_path / "copy"

    def fake(out_dir, **kw):
        res = {"config": {"alphabet": 16, "l_train": 4, "steps": 3, "seed": 0},
               "evaluation": {"lengths": list(range(1, 13)), "exact_match": [1.0] * 6 + [0.0] * 6},
               "cliff": 6.5, "cliff_interval": [6, 7], "bounds": {"x": list(range(5000))},
               "files": {"summary": str(out / "copy_summary.json")}, "wall_s": 1.0}
        out.mkdir(parents=True)
        _json.dump(res, out / "copy_summary.json")
        return res

    monkeypatch.setattr(copying, "run_copy", fake)
    assert main(["copy", "--out", str(out), "--l-train", "4"]) == 0
    text = capsys.readouterr().out
    assert "cliff: 6.5" in text and str(out / "copy_summary.json") in text
    assert "{" not in text and len(text) < 2000
    import json

    assert len(json.loads((out / "copy_summary.json").read_text())["bounds"]["x"]) == 5000


# ---------------------------------------------------------------------------------------------
# Issue 21, kind 6: a third-party exception caused by the user's input never reaches the
# "internal error" branch; it is one line on stderr that names the flag, and exit code 2
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    """Folders and files that are not loadable causal LMs, each as a user might pass them."""
    import json

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("bad_models")
    torch.manual_seed(0)
    good = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2,
                                      n_positions=32))

    def folder(name):
        (root / name).mkdir()
        return root / name

    folder("empty")
    (folder("config_not_json") / "config.json").write_text("{not json")
    (folder("config_without_model_type") / "config.json").write_text(json.dumps({"n_embd": 32}))
    (folder("unknown_model_type") / "config.json").write_text(json.dumps({"model_type": "nosuch"}))
    good.config.save_pretrained(folder("no_weights"))
    good.save_pretrained(root / "truncated_weights")
    w = root / "truncated_weights" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    good.save_pretrained(root / "config_does_not_fit")
    cfg = json.loads((root / "config_does_not_fit" / "config.json").read_text())
    (root / "config_does_not_fit" / "config.json").write_text(json.dumps({**cfg, "n_embd": 64}))
    (root / "not_a.gguf").write_bytes(b"this is not a gguf file" * 8)
    (root / "empty.gguf").write_bytes(b"")
    return root


BAD_MODELS = ["empty", "config_not_json", "config_without_model_type", "unknown_model_type",
              "no_weights", "truncated_weights", "config_does_not_fit", "not_a.gguf", "empty.gguf"]


def _one_error_line(err, command):
    import re

    # a bar of transformers' own ("Loading weights: 100%|...| 16/16 [...]") when transformers was
    # imported before main() switched the bars off (another test imported it first)
    err = re.sub(r"[^\n]*\|\s*\d+/\d+ \[[^\]]*\]", "", err)
    lines = [x for x in err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith(f"embgeom {command}: ")]
    assert len(errors) == 1 and "Traceback" not in err and "internal error" not in err, err
    # the rest, if any, are the report's phase lines (a sign of life when stderr is no terminal)
    assert all(x.startswith("embgeom: info:") for x in lines if x not in errors), err
    return errors[0]


@pytest.mark.parametrize("name", BAD_MODELS)
@pytest.mark.parametrize("command", ["report", "cram"])
def test_a_model_that_cannot_be_loaded_names_model(capsys, tmp_path, bad_models, name, command):
    """Empty folder (the issue's example: "internal error (ValueError: Unrecognized model ...)"),
    broken config, missing/truncated/misfit weights, a .gguf that is not one: exit 2, one line
    naming --model, the path and the loader's own reason."""
    extra = ["--lengths", "2"] if command == "cram" else ["--quick"]
    code, err = _run(capsys, [command, "--model", str(bad_models / name), "--out",
                              str(tmp_path / "o"), *extra])
    line = _one_error_line(err, command)
    assert code == 2
    assert line.startswith(f"embgeom {command}: error: --model: cannot load a causal language "
                           f"model from {bad_models / name} ("), line


def test_empty_model_folder_in_a_real_process(tmp_path):
    """The issue's reproducer as a user runs it: `embgeom report --model <empty folder>`."""
    (tmp_path / "empty").mkdir()
    for quiet in ([], ["-q"]):
        out = subprocess.run([sys.executable, "-m", "embgeom", "report", "--model",
                              str(tmp_path / "empty"), "--out", str(tmp_path / "r"), *quiet],
                             capture_output=True, text=True, timeout=300,
                             env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
        assert out.returncode == 2, out.stderr
        line = _one_error_line(out.stderr, "report")
        assert line.startswith("embgeom report: error: --model: cannot load") and "model_type" in line
        if quiet:
            assert out.stderr.strip() == line


def test_files_that_are_not_text_name_their_flag(capsys, tmp_path, monkeypatch):
    """A binary --cram-summary (was "internal error (UnicodeDecodeError ...)"), and a binary
    cram.jsonl in cram's --out, refused before any model is loaded."""
    from embgeom.cramming import _run as run_mod

    monkeypatch.setattr(run_mod, "_load", lambda name: (_ for _ in ()).throw(
        AssertionError("the model was loaded before the resume file was checked")))
    blob = bytes(range(128, 256)) * 4
    (tmp_path / "summary.json").write_bytes(blob)
    code, err = _run(capsys, ["report", "--cram-summary", str(tmp_path / "summary.json"),
                              "--out", str(tmp_path / "r")])
    assert code == 2 and _one_error_line(err, "report").startswith(
        f"embgeom report: error: --cram-summary: {tmp_path / 'summary.json'} is not UTF-8 text")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cram.jsonl").write_bytes(b'{"ok": 1}\n' + blob)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c"), "--lengths", "2"])
    assert code == 2 and _one_error_line(err, "cram").startswith(
        f"embgeom cram: error: --out: {tmp_path / 'c' / 'cram.jsonl'} is not UTF-8 text")


@pytest.mark.parametrize("command, flags", [
    ("report", "--lengths, --n-per-length, --cell-samples"),
    ("cram", "--mem, --lengths, --n-targets"),
    ("copy", "--alphabet, --l-train"),
])
@pytest.mark.parametrize("exc", [
    MemoryError("Unable to allocate 91.6 GiB for an array with shape (64, 192112075)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 25600000512 bytes."),
])
def test_sizes_that_do_not_fit_in_memory_name_the_size_flags(capsys, monkeypatch, tmp_path,
                                                             command, flags, exc):
    """`copy --alphabet 100000000` and `cram --mem 100000000` ran out of memory as an
    "internal error"; the sizes are the user's: exit 2, naming the flags that set them."""
    from embgeom import copying, cramming, report

    def boom(*a, **k):
        raise exc

    for mod, name in ((cramming, "run_cram"), (copying, "run_copy"), (report, "build_report")):
        monkeypatch.setattr(mod, name, boom)
    code, err = _run(capsys, [command, "--out", str(tmp_path / "o")])
    line = _one_error_line(err, command)
    assert code == 2 and line.startswith(f"embgeom {command}: error: out of memory (")
    assert line.endswith(f"lower {flags}")


def test_a_bug_is_still_an_internal_error_and_on_one_line(capsys, monkeypatch, tmp_path):
    """The kinds above are narrow: a RuntimeError or IndexError from torch stays a bug."""
    for exc in (RuntimeError("shape mismatch\nin a kernel"), IndexError("index out of range")):
        _fake_cram(monkeypatch, lambda: (_ for _ in ()).throw(exc))
        code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
        assert code == 1 and "internal error" in err and len(err.strip().splitlines()) == 1


def test_multi_line_messages_become_one_line(capsys, monkeypatch, tmp_path):
    def boom():
        raise OSError("first line\n  second line")

    _fake_cram(monkeypatch, boom)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c")])
    assert code == 2 and err.strip() == "embgeom cram: error: first line second line"


@pytest.mark.parametrize("argv, head", [
    (["--executor", "ray", "--ray-num-cpus", "-1"], "--ray-num-cpus: expected a number > 0"),
    (["--executor", "ray", "--ray-num-cpus", "nan"], "--ray-num-cpus: expected a finite number"),
    (["--executor", "ray", "--ray-num-gpus", "-2"], "--ray-num-gpus: expected a number >= 0"),
])
def test_ray_resources_name_their_flag(capsys, tmp_path, argv, head):
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c"), *argv])
    assert code == 2 and err.strip().startswith(f"embgeom cram: error: {head}"), err


@pytest.mark.parametrize("command", ["report", "cram"])
def test_n_jobs_with_ray_is_refused(capsys, tmp_path, command):
    """`--executor ray --n-jobs 2` ran on Ray and dropped --n-jobs without a word."""
    code, err = _run(capsys, [command, "--out", str(tmp_path / "c"), "--executor", "ray",
                              "--n-jobs", "2"])
    assert code == 2 and err.strip().startswith(
        f"embgeom {command}: error: --n-jobs: only with --executor local"), err
    assert not (tmp_path / "c").exists()


def test_n_jobs_default_is_the_commands():
    from embgeom.cli import build_parser
    from embgeom.parallel import LocalExecutor, executor_from_args

    parser = build_parser()
    rep = executor_from_args(parser.parse_args(["report"]))
    cram = executor_from_args(parser.parse_args(["cram", "--out", "x"]))
    assert isinstance(rep, LocalExecutor) and rep.n_jobs == -1
    assert isinstance(cram, LocalExecutor) and cram.n_jobs == 1
    assert executor_from_args(parser.parse_args(["report", "--n-jobs", "2"])).n_jobs == 2


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("seed", [str(2**63), str(2**70), "-1"])
def test_seed_outside_the_range_every_command_can_use(capsys, command, seed):
    """`cram --seed 2**70` failed deep in the seeding ("got list [...]"); the range is one for
    every command and checked by the parser."""
    code, err = _run(capsys, [command, "--out", "x", "--seed", seed])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"embgeom {command}: error: argument --seed: expected an integer in "
                          "[0, 2**63)")


@pytest.mark.parametrize("argv", [
    ["report", "--lengths", "0"], ["cram", "--out", "x", "--precision", "fp16"],
    ["copy", "--bogus", "--out", "x"], ["report", "--n-per-length"], [],
])
def test_parser_errors_are_one_line(capsys, argv):
    code, err = _run(capsys, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err, err
    assert err.rstrip().endswith("--help)")


def test_diverged_optimisation_is_the_users_lr(capsys, monkeypatch, tmp_path):
    """A FloatingPointError that embgeom raises on purpose (the loss diverged: "use a smaller
    lr") is the user's setting, not a bug."""
    from embgeom.cramming import _run as run_mod

    tiny = _tiny_llama()
    monkeypatch.setattr(run_mod, "_load", lambda name: tiny)
    code, err = _run(capsys, ["cram", "--out", str(tmp_path / "c"), "--lengths", "2", "--lr",
                              "1e308", "--steps", "3", "--n-targets", "1", "--start-token", "none"])
    assert code == 2 and "not finite" in err and "lr" in err and "internal" not in err, err


def test_the_default_log_level_shows_where_model_and_states_came_from(monkeypatch):
    """At the default level (warnings) the adapters' INFO lines still show: one line each says
    whether the model came from the converted cache and the hidden states from theirs; -q hides
    them."""
    import argparse
    import logging

    from embgeom import cli

    saved = {n: logging.getLogger(n).level for n in ("", "embgeom.adapters", "embgeom.report")}
    try:
        cli._setup_logging(argparse.Namespace(quiet=False, verbose=0, no_progress=False))
        assert logging.getLogger("embgeom.adapters._load").isEnabledFor(logging.INFO)
        assert not logging.getLogger("embgeom.cells").isEnabledFor(logging.INFO)
        logging.getLogger("embgeom.adapters").setLevel(logging.NOTSET)
        cli._setup_logging(argparse.Namespace(quiet=True, verbose=0, no_progress=False))
        assert not logging.getLogger("embgeom.adapters._sample").isEnabledFor(logging.WARNING)
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)
