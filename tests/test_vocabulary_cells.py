"""Every cell of a vocabulary, in resumable chunks (``volumes.vocabulary_cell_volumes``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embgeom.cells import Decoder
from embgeom.supports import Ball, Box, Ellipsoid
from embgeom.volumes import cell_volumes, load_vocabulary_cell_volumes, vocabulary_cell_volumes


def _case():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((60, 5)).astype(np.float32)
    return Decoder(W), Ball.from_params(np.zeros(5), 1.0)


def test_chunked_resumed_run_equals_one_call_of_cell_volumes(tmp_path):
    dec, ball = _case()
    path = tmp_path / "cells.npz"
    one = cell_volumes(dec, ball, 4000, 7, tokens=None, n_chains=32, progress=False)
    part = vocabulary_cell_volumes(dec, ball, path, 4000, 7, chunk_size=16, n_chains=32,
                                   max_chunks=2, progress=False)
    assert part.extra["vocabulary"]["n_done"] == 32 and not part.extra["vocabulary"]["complete"]
    assert (part.token_method[32:] == "not estimated").all()
    assert np.isnan(part.log_fractions[32:]).all()
    # resumed (on a pool of two: the same numbers), the rest done, the first chunks read back
    full = vocabulary_cell_volumes(dec, ball, path, 4000, 7, chunk_size=16, n_chains=32,
                                   n_jobs=2, progress=False)
    assert full.extra["vocabulary"]["complete"]
    for f in ("log_fractions", "log_lower", "log_upper"):
        want = getattr(one, f).astype(np.float32).astype(np.float64)  # the file keeps float32
        np.testing.assert_array_equal(getattr(full, f), want, err_msg=f)
    np.testing.assert_array_equal(full.token_method, one.token_method)
    np.testing.assert_array_equal(full.counts, one.counts)
    np.testing.assert_array_equal(full.extra["rare_event_n_runs"], one.extra["rare_event_n_runs"])
    # the three estimators all occur here: splitting, counts and cells proven empty
    assert {"rare-event", "uniform", "empty"} <= set(full.token_method.tolist())
    again = load_vocabulary_cell_volumes(path, dec, ball)
    np.testing.assert_array_equal(again.log_fractions, full.log_fractions)
    assert again.seed.entropy == one.seed.entropy


def test_a_file_of_another_model_support_or_setting_is_refused(tmp_path):
    dec, ball = _case()
    path = tmp_path / "cells.npz"
    vocabulary_cell_volumes(dec, ball, path, 2000, 3, chunk_size=30, n_chains=32, max_chunks=1,
                            progress=False)
    with pytest.raises(ValueError, match="another decoder or support"):
        load_vocabulary_cell_volumes(path, Decoder(dec.W_ * 2), ball)
    with pytest.raises(ValueError, match="another decoder or support"):
        load_vocabulary_cell_volumes(path, dec, Ellipsoid.from_params(np.zeros(5),
                                                                      semi_axes=[1, 1, 1, 1, 2.0]))
    # the shares of cones do not depend on the ball's radius: the file is this ball's too
    big = load_vocabulary_cell_volumes(path, dec, Ball.from_params(np.zeros(5), 1e150))
    assert big.extra["vocabulary"]["n_done"] == 30
    with pytest.raises(ValueError, match="seed_entropy"):
        vocabulary_cell_volumes(dec, ball, path, 2000, 4, chunk_size=30, n_chains=32, progress=False)
    with pytest.raises(ValueError, match="n_chains"):
        vocabulary_cell_volumes(dec, ball, path, 2000, 3, chunk_size=30, n_chains=64, progress=False)
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a file of vocabulary_cell_volumes"):
        load_vocabulary_cell_volumes(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="seed"):
        vocabulary_cell_volumes(dec, ball, tmp_path / "b.npz", 2000, None, progress=False)
    with pytest.raises(ValueError, match="cones"):
        vocabulary_cell_volumes(dec, Box.from_params(-np.ones(5), np.ones(5)), tmp_path / "c.npz",
                                2000, 0, progress=False)
    with pytest.raises(ValueError, match="chunk_size"):
        vocabulary_cell_volumes(dec, ball, tmp_path / "d.npz", 2000, 0, chunk_size=0, progress=False)


def test_the_report_uses_the_file_of_its_own_model_and_support(tmp_path):
    from embgeom.report._cells import cells_markdown, cells_report_section

    rng = np.random.default_rng(1)
    W = rng.standard_normal((12, 5)).astype(np.float32)
    dec = Decoder(W)
    path = tmp_path / "cells.npz"
    full = vocabulary_cell_volumes(dec, Ball.from_params(np.zeros(5), 1.0), path, 3000, 2,
                                   chunk_size=5, n_chains=32, progress=False)
    other = tmp_path / "other.npz"  # another model's file comes first and is passed over
    vocabulary_cell_volumes(Decoder(W[::-1].copy()), Ball.from_params(np.zeros(5), 1.0), other,
                            3000, 2, n_chains=32, progress=False)
    ball = Ball.from_params(np.zeros(5), 3.0)  # the report's fitted ball: another radius
    section = cells_report_section(dec, ball, 3000, 2, tmp_path / "rep", unargmaxable="off",
                                   progress=False, vocabulary=[other, path])
    v = section["vocabulary"]
    assert v["path"] == str(path) and v["complete"] and v["n_done"] == 12
    fin = np.sort(full.log_fractions[np.isfinite(full.log_fractions)])
    assert [r["log_share"] for r in v["smallest"]] == fin[:20].tolist()
    assert [r["log_share"] for r in v["largest"]] == fin[::-1][:20].tolist()
    assert v["lambda_all"] == full.cell_volume_rate().rate
    assert (tmp_path / "rep" / v["histogram"]).is_file()
    assert "Every cell (12 tokens" in cells_markdown(section, "ball_origin")
    # only other models' files: no section; an unfinished file of this model: named, not used
    assert cells_report_section(dec, ball, 3000, 2, tmp_path / "rep", unargmaxable="off",
                                progress=False, vocabulary=[other])["vocabulary"] is None
    part = tmp_path / "part.npz"
    vocabulary_cell_volumes(dec, ball, part, 3000, 2, chunk_size=5, n_chains=32, max_chunks=1,
                            progress=False)
    v = cells_report_section(dec, ball, 3000, 2, tmp_path / "rep", unargmaxable="off",
                             progress=False, vocabulary=part)["vocabulary"]
    assert v == {"path": str(part), "complete": False, "n_done": 5}


@pytest.mark.filterwarnings("ignore:target_se")
def test_the_smallest_cells_table_says_what_it_leaves_out(tmp_path):
    """An empty cell (a duplicate row) has no log-share to rank; the table said nothing of the
    11 that SmolLM2 has. The all-cells histogram is in the report's figure list."""
    from embgeom.report._build import _figure_list
    from embgeom.report._cells import cells_markdown, cells_report_section

    rng = np.random.default_rng(2)
    W = rng.standard_normal((10, 4)).astype(np.float32)
    W[9] = W[2]  # token 9 repeats token 2's row: ties go to the lower id, its cell is empty
    dec = Decoder(W)
    path = tmp_path / "cells.npz"
    full = vocabulary_cell_volumes(dec, Ball.from_params(np.zeros(4), 1.0), path, 3000, 2,
                                   chunk_size=5, n_chains=32, progress=False)
    n_empty = int(np.isneginf(full.log_fractions).sum())
    assert np.isneginf(full.log_fractions[9]) and n_empty >= 1
    section = cells_report_section(dec, Ball.from_params(np.zeros(4), 2.0), 3000, 2,
                                   tmp_path / "rep", unargmaxable="off", progress=False,
                                   vocabulary=path)
    v = section["vocabulary"]
    assert v["n_empty"] == n_empty and v["n_unresolved"] == 0
    assert 9 not in [r["token_id"] for r in v["smallest"]]
    assert len(v["smallest"]) == 10 - n_empty
    md = cells_markdown(section, "ball_origin")
    word = "cell" if n_empty == 1 else "cells"
    assert f"the finite ones only; left out: {n_empty} empty {word} (unargmaxable, share 0)" in md
    figs = _figure_list({"figure": "h.png"}, {"figures": {"log_volume": "s.png"}}, section, {})
    assert figs["cell_histogram_all"] == v["histogram"] == "cell_histogram_all.png"
    # the counted shares are named, with the values counts can take (the histogram's spikes)
    counted = full.token_method == "uniform"
    k = int(full.counts[counted].min())
    assert v["n_counted"] == int(counted.sum()) >= 1 and v["min_count"] == k
    assert (f"{int(counted.sum()):,} of these shares are uniform counts k / 3,000 (k >= {k} hits"
            in md) and f"log({k} / N) = {math.log(k / 3000):.2f}" in md


def test_a_rescaled_support_keeps_the_shares_and_takes_its_own_volume(tmp_path):
    """The file's shares are those of directions, so a resumed run (or a load) with a rescaled
    ball reads them; its log-volumes are the new ball's: log|B_10| = log|B_1| + 5 log 10 in
    d = 5 (the trial found a resumed run keeping the first ball's volume, 11.5 nats off)."""
    import math

    dec, ball = _case()
    path = tmp_path / "cells.npz"
    a = vocabulary_cell_volumes(dec, ball, path, 2000, 3, chunk_size=30, n_chains=32,
                                max_chunks=1, progress=False)
    big = Ball.from_params(np.zeros(5), 10.0)
    b = vocabulary_cell_volumes(dec, big, path, 2000, 3, chunk_size=30, n_chains=32,
                                progress=False)
    assert b.support_log_volume == pytest.approx(a.support_log_volume + 5 * math.log(10.0))
    np.testing.assert_array_equal(b.log_fractions[:30], a.log_fractions[:30])
    hit = b.counts > 0
    assert hit.sum() > 20
    # log-volumes follow the best estimate (the file's log-shares): the first 30 tokens are
    # done in both, the rest only in b (nan, unresolved, in a)
    np.testing.assert_allclose(b.log_volumes[:30], a.log_volumes[:30] + 5 * math.log(10.0))
    assert np.isnan(a.log_volumes[30:]).all() and np.isfinite(b.log_volumes[30:][hit[30:]]).all()
    np.testing.assert_allclose(b.log_volumes, b.log_fractions + b.support_log_volume)
    again = load_vocabulary_cell_volumes(path, dec, ball)
    assert again.support_log_volume == pytest.approx(a.support_log_volume)
    with pytest.raises(ValueError, match="pass both"):
        load_vocabulary_cell_volumes(path, dec)


def test_vocabulary_run_refuses_what_it_cannot_resume_or_split(tmp_path):
    dec, ball = _case()
    with pytest.raises(TypeError, match="seed: expected an int >= 0 or a SeedSequence, got a Generator"):
        vocabulary_cell_volumes(dec, ball, tmp_path / "a.npz", 2000, np.random.default_rng(1),
                                progress=False)
    biased = Decoder(dec.W_, bias=np.linspace(0, 1, dec.n_tokens))
    with pytest.raises(ValueError, match=r"has a bias; vocabulary_cell_volumes splits every cell; "
                                         r"for these cells use cell_volumes\(\.\.\., method='uniform'\)"):
        vocabulary_cell_volumes(biased, ball, tmp_path / "b.npz", 2000, 0, progress=False)
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "text.npz").write_text("not a zip")
    for p in (tmp_path / "one.npy", tmp_path / "text.npz"):
        with pytest.raises(ValueError, match="path: .* is not a .npz of vocabulary_cell_volumes"):
            load_vocabulary_cell_volumes(p)
    with pytest.raises(FileNotFoundError):
        load_vocabulary_cell_volumes(tmp_path / "missing.npz")
    assert not (tmp_path / "a.npz").exists() and not (tmp_path / "b.npz").exists()


def test_resume_over_a_foreign_file_and_the_above_target_count(tmp_path):
    """A run resumed over a file that is not its .npz names ``path``; the count of tokens that
    stopped above target_se covers every chunk, not the last one only."""
    import warnings

    dec, ball = _case()
    np.save(tmp_path / "x.npy", np.zeros(2))
    (tmp_path / "t.npz").write_text("text")
    for p in (tmp_path / "x.npy", tmp_path / "t.npz"):
        with pytest.raises(ValueError, match="path: .* is not a .npz of vocabulary_cell_volumes"):
            vocabulary_cell_volumes(dec, ball, p, 2000, 0, progress=False)
    path = tmp_path / "cells.npz"
    kw = dict(chunk_size=30, n_chains=32, target_se=1e-4, rare_event_options={"max_runs": 1},
              progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        one = vocabulary_cell_volumes(dec, ball, path, 2000, 3, max_chunks=1, **kw)
        n1 = one.extra["rare_event"]["n_tokens_above_target_se"]
        full = vocabulary_cell_volumes(dec, ball, path, 2000, 3, **kw)
    split = np.isfinite(full.log_fractions) & (full.token_method == "rare-event")
    assert 0 < n1 < int(split.sum())
    assert full.extra["rare_event"]["n_tokens_above_target_se"] == int(split.sum())


# ------------------------------------------------------------------ a new user's findings


@pytest.fixture
def no_uniform_pass(monkeypatch):
    """Fails the test if the uniform pass starts: the refusals below come before any work."""
    import embgeom.volumes as volumes

    def refuse(*args, **kwargs):
        raise AssertionError("the uniform pass ran before the path was checked")

    monkeypatch.setattr(volumes, "cell_volumes", refuse)


def test_a_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, no_uniform_pass,
                                                                  monkeypatch):
    """The trial's path in a missing folder failed after the whole uniform pass, with a raw
    FileNotFoundError naming the internal temp file ``x.npz.tmp.npz``."""
    import re

    dec, ball = _case()
    run = lambda p: vocabulary_cell_volumes(dec, ball, p, 2000, 0, progress=False)  # noqa: E731
    missing = tmp_path / "no" / "such"
    with pytest.raises(ValueError, match=rf"^path: the folder {re.escape(str(missing))} of "
                                         r".*x\.npz does not exist; create it first$"):
        run(missing / "x.npz")
    (tmp_path / "f").write_text("a file")
    with pytest.raises(ValueError, match=r"^path: .*f \(the folder of .*x\.npz\) is not a folder"):
        run(tmp_path / "f" / "x.npz")
    with pytest.raises(ValueError, match=r"^path: .* is a folder; expected the \.npz file"):
        run(tmp_path)
    with pytest.raises(ValueError, match="^path: expected the .npz file to write, got an empty"):
        run("")
    with pytest.raises(TypeError, match="^path: expected a str or path-like, got int"):
        run(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # nothing written, no probe left
    # a folder that takes no new file (read-only, or full): refused before the uniform pass too
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:
        m.setattr(tempfile, "NamedTemporaryFile", refuse)
        with pytest.raises(ValueError, match=r"^path: cannot write in the folder .* of .*x\.npz "
                                             r"\(Permission denied\)$"):
            run(tmp_path / "x.npz")
    # a bare file name (no folder part: the current folder) gets as far as the work itself
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match="uniform pass ran"):
        run("ok.npz")


def test_a_foreign_file_at_path_is_refused_by_name_before_any_work(tmp_path, no_uniform_pass):
    """The trial's ``np.savez(path, x=np.zeros(3))`` gave a raw ``KeyError: 'counts'``; each kind
    of foreign file is one ValueError naming ``path``, from the run and the loader alike, and
    the file is left as it was."""
    import json

    dec, ball = _case()
    keys = ("counts", "done", "log_fractions", "log_lower", "log_upper", "token_method", "n_runs")
    setting = lambda s: np.array(s if isinstance(s, str) else json.dumps(s))  # noqa: E731
    np.savez(tmp_path / "x.npz", x=np.zeros(3))
    np.savez(tmp_path / "kind.npz", settings=setting({"kind": "horizons"}), counts=np.zeros(3))
    np.savez(tmp_path / "json.npz", settings=setting("{not json"))
    np.savez(tmp_path / "list.npz", settings=setting([1, 2]))
    np.savez(tmp_path / "part.npz", settings=setting({"kind": "vocabulary_cell_volumes"}),
             counts=np.zeros(3), done=np.zeros(3, bool))
    (tmp_path / "empty.npz").write_bytes(b"")
    whole = tmp_path / "whole.npz"
    np.savez_compressed(whole, settings=setting({"kind": "vocabulary_cell_volumes"}),
                        **{k: np.random.default_rng(0).standard_normal(4000) for k in keys})
    b = whole.read_bytes()
    (tmp_path / "cut.npz").write_bytes(b[:len(b) // 2])
    bad = bytearray(b)
    bad[len(b) // 3:len(b) // 3 + 64] = bytes(x ^ 0xFF for x in bad[len(b) // 3:len(b) // 3 + 64])
    (tmp_path / "crc.npz").write_bytes(bytes(bad))
    cases = {
        "x.npz": r"is not a file of vocabulary_cell_volumes \(no settings\)$",
        "kind.npz": r"is not a file of vocabulary_cell_volumes$",
        "json.npz": r"is not a file of vocabulary_cell_volumes \(its settings are not a JSON",
        "list.npz": r"is not a file of vocabulary_cell_volumes \(its settings are not a JSON",
        "part.npz": r"is not a file of vocabulary_cell_volumes \(no log_fractions, log_lower, "
                    r"log_upper, token_method, n_runs\)$",
        "empty.npz": r"is not a \.npz of vocabulary_cell_volumes \(not a numpy archive\)$",
        "cut.npz": r"is not a \.npz of vocabulary_cell_volumes \(not a numpy archive\)$",
        "crc.npz": r"is not a readable file of vocabulary_cell_volumes \(BadZipFile: ",
    }
    before = {n: (tmp_path / n).read_bytes() for n in cases}
    for name, why in cases.items():
        p = tmp_path / name
        for call in (lambda: vocabulary_cell_volumes(dec, ball, p, 2000, 0, progress=False),
                     lambda: load_vocabulary_cell_volumes(p)):
            with pytest.raises(ValueError, match=rf"^path: .*{name} {why}"):
                call()
        assert p.read_bytes() == before[name], name
    assert not list(tmp_path.glob("*.tmp.npz"))


def _all_cells_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "all_cells.py"
    spec = importlib.util.spec_from_file_location("all_cells_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_split_check_compares_summed_split_shares_with_independent_hits():
    """benchmarks/all_cells.py's split check: the log-ratio of the split tokens' summed shares to
    an independent run's hits on them, in all and per bin of the file's own hits, with the
    proven-empty and counted tokens left out."""
    from types import SimpleNamespace

    mod = _all_cells_module()
    n = 1_000_000
    p = np.array([0.5, 0.4, 1e-6, 2e-6, 3e-6, 4e-6, 0.0])  # the rest of the mass: counted tokens
    method = np.array(["uniform", "uniform", "rare-event", "rare-event", "rare-event",
                       "rare-event", "empty"])
    with np.errstate(divide="ignore"):
        lf = np.log(p)
    half = np.where(method == "rare-event", 0.4 * 1.959964, 0.0)
    own = np.array([500_000, 400_000, 0, 1, 1, 4, 0])
    indep = np.array([0, 0, 1, 2, 3, 4, 0])  # hits on the split tokens: n * p exactly
    indep[0] = n - indep.sum()
    cv = SimpleNamespace(token_method=method, log_fractions=lf, log_lower=lf - half,
                         log_upper=lf + half, counts=own)
    res = mod.split_check(cv, indep)
    a = res["all"]
    assert a["n_tokens"] == 4 and a["hits"] == 10 and res["n_samples"] == n
    assert a["split_sum"] == pytest.approx(1e-5)
    assert a["log_ratio_nats"] == pytest.approx(0.0, abs=1e-12)
    rel = 0.4 * np.sqrt(np.sum(p[2:6] ** 2)) / 1e-5
    assert a["se_nats"] == pytest.approx(np.sqrt(rel**2 + 1 / 10))
    assert [(b["bin"], b["n_tokens"], b["hits"]) for b in res["bins_by_own_hits"]] == \
        [("0", 1, 1), ("1", 2, 5), ("3-4", 1, 4)]
    # splitting twice too high on every token reads log 2 in every bin
    cv.log_fractions = lf + np.log(2.0)
    res = mod.split_check(cv, indep)
    assert res["all"]["log_ratio_nats"] == pytest.approx(np.log(2.0))
    assert all(b["log_ratio_nats"] == pytest.approx(np.log(2.0)) for b in res["bins_by_own_hits"])


def test_sum_check_takes_the_counted_shares_from_the_independent_run():
    """The file's plain sum is 1 + sum_S p - K_S / N (S: the tokens its counts chose to split),
    above 1 by the selection term; with the counted shares from an independent run the sum is 1
    when the split shares are exact, and the selection term is K'_S / N' - K_S / N."""
    from types import SimpleNamespace

    mod = _all_cells_module()
    n = 1000
    p = np.array([0.6, 0.393, 0.004, 0.003, 0.0])
    method = np.array(["uniform", "uniform", "rare-event", "rare-event", "empty"])
    own = np.array([602, 396, 1, 1, 0])  # the split tokens' own counts sit low: chosen by them
    with np.errstate(divide="ignore"):  # counted tokens keep their own count's share
        lf = np.log(np.where(method == "uniform", own / n, p))
    half = np.where(method == "rare-event", 0.2 * 1.959964, 0.0)
    cv = SimpleNamespace(token_method=method, log_fractions=lf,
                         log_lower=lf - half, log_upper=lf + half, counts=own, n_samples=n)
    indep = np.array([600, 393, 4, 3, 0])
    res = mod.sum_check(cv, indep)
    assert res["sum"] == pytest.approx(1.0 + 0.007 - 2 / n)
    assert res["n_split"] == 3 and res["own_hits_on_split"] == 2 and res["n_unresolved"] == 0
    se_split = 0.2 * np.hypot(0.004, 0.003)
    assert res["se"] == pytest.approx(np.sqrt(2 * (1 - 2 / n) / n**2 + se_split**2))
    ind = res["independent"]
    assert ind["sum"] == pytest.approx(1.0) and ind["one_inside"] is True
    assert ind["selection_term"] == pytest.approx(7 / n - 2 / n)
    assert ind["hits_on_empty"] == 0
    assert res["one_inside"] is False  # the plain sum, 1.005, is 1 + the selection term
    # a file not yet complete gives its sums and no verdict
    cv.log_fractions = cv.log_fractions.copy()
    cv.log_fractions[3] = np.nan
    cv.token_method = np.array(["uniform", "uniform", "rare-event", "not estimated", "empty"])
    part = mod.sum_check(cv, indep)
    assert part["one_inside"] is None and part["independent"]["one_inside"] is None
    assert part["n_unresolved"] == 1
