"""Cramming itself: optimise soft prompts (memory vectors) so a frozen causal LM emits targets.

:func:`cram` runs in named phases: validate the inputs (:func:`_cram_inputs`), initialise the
memory vectors at the embedding scale (:func:`_init_memory`), run Adam with early stopping per
target (:func:`_optimise`, one :class:`_Adam` update per step), then check generation.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import numpy as np
import torch

from embgeom._hf import (
    check_device,
    dtype_name,
    embed_rows,
    frozen,
    input_embeddings,
    last_logits,
    model_device_dtype,
    prefix,
    resolve_start_token,
    unwrap,
    vocab_rows,
)
from embgeom._validation import check_positive, check_positive_int, check_probability, seed_sequence

from ._checks import greedy_generate
from ._targets import check_targets

__all__ = ["CramResult", "cram"]


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




def _embedding_stats(emb, n_rows: int, *, max_rows: int = 8192, seed: int = 0):
    """Per-coordinate mean and std (float32 (d,)) of the embedding *module's output*.

    The rows are :func:`embgeom._hf.embed_rows` (the module called, so a scale inside it, e.g.
    Gemma-3's ``sqrt(d)``, is included): every row when ``n_rows <= max_rows``, else
    ``max_rows`` rows drawn without replacement from ``default_rng(seed)``.
    """
    dev = emb.weight.device
    if n_rows <= max_rows:
        ids = torch.arange(n_rows, device=dev)
    else:
        rng = np.random.default_rng(seed)
        ids = torch.as_tensor(np.sort(rng.choice(n_rows, size=max_rows, replace=False)), device=dev)
    E = embed_rows(emb, ids, chunk=max(max_rows, 1))
    return E.mean(0), E.std(0)


def _per_target_seeds(seed, B: int) -> list:
    """One ``SeedSequence`` per target.

    An int ``s``: target ``i`` gets ``seed_sequence(s, i)`` (``SeedSequence([s, i])``). A
    ``SeedSequence``, ``BitGenerator``, ``Generator`` or None: target ``i`` gets child ``i``
    (``spawn_key`` extended by ``i``) of its root sequence. A list, tuple or array: one seed per
    target, each anything :func:`embgeom._validation.seed_sequence` takes.
    """
    if isinstance(seed, (list, tuple, np.ndarray)):
        seeds = list(seed)
        if len(seeds) != B:
            raise ValueError(f"seed: expected one seed per target ({B}), got {len(seeds)}")
        return [seed_sequence(s) for s in seeds]
    if isinstance(seed, (numbers.Integral, np.integer)) and not isinstance(seed, bool):
        return [seed_sequence(seed, i) for i in range(B)]
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.BitGenerator,
                                         np.random.Generator)):
        root = seed_sequence(seed)
        return [seed_sequence(root, i) for i in range(B)]
    raise TypeError(
        "seed: expected an int, a SeedSequence/Generator or a sequence of B per-target seeds, "
        f"got {type(seed).__name__}"
    )


@dataclass
class _CramInputs:
    """Validated inputs of :func:`cram`."""

    hf: torch.nn.Module
    emb: torch.nn.Module
    vocab: int
    targets: np.ndarray  # int64 (B, n)
    start: int | None
    seeds: list


def _cram_inputs(model, targets, seed, start_token) -> _CramInputs:
    hf, tok, _, _ = unwrap(model)
    emb = input_embeddings(hf)
    vocab = vocab_rows(hf)
    T_np = check_targets(targets, vocab)
    start = resolve_start_token(hf, tok, start_token, vocab)
    return _CramInputs(hf, emb, vocab, T_np, start, _per_target_seeds(seed, T_np.shape[0]))


def _init_memory(emb, vocab: int, seeds: list, n_mem: int, init_scale: float, dev) -> torch.Tensor:
    """``mean + init_scale * std * z`` float32 ``(B, n_mem, d)``, z standard normal from each
    target's seed, mean and std per coordinate of the embedding module's output."""
    mu, sd = _embedding_stats(emb, vocab)
    d = int(mu.shape[0])
    z = np.stack(
        [np.random.default_rng(s).standard_normal((n_mem, d)).astype(np.float32) for s in seeds]
    )
    return mu + init_scale * sd * torch.as_tensor(z, device=dev)


class _Adam:
    """Adam (the formula of ``torch.optim.Adam``, no weight decay) on a batch of parameters
    whose rows leave the batch when their target is done; its moments shrink with them."""

    def __init__(self, P: torch.Tensor, lr: float, betas: tuple[float, float], eps: float):
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.m = torch.zeros_like(P)
        self.v = torch.zeros_like(P)

    @torch.no_grad()
    def step(self, P: torch.Tensor, grad: torch.Tensor, keep: torch.Tensor, t: int) -> torch.Tensor:
        """The rows ``keep`` of ``P`` after update ``t`` (0-based) with gradient ``grad``."""
        P, g = P.detach()[keep], grad[keep]
        self.m, self.v = self.m[keep], self.v[keep]
        self.m.mul_(self.b1).add_(g, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        bc1, bc2 = 1 - self.b1 ** (t + 1), 1 - self.b2 ** (t + 1)
        return P - self.lr * (self.m / bc1) / ((self.v / bc2).sqrt() + self.eps)


@dataclass
class _Outcome:
    """Per-target results filled in as targets finish (numpy, indexed by target)."""

    steps: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    success: np.ndarray
    memory: np.ndarray

    @classmethod
    def empty(cls, B: int, n_mem: int, d: int) -> "_Outcome":
        return cls(np.zeros(B, np.int64), np.zeros(B, np.float64), np.zeros(B, np.float64),
                   np.zeros(B, bool), np.zeros((B, n_mem, d), np.float32))

    def record(self, idx, t, ce, acc, correct, P) -> None:
        self.steps[idx] = t
        self.loss[idx] = ce.cpu().double().numpy()
        self.accuracy[idx] = acc.cpu().double().numpy()
        self.success[idx] = correct.all(1).cpu().numpy()
        self.memory[idx] = P.cpu().numpy()


def _teacher_forced(hf, emb, P, te_active, T_active, start, mdtype, n: int):
    """Per-target mean cross-entropy (nats/token, with grad) and the argmax hits ``(b, n)``."""
    x = torch.cat([prefix(P, emb, start, mdtype), te_active], dim=1)
    logits, _ = last_logits(hf, x, n, use_cache=False)  # (b, n, rows)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), T_active, reduction="none").mean(1)
    with torch.no_grad():
        correct = logits.argmax(-1) == T_active
    return ce, correct


def _optimise(hf, emb, P, T, start, mdtype, *, steps, adam: _Adam, progress, n_mem):
    """Adam until each target's teacher-forced accuracy is 100% or ``steps`` updates are spent.

    Returns the :class:`_Outcome` and the best accuracy per target (float64 tensor (B,)).
    """
    B, n = T.shape
    dev = P.device
    with torch.no_grad():
        te = emb(T[:, :-1]).to(mdtype)  # (B, n-1, d), constant
    active = torch.arange(B, device=dev)
    best = torch.zeros(B, dtype=torch.float64, device=dev)
    out = _Outcome.empty(B, P.shape[1], P.shape[2])
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"cram m={n_mem} n={n}", leave=False)
    try:
        for t in range(steps + 1):
            P.requires_grad_(True)
            ce, correct = _teacher_forced(hf, emb, P, te[active], T[active], start, mdtype, n)
            with torch.no_grad():
                acc = correct.float().mean(1)
                best[active] = torch.maximum(best[active], acc.double())
                done = correct.all(1) if t < steps else torch.ones_like(correct[:, 0])
            if bool(done.any()):
                out.record(active[done].cpu().numpy(), t, ce.detach()[done], acc[done],
                           correct[done], P.detach()[done])
            keep = ~done
            if not bool(keep.any()):
                break
            (grad,) = torch.autograd.grad(ce[keep].sum(), P)
            P = adam.step(P, grad, keep, t)
            active = active[keep]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=int(active.numel()), best_acc=f"{float(best.mean()):.2f}")
    finally:
        if bar is not None:
            bar.close()
    return out, best


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
    seed : int, SeedSequence, Generator or sequence of B seeds, default 0
        Initialisation. With an int, target ``i`` is initialised from
        ``numpy.random.default_rng([seed, i])``; with a sequence, target ``i`` uses
        ``default_rng(seed[i])`` (an int or a sequence of ints), so a target gets the same start
        whether it is crammed alone or in a batch. A ``SeedSequence`` or ``Generator``: target
        ``i`` uses child ``i`` of its root sequence (:func:`embgeom._validation.seed_sequence`).
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
    Not run by the doctests (+SKIP): it loads the real model and runs 500 Adam steps (minutes);
    tests/test_cramming.py crams tiny models instead.

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
    inp = _cram_inputs(model, targets, seed, start_token)
    hf, emb = inp.hf, inp.emb
    device = check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = model_device_dtype(hf)
    t_start = time.perf_counter()

    with frozen(hf):
        P = _init_memory(emb, inp.vocab, inp.seeds, n_mem, init_scale, dev)
        T = torch.as_tensor(inp.targets, device=dev)
        out, best = _optimise(hf, emb, P, T, inp.start, mdtype, steps=steps,
                              adam=_Adam(P, lr, (b1, b2), adam_eps), progress=progress,
                              n_mem=n_mem)
        gen_ok = np.zeros(T.shape[0], bool)
        if check_generation:
            gen = greedy_generate(hf, out.memory, T.shape[1], use_cache=use_cache,
                                  start_token=inp.start)
            gen_ok = (gen == inp.targets).all(1)

    return CramResult(
        success_teacher_forced=out.success,
        success_generation=gen_ok,
        steps=out.steps,
        loss=out.loss,
        accuracy=out.accuracy,
        best_accuracy=best.cpu().numpy(),
        memory=out.memory,
        n_mem=n_mem,
        length=int(T.shape[1]),
        dtype=dtype_name(mdtype),
        device=str(dev),
        wall_s=time.perf_counter() - t_start,
        generation_checked=bool(check_generation),
        start_token=inp.start,
    )
