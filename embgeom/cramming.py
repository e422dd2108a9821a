"""Cramming: optimise soft prompts (memory vectors) so a frozen causal LM emits a target sequence.

This is the empirical check of the paper's bounds. Freeze a causal language model, prepend
``m`` trainable input vectors (memory vectors, a soft prompt) to the input embeddings of a target
sequence, and optimise them with Adam until, teacher-forced, every next-token argmax of the
target is right (100% token accuracy). The *accessibility* at length ``n`` is the fraction of
random targets of that length that reach 100%; ``n50(m)`` is the length where accessibility crosses
50%, and the slope ``C_emp`` of ``n50 = C_emp m`` (tokens per vector) is compared with the
theoretical slope ``C_theory`` of :mod:`embgeom.bounds` (a valid bound needs
``C_theory / C_emp >= 1``).

Protocol from Y. Kuratov et al., "Cramming 1568 Tokens into a Single Vector and Back Again",
ACL 2025 (arXiv 2502.13063), as used in M. Meyer et al., "How Many Different Outputs Can a
Transformer Generate?", ICML 2026 (arXiv 2605.22223), Sec. 5 (empirical slopes, Cor. 4.6).

Public API
----------
- :func:`cram`: optimise B independent sets of memory vectors in one batch.
- :func:`greedy_generate`, :func:`teacher_forced_accuracy`: the two success checks.
- :func:`sample_targets`: seeded targets (random tokens, random words, or given texts).
- :func:`accessibility_curve`: accessibility vs length, with Wilson intervals, adaptive mode,
  results appended to a JSONL file and reused on a rerun.
- :func:`n50`: logistic fit of accessibility vs length, with a bootstrap interval.
- :func:`fit_slope`: ``C_emp`` with intervals and R^2, ratio against ``C_theory``.
- :func:`theory_slope`: ``C_theory`` from :mod:`embgeom.bounds`.
- :func:`plot_accessibility`, :func:`plot_n50`: PNG figures.
- :func:`run_cram`: the whole ``embgeom cram`` job (JSONL + JSON summary + PNGs).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import numbers
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy import optimize, special, stats

from embgeom.volumes import wilson_interval
from embgeom._validation import check_positive, check_positive_int, check_probability, check_seed

__all__ = [
    "CramResult",
    "AccessibilityCurve",
    "cram",
    "greedy_generate",
    "teacher_forced_accuracy",
    "sample_targets",
    "accessibility_curve",
    "n50",
    "fit_slope",
    "theory_slope",
    "plot_accessibility",
    "plot_n50",
    "run_cram",
]

#: Word-boundary markers of the two common subword vocabularies: GPT-2 byte-level BPE ("Ġ",
#: U+0120, used by SmolLM2, Pythia, Qwen) and SentencePiece ("▁", U+2581, used by Llama-2, Gemma).
WORD_BOUNDARY_MARKERS = ("\u0120", "\u2581")

_TARGET_CHUNK = 64  # targets are drawn in chunks of this many tokens, so shorter ones are prefixes
_TAG_TARGET = 0  # seed-domain tags, so target draws and memory initialisations never share streams
_TAG_INIT = 1


# --------------------------------------------------------------------------------------------
# Model plumbing
# --------------------------------------------------------------------------------------------


def _resolve_model(model):
    """Return ``(hf_model, tokenizer_or_None, name)`` from a LoadedModel or a HF causal LM."""
    if isinstance(model, torch.nn.Module):
        hf, tok = model, None
        name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    elif hasattr(model, "model") and hasattr(model, "tokenizer"):
        hf, tok = model.model, model.tokenizer
        name = getattr(model, "name", None) or type(hf).__name__
        if not isinstance(hf, torch.nn.Module):
            raise TypeError(
                f"model: expected model.model to be a torch module, got {type(hf).__name__}"
            )
    else:
        raise TypeError(
            "model: expected an embgeom.adapters.LoadedModel or a Hugging Face causal LM "
            f"(torch.nn.Module), got {type(model).__name__}"
        )
    return hf, tok, str(name)


def _input_embedding(hf) -> torch.nn.Module:
    """The model's input-embedding module, or a ValueError if it has none."""
    getter = getattr(hf, "get_input_embeddings", None)
    emb = None
    if callable(getter):
        try:
            emb = getter()
        except Exception:  # e.g. a base class that does not implement it
            emb = None
    if not isinstance(emb, torch.nn.Module) or getattr(emb, "weight", None) is None:
        raise ValueError(
            "model: has no input embeddings (get_input_embeddings() returned no module with a "
            "weight); cramming optimises inputs_embeds and needs a model that accepts them"
        )
    return emb


def _check_device(device):
    """``device`` as a ``torch.device`` that this torch can use, or ``None``.

    Raises
    ------
    ValueError
        An unknown device string, or a CUDA device without CUDA.
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but this torch has no CUDA device; "
                         "use 'cpu'")
    if dev.type != "cpu":
        try:
            torch.empty(1, device=dev)
        except (RuntimeError, AssertionError) as exc:
            raise ValueError(f"device: {device!r} is not usable with this torch ({exc})") from None
    return dev


def _model_device_dtype(hf):
    p = next(iter(hf.parameters()), None)
    if p is None:
        raise ValueError("model: has no parameters")
    return p.device, p.dtype


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


@contextlib.contextmanager
def _frozen(hf):
    """Freeze every parameter (requires_grad False) and switch to eval mode; restore afterwards."""
    params = list(hf.parameters())
    flags = [p.requires_grad for p in params]
    training = hf.training
    for p in params:
        p.requires_grad_(False)
    hf.eval()
    try:
        yield
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)
        hf.train(training)


def _cache_kwarg(hf) -> str:
    """Name of the KV-cache keyword of ``hf.forward`` (``cache`` in transformers >= 5.x)."""
    try:
        params = inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _logits(hf, x, keep: int, **kw):
    """Logits of the last ``keep`` positions, float32 (b, keep, n_rows)."""
    try:
        out = hf(inputs_embeds=x, logits_to_keep=keep, **kw)
        logits = out.logits
    except TypeError:  # older models without logits_to_keep
        out = hf(inputs_embeds=x, **kw)
        logits = out.logits
    if logits.shape[1] != keep:
        logits = logits[:, -keep:]
    return logits.float(), out


def _vocab_rows(hf, emb) -> int:
    """Number of token ids that can be both embedded and predicted."""
    n = int(emb.weight.shape[0])
    out = getattr(hf, "get_output_embeddings", None)
    if callable(out):
        head = out()
        if head is not None and getattr(head, "weight", None) is not None:
            n = min(n, int(head.weight.shape[0]))
    return n


def _resolve_start_token(hf, tok, start_token, vocab: int):
    """The start token placed before the memory vectors, as an int id, or ``None`` for none.

    ``"auto"``: the tokenizer's ``bos_token_id`` when a tokenizer is known, else the model
    config's ``bos_token_id``, else ``None``.

    Raises
    ------
    TypeError
        ``start_token`` is not ``"auto"``, ``None`` or an int.
    ValueError
        An id outside ``[0, vocab)``.
    """
    if isinstance(start_token, str):
        if start_token != "auto":
            raise ValueError(f'start_token: expected "auto", None or a token id, got {start_token!r}')
        cand = getattr(tok, "bos_token_id", None) if tok is not None else None
        if cand is None:
            cand = getattr(getattr(hf, "config", None), "bos_token_id", None)
        if isinstance(cand, (list, tuple)):
            cand = cand[0] if cand else None
        if cand is None or not 0 <= int(cand) < vocab:
            return None
        return int(cand)
    if start_token is None:
        return None
    if isinstance(start_token, bool) or not isinstance(start_token, (numbers.Integral, np.integer)):
        raise TypeError(
            f'start_token: expected "auto", None or an int token id, got {type(start_token).__name__}'
        )
    if not 0 <= int(start_token) < vocab:
        raise ValueError(f"start_token: token id must lie in [0, {vocab}), got {int(start_token)}")
    return int(start_token)


def _prefix(M: torch.Tensor, emb, start: int | None, mdtype) -> torch.Tensor:
    """``[e(start), memory]`` (b, [1 +] m, d) in the model dtype: what generation starts from."""
    x = M.to(mdtype)
    if start is None:
        return x
    s = emb(torch.full((x.shape[0], 1), start, dtype=torch.long, device=x.device)).to(mdtype)
    return torch.cat([s, x], dim=1)


def _embedding_stats(emb, n_rows: int, *, max_rows: int = 8192, seed: int = 0):
    """Per-coordinate mean and std (float32 (d,)) of the embedding *module's output*.

    Calling the module (not reading its weight) includes any scale applied inside it, e.g.
    Gemma-3's ``sqrt(d)`` in ``Gemma3TextScaledWordEmbedding``, so the statistics are those of
    the ``inputs_embeds`` the model expects.
    """
    dev = emb.weight.device
    if n_rows <= max_rows:
        ids = torch.arange(n_rows, device=dev)
    else:
        rng = np.random.default_rng(seed)
        ids = torch.as_tensor(np.sort(rng.choice(n_rows, size=max_rows, replace=False)), device=dev)
    with torch.no_grad():
        E = emb(ids).float()
    return E.mean(0), E.std(0)


def _check_targets(targets, vocab: int) -> np.ndarray:
    if targets is None:
        raise TypeError("targets: expected an int64 array of token ids of shape (B, n), got None")
    if isinstance(targets, torch.Tensor):
        targets = targets.detach().cpu().numpy()
    arr = np.asarray(targets)
    if arr.size == 0:
        raise ValueError(f"targets: expected at least one target of length >= 1, got shape {arr.shape}")
    if arr.dtype == object or arr.dtype.kind not in "iu":
        raise TypeError(f"targets: expected integer token ids, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"targets: expected shape (B, n), got {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"targets: expected at least one target of length >= 1, got shape {arr.shape}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"targets: token ids must lie in [0, {vocab}) (the model's vocabulary rows), "
            f"got range [{lo}, {hi}]"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def _per_target_seeds(seed, B: int) -> list:
    """Per-target seed entropy: ``[seed, i]`` for an int, or the given sequence of B seeds."""
    if isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"seed: expected a non-negative integer, got {seed}")
        return [[int(seed), i] for i in range(B)]
    if isinstance(seed, (list, tuple, np.ndarray)):
        seeds = list(seed)
        if len(seeds) != B:
            raise ValueError(f"seed: expected one seed per target ({B}), got {len(seeds)}")
        out = []
        for s in seeds:
            ent = [s] if np.ndim(s) == 0 else list(np.asarray(s).ravel())
            if not all(isinstance(e, (numbers.Integral, np.integer)) and int(e) >= 0 for e in ent):
                raise TypeError(
                    "seed: each per-target seed must be a non-negative int or a sequence of them, "
                    f"got {s!r}"
                )
            out.append([int(e) for e in ent])
        return out
    raise TypeError(
        f"seed: expected an int or a sequence of B per-target seeds, got {type(seed).__name__}"
    )


# --------------------------------------------------------------------------------------------
# cram
# --------------------------------------------------------------------------------------------


@dataclass
class CramResult:
    """Per-target outcome of :func:`cram`.

    Attributes
    ----------
    success_teacher_forced : numpy.ndarray of bool, shape (B,)
        100% teacher-forced token accuracy (the paper's criterion).
    success_generation : numpy.ndarray of bool, shape (B,)
        Greedy generation from the memory vectors alone reproduces the target exactly.
        All False when the generation check was switched off (``generation_checked`` False).
    steps : numpy.ndarray of int64, shape (B,)
        Adam updates applied before the target reached 100% accuracy (or the step budget).
    loss : numpy.ndarray of float64, shape (B,)
        Mean teacher-forced cross-entropy per target token (nats/token) at the returned vectors.
    accuracy : numpy.ndarray of float64, shape (B,)
        Teacher-forced token accuracy at the returned vectors, in [0, 1].
    best_accuracy : numpy.ndarray of float64, shape (B,)
        The highest teacher-forced token accuracy seen at any step (Adam does not descend
        monotonically: a failed target can end below its best).
    memory : numpy.ndarray of float32, shape (B, n_mem, d)
        The memory vectors (as ``inputs_embeds``, i.e. on the scale of the embedding module's
        output).
    n_mem, length : int
    dtype : str
        The model's compute dtype (the precision eps of the bounds depends on it).
    device : str
    wall_s : float
    generation_checked : bool
    start_token : int or None
        The token id placed before the memory vectors (see :func:`cram`), or None.
    """

    success_teacher_forced: np.ndarray
    success_generation: np.ndarray
    steps: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    memory: np.ndarray
    n_mem: int
    length: int
    dtype: str
    device: str
    wall_s: float
    generation_checked: bool = True
    start_token: int | None = None
    best_accuracy: np.ndarray | None = None

    @property
    def success(self) -> np.ndarray:
        """bool (B,): the paper's verdict, 100% teacher-forced token accuracy."""
        return self.success_teacher_forced

    def to_records(self) -> list[dict]:
        """One JSON-able dict per target (memory vectors left out)."""
        return [
            {
                "success_teacher_forced": bool(self.success_teacher_forced[i]),
                "success_generation": (
                    bool(self.success_generation[i]) if self.generation_checked else None
                ),
                "steps": int(self.steps[i]),
                "loss": float(self.loss[i]),
                "accuracy": float(self.accuracy[i]),
                "best_accuracy": (
                    float(self.best_accuracy[i]) if self.best_accuracy is not None else None
                ),
                "memory_norm": float(np.linalg.norm(self.memory[i])),
            }
            for i in range(len(self.steps))
        ]

    def to_dict(self) -> dict:
        """JSON-able summary (memory vectors left out)."""
        return {
            "n_mem": self.n_mem,
            "length": self.length,
            "dtype": self.dtype,
            "device": self.device,
            "wall_s": self.wall_s,
            "generation_checked": self.generation_checked,
            "start_token": self.start_token,
            "targets": self.to_records(),
        }


def cram(
    model,
    targets,
    n_mem: int,
    *,
    steps: int = 1000,
    lr: float = 1e-2,
    seed=0,
    init_scale: float = 1.0,
    start_token="auto",
    betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
    check_generation: bool = True,
    use_cache: bool = True,
    device=None,
    progress: bool = False,
) -> CramResult:
    """Optimise ``n_mem`` memory vectors per target so the frozen model emits the target.

    B independent soft prompts are optimised in one batch. The model input is
    ``[e(s), mem_1, ..., mem_m, e(x_1), ..., e(x_{n-1})]`` (``inputs_embeds``, teacher forcing)
    with ``s`` a fixed start token (the tokenizer's BOS by default, as a soft prompt follows BOS
    in prompt tuning); the logits at the last n positions (the last memory vector and
    ``x_1 .. x_{n-1}``) predict ``x_1, ..., x_n``. With ``start_token=None`` the input is
    ``[mem_1, ..., mem_m, e(x_1), ..., e(x_{n-1})]``. The loss is the
    *sum over targets* of each target's mean token cross-entropy, and Adam is applied per
    coordinate, so each target's trajectory does not depend on the others in the batch. A
    target stops (its vectors freeze and it leaves the batch) at the first step where its
    teacher-forced token accuracy is 100%.

    Parameters
    ----------
    model : embgeom.adapters.LoadedModel or transformers PreTrainedModel
        A causal LM that accepts ``inputs_embeds``. Its parameters are frozen for the run
        (``requires_grad`` False, eval mode; both restored afterwards) and never modified.
    targets : array_like of int, shape (B, n) or (n,)
        Token ids in ``[0, n_rows)``.
    n_mem : int
        Number of memory vectors m per target (>= 1).
    steps : int, default 1000
        Maximum Adam updates per target (>= 0).
    lr : float, default 1e-2
        Adam learning rate.
    seed : int or sequence of B seeds, default 0
        Initialisation. With an int, target ``i`` is initialised from
        ``numpy.random.default_rng([seed, i])``; with a sequence, target ``i`` uses
        ``default_rng(seed[i])`` (an int or a sequence of ints), so a target gets the same start
        whether it is crammed alone or in a batch.
    init_scale : float, default 1.0
        Memory vectors start at ``mean + init_scale * std * z``, z standard normal, with the
        per-coordinate mean and std of the embedding module's output over the vocabulary
        (includes any embedding multiplier such as Gemma's sqrt(d)).
    start_token : "auto", int or None, default "auto"
        Token id placed before the memory vectors. ``"auto"``: the tokenizer's
        ``bos_token_id``, else the model config's ``bos_token_id``, else None. It carries no
        information (the same for every target), so the prompt is still m free vectors. Why it
        matters: in a pretrained LM the first position is an attention sink whose output hardly
        depends on its input (SmolLM2-135M: 512 random vectors at position 0 give 3 distinct
        argmax tokens, 512 random vocabulary tokens give 1, the same vectors after BOS give 25;
        ``benchmarks/bench_cramming.py``). A memory vector at position 0 cannot make its own
        position predict ``x_1``, and passes little to later positions: on SmolLM2 at n = 8
        (lr 1e-2), 0 of 8 targets with ``None`` (600 steps; 7 stalled at 7/8), 3 of 8 with BOS
        *after* the memory vector (Kuratov et al.'s layout, 1000 steps), 6 of 8 with BOS before
        it (400 steps). See ``docs/cramming.md``.
    betas, adam_eps : Adam constants (same formula as ``torch.optim.Adam``).
    check_generation : bool, default True
        Also check success the user's way: greedy generation of n tokens from the memory
        vectors alone (no target tokens).
    use_cache : bool, default True
        Generate with the KV cache (False: recompute the whole prefix each token).
    device : str or torch.device, optional
        Run on this device (the model is moved there). Default: the model's device.
    progress : bool, default False
        tqdm bar over optimisation steps.

    Returns
    -------
    CramResult
        Per target: both verdicts, steps used, loss, accuracy and memory vectors float32
        (B, n_mem, d).

    Raises
    ------
    TypeError
        ``model`` is not a torch module / LoadedModel; ``targets`` not integers; bad ``seed``.
    ValueError
        ``n_mem < 1``, ``steps < 0``, ``lr <= 0``, empty targets, token ids out of range
        (targets or ``start_token``), or a model without input embeddings.

    Notes
    -----
    Memory vectors are optimised in float32 and cast to the model's dtype for each forward, so
    a bf16 model on a GPU works unchanged; the dtype is recorded in the result. Batching pays
    where one target leaves the hardware idle (GPUs, small models). On a CPU a real model's
    step is compute-bound: on 2 cores, SmolLM2 at n = 32 costs 17.6 GFLOP per target-step, one
    target at a time runs at 25% of the float32 GEMM peak and B = 8 at 48%, a 1.9x speedup
    with a ceiling of 3.9x for any batching (``benchmarks/bench_cramming.py``).

    Examples
    --------
    >>> from embgeom.adapters import load_model                     # doctest: +SKIP
    >>> lm = load_model("smollm2-135m")                              # doctest: +SKIP
    >>> T = sample_targets(lm, 16, 8, seed=0)                        # doctest: +SKIP
    >>> res = cram(lm, T, n_mem=1, steps=500)                        # doctest: +SKIP
    >>> res.success.mean(), res.memory.shape                         # doctest: +SKIP
    (..., (8, 1, 576))
    """
    n_mem = check_positive_int(n_mem, "n_mem")
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_positive(lr, "lr")
    init_scale = check_positive(init_scale, "init_scale", allow_zero=True)
    b1, b2 = (check_probability(b, "betas", open_left=False) for b in betas)
    adam_eps = check_positive(adam_eps, "adam_eps")
    hf, tok, _ = _resolve_model(model)
    emb = _input_embedding(hf)
    vocab = _vocab_rows(hf, emb)
    T_np = _check_targets(targets, vocab)
    start = _resolve_start_token(hf, tok, start_token, vocab)
    B, n = T_np.shape
    seeds = _per_target_seeds(seed, B)
    device = _check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = _model_device_dtype(hf)
    t_start = time.perf_counter()

    with _frozen(hf):
        mu, sd = _embedding_stats(emb, vocab)
        d = int(mu.shape[0])
        z = np.stack(
            [np.random.default_rng(s).standard_normal((n_mem, d)).astype(np.float32) for s in seeds]
        )
        P = mu + init_scale * sd * torch.as_tensor(z, device=dev)  # float32 (B, m, d)
        T = torch.as_tensor(T_np, device=dev)
        with torch.no_grad():
            te = emb(T[:, :-1]).to(mdtype)  # (B, n-1, d), constant
        m1 = torch.zeros_like(P)
        v = torch.zeros_like(P)
        active = torch.arange(B, device=dev)

        out_steps = np.zeros(B, np.int64)
        out_loss = np.zeros(B, np.float64)
        out_acc = np.zeros(B, np.float64)
        best = torch.zeros(B, dtype=torch.float64, device=dev)
        out_tf = np.zeros(B, bool)
        out_mem = np.zeros((B, n_mem, d), np.float32)

        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, desc=f"cram m={n_mem} n={n}", leave=False)
        for t in range(steps + 1):
            P.requires_grad_(True)
            x = torch.cat([_prefix(P, emb, start, mdtype), te[active]], dim=1)
            logits, _ = _logits(hf, x, n, use_cache=False)  # (b, n, rows)
            Ta = T[active]
            ce = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), Ta, reduction="none"
            ).mean(1)  # (b,)
            with torch.no_grad():
                correct = logits.argmax(-1) == Ta
                acc = correct.float().mean(1)
                best[active] = torch.maximum(best[active], acc.double())
                done = correct.all(1) if t < steps else torch.ones_like(correct[:, 0])
            if bool(done.any()):
                idx = active[done].cpu().numpy()
                out_steps[idx] = t
                out_loss[idx] = ce.detach()[done].cpu().double().numpy()
                out_acc[idx] = acc[done].cpu().double().numpy()
                out_tf[idx] = correct[done].all(1).cpu().numpy()
                out_mem[idx] = P.detach()[done].cpu().numpy()
            keep = ~done
            if not bool(keep.any()):
                break
            (grad,) = torch.autograd.grad(ce[keep].sum(), P)
            with torch.no_grad():
                P, g = P.detach()[keep], grad[keep]
                m1, v, active = m1[keep], v[keep], active[keep]
                m1.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
                P = P - lr * (m1 / bc1) / ((v / bc2).sqrt() + adam_eps)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=int(active.numel()), best_acc=f"{float(best.mean()):.2f}")
        if bar is not None:
            bar.close()

        gen_ok = np.zeros(B, bool)
        if check_generation:
            gen = greedy_generate(hf, out_mem, n, use_cache=use_cache, start_token=start)
            gen_ok = (gen == T_np).all(1)

    return CramResult(
        success_teacher_forced=out_tf,
        success_generation=gen_ok,
        steps=out_steps,
        loss=out_loss,
        accuracy=out_acc,
        best_accuracy=best.cpu().numpy(),
        memory=out_mem,
        n_mem=n_mem,
        length=n,
        dtype=_dtype_name(mdtype),
        device=str(dev),
        wall_s=time.perf_counter() - t_start,
        generation_checked=bool(check_generation),
        start_token=start,
    )


def greedy_generate(model, memory, n_tokens: int, *, start_token="auto", use_cache: bool = True,
                    batch_size: int = 64):
    """Greedy generation from memory vectors alone (no target tokens).

    The model is fed ``[e(s), mem_1, ..., mem_m]`` (the memory vectors alone with
    ``start_token=None``) and emits ``n_tokens`` argmax tokens, each fed back.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    memory : array_like of float, shape (B, m, d) or (m, d)
        Memory vectors on the ``inputs_embeds`` scale (e.g. :attr:`CramResult.memory`).
    n_tokens : int
        Tokens to generate (>= 1).
    start_token : "auto", int or None, default "auto"
        The start token before the memory vectors; use the one the memory vectors were crammed
        with (:attr:`CramResult.start_token`; see :func:`cram`).
    use_cache : bool, default True
        Use the KV cache; False recomputes the whole prefix at each token (slower, for checks).
    batch_size : int, default 64

    Returns
    -------
    numpy.ndarray of int64, shape (B, n_tokens)
        Argmax tokens over all rows of the unembedding.

    Raises
    ------
    TypeError, ValueError
        Bad model, memory of the wrong dimension, ``n_tokens < 1``.
    """
    from embgeom._validation import check_array

    hf, tokenizer, _ = _resolve_model(model)
    emb = _input_embedding(hf)
    start = _resolve_start_token(hf, tokenizer, start_token, _vocab_rows(hf, emb))
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    batch_size = check_positive_int(batch_size, "batch_size")
    M = check_array(memory, "memory", ndim=(2, 3), dtype=np.float32)
    if M.ndim == 2:
        M = M[None]
    d = int(emb.weight.shape[1])
    if M.shape[2] != d:
        raise ValueError(f"memory: expected last dimension {d} (hidden size), got {M.shape}")
    dev, mdtype = _model_device_dtype(hf)
    key = _cache_kwarg(hf)
    out = np.zeros((M.shape[0], n_tokens), np.int64)
    with _frozen(hf), torch.no_grad():
        for s in range(0, M.shape[0], batch_size):
            x = _prefix(torch.as_tensor(M[s : s + batch_size], device=dev), emb, start, mdtype)
            b, m = x.shape[0], x.shape[1]  # m: prefix length ([start token +] memory vectors)
            toks = []
            if use_cache:
                logits, o = _logits(hf, x, 1, use_cache=True)
                cache = getattr(o, "cache", None) or getattr(o, "past_key_values", None)
                tok = logits[:, -1].argmax(-1)
                toks.append(tok)
                for k in range(1, n_tokens):
                    pos = torch.full((b, 1), m + k - 1, device=dev, dtype=torch.long)
                    logits, o = _logits(
                        hf, emb(tok)[:, None].to(mdtype), 1, use_cache=True,
                        position_ids=pos, **{key: cache},
                    )
                    cache = getattr(o, "cache", None) or getattr(o, "past_key_values", None)
                    tok = logits[:, -1].argmax(-1)
                    toks.append(tok)
            else:
                seq = x
                for _ in range(n_tokens):
                    logits, _ = _logits(hf, seq, 1, use_cache=False)
                    tok = logits[:, -1].argmax(-1)
                    toks.append(tok)
                    seq = torch.cat([seq, emb(tok)[:, None].to(mdtype)], dim=1)
            out[s : s + b] = torch.stack(toks, 1).cpu().numpy()
    return out


def teacher_forced_accuracy(model, memory, targets, *, start_token="auto") -> np.ndarray:
    """Teacher-forced token accuracy of memory vectors on their targets.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    memory : array_like of float, shape (B, m, d)
    targets : array_like of int, shape (B, n)
    start_token : "auto", int or None, default "auto"
        As in :func:`cram` (use the one the memory vectors were crammed with).

    Returns
    -------
    numpy.ndarray of float64, shape (B,)
        Fraction of the n positions whose argmax is the target token.
    """
    from embgeom._validation import check_array

    hf, tok, _ = _resolve_model(model)
    emb = _input_embedding(hf)
    vocab = _vocab_rows(hf, emb)
    T_np = _check_targets(targets, vocab)
    start = _resolve_start_token(hf, tok, start_token, vocab)
    M = check_array(memory, "memory", ndim=3, dtype=np.float32, shape=(T_np.shape[0], None, None))
    dev, mdtype = _model_device_dtype(hf)
    n = T_np.shape[1]
    with _frozen(hf), torch.no_grad():
        T = torch.as_tensor(T_np, device=dev)
        x = torch.cat([_prefix(torch.as_tensor(M, device=dev), emb, start, mdtype),
                       emb(T[:, :-1]).to(mdtype)], 1)
        logits, _ = _logits(hf, x, n, use_cache=False)
        return (logits.argmax(-1) == T).double().mean(1).cpu().numpy()


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


def _special_ids(tok) -> set:
    if tok is None:
        return set()
    ids = getattr(tok, "all_special_ids", None) or []
    return {int(i) for i in ids if i is not None}


def _token_pool(hf, tok, source: str) -> np.ndarray:
    """Token ids targets are drawn from (int64, sorted)."""
    emb = _input_embedding(hf)
    rows = _vocab_rows(hf, emb)
    size = rows if tok is None else min(rows, len(tok))
    if source == "random-tokens":
        special = _special_ids(tok)
        pool = np.array([i for i in range(size) if i not in special], np.int64)
    elif source == "words":
        if tok is None:
            raise ValueError('target_source: "words" needs a tokenizer (pass a LoadedModel)')
        special = _special_ids(tok)
        pieces = tok.convert_ids_to_tokens(list(range(size)))
        pool = np.array(
            [
                i
                for i, p in enumerate(pieces)
                if i not in special
                and isinstance(p, str)
                and len(p) >= 3
                and p[0] in WORD_BOUNDARY_MARKERS
                and p[1:].isascii()
                and p[1:].isalpha()
            ],
            np.int64,
        )
        if pool.size < 16:
            raise ValueError(
                'target_source: "words" found fewer than 16 word tokens (tokens starting with a '
                f"word-boundary marker {WORD_BOUNDARY_MARKERS}) in this tokenizer"
            )
    else:
        raise ValueError(
            f'target_source: expected "random-tokens", "words" or a list of texts, got {source!r}'
        )
    if pool.size == 0:
        raise ValueError("target_source: no token ids to draw targets from")
    return pool


def sample_targets(model, length: int, n_targets: int, *, target_source="random-tokens", seed: int = 0,
                   start: int = 0) -> np.ndarray:
    """Seeded targets for cramming.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    length : int
        Target length n (tokens).
    n_targets : int
        How many targets (rows), with indices ``start, ..., start + n_targets - 1``.
    target_source : {"random-tokens", "words"} or list of str, default "random-tokens"
        - ``"random-tokens"``: i.i.d. uniform over the vocabulary rows, special tokens excluded
          (the paper's "random text").
        - ``"words"``: i.i.d. uniform over *word tokens*: vocabulary entries made of a
          word-boundary marker ("Ġ" for byte-level BPE, "▁" for SentencePiece) followed by at
          least two ASCII letters, i.e. whole words that start with a space. A target is a
          sequence of random words (more text-like than random tokens, still incompressible).
        - a list of texts: tokenised without special tokens and concatenated, separated by a
          space, into one cyclic token stream; target j starts at the first token of text
          ``j mod len(texts)``.
    seed : int, default 0
    start : int, default 0
        Index of the first target (targets are indexed, so a rerun can draw target j alone).

    Returns
    -------
    numpy.ndarray of int64, shape (n_targets, length)
        Target j of length n is the prefix of target j of any longer length (random sources draw
        in chunks of 64 tokens from ``default_rng([seed, 0, j, chunk])``).

    Raises
    ------
    ValueError
        Unknown source, a source that needs a tokenizer without one, empty texts.
    """
    length = check_positive_int(length, "length")
    n_targets = check_positive_int(n_targets, "n_targets")
    start = check_positive_int(start, "start", minimum=0)
    seed = check_positive_int(seed, "seed", minimum=0)
    hf, tok, _ = _resolve_model(model)
    if isinstance(target_source, str):
        pool = _token_pool(hf, tok, target_source)
        out = np.empty((n_targets, length), np.int64)
        n_chunks = -(-length // _TARGET_CHUNK)
        for r, j in enumerate(range(start, start + n_targets)):
            draws = [
                np.random.default_rng([seed, _TAG_TARGET, j, c]).integers(0, pool.size, _TARGET_CHUNK)
                for c in range(n_chunks)
            ]
            out[r] = pool[np.concatenate(draws)[:length]]
        return out
    texts = list(target_source)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError("target_source: expected a non-empty list of non-empty texts")
    if tok is None:
        raise ValueError("target_source: a list of texts needs a tokenizer (pass a LoadedModel)")
    pieces = [tok(t if i == 0 else " " + t, add_special_tokens=False)["input_ids"] for i, t in enumerate(texts)]
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    stream = np.array([i for p in pieces for i in p], np.int64)
    if stream.size == 0:
        raise ValueError("target_source: the texts tokenise to nothing")
    out = np.empty((n_targets, length), np.int64)
    for r, j in enumerate(range(start, start + n_targets)):
        s0 = starts[j % len(texts)]
        out[r] = stream[(s0 + np.arange(length)) % stream.size]
    return out


def _source_descriptor(target_source):
    if isinstance(target_source, str):
        return target_source
    h = hashlib.sha256("\x1e".join(target_source).encode()).hexdigest()[:16]
    return f"texts:{len(target_source)}:{h}"


# --------------------------------------------------------------------------------------------
# Accessibility curve
# --------------------------------------------------------------------------------------------


@dataclass
class AccessibilityCurve:
    """Accessibility vs target length for one number of memory vectors.

    Attributes
    ----------
    n_mem : int
    lengths : numpy.ndarray of int64, shape (K,)
        Target lengths (tokens), ascending.
    successes : numpy.ndarray of int64, shape (K,)
        Targets reaching 100% teacher-forced token accuracy (the paper's criterion).
    successes_generation : numpy.ndarray of int64, shape (K,)
        Targets reproduced by greedy generation from the memory vectors alone.
    trials : numpy.ndarray of int64, shape (K,)
    accessibility, lower, upper : numpy.ndarray of float64, shape (K,)
        successes / trials and its Wilson 95% interval.
    settings : dict
    """

    n_mem: int
    lengths: np.ndarray
    successes: np.ndarray
    successes_generation: np.ndarray
    trials: np.ndarray
    settings: dict = field(default_factory=dict)

    @property
    def accessibility(self) -> np.ndarray:
        return self.successes / np.maximum(self.trials, 1)

    @property
    def intervals(self):
        return wilson_interval(self.successes, self.trials)

    def to_dict(self) -> dict:
        lo, hi = self.intervals
        return {
            "n_mem": int(self.n_mem),
            "lengths": self.lengths.tolist(),
            "successes": self.successes.tolist(),
            "successes_generation": self.successes_generation.tolist(),
            "trials": self.trials.tolist(),
            "accessibility": self.accessibility.tolist(),
            "lower": lo.tolist(),
            "upper": hi.tolist(),
            "settings": self.settings,
        }


def _model_fingerprint(hf, name: str) -> dict:
    emb = _input_embedding(hf)
    with torch.no_grad():
        w = emb.weight.detach().reshape(-1)[:256].float().cpu().numpy()
    return {
        "name": name,
        "class": type(hf).__name__,
        "n_params": int(sum(p.numel() for p in hf.parameters())),
        "embedding_digest": hashlib.sha256(w.tobytes()).hexdigest()[:16],
    }


def _settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _read_jsonl(path) -> dict:
    """Finished per-target records keyed by (settings_hash, n_mem, length, target_index)."""
    done = {}
    if path is None or not os.path.exists(path):
        return done
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interrupted run
                continue
            key = (r.get("settings_hash"), r.get("n_mem"), r.get("length"), r.get("target_index"))
            done[key] = r
    return done


def _append_lines(path, lines: list[str]) -> None:
    """Append JSON lines to ``path``, first ending a last line that an interrupted run cut short
    (so a new record never lands on the same line as the fragment)."""
    with open(path, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write(("\n".join(lines) + "\n").encode())


def accessibility_curve(
    model,
    n_mem: int,
    lengths=None,
    n_targets: int = 16,
    *,
    target_source="random-tokens",
    seed: int = 0,
    start_token="auto",
    adaptive: bool = False,
    max_length: int = 4096,
    steps: int = 1000,
    lr: float = 1e-2,
    batch_size: int = 8,
    jsonl=None,
    device=None,
    check_generation: bool = True,
    progress: bool = True,
    **cram_kwargs,
) -> AccessibilityCurve:
    """Accessibility (fraction of crammable targets) vs target length, for m = ``n_mem``.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    n_mem : int
        Memory vectors per target (m >= 1).
    lengths : sequence of int, optional
        Target lengths. Without ``adaptive`` every length is run. With ``adaptive`` they are the
        coarse grid (default ``1, 2, 4, ...`` up to ``max_length``): run in order while
        accessibility stays >= 0.5; at the first length below 0.5, bisect (integer lengths)
        between the last length with accessibility >= 0.5 and that one until they are adjacent,
        then stop.
    n_targets : int, default 16
        Targets per length (target j of length n is a prefix of target j of longer lengths).
    target_source : "random-tokens", "words" or list of str
        See :func:`sample_targets`.
    seed : int, default 0
        Targets use ``default_rng([seed, 0, j, chunk])``; the memory vectors of target j at
        length n start from ``default_rng([seed, 1, n_mem, n, j])``.
    start_token : "auto", int or None, default "auto"
        See :func:`cram`; resolved once and recorded in the settings (and their hash).
    adaptive : bool, default False
    max_length : int, default 4096
        Adaptive mode never goes past this length.
    steps, lr : cram settings (see :func:`cram`).
    batch_size : int, default 8
        Targets crammed together (does not change the verdicts, only the speed).
    jsonl : path, optional
        Append one line per target as results come (settings hash, n_mem, length,
        target_index, verdicts, steps, loss, accuracy, dtype, device). A rerun with the same
        settings reads the file and skips the targets already done.
    device : optional
        Move the model to this device first.
    check_generation : bool, default True
    progress : bool, default True
        tqdm bars: one over lengths, and one over the Adam steps of each batch of targets.
    **cram_kwargs
        Passed to :func:`cram` (``init_scale``, ``betas``, ``adam_eps``, ``use_cache``); they
        enter the settings hash.

    Returns
    -------
    AccessibilityCurve

    Raises
    ------
    TypeError, ValueError
        Bad arguments (as in :func:`cram` and :func:`sample_targets`), lengths not positive.
    """
    n_mem = check_positive_int(n_mem, "n_mem")
    n_targets = check_positive_int(n_targets, "n_targets")
    batch_size = check_positive_int(batch_size, "batch_size")
    max_length = check_positive_int(max_length, "max_length")
    seed = check_positive_int(seed, "seed", minimum=0)
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_positive(lr, "lr")
    if lengths is None:
        if not adaptive:
            raise ValueError("lengths: required unless adaptive=True")
        grid = [2**k for k in range(int(math.log2(max_length)) + 1)]
    else:
        grid = [check_positive_int(x, "lengths") for x in np.atleast_1d(lengths).tolist()]
        if not grid:
            raise ValueError("lengths: expected at least one length")
        grid = sorted(set(grid)) if not adaptive else sorted(set(x for x in grid if x <= max_length))
        if not grid:
            raise ValueError(f"lengths: every length exceeds max_length={max_length}")
    hf, tokenizer, name = _resolve_model(model)
    start = _resolve_start_token(hf, tokenizer, start_token, _vocab_rows(hf, _input_embedding(hf)))
    device = _check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = _model_device_dtype(hf)
    settings = {
        "model": _model_fingerprint(hf, name),
        "dtype": _dtype_name(mdtype),
        "start_token": start,
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "target_source": _source_descriptor(target_source),
        "check_generation": bool(check_generation),
        "cram_kwargs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(cram_kwargs.items())},
    }
    shash = _settings_hash(settings)
    store = _read_jsonl(jsonl)
    if jsonl is not None:
        Path(jsonl).parent.mkdir(parents=True, exist_ok=True)

    results: dict[int, tuple[int, int, int]] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"accessibility m={n_mem}", unit="length")

    def run_length(n: int):
        missing = [j for j in range(n_targets) if (shash, n_mem, n, j) not in store]
        for s in range(0, len(missing), batch_size):
            idx = missing[s : s + batch_size]
            T = np.concatenate(
                [sample_targets(model, n, 1, target_source=target_source, seed=seed, start=j) for j in idx]
            )
            res = cram(
                model, T, n_mem, steps=steps, lr=lr,
                seed=[[seed, _TAG_INIT, n_mem, n, j] for j in idx], start_token=start,
                check_generation=check_generation, progress=progress, **cram_kwargs,
            )
            lines = []
            for j, rec in zip(idx, res.to_records()):
                rec = {
                    "settings_hash": shash, "n_mem": n_mem, "length": n, "target_index": j,
                    **rec, "dtype": res.dtype, "device": res.device,
                    "batch_wall_s": res.wall_s, "settings": settings,
                }
                store[(shash, n_mem, n, j)] = rec
                lines.append(json.dumps(rec))
            if jsonl is not None:
                _append_lines(jsonl, lines)
        recs = [store[(shash, n_mem, n, j)] for j in range(n_targets)]
        k = sum(bool(r["success_teacher_forced"]) for r in recs)
        kg = sum(bool(r["success_generation"]) for r in recs)
        results[n] = (k, kg, n_targets)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(length=n, accessibility=f"{k / n_targets:.2f}")
        return k / n_targets

    try:
        if not adaptive:
            for n in grid:
                run_length(n)
        else:
            lo = hi = None
            for n in grid:
                if run_length(n) >= 0.5:
                    lo = n
                else:
                    hi = n
                    break
            if hi is not None:
                lo_b = lo if lo is not None else 0  # below the first grid point: bisect from 0
                while hi - lo_b > 1:
                    mid = (lo_b + hi) // 2
                    if run_length(mid) >= 0.5:
                        lo_b = mid
                    else:
                        hi = mid
    finally:
        if bar is not None:
            bar.close()

    ls = np.array(sorted(results), np.int64)
    return AccessibilityCurve(
        n_mem=n_mem,
        lengths=ls,
        successes=np.array([results[n][0] for n in ls], np.int64),
        successes_generation=np.array([results[n][1] for n in ls], np.int64),
        trials=np.array([results[n][2] for n in ls], np.int64),
        settings={**settings, "settings_hash": shash, "adaptive": bool(adaptive), "n_targets": n_targets},
    )


# --------------------------------------------------------------------------------------------
# n50 and slope
# --------------------------------------------------------------------------------------------


def _curve_arrays(curve):
    if isinstance(curve, AccessibilityCurve):
        x, k, N = curve.lengths, curve.successes, curve.trials
    elif isinstance(curve, dict):
        try:
            x, k, N = curve["lengths"], curve["successes"], curve["trials"]
        except KeyError as e:
            raise ValueError(f"curve: dict lacks the key {e}") from None
    else:
        raise TypeError(
            f"curve: expected an AccessibilityCurve or a dict with lengths/successes/trials, "
            f"got {type(curve).__name__}"
        )
    x = np.asarray(x, np.float64)
    k = np.asarray(k, np.float64)
    N = np.asarray(N, np.float64)
    if x.ndim != 1 or x.size == 0 or k.shape != x.shape or N.shape != x.shape:
        raise ValueError("curve: lengths, successes and trials must be 1-D of the same length >= 1")
    if not (np.isfinite(x).all() and np.isfinite(k).all() and np.isfinite(N).all()):
        raise ValueError("curve: lengths, successes and trials must be finite (no NaN or inf)")
    if np.any(x <= 0) or np.any(N < 1) or np.any(k < 0) or np.any(k > N):
        raise ValueError("curve: expected lengths > 0, trials >= 1 and 0 <= successes <= trials")
    return x, k, N


def _logistic_fit(x, k, N, s_min: float):
    """Binomial MLE of p(n) = 1 / (1 + exp((n - n50) / s)); returns (n50, s) or None if censored."""
    p = k / N
    if np.all(p >= 0.5) or np.all(p < 0.5):
        return None
    span = float(x.max() - x.min()) or 1.0

    def nll(theta):
        # -sum[k log sigma(-z) + (N - k) log sigma(z)], z = (x - loc) / s, and its gradient in
        # (loc, log s): d/dz = N sigma(z) - (N - k), dz/dloc = -1/s, dz/dlog s = -z
        loc, log_s = theta
        zz = (x - loc) / np.exp(log_s)
        val = -float(np.sum(k * special.log_expit(-zz) + (N - k) * special.log_expit(zz)))
        g = N * special.expit(zz) - (N - k)
        return val, np.array([-float(g.sum()) / np.exp(log_s), -float(g @ zz)])

    # start: linear interpolation of the first 0.5 crossing
    i = int(np.argmax(p < 0.5))
    if i == 0:
        loc0 = float(x[0])
    else:
        x0, x1, p0, p1 = x[i - 1], x[i], p[i - 1], p[i]
        loc0 = float(x0 + (p0 - 0.5) / max(p0 - p1, 1e-12) * (x1 - x0))
    s_max = max(span, 2 * s_min)
    best = None
    for s0 in (max(s_min, span / 8), max(s_min, span / 2)):
        r = optimize.minimize(
            nll, x0=[loc0, math.log(s0)], method="L-BFGS-B", jac=True,
            bounds=[(x.min() - span, x.max() + span), (math.log(s_min), math.log(s_max))],
        )
        if best is None or r.fun < best.fun:
            best = r
    return float(best.x[0]), float(math.exp(best.x[1]))


def n50(curve, *, n_boot: int = 200, seed: int = 0, confidence: float = 0.95, s_min: float = 0.5) -> dict:
    """The length where accessibility crosses 50%, from a logistic fit, with a bootstrap interval.

    Fits ``p(n) = 1 / (1 + exp((n - n50) / s))`` to the per-length success counts by binomial
    maximum likelihood (``scipy.optimize.minimize``, L-BFGS-B), with the scale ``s`` bounded
    below by ``s_min`` tokens (lengths are integers: a sharper transition is not resolvable).
    The interval is a parametric bootstrap: each length's successes are redrawn
    Binomial(trials, observed fraction) and refitted ``n_boot`` times (seeded); percentile
    interval. Perfectly separated data (every target crammed up to length a, none from the next
    tested length b) carry no information on where in (a, b) the crossing is: n50 is then the
    midpoint and the interval is ``[a, b]`` (``separated`` True).

    Parameters
    ----------
    curve : AccessibilityCurve or dict with ``lengths``, ``successes``, ``trials``
    n_boot : int, default 200
    seed : int, default 0
    confidence : float, default 0.95
    s_min : float, default 0.5
        Lower bound of the logistic scale (tokens).

    Returns
    -------
    dict
        ``n50`` (tokens; NaN when censored), ``lower``, ``upper`` (bootstrap interval; a
        bootstrap draw with no crossing counts as +inf or -inf), ``scale`` (tokens),
        ``censored`` (None, ``"above"``: accessibility >= 0.5 at every tested length, so
        n50 > max length; ``"below"``: < 0.5 everywhere), ``separated`` (bool), ``n_boot``,
        ``confidence``.

    Raises
    ------
    TypeError, ValueError
        Malformed curve or settings.
    """
    x, k, N = _curve_arrays(curve)
    n_boot = check_positive_int(n_boot, "n_boot", minimum=0)
    confidence = check_probability(confidence, "confidence")
    s_min = check_positive(s_min, "s_min")
    rng = check_seed(seed)
    with _single_blas_thread():
        return _n50_fit(x, k, N, s_min, rng, n_boot, confidence)


@contextlib.contextmanager
def _single_blas_thread():
    """Limit BLAS to one thread: L-BFGS-B on a 2-parameter problem spends ~50x longer in
    OpenBLAS thread start-up than in arithmetic when the library's default threading is on
    (measured here: 1.6 s vs 0.05 s for 50 bootstrap fits)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # threadpoolctl comes with scikit-learn; without it, just run
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _n50_fit(x, k, N, s_min, rng, n_boot, confidence) -> dict:
    base = {"n_boot": n_boot, "confidence": confidence, "lengths_max": float(x.max()),
            "lengths_min": float(x.min())}
    fit = _logistic_fit(x, k, N, s_min)
    if fit is None:
        censored = "above" if np.all(k / N >= 0.5) else "below"
        return {"n50": float("nan"), "lower": float("nan"), "upper": float("nan"),
                "scale": float("nan"), "censored": censored, "separated": False, **base}
    loc, scale = fit
    p = k / N
    gap = _separation_gap(x, p)
    if gap is not None:
        # every length up to a passes, every length from b fails: the likelihood cannot place
        # n50 inside (a, b), so report the midpoint and the whole gap, not a bootstrap of zeros
        return {"n50": 0.5 * (gap[0] + gap[1]), "lower": gap[0], "upper": gap[1],
                "scale": s_min, "censored": None, "separated": True, **base}
    boots = np.empty(n_boot)
    for b in range(n_boot):
        kb = rng.binomial(N.astype(np.int64), p).astype(np.float64)
        fb = _logistic_fit(x, kb, N, s_min)
        if fb is None:
            boots[b] = np.inf if np.all(kb / N >= 0.5) else -np.inf
        else:
            boots[b] = fb[0]
    if n_boot:
        a = (1 - confidence) / 2
        lower, upper = (float(np.quantile(boots, q, method="inverted_cdf")) for q in (a, 1 - a))
    else:
        lower = upper = float("nan")
    return {"n50": loc, "lower": lower, "upper": upper, "scale": scale, "censored": None,
            "separated": False, **base}


def _separation_gap(x, p):
    """``(a, b)`` when accessibility is 1 at every length <= a and 0 at every length >= b
    (a < b adjacent in the data), else None."""
    ones, zeros = p == 1, p == 0
    if not (ones | zeros).all():
        return None
    i = int(np.argmax(zeros))
    if i == 0 or not ones[:i].all() or not zeros[i:].all():
        return None
    return float(x[i - 1]), float(x[i])


def fit_slope(n50_by_m, *, confidence: float = 0.95, c_theory: float | None = None) -> dict:
    """Empirical slope ``C_emp`` (tokens per memory vector) of n50 vs m.

    Fits ``n50 = C_emp m`` through the origin (the paper's linear law, Cor. 4.6 and Sec. 5) by
    least squares, ``C_emp = sum(m n50) / sum(m^2)``, with a Student-t interval (k - 1 degrees
    of freedom), and also the affine fit ``n50 = a m + b`` (``scipy.stats.linregress``).

    Parameters
    ----------
    n50_by_m : mapping {m: float or dict with key "n50"}
        At least two finite n50 values; keys are ints (or digit strings, as in a JSON summary).
    confidence : float, default 0.95
    c_theory : float, optional
        Theoretical slope (e.g. from :func:`theory_slope`); adds ``ratio = c_theory / c_emp``
        (>= 1 for a valid bound) and its interval.

    Returns
    -------
    dict
        ``m``, ``n50`` lists; ``c_emp``, ``c_emp_lower``, ``c_emp_upper``; ``r2`` (centred:
        1 - SS_res / sum (n50 - mean)^2, of the fit through the origin; can be negative),
        ``r2_uncentred`` (1 - SS_res / sum n50^2, the usual R^2 of a fit through the origin);
        ``affine``: ``slope``, ``intercept``, their intervals, ``r2``; and ``c_theory``,
        ``ratio``, ``ratio_lower``, ``ratio_upper`` when ``c_theory`` is given.

    Raises
    ------
    TypeError
        Not a mapping.
    ValueError
        Fewer than two points, a non-finite n50 (e.g. a censored curve), m < 1.
    """
    if not hasattr(n50_by_m, "items"):
        raise TypeError(f"n50_by_m: expected a mapping {{m: n50}}, got {type(n50_by_m).__name__}")
    ms, ys = [], []
    items = []
    for m, v in n50_by_m.items():
        if isinstance(m, str) and m.strip().isdigit():  # keys of a JSON summary
            m = int(m)
        items.append((check_positive_int(m, "n50_by_m key (m)"), v))
    seen = [m for m, _ in items]
    if len(set(seen)) != len(seen):
        raise ValueError(f"n50_by_m: m given twice (keys {sorted(seen)}, e.g. 1 and '1')")
    for m, v in sorted(items, key=lambda kv: kv[0]):
        if isinstance(v, dict):
            if "n50" not in v:
                raise TypeError(f"n50_by_m: the value for m={m} is a dict without the key 'n50'")
            y = v["n50"]
        else:
            y = v
        if y is not None and (isinstance(y, (str, bool, np.bool_))
                              or not isinstance(y, (numbers.Real, np.floating, np.integer))):
            raise TypeError(f"n50_by_m: n50 for m={m} must be a number, got {type(y).__name__}")
        if y is not None and np.isfinite(float(y)) and float(y) <= 0:
            raise ValueError(f"n50_by_m: n50 for m={m} must be > 0 tokens, got {y}")
        if y is None or not np.isfinite(float(y)):
            raise ValueError(
                f"n50_by_m: n50 for m={m} is not finite ({y}); a censored accessibility curve "
                "needs longer (or shorter) lengths"
            )
        ms.append(float(m))
        ys.append(float(y))
    if len(ms) < 2:
        raise ValueError(f"n50_by_m: expected at least two values of m, got {len(ms)}")
    confidence = check_probability(confidence, "confidence")
    m_arr, y = np.array(ms), np.array(ys)
    k = m_arr.size
    c = float(m_arr @ y / (m_arr @ m_arr))
    res = y - c * m_arr
    ss_res = float(res @ res)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    se = math.sqrt(ss_res / (k - 1) / float(m_arr @ m_arr))
    tq = float(stats.t.ppf(0.5 + confidence / 2, k - 1))
    out = {
        "m": [int(v) for v in ms],
        "n50": ys,
        "c_emp": c,
        "c_emp_lower": c - tq * se,
        "c_emp_upper": c + tq * se,
        "r2": (1 - ss_res / ss_tot) if ss_tot > 0 else float("nan"),
        "r2_uncentred": 1 - ss_res / float(y @ y),
        "confidence": confidence,
    }
    lr_ = stats.linregress(m_arr, y)
    if k > 2:
        ta = float(stats.t.ppf(0.5 + confidence / 2, k - 2))
        s_lo, s_hi = lr_.slope - ta * lr_.stderr, lr_.slope + ta * lr_.stderr
        b_lo, b_hi = lr_.intercept - ta * lr_.intercept_stderr, lr_.intercept + ta * lr_.intercept_stderr
    else:
        s_lo = s_hi = b_lo = b_hi = float("nan")
    out["affine"] = {
        "slope": float(lr_.slope), "slope_lower": float(s_lo), "slope_upper": float(s_hi),
        "intercept": float(lr_.intercept), "intercept_lower": float(b_lo),
        "intercept_upper": float(b_hi), "r2": float(lr_.rvalue**2),
    }
    if c_theory is not None:
        ct = check_positive(c_theory, "c_theory")
        out["c_theory"] = ct
        out["ratio"] = ct / c
        out["ratio_lower"] = ct / out["c_emp_upper"] if out["c_emp_upper"] > 0 else float("nan")
        out["ratio_upper"] = ct / out["c_emp_lower"] if out["c_emp_lower"] > 0 else float("inf")
    return out


def theory_slope(support, eps: float, vocab_size: int, *, rate: float | None = None) -> float:
    """Theoretical slope ``C_theory`` (tokens per vector) from :mod:`embgeom.bounds`.

    Calls ``embgeom.bounds.slope_bound(support, eps, vocab_size, rate=rate)``: the linear law
    ``C <= log P(S, eps) / log|V|`` (Cor. 4.6; with ``rate`` = lambda, the non-uniform-cell
    refinement in place of log|V|; a heuristic for typical sequences, not a counting bound).

    Parameters
    ----------
    support : embgeom.supports.Support
    eps : float
        Precision (see ``embgeom.bounds.precision_eps``; the paper's ``r_inf * 2**-11``).
    vocab_size : int
    rate : float, optional
        Nats per token replacing log|V| (cell-volume rate lambda).

    Returns
    -------
    float
        C_theory in tokens per memory vector.

    Raises
    ------
    ValueError, TypeError
        Bad support, eps, vocab_size or rate.
    """
    eps = check_positive(eps, "eps")
    vocab_size = check_positive_int(vocab_size, "vocab_size", minimum=2)
    from embgeom import bounds  # numpy-only; imported here so cramming loads without it

    return float(bounds.slope_bound(support, eps, vocab_size, rate=rate))


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def plot_accessibility(curves, path) -> str:
    """Accessibility vs length, one line per m, with Wilson 95% bands; saves a PNG.

    Parameters
    ----------
    curves : mapping {m: AccessibilityCurve or its dict}
    path : str or Path
        PNG file to write.

    Returns
    -------
    str
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in sorted(curves):
        c = curves[m]
        d = c.to_dict() if isinstance(c, AccessibilityCurve) else c
        x = np.asarray(d["lengths"])
        ax.plot(x, d["accessibility"], "o-", label=f"m = {m}")
        ax.fill_between(x, d["lower"], d["upper"], alpha=0.2)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("target length n (tokens)")
    ax.set_ylabel("accessibility")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title("Cramming accessibility vs length")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def plot_n50(n50_by_m, fit, path) -> str:
    """n50 vs m with bootstrap intervals and the fitted line n50 = C_emp m; saves a PNG.

    Parameters
    ----------
    n50_by_m : mapping {m: dict from :func:`n50`}
    fit : dict from :func:`fit_slope` or None
    path : str or Path

    Returns
    -------
    str
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5, 4))
    ms = sorted(n50_by_m)
    y = np.array([n50_by_m[m]["n50"] for m in ms], float)
    lo = np.array([n50_by_m[m].get("lower", np.nan) for m in ms], float)
    hi = np.array([n50_by_m[m].get("upper", np.nan) for m in ms], float)
    yerr = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
    yerr[~np.isfinite(yerr)] = 0
    ax.errorbar(ms, y, yerr=yerr, fmt="o", capsize=3, label="n50 (95% bootstrap)")
    if fit is not None:
        xx = np.linspace(0, max(ms) * 1.05, 50)
        ax.plot(xx, fit["c_emp"] * xx, "-",
                label=f"n50 = {fit['c_emp']:.2f} m  (R² {fit['r2_uncentred']:.3f}, through 0)")
    ax.set_xlabel("memory vectors m")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("n50 (tokens)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------------------------
# The whole job
# --------------------------------------------------------------------------------------------


def run_cram(
    model_name,
    mems,
    out_dir,
    *,
    lengths=None,
    n_targets: int = 16,
    steps: int = 1000,
    lr: float = 1e-2,
    seed: int = 0,
    plot: bool = True,
    adaptive: bool = True,
    target_source="random-tokens",
    max_length: int = 4096,
    batch_size: int = 8,
    device=None,
    n_boot: int = 200,
    c_theory: float | None = None,
    check_generation: bool = True,
    start_token="auto",
    progress: bool = True,
) -> dict:
    """The ``embgeom cram`` job: accessibility curves for each m, n50, C_emp, files on disk.

    Writes into ``out_dir``: ``cram.jsonl`` (one line per target, appended as results come;
    a rerun with the same settings skips finished targets), ``cram_summary.json`` (the returned
    dict), and with ``plot`` ``accessibility.png`` (one line per m) and ``n50_vs_m.png`` (with
    the fitted line).

    Parameters
    ----------
    model_name : str, LoadedModel or HF causal LM
        A registry name / path for ``embgeom.adapters.load_model``, or a loaded model.
    mems : sequence of int
        Numbers of memory vectors m.
    out_dir : str or Path
    lengths, n_targets, steps, lr, seed, adaptive, target_source, max_length, batch_size,
    device, check_generation, start_token : see :func:`accessibility_curve`.
    plot : bool, default True
    n_boot : int, default 200
        Bootstrap draws of :func:`n50`.
    c_theory : float, optional
        Theoretical slope for the ratio in :func:`fit_slope`.
    progress : bool, default True

    Returns
    -------
    dict (JSON-able)
        ``model``, ``dtype``, ``device``, ``settings``, ``curves`` {m: curve dict}, ``n50``
        {m: dict}, ``fit`` (:func:`fit_slope`, or None with ``fit_error`` when fewer than two
        finite n50), ``files``, ``wall_s``.
    """
    t0 = time.perf_counter()
    ms = sorted({check_positive_int(m, "mems") for m in np.atleast_1d(mems).tolist()})
    if not ms:
        raise ValueError("mems: expected at least one number of memory vectors")
    out = Path(out_dir)
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"out_dir: {str(parent)!r} exists and is not a folder")
    if isinstance(model_name, str):
        from embgeom.adapters import load_model

        model = load_model(model_name)
    else:
        model = model_name
    hf, _, name = _resolve_model(model)
    device = _check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = _model_device_dtype(hf)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "cram.jsonl"
    curves, n50s = {}, {}
    for m in ms:
        curves[m] = accessibility_curve(
            model, m, lengths, n_targets, target_source=target_source, seed=seed,
            adaptive=adaptive, max_length=max_length, steps=steps, lr=lr,
            batch_size=batch_size, jsonl=jsonl, check_generation=check_generation,
            start_token=start_token, progress=progress,
        )
        n50s[m] = n50(curves[m], n_boot=n_boot, seed=seed)
    finite = {m: v for m, v in n50s.items() if np.isfinite(v["n50"])}
    fit, fit_error = None, None
    try:
        fit = fit_slope(finite, c_theory=c_theory)
    except ValueError as e:
        fit_error = str(e)
    files = {"jsonl": str(jsonl)}
    if plot:
        files["accessibility_png"] = plot_accessibility(curves, out / "accessibility.png")
        if finite:
            files["n50_png"] = plot_n50(finite, fit, out / "n50_vs_m.png")
    summary = {
        "model": name,
        "source_dtype": getattr(model, "source_dtype", None),
        "dtype": _dtype_name(mdtype),
        "device": str(dev),
        "settings": {
            "mems": ms, "lengths": None if lengths is None else [int(x) for x in np.atleast_1d(lengths)],
            "n_targets": n_targets, "steps": steps, "lr": lr, "seed": seed, "adaptive": adaptive,
            "target_source": _source_descriptor(target_source), "max_length": max_length,
            "batch_size": batch_size, "n_boot": n_boot,
            "start_token": next(iter(curves.values())).settings.get("start_token"),
        },
        "curves": {str(m): c.to_dict() for m, c in curves.items()},
        "n50": {str(m): v for m, v in n50s.items()},
        "fit": fit,
        "fit_error": fit_error,
        "files": files,
        "wall_s": time.perf_counter() - t0,
    }
    summary_path = out / "cram_summary.json"
    files["summary_json"] = str(summary_path)
    files["summary_md"] = str(out / "cram_summary.md")
    text = _summary_markdown(summary)
    (out / "cram_summary.md").write_text(text)
    with open(summary_path, "w") as fh:
        json.dump(_jsonable(summary), fh, indent=2)
    summary["summary_lines"] = text.splitlines() + ["", *(f"wrote {f}" for f in files.values())]
    return summary


def _summary_markdown(summary: dict) -> str:
    """The readable form of a :func:`run_cram` summary: one table per m, n50s, the fit."""
    from embgeom._markdown import fmt, md_table

    st = summary["settings"]
    lines = [
        f"# Cramming: {summary['model']}",
        "",
        f"dtype {summary['dtype']} on {summary['device']}; start token {st.get('start_token')}; "
        f"Adam lr {st['lr']}, at most {st['steps']} steps; {st['n_targets']} targets per length "
        f"({st['target_source']}), seed {st['seed']}; wall {summary['wall_s']:.0f} s.",
    ]
    for m, c in summary["curves"].items():
        rows = [
            [n, f"{k}/{N}", a, f"[{fmt(lo, 3)}, {fmt(hi, 3)}]", f"{kg}/{N}"]
            for n, k, N, a, lo, hi, kg in zip(c["lengths"], c["successes"], c["trials"],
                                               c["accessibility"], c["lower"], c["upper"],
                                               c["successes_generation"])
        ]
        r = summary["n50"][m]
        note = f" (censored {r['censored']})" if r.get("censored") else ""
        lines += ["", f"## m = {m}", "",
                  md_table(["length n", "crammed", "accessibility", "95% Wilson", "generation"], rows),
                  "", f"n50 = {fmt(r['n50'])} tokens [{fmt(r['lower'])}, {fmt(r['upper'])}]{note}"]
    fit = summary.get("fit")
    lines += [""]
    if fit:
        lines.append(f"C_emp = {fmt(fit['c_emp'])} tokens per vector "
                     f"[{fmt(fit['c_emp_lower'])}, {fmt(fit['c_emp_upper'])}], R² through the "
                     f"origin {fmt(fit['r2_uncentred'])} (centred {fmt(fit['r2'])}), affine R² "
                     f"{fmt(fit['affine']['r2'])}")
        if "ratio" in fit:
            lines.append(f"C_theory / C_emp = {fmt(fit['ratio'])}")
    else:
        lines.append(f"no slope: {summary.get('fit_error')}")
    return "\n".join(lines) + "\n"


def _jsonable(obj):
    """NaN/inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    return obj
