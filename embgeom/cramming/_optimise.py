"""Cramming itself: optimise soft prompts (memory vectors) so a frozen causal LM emits targets.

:func:`cram` runs in named phases: validate the inputs (:func:`_cram_inputs`), initialise the
memory vectors at the embedding scale (:func:`_init_memory`), run Adam with early stopping per
target (:func:`_optimise`, one :class:`_Adam` update per step), then check generation.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from embgeom._hf import (
    check_device,
    check_positions,
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
from embgeom._progress import tqdm_kwargs
from embgeom._validation import check_bool, check_positive, check_positive_int, seed_sequence

from ._checks import greedy_generate
from ._targets import check_targets

__all__ = ["CramResult", "cram", "PRECISIONS", "STOP_REASONS"]


#: The precisions of the model forward that :func:`cram` offers.
PRECISIONS = ("float32", "bf16-autocast", "bf16-linear")

#: Why a target stopped (``CramResult.stop_reason``).
STOP_REASONS = ("accuracy", "patience", "steps")


@dataclass
class CramResult:
    """Per-target outcome of :func:`cram`.

    Attributes
    ----------
    success_teacher_forced : numpy.ndarray of bool, shape (B,)
        100% teacher-forced token accuracy (the paper's criterion), judged by a float32 forward
        whatever ``precision`` the optimisation ran in.
    success_generation : numpy.ndarray of bool, shape (B,)
        Greedy generation from the memory vectors alone reproduces the target exactly.
        All False when the generation check was switched off (``generation_checked`` False).
    steps : numpy.ndarray of int64, shape (B,)
        Adam updates applied before the target stopped.
    loss : numpy.ndarray of float64, shape (B,)
        Mean teacher-forced cross-entropy per target token (nats/token) at the returned vectors
        (float32 forward).
    accuracy : numpy.ndarray of float64, shape (B,)
        Teacher-forced token accuracy at the returned vectors, in [0, 1] (float32 forward).
    best_accuracy : numpy.ndarray of float64, shape (B,)
        The highest teacher-forced token accuracy seen at any step (Adam does not descend
        monotonically: a failed target can end below its best). Under ``"bf16-autocast"`` the
        accuracies of the optimisation steps are those of the bf16 forward.
    memory : numpy.ndarray of float32, shape (B, n_mem, d)
        The memory vectors (as ``inputs_embeds``, i.e. on the scale of the embedding module's
        output). With rows of different m, ``n_mem`` is the largest and row i's vectors are
        ``memory[i, :n_mems[i]]`` (the rest zeros).
    n_mem, length : int
        m and n; with rows of different m or n, the largest.
    dtype : str
        The model's compute dtype (the precision eps of the bounds depends on it).
    device : str
    wall_s : float
    generation_checked : bool
    start_token : int or None
        The token id placed before the memory vectors (see :func:`cram`), or None.
    stop_reason : numpy.ndarray of str, shape (B,)
        ``"accuracy"`` (100% teacher-forced accuracy in float32), ``"patience"`` (``patience``
        steps without a new best accuracy) or ``"steps"`` (the step budget).
    precision : str
        The precision of the model forward during the optimisation (``"float32"`` or
        ``"bf16-autocast"``).
    n_mems, lengths : numpy.ndarray of int64, shape (B,)
        m and n per row (all equal unless rows of different m or n were crammed together).
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
    stop_reason: np.ndarray | None = None
    precision: str = "float32"
    n_mems: np.ndarray | None = None
    lengths: np.ndarray | None = None

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
                "stop_reason": None if self.stop_reason is None else str(self.stop_reason[i]),
                "precision": self.precision,
            }
            for i in range(len(self.steps))
        ]

    def to_dict(self) -> dict:
        """JSON-able summary (memory vectors left out), through :mod:`embgeom._json` (a
        non-finite loss or accuracy is ``null``)."""
        from embgeom._json import to_jsonable

        return to_jsonable({
            "n_mem": self.n_mem,
            "length": self.length,
            "dtype": self.dtype,
            "device": self.device,
            "precision": self.precision,
            "wall_s": self.wall_s,
            "generation_checked": self.generation_checked,
            "start_token": self.start_token,
            "targets": self.to_records(),
        })


# --------------------------------------------------------------------------------------------
# The options, checked at the door (the rules of torch.optim.Adam / AdamW)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CramOptions:
    """The optimiser and numerical options of :func:`cram`, validated."""

    steps: int
    lr: float
    init_scale: float
    betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    patience: int | None
    precision: str


def _check_betas(betas) -> tuple[float, float]:
    """``betas`` as two floats in [0, 1) (``torch.optim.Adam``'s rule)."""
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise TypeError(f"betas: expected a pair (beta1, beta2) of numbers in [0, 1), got {betas!r}")
    out = []
    for i, b in enumerate(betas):
        v = check_positive(b, f"betas[{i}]", allow_zero=True)
        if v >= 1:
            raise ValueError(f"betas[{i}]: expected a number in [0, 1) (as torch.optim.Adam), "
                             f"got {v}")
        out.append(v)
    return out[0], out[1]


def _check_flag(x, name: str) -> bool:
    return check_bool(x, name)


def _check_progress(x, name: str = "progress") -> bool:
    """The ``progress`` of the cramming entry points: True or False as given, or None (their
    default) for bars only where stderr is a terminal (:func:`embgeom._progress.
    progress_enabled`), so that a job logging to a file is not flooded with redraws.

    Raises
    ------
    TypeError
        Neither None nor True/False.
    """
    if x is None:
        from embgeom._progress import progress_enabled

        return progress_enabled()
    return _check_flag(x, name)


def _check_cram_options(*, steps=1000, lr=1e-2, init_scale=1.0, betas=(0.9, 0.999),
                        adam_eps=1e-8, weight_decay=0.0, patience=None,
                        precision="float32") -> _CramOptions:
    """Validate the optimiser and numerical options of :func:`cram` before any work.

    The rules are ``torch.optim.Adam``'s / ``AdamW``'s: ``0 <= lr``, ``0 <= adam_eps``,
    ``0 <= betas[i] < 1``, ``0 <= weight_decay``, all finite; and ``steps`` an int >= 0,
    ``init_scale`` finite > 0, ``patience`` None or an int >= 1, ``precision`` one of
    :data:`PRECISIONS`. Raises TypeError or ValueError naming the argument.
    """
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_positive(lr, "lr", allow_zero=True)
    init_scale = check_positive(init_scale, "init_scale")
    b = _check_betas(betas)
    adam_eps = check_positive(adam_eps, "adam_eps", allow_zero=True)
    weight_decay = check_positive(weight_decay, "weight_decay", allow_zero=True)
    if patience is not None:
        patience = check_positive_int(patience, "patience")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    return _CramOptions(steps, lr, init_scale, b, adam_eps, weight_decay, patience, precision)


def _check_precision_device(precision: str, dev: torch.device) -> None:
    """bf16 autocast (and bf16 products) must be available on the device the model runs on."""
    if precision == "float32":
        return
    if precision == "bf16-autocast" and not torch.amp.is_autocast_available(dev.type):
        raise ValueError(f"precision: bf16 autocast is not available on device {str(dev)!r}")
    if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision: device {str(dev)!r} does not support bfloat16; use float32")


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
    targets: list  # B int64 arrays (n_i,)
    n_mems: np.ndarray  # int64 (B,)
    start: int | None
    seeds: list


def _check_rows(targets, n_mem, vocab: int) -> tuple[list, np.ndarray]:
    """Targets as a list of B int64 rows and m per row (int64 (B,)).

    ``targets``: an int array (B, n) or (n,), or a list of 1-D int arrays of any lengths;
    ``n_mem``: an int, or a sequence of B ints.
    """
    if isinstance(targets, (list, tuple)) and targets and all(
            hasattr(t, "__len__") and not isinstance(t, (str, bytes)) for t in targets) and \
            len({len(t) for t in targets}) > 1:
        rows = [check_targets(t, vocab)[0] if np.ndim(t) == 1 else None for t in targets]
        if any(r is None for r in rows):
            raise ValueError("targets: rows of different lengths must each be 1-D")
    else:
        rows = list(check_targets(targets, vocab))
    if isinstance(n_mem, (list, tuple, np.ndarray)):
        ms = [check_positive_int(m, "n_mem") for m in np.asarray(n_mem).ravel().tolist()]
        if len(ms) != len(rows):
            raise ValueError(f"n_mem: expected one m per target ({len(rows)}), got {len(ms)}")
    else:
        ms = [check_positive_int(n_mem, "n_mem")] * len(rows)
    return rows, np.array(ms, np.int64)


def _cram_inputs(model, targets, n_mem, seed, start_token) -> _CramInputs:
    hf, tok, _, _ = unwrap(model)
    emb = input_embeddings(hf)
    vocab = vocab_rows(hf)
    rows, ms = _check_rows(targets, n_mem, vocab)
    start = resolve_start_token(hf, tok, start_token, vocab)
    longest = int(max(int(m) + len(r) for m, r in zip(ms, rows)))
    check_positions(hf, (start is not None) + longest - 1, "targets",
                    "the start token, the memory vectors and the longest target")
    return _CramInputs(hf, emb, vocab, rows, ms, start, _per_target_seeds(seed, len(rows)))


def _init_memory(emb, vocab: int, seeds: list, n_mems, init_scale: float, dev) -> torch.Tensor:
    """``mean + init_scale * std * z`` float32 ``(B, max m, d)``, z standard normal ``(m_i, d)``
    from each target's seed, mean and std per coordinate of the embedding module's output.
    Slots past a row's own m (rows of different m) hold the mean and are never used."""
    mu, sd = _embedding_stats(emb, vocab)
    d = int(mu.shape[0])
    m_max = int(max(n_mems))
    z = np.zeros((len(seeds), m_max, d), np.float32)
    for i, (s, m) in enumerate(zip(seeds, n_mems)):
        z[i, :m] = np.random.default_rng(s).standard_normal((int(m), d)).astype(np.float32)
    return mu + init_scale * sd * torch.as_tensor(z, device=dev)


class _Adam:
    """Adam (the formula of ``torch.optim.Adam``), or AdamW with ``weight_decay`` (decoupled:
    ``P <- P (1 - lr wd)`` before the update, as ``torch.optim.AdamW``), on a batch of
    parameters whose rows leave the batch when their target is done; its moments shrink with
    them."""

    def __init__(self, P: torch.Tensor, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float = 0.0):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = torch.zeros_like(P)
        self.v = torch.zeros_like(P)

    @torch.no_grad()
    def step(self, P: torch.Tensor, grad: torch.Tensor, keep: torch.Tensor, t: int) -> torch.Tensor:
        """The rows ``keep`` of ``P`` after update ``t`` (0-based) with gradient ``grad``."""
        P, g = P.detach()[keep], grad[keep]
        self.m, self.v = self.m[keep], self.v[keep]
        if self.wd:
            P = P * (1 - self.lr * self.wd)
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
    reason: np.ndarray

    @classmethod
    def empty(cls, B: int, n_mem: int, d: int) -> "_Outcome":
        return cls(np.zeros(B, np.int64), np.zeros(B, np.float64), np.zeros(B, np.float64),
                   np.zeros(B, bool), np.zeros((B, n_mem, d), np.float32),
                   np.full(B, "steps", dtype="<U8"))

    def record(self, idx, t, ce, acc, success, P, reason) -> None:
        self.steps[idx] = t
        self.loss[idx] = ce.cpu().double().numpy()
        self.accuracy[idx] = acc.cpu().double().numpy()
        self.success[idx] = success.cpu().numpy()
        self.memory[idx] = P.cpu().numpy()
        self.reason[idx] = reason


#: bfloat16 copies of a model's ``nn.Linear`` weights for ``"bf16-linear"``, per model (made on
#: first use; a weight whose storage or version changed is cast again).
_BF16_LINEARS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _bf16_copy(t: torch.Tensor | None, cached):
    """``t`` in bfloat16, reusing ``cached`` (``(data_ptr, version, copy)``) while ``t`` is
    unchanged. Returns ``(copy, key)``."""
    if t is None:
        return None, None
    key = (t.data_ptr(), t._version)
    if cached is not None and cached[0] == key:
        return cached[1], cached
    c = t.detach().to(torch.bfloat16)
    return c, (key, c)


def _linear_bf16(module, wb, bb, x):
    """``module``'s product in bfloat16 (``x`` and the weight rounded to bf16), back in ``x``'s
    dtype: what autocast does for a linear layer, without casting the weight on every call."""
    return torch.nn.functional.linear(x.to(torch.bfloat16), wb, bb).to(x.dtype)


@contextlib.contextmanager
def _bf16_linears(hf):
    """During the block every ``nn.Linear`` of ``hf`` (the body's projections and the
    unembedding) multiplies in bfloat16 from a cached bf16 copy of its weight and returns
    float32; attention, norms, activations, residual sums and the loss stay float32.

    Against ``torch.autocast`` (which also casts each weight on every call and runs attention
    in bf16, whose CPU backward is slow) this is the same rounding of every matrix product's
    inputs, without the weight casts: on SmolLM2 (1 thread, 4 targets x 32 tokens, an AMX CPU)
    a step took 0.44-0.48 s against 0.63 under autocast and 0.72-0.79 in float32
    (``benchmarks/bench_cram_step.py``).
    """
    cache = _BF16_LINEARS.setdefault(hf, {})
    patched = []
    try:
        for name, mod in hf.named_modules():
            if type(mod) is not torch.nn.Linear or mod.weight.dtype == torch.bfloat16:
                continue
            old_w, old_b = cache.get(name, (None, None))
            wb, kw = _bf16_copy(mod.weight, old_w)
            bb, kb = _bf16_copy(mod.bias, old_b)
            cache[name] = (kw, kb)
            mod.forward = functools.partial(_linear_bf16, mod, wb, bb)
            patched.append(mod)
        yield
    finally:
        for mod in patched:
            del mod.forward


def _model_forward(hf, x, keep: int, precision: str):
    """Logits (float32) of the last ``keep`` positions, the model forward in ``precision``
    (:data:`PRECISIONS`): ``"float32"`` as the model is; ``"bf16-autocast"`` under
    ``torch.autocast(device, bfloat16)``; ``"bf16-linear"`` with every linear layer in bf16
    and the rest float32 (:func:`_bf16_linears`)."""
    if precision == "float32":
        return last_logits(hf, x, keep, use_cache=False)[0]
    if precision == "bf16-linear":
        with _bf16_linears(hf):
            return last_logits(hf, x, keep, use_cache=False)[0]
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        logits, _ = last_logits(hf, x, keep, use_cache=False)
    return logits.float()


class _Rows:
    """The targets of one batch and the layout of their inputs.

    All rows of one m and one n (the usual case): ``[e(s), mem, e(x_1 .. x_{n-1})]`` stacked.
    Rows of different m or n: each row laid out the same way, right-padded to the longest
    row (causal attention: positions after a row's own change nothing before them, and the
    positions are those of the row alone), its n scored logits picked from the window that
    covers every row's (the last memory vector to the end).
    """

    def __init__(self, emb, targets: list, n_mems: np.ndarray, start, mdtype, dev):
        self.emb, self.start, self.mdtype, self.dev = emb, start, mdtype, dev
        self.m = np.asarray(n_mems, np.int64)
        self.n = np.array([len(t) for t in targets], np.int64)
        self.uniform = len(set(self.m.tolist())) == 1 and len(set(self.n.tolist())) == 1
        n_max = int(self.n.max())
        T = np.full((len(targets), n_max), -100, np.int64)
        for i, t in enumerate(targets):
            T[i, : len(t)] = t
        self.T = torch.as_tensor(T, device=dev)
        with torch.no_grad():
            self.te = emb(self.T.clamp(min=0)[:, :-1]).to(mdtype)  # (B, n_max - 1, d), constant
            d = self.te.shape[-1]
            extra = [torch.zeros(1, d, dtype=mdtype, device=dev)]
            if start is not None:
                extra.append(emb(torch.tensor([start], device=dev)).to(mdtype))
            self.te_pool = torch.cat([self.te.reshape(-1, d), *extra])
        self._layout = (None, None)

    def _ragged_layout(self, active: np.ndarray, m_slots: int):
        """Gather indices ``(b, L)`` into ``[P (b m_slots), te, zero, start]``, the scored window
        ``K`` and the targets aligned to it ``(b, K)`` (-100 where not scored)."""
        if self._layout[0] is not None and np.array_equal(self._layout[0], active):
            return self._layout[1]
        m, n = self.m[active], self.n[active]
        s = 0 if self.start is None else 1
        b, n_max = len(active), self.T.shape[1]
        first = s + m - 1  # the position whose logits predict x_1
        L = int((first + n).max())
        K = L - int(first.min())
        off_te = b * m_slots
        zero = off_te + self.te.shape[0] * (n_max - 1)
        idx = np.full((b, L), zero, np.int64)
        tgt = np.full((b, K), -100, np.int64)
        T_np = self.T.cpu().numpy()
        for r, (i, mi, ni) in enumerate(zip(active, m, n)):
            if s:
                idx[r, 0] = zero + 1
            idx[r, s : s + mi] = r * m_slots + np.arange(mi)
            idx[r, s + mi : s + mi + ni - 1] = off_te + i * (n_max - 1) + np.arange(ni - 1)
            w0 = (s + mi - 1) - (L - K)
            tgt[r, w0 : w0 + ni] = T_np[i, :ni]
        layout = (torch.as_tensor(idx, device=self.dev), K,
                  torch.as_tensor(tgt, device=self.dev),
                  torch.as_tensor(n, device=self.dev, dtype=torch.float32))
        self._layout = (active.copy(), layout)
        return layout

    def forward(self, hf, P, active: torch.Tensor, precision: str):
        """Per-row mean cross-entropy (nats/token, float32 (b,), with grad), the hits
        (bool (b, k): argmax right, or a position that is not scored) and the token accuracy
        (float32 (b,))."""
        if self.uniform:
            n = int(self.n[0])
            x = torch.cat([prefix(P, self.emb, self.start, self.mdtype), self.te[active]], dim=1)
            logits = _model_forward(hf, x, n, precision)  # (b, n, rows)
            T = self.T[active]
            ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), T,
                                                   reduction="none").mean(1)
            with torch.no_grad():
                hits = logits.argmax(-1) == T
                return ce, hits, hits.float().mean(1)
        idx, K, tgt, n = self._ragged_layout(active.cpu().numpy(), P.shape[1])
        d = P.shape[-1]
        pool = torch.cat([P.reshape(-1, d).to(self.mdtype), self.te_pool])
        logits = _model_forward(hf, pool[idx], K, precision)  # (b, K, rows)
        ce_tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, reduction="none",
                                                   ignore_index=-100)
        ce = ce_tok.sum(1) / n
        with torch.no_grad():
            right = logits.argmax(-1) == tgt
            return ce, right | (tgt < 0), right.sum(1).float() / n


def _check_finite(ce: torch.Tensor, t: int) -> None:
    if not bool(torch.isfinite(ce.detach()).all()):
        raise FloatingPointError(
            f"cram: the loss is not finite at step {t} (the optimisation diverged); use a smaller "
            "lr or a larger adam_eps"
        )


@torch.enable_grad()  # a caller's no_grad (or a Ray worker left in one) must not break the steps
def _optimise(hf, P, rows: _Rows, *, opts: _CramOptions, adam: _Adam, progress, label):
    """Adam until each target stops: 100% teacher-forced accuracy (confirmed by a float32
    forward under bf16 autocast), ``patience`` steps without a new best accuracy, or
    ``steps`` updates spent.

    Returns the :class:`_Outcome` and the best accuracy per target (float64 tensor (B,)).
    """
    B = P.shape[0]
    dev = P.device
    steps, patience = opts.steps, opts.patience
    bf16 = opts.precision != "float32"
    active = torch.arange(B, device=dev)
    best = torch.zeros(B, dtype=torch.float64, device=dev)
    last_rise = torch.zeros(B, dtype=torch.long, device=dev)  # step of the last new best
    out = _Outcome.empty(B, P.shape[1], P.shape[2])
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"cram {label}", leave=False, **tqdm_kwargs(progress))
    try:
        for t in range(steps + 1):
            P.requires_grad_(True)
            ce, hits, acc = rows.forward(hf, P, active, opts.precision)
            _check_finite(ce, t)
            with torch.no_grad():
                full = hits.all(1)
                if patience is not None:
                    rose = acc.double() > best[active]
                    last_rise[active] = torch.where(rose, t, last_rise[active])
                    patient = (t - last_rise[active]) >= patience
                else:
                    patient = torch.zeros_like(full)
                best[active] = torch.maximum(best[active], acc.double())
                cand = full | patient if t < steps else torch.ones_like(full)
            done = torch.zeros_like(full)
            if bool(cand.any()):
                ci = cand.nonzero()[:, 0]
                with torch.no_grad():
                    if bf16:  # confirm in float32: only rows still at 100% stop on accuracy
                        ce_c, hits_c, acc_c = rows.forward(hf, P.detach()[ci], active[ci], "float32")
                    else:
                        ce_c, hits_c, acc_c = ce.detach()[ci], hits[ci], acc[ci]
                    ok = hits_c.all(1)
                    stop = ok | patient[ci] | (t == steps)
                if bool(stop.any()):
                    si = ci[stop]
                    for why, sel in (("accuracy", ok[stop]),
                                     ("patience", ~ok[stop] & patient[si]),
                                     ("steps", ~ok[stop] & ~patient[si])):
                        if bool(sel.any()):
                            out.record(active[si[sel]].cpu().numpy(), t, ce_c[stop][sel],
                                       acc_c[stop][sel], ok[stop][sel], P.detach()[si[sel]], why)
                    done[si] = True
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


def _generation_check(hf, inp: _CramInputs, memory: np.ndarray, use_cache: bool) -> np.ndarray:
    """bool (B,): greedy generation (float32, no autocast) reproduces each target; rows are
    generated per m, each group for its longest n, each row compared on its own n."""
    ok = np.zeros(len(inp.targets), bool)
    for m in np.unique(inp.n_mems):
        g = np.flatnonzero(inp.n_mems == m)
        n_max = max(len(inp.targets[i]) for i in g)
        gen = greedy_generate(hf, memory[g, :m], n_max, use_cache=use_cache, start_token=inp.start)
        for r, i in enumerate(g):
            t = inp.targets[i]
            ok[i] = bool((gen[r, : len(t)] == t).all())
    return ok


def cram(
    model,
    targets,
    n_mem,
    *,
    steps: int = 1000,
    lr: float = 1e-2,
    seed=0,
    init_scale: float = 1.0,
    start_token="auto",
    betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
    weight_decay: float = 0.0,
    patience: int | None = None,
    precision: str = "float32",
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
    teacher-forced token accuracy is 100%, or, with ``patience``, when its best accuracy has
    not risen for ``patience`` steps.

    Rows of different m and n can share a batch (``targets`` a list of rows of different
    lengths, ``n_mem`` one m per row): each row keeps its own layout and positions, right-padded
    to the longest row (causal attention: padding after a row changes nothing before it), and
    is scored on its own n positions. This lets one GPU batch hold a whole grid of (m, n).

    Parameters
    ----------
    model : embgeom.adapters.LoadedModel or transformers PreTrainedModel
        A causal LM that accepts ``inputs_embeds``. Its parameters are frozen for the run
        (``requires_grad`` False, eval mode; both restored afterwards) and never modified.
    targets : array_like of int, shape (B, n) or (n,), or list of B 1-D int arrays
        Token ids in ``[0, n_rows)``; a list of rows of different lengths crams them together.
    n_mem : int or sequence of B int
        Number of memory vectors m per target (>= 1); one per row for rows of different m.
    steps : int, default 1000
        Maximum Adam updates per target (>= 0).
    lr : float, default 1e-2
        Adam learning rate (>= 0, as ``torch.optim.Adam``).
    seed : int, SeedSequence, Generator or sequence of B seeds, default 0
        Initialisation. With an int, target ``i`` is initialised from
        ``numpy.random.default_rng([seed, i])``; with a sequence, target ``i`` uses
        ``default_rng(seed[i])`` (an int or a sequence of ints), so a target gets the same start
        whether it is crammed alone or in a batch. A ``SeedSequence`` or ``Generator``: target
        ``i`` uses child ``i`` of its root sequence (:func:`embgeom._validation.seed_sequence`).
    init_scale : float, default 1.0
        Finite and > 0. Memory vectors start at ``mean + init_scale * std * z``, z standard normal, with the
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
    betas : pair of float, default (0.9, 0.999)
        Adam's decay rates, each in [0, 1) (``torch.optim.Adam``'s rule).
    adam_eps : float, default 1e-8
        Adam's epsilon (>= 0).
    weight_decay : float, default 0.0
        Decoupled weight decay (AdamW, as ``torch.optim.AdamW``): ``P <- P (1 - lr wd)`` before
        each update; >= 0. Kuratov et al. use 0.01 (:mod:`embgeom.cramming._gpu_protocol`).
    patience : int or None, default None
        Stop a target once its best teacher-forced accuracy has not risen for this many steps
        (>= 1); None: never (the target runs until 100% or ``steps``). Kuratov et al. use 2000.
    precision : {"float32", "bf16-autocast", "bf16-linear"}, default "float32"
        The precision of the model forward during the optimisation. ``"bf16-autocast"`` runs
        only the model forward that gives the scored logits under
        ``torch.autocast(device, bfloat16)``; the cross-entropy, the gradient, the memory
        vectors and Adam stay float32. Every stop is confirmed in float32: a row that reaches
        100% under bf16 is re-evaluated by a float32 forward and stops only if it is still at
        100% (else it keeps optimising). The recorded loss and accuracy and the generation
        check are float32. On a Zen 5 CPU (avx512_bf16) the step is 2.04x faster, but it
        changed 1 of 8 verdicts of a 300-step check set (``benchmarks/bench_cram_step.py``),
        so it is not the default. ``"bf16-linear"``: every ``nn.Linear`` (projections and
        unembedding) multiplies in bfloat16 from a cached bf16 copy of its weight, attention
        and the rest float32; stops confirmed in float32 the same way. On an AMX CPU a
        SmolLM2 step is 1.6x float32's at one thread (autocast 1.2x, ``_bf16_linears``); on a
        tiny model (hidden size 48) the activations' casts cost more than the products save
        and it ran at half float32's speed.
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
        Per target: both verdicts, steps used, why it stopped, loss, accuracy and memory
        vectors float32 (B, n_mem, d).

    Raises
    ------
    TypeError
        ``model`` is not a torch module / LoadedModel; ``targets`` not integers; bad ``seed``;
        ``betas`` not a pair; a non-integer ``n_mem``, ``steps`` or ``patience``; a flag that is
        not a bool.
    ValueError
        Checked before any work: ``n_mem < 1``, ``steps < 0``, ``lr``, ``adam_eps`` or
        ``weight_decay`` negative or not finite, a beta outside [0, 1), ``init_scale`` not
        finite and > 0, ``patience < 1``, an unknown ``precision`` or one the device lacks, an
        unusable ``device``, empty targets, token ids out of range (targets or
        ``start_token``), or a model without input embeddings.
    FloatingPointError
        The loss became NaN or infinite (the optimisation diverged).

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
    opts = _check_cram_options(steps=steps, lr=lr, init_scale=init_scale, betas=betas,
                               adam_eps=adam_eps, weight_decay=weight_decay, patience=patience,
                               precision=precision)
    check_generation = _check_flag(check_generation, "check_generation")
    use_cache = _check_flag(use_cache, "use_cache")
    progress = _check_flag(progress, "progress")
    inp = _cram_inputs(model, targets, n_mem, seed, start_token)
    hf, emb = inp.hf, inp.emb
    device = check_device(device)
    _check_precision_device(opts.precision, device if device is not None
                            else model_device_dtype(hf)[0])
    if device is not None:
        hf.to(device)
    dev, mdtype = model_device_dtype(hf)
    t_start = time.perf_counter()

    with frozen(hf):
        P = _init_memory(emb, inp.vocab, inp.seeds, inp.n_mems, opts.init_scale, dev)
        rows = _Rows(emb, inp.targets, inp.n_mems, inp.start, mdtype, dev)
        ms, ns = sorted(set(rows.m.tolist())), sorted(set(rows.n.tolist()))
        label = (f"m={ms[0]} n={ns[0]}" if rows.uniform else
                 f"m={ms[0]}..{ms[-1]} n={ns[0]}..{ns[-1]}")
        out, best = _optimise(hf, P, rows, opts=opts,
                              adam=_Adam(P, opts.lr, opts.betas, opts.adam_eps, opts.weight_decay),
                              progress=progress, label=label)
        for i, m in enumerate(inp.n_mems):  # rows of a smaller m: their unused slots are zeros
            out.memory[i, m:] = 0
        gen_ok = np.zeros(len(inp.targets), bool)
        if check_generation:
            gen_ok = _generation_check(hf, inp, out.memory, use_cache)

    return CramResult(
        success_teacher_forced=out.success,
        success_generation=gen_ok,
        steps=out.steps,
        loss=out.loss,
        accuracy=out.accuracy,
        best_accuracy=best.cpu().numpy(),
        memory=out.memory,
        n_mem=int(rows.m.max()),
        length=int(rows.n.max()),
        dtype=dtype_name(mdtype),
        device=str(dev),
        wall_s=time.perf_counter() - t_start,
        generation_checked=check_generation,
        start_token=inp.start,
        stop_reason=out.reason,
        precision=opts.precision,
        n_mems=rows.m.copy(),
        lengths=rows.n.copy(),
    )
