"""The CLI's bad-input paths: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import pytest

from embgeom.cli import main


def _run(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        rc = main(argv)
        raise SystemExit(rc)
    err = capsys.readouterr().err
    return exc.value.code, err


def test_unknown_model_lists_known_names(capsys, tmp_path):
    code, err = _run(capsys, ["report", "--model", "no-such-model", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "smollm2-135m" in err and "gemma-3-270m" in err
    assert "Traceback" not in err


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
    assert "positive" in err or "invalid" in err


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
