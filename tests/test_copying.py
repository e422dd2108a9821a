"""Tests of embgeom.copying: the copy task, the trained model's cliff, the cliff detector."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from embgeom import copying  # noqa: E402
from embgeom._stats import wilson_interval  # noqa: E402
from embgeom.copying import CopyTask, detect_cliff  # noqa: E402

# The tiny configuration: L_train = 8, alphabet 8, d = 64, 2 layers, 800 AdamW steps
# (about 30-40 s on one shared core).
L_TRAIN = 8


def _refuse_constant(constant):
    raise ValueError(f"not strict JSON: {constant}")


ALPHABET = 8
STEPS = 800


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy")
    summary = copying.run_copy(
        out, l_train=L_TRAIN, alphabet=ALPHABET, steps=STEPS, hidden_size=64, num_layers=2,
        n_eval=100, max_length=2 * L_TRAIN, seed=0, compare_bounds=False, progress=False,
    )
    return out, summary


# ----------------------------------------------------------------------------------------------
# The trained tiny model
# ----------------------------------------------------------------------------------------------
def test_tiny_model_copies_in_range_and_fails_at_twice_the_length(trained):
    _, s = trained
    ev = s["evaluation"]
    em = dict(zip(ev["lengths"], ev["exact_match"]))
    in_range = [em[L] for L in range(1, L_TRAIN + 1)]
    assert min(in_range) >= 0.95, in_range
    assert em[2 * L_TRAIN] <= 0.2, em
    # and the cliff lies between the two
    assert s["cliff"] is not None and L_TRAIN < s["cliff"] <= 2 * L_TRAIN
    lo, hi = s["cliff_interval"]
    assert lo <= s["cliff"] <= hi


def test_exact_match_agrees_with_teacher_forced_argmax(trained):
    """Greedy exact match == every teacher-forced next-token argmax correct (two methods)."""
    out, _ = trained
    model, task = copying.load_copy_model(out / "checkpoint")
    rng = np.random.default_rng(3)
    for length in (L_TRAIN, L_TRAIN + 3):
        x = task.sample_symbols(64, length, rng)
        gen = copying.greedy_copy(model, task.prompts(x), length).numpy()
        greedy_ok = (gen == x).all(axis=1)
        ids = torch.cat([task.prompts(x), torch.from_numpy(x)], dim=1)
        with torch.no_grad():
            pred = model(input_ids=ids).logits[:, length : 2 * length].argmax(-1).numpy()
        tf_ok = (pred == x).all(axis=1)
        np.testing.assert_array_equal(greedy_ok, tf_ok)
        # first token: both methods see the same prefix, so they must agree exactly
        np.testing.assert_array_equal(gen[:, 0], pred[:, 0])


def test_run_writes_checkpoint_summary_and_figure(trained):
    out, s = trained
    data = json.loads((out / "copy_summary.json").read_text(), parse_constant=_refuse_constant)
    assert data["cliff"] == s["cliff"]
    assert (out / "copy_accuracy.png").stat().st_size > 1000
    assert (out / "checkpoint" / "config.json").exists()
    model, task = copying.load_copy_model(out / "checkpoint")
    assert (task.alphabet, task.l_train) == (ALPHABET, L_TRAIN)
    assert model.config.vocab_size == ALPHABET + 2
    # per-token accuracy is at least exact match at every length
    ev = s["evaluation"]
    assert all(t >= e - 1e-12 for t, e in zip(ev["per_token"], ev["exact_match"]))


def test_compare_with_bounds_is_consistent_and_matches_theorem45(trained):
    pytest.importorskip("embgeom.bounds")
    from embgeom import bounds

    out, s = trained
    model, task = copying.load_copy_model(out / "checkpoint")
    cmp = copying.compare_with_bounds(model, task, s["evaluation"], n_hidden_per_length=8,
                                      n_cell_samples=2000)
    d, eps, r = cmp["hidden_size"], cmp["eps"], cmp["prompt_support"]["radius"]
    per = cmp["per_length"]
    # the bound in use is Theorem 4.5 with m = L + 1 prompt vectors: linear in m, and never
    # above the paper's closed form d m log(1 + 2r/eps) for the ball
    slope_per_vector = np.asarray(per["log_bound"]) / (np.asarray(per["lengths"]) + 1)
    np.testing.assert_allclose(slope_per_vector, slope_per_vector[0], rtol=1e-12)
    assert slope_per_vector[0] <= bounds.theorem45_log_count(d, 1, r, eps) * (1 + 1e-12)
    assert cmp["slope_tokens_per_vector"] == pytest.approx(slope_per_vector[0] / np.log(ALPHABET))
    # the model's demonstrated copies never exceed the bound; copying needs 1 token per vector,
    # far below the slope, so the bound sets no length limit here
    assert cmp["consistent"] is True
    assert cmp["slope_tokens_per_vector"] > 1 and cmp["bound_threshold_length"] is None
    em = dict(zip(per["lengths"], per["log_accessible_lower"]))
    assert em[L_TRAIN] is not None and 0 < em[L_TRAIN] <= L_TRAIN * np.log(ALPHABET)
    counts = dict(zip(s["evaluation"]["lengths"], s["evaluation"]["exact_match_count"]))
    assert all((em[L] is None) == (counts[L] == 0) for L in em)  # log 0 -> None, else finite


def test_compare_with_bounds_cell_shares_are_cell_volumes_on_the_same_inputs(trained):
    """The hidden-side figures are embgeom.volumes.cell_volumes and bounds.cell_volume_rate on
    the same hidden states and seed (no second cell-share estimator inside copying): the counts
    equal bit for bit, and another seed gives other counts."""
    from embgeom import bounds, supports
    from embgeom.cells import Decoder
    from embgeom.volumes import cell_volumes

    out, s = trained
    model, task = copying.load_copy_model(out / "checkpoint")
    cmp = copying.compare_with_bounds(model, task, s["evaluation"], n_hidden_per_length=4,
                                      n_cell_samples=3000, seed=11)
    used = cmp["hidden_support"]["lengths"]
    H, _ = copying.copy_hidden_states(model, task, used, n_per_length=4, seed=11)
    hidden = supports.fit_support(H.astype(np.float64), "ball", center="free")
    assert cmp["hidden_support"]["radius"] == float(hidden.radius_)
    W = model.lm_head.weight.detach().float().numpy()
    cv = cell_volumes(Decoder(W), hidden, 3000, seed=11, method="uniform", progress=False)
    assert cmp["cell_counts"] == cv.counts.tolist() and sum(cmp["cell_counts"]) == 3000
    k = cv.counts[:ALPHABET]
    assert cmp["fraction_of_support_in_alphabet_cells"] == k.sum() / 3000
    np.testing.assert_array_equal(cmp["alphabet_cell_fractions"], k / k.sum())
    rate = bounds.cell_volume_rate(k / k.sum(), k_max=16, n_samples=int(k.sum())).rate
    assert cmp["rate_lambda"] == float(rate)
    other = cell_volumes(Decoder(W), hidden, 3000, seed=12, method="uniform", progress=False)
    assert other.counts.tolist() != cmp["cell_counts"]


def test_intervals_come_from_stats_only():
    """copying keeps no interval of its own and re-exports none (issue 20: one home)."""
    import re
    from pathlib import Path

    assert not hasattr(copying, "wilson_interval")
    for f in Path(copying.__file__).parent.glob("*.py"):
        text = f.read_text()
        assert not re.search(r"def _?(wilson|clopper|binomial)", text), f.name
        if "wilson_interval" in text.split('"""', 2)[-1]:
            assert "from embgeom._stats import wilson_interval" in text, f.name


def test_compare_with_bounds_bad_evaluation():
    task = CopyTask(alphabet=4, l_train=2)
    model = copying.make_copy_model(task, hidden_size=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="exact_match_count"):
        copying.compare_with_bounds(model, task, {"lengths": [1, 2], "n_eval": 4})
    with pytest.raises(ValueError, match="one exact_match_count per length"):
        copying.compare_with_bounds(model, task, {"lengths": [1, 2], "n_eval": 4,
                                                  "exact_match_count": [1]})
    with pytest.raises(TypeError, match="task"):
        copying.compare_with_bounds(model, "task", {})


def test_greedy_copy_restores_the_callers_mode():
    task = CopyTask(alphabet=4, l_train=2)
    model = copying.make_copy_model(task, hidden_size=8, num_layers=1, num_heads=2)  # train mode
    x = task.sample_symbols(3, 2, np.random.default_rng(0))
    a = copying.greedy_copy(model, task.prompts(x), 2)
    assert model.training and a.shape == (3, 2) and a.dtype == torch.int64
    with pytest.raises(TypeError, match="prompts"):
        copying.greedy_copy(model, x, 2)


def test_same_seed_same_weights():
    task = CopyTask(alphabet=4, l_train=3)
    a = copying.make_copy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=5)
    b = copying.make_copy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=5)
    c = copying.make_copy_model(task, hidden_size=16, num_layers=1, num_heads=2, seed=6)
    ha = copying.train_copy_model(a, task, steps=3, batch_size=4, seed=1, progress=False)
    hb = copying.train_copy_model(b, task, steps=3, batch_size=4, seed=1, progress=False)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert ha.loss == hb.loss
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_training_batch_layout():
    task = CopyTask(alphabet=5, l_train=4)
    ids, labels = task.training_batch(np.array([1, 3]), np.random.default_rng(0))
    assert ids.shape == labels.shape == (2, 7)
    x0 = ids[0, 0].item()
    assert ids[0, :3].tolist() == [x0, task.sep_id, x0] and set(ids[0, 3:].tolist()) == {task.pad_id}
    assert labels[0].tolist() == [-100, -100, x0] + [-100] * 4
    x1 = ids[1, :3].tolist()
    assert ids[1, 3].item() == task.sep_id and ids[1, 4:].tolist() == x1
    assert labels[1, 4:].tolist() == x1 and (labels[1, :4] == -100).all()
    assert max(x0, *x1) < 5


# ----------------------------------------------------------------------------------------------
# The cliff detector on synthetic curves
# ----------------------------------------------------------------------------------------------
def test_cliff_of_a_step():
    lengths = np.arange(1, 31)
    em = np.where(lengths < 13, 1.0, 0.0)
    cliff, (lo, hi) = detect_cliff(lengths, em, 200)
    assert cliff == 13 and lo == 13 and hi == 13


def test_cliff_of_a_step_unsorted_input():
    lengths = np.arange(1, 31)
    em = np.where(lengths < 13, 0.98, 0.02)
    perm = np.random.default_rng(0).permutation(30)
    cliff, interval = detect_cliff(lengths[perm], em[perm], 200)
    assert cliff == 13 and interval == (13, 13)


def test_cliff_of_a_ramp():
    # linear fall from 1 at L=10 to 0 at L=30: crosses 0.5 at 20, first below at 21
    lengths = np.arange(1, 41)
    em = np.clip((30 - lengths) / 20.0, 0.0, 1.0)
    cliff, (lo, hi) = detect_cliff(lengths, em, 100)
    assert cliff == 21
    # a ramp is uncertain around 0.5: the interval is wide and contains the crossing
    assert lo < 20 < hi and hi - lo >= 3
    # more strings per length: a narrower interval
    _, (lo2, hi2) = detect_cliff(lengths, em, 10000)
    assert lo <= lo2 <= 21 <= hi2 <= hi and hi2 - lo2 < hi - lo


@pytest.mark.parametrize("level", [1.0, 0.8, 0.5, 0.3, 0.0])
def test_flat_curve_has_no_cliff(level):
    cliff, interval = detect_cliff(np.arange(1, 20), np.full(19, level), 100)
    assert cliff is None and interval is None


def test_cliff_interval_matches_wilson():
    # 0.55 with n=100 straddles 0.5 (Wilson ~[0.45, 0.64]); 0.3 does not
    lengths = np.arange(1, 6)
    em = np.array([1.0, 0.95, 0.55, 0.45, 0.3])
    cliff, interval = detect_cliff(lengths, em, 100)
    assert cliff == 4 and interval == (3, 5)
    lo, hi = wilson_interval(55, 100)
    assert lo < 0.5 < hi


def test_wilson_interval_known_values():
    # Brown, Cai & DasGupta (2001): k=0, n=10 -> upper = z^2/(n+z^2)
    lo, hi = wilson_interval(0, 10)
    z2 = 1.959963984540054**2
    assert lo == 0.0 and hi == pytest.approx(z2 / (10 + z2), rel=1e-12)
    # the same interval in its other textbook form: (k + z^2/2)/(n + z^2) +- half-width
    k, n = 37, 90
    p = k / n
    centre = (k + z2 / 2) / (n + z2)
    half = np.sqrt(z2) * np.sqrt(n) / (n + z2) * np.sqrt(p * (1 - p) + z2 / (4 * n))
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(centre - half, rel=1e-12) and hi == pytest.approx(centre + half, rel=1e-12)


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("l_train", [0, -3])
def test_l_train_below_one(l_train, tmp_path):
    with pytest.raises(ValueError, match="l_train"):
        CopyTask(alphabet=4, l_train=l_train)
    with pytest.raises(ValueError, match="l_train"):
        copying.run_copy(tmp_path, l_train=l_train, progress=False)


@pytest.mark.parametrize("alphabet", [1, 0])
def test_alphabet_below_two(alphabet, tmp_path):
    with pytest.raises(ValueError, match="alphabet"):
        CopyTask(alphabet=alphabet, l_train=4)
    with pytest.raises(ValueError, match="alphabet"):
        copying.run_copy(tmp_path, alphabet=alphabet, progress=False)


def test_non_integer_sizes():
    with pytest.raises(TypeError, match="l_train"):
        CopyTask(alphabet=4, l_train=2.5)
    with pytest.raises(TypeError, match="alphabet"):
        CopyTask(alphabet="8", l_train=2)


def test_empty_evaluation_lengths():
    task = CopyTask(alphabet=4, l_train=2)
    model = copying.make_copy_model(task, hidden_size=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="lengths"):
        copying.evaluate_copy(model, task, [], progress=False)
    with pytest.raises(ValueError, match="lengths"):
        copying.evaluate_copy(model, task, [0, 1], progress=False)
    with pytest.raises(ValueError, match="lengths"):
        detect_cliff([], [], 10)


def test_detect_cliff_bad_input():
    with pytest.raises(ValueError, match="exact_match"):
        detect_cliff([1, 2], [0.5], 10)
    with pytest.raises(ValueError, match="exact_match"):
        detect_cliff([1, 2], [1.2, 0.1], 10)
    with pytest.raises(ValueError, match="n_eval"):
        detect_cliff([1, 2], [1.0, 0.1], 0)
    with pytest.raises(ValueError, match="distinct"):
        detect_cliff([1, 1], [1.0, 0.1], 10)
    with pytest.raises(ValueError, match="exact_match"):
        detect_cliff([1, 2], [np.nan, 0.1], 10)
