"""Per-target horizons by progressive cramming: one run per target gives the accessibility curve.

Accessibility is monotone in prefixes: memory vectors that make the model emit ``x_1 .. x_n``
(teacher-forced, every next-token argmax right) also make it emit ``x_1 .. x_k`` for every
``k < n``. Each target therefore has a *horizon* ``h(x)``, the longest prefix that can be
crammed, and ``accessibility(n) = P(h >= n)``. :func:`horizons` measures ``h`` per target with
one progressive run (Tarasov et al., ICML 2026, "progressive cramming"): cram the first token,
then grow the target one token at a time from the previous solution, and stop at the first
length that fails within its budget. The per-length runs of :func:`accessibility_curve` (one
fresh optimisation per (target, length): the paper's protocol) stay as the check.

Layout of a batch: the targets are split, in the order given, into fixed batches of
``batch_size`` rows. Every row has its own current length; a batch forward takes the rows still
running, ``[e(s), mem, e(x_1) .. e(x_{K-1})]`` with K the longest current length among them, and
scores row i on its own first ``k_i`` positions (causal attention: tokens past ``k_i`` change
nothing before them). The same forward's logits give the accuracy check (no second forward):
the number ``c_i`` of leading tokens already right; when ``c_i >= k_i`` the row has crammed
every length up to ``c_i`` and its next length is ``c_i + 1``. Finished rows leave the batch.

Resume: one JSON line per finished target (:mod:`embgeom._json`), keyed on the settings' hash
and the target index; a batch that was cut short resumes from its checkpoint (the whole state,
saved every ``checkpoint_every`` updates with an atomic rename), so a resumed run equals the
uninterrupted one record for record. Batches are fixed by the target order, never re-formed.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embgeom import _json
from embgeom._hf import (
    check_device,
    check_positions,
    dtype_name,
    embed_rows,
    frozen,
    input_embeddings,
    model_device_dtype,
    prefix,
    resolve_start_token,
    unwrap,
    vocab_rows,
)
from embgeom._progress import tqdm_kwargs
from embgeom._validation import check_bool, check_positive, check_positive_int, seed_sequence

from ._checks import greedy_generate
from ._curve import (
    _append_lines,
    _check_jsonl,
    _is_int,
    _model_fingerprint,
    _read_jsonl,
    _settings_hash,
    _settings_problem,
)
from ._optimise import PRECISIONS, _embedding_stats, _model_forward
from ._protocols import DEFAULT_PROTOCOL, CramProtocol, get_protocol
from ._targets import check_targets, sample_targets, source_descriptor
from .analysis import HorizonCurve, check_n_boot

__all__ = ["horizons", "HORIZON_STOP_REASONS"]

#: Why a target's run ended (``stop_reason`` of a record):
#: ``"budget"``: its next length was not crammed within ``steps_per_length`` updates;
#: ``"patience"``: the protocol's patience ran out at that length;
#: ``"max_steps"``: the total cap was reached (the horizon is then a lower bound);
#: ``"max_length"``: every length up to ``max_length`` was crammed (a lower bound too).
HORIZON_STOP_REASONS = ("budget", "patience", "max_steps", "max_length")

_TAG_HORIZON = 7  # seed domain of the horizon runs' initialisations (not the per-length runs')


# --------------------------------------------------------------------------------------------
# Parametrisations of the memory vectors
# --------------------------------------------------------------------------------------------


class _Param:
    """``P = base + Q A`` (or ``P = Q`` for ``"full"``): the map from optimised Q to memory P."""

    def __init__(self, kind: str, P0: torch.Tensor, mu, sd, emb, vocab: int, rank: int):
        self.kind = kind
        if kind == "full":
            self.A = None
            self.base = None
            self.Q0 = P0.clone()
        elif kind == "whitened":
            self.base, self.scale = mu, torch.where(sd > 0, sd, torch.ones_like(sd))
            self.Q0 = (P0 - mu) / self.scale
        else:  # lowrank: the top principal directions of the embedding rows
            n = min(vocab, 8192)
            rng = np.random.default_rng(0)
            ids = torch.as_tensor(np.sort(rng.choice(vocab, size=n, replace=False)),
                                  device=P0.device)
            E = embed_rows(emb, ids, chunk=n).float()
            _, _, Vh = torch.linalg.svd(E - E.mean(0), full_matrices=False)
            r = min(rank, Vh.shape[0])
            self.A = Vh[:r].contiguous()  # (r, d)
            self.base = P0.clone()
            self.Q0 = torch.zeros(P0.shape[0], P0.shape[1], r, dtype=P0.dtype, device=P0.device)

    def memory(self, Q: torch.Tensor, rows) -> torch.Tensor:
        if self.kind == "full":
            return Q
        if self.kind == "whitened":
            return self.base + self.scale * Q
        return self.base[rows] + Q @ self.A


# --------------------------------------------------------------------------------------------
# The state of one batch (all rows kept; finished rows are masked out), saved as a checkpoint
# --------------------------------------------------------------------------------------------


_STATE_TENSORS = ("Q", "m1", "m2", "ta", "k", "h", "t_len", "t_total", "best_acc", "last_rise",
                  "best_loss", "best_Q", "since_best", "lr_scale", "done", "cpu_s", "P_h",
                  "last_acc", "last_loss")


def _new_state(Q0: torch.Tensor, P0: torch.Tensor) -> dict:
    B = Q0.shape[0]
    dev = Q0.device
    z = dict(dtype=torch.long, device=dev)
    f = dict(dtype=torch.float64, device=dev)
    return {
        "Q": Q0.clone(), "m1": torch.zeros_like(Q0), "m2": torch.zeros_like(Q0),
        "ta": torch.zeros(B, **z),  # Adam updates since its moments were last cleared
        "k": torch.ones(B, **z),  # the length being crammed
        "h": torch.zeros(B, **z),  # the longest length crammed so far
        "t_len": torch.zeros(B, **z), "t_total": torch.zeros(B, **z),
        "best_acc": torch.zeros(B, **f), "last_rise": torch.zeros(B, **z),
        "best_loss": torch.full((B,), math.inf, **f), "best_Q": Q0.clone(),
        "since_best": torch.zeros(B, **z), "lr_scale": torch.ones(B, **f),
        "done": torch.zeros(B, dtype=torch.bool, device=dev), "cpu_s": torch.zeros(B, **f),
        "P_h": P0.clone(), "last_acc": torch.zeros(B, **f), "last_loss": torch.zeros(B, **f),
        "lengths_steps": [[] for _ in range(B)],  # per row: [length, updates spent] per attempt
        "reason": [""] * B, "step": 0,
    }


def _save_checkpoint(path: Path, state: dict, shash: str) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"settings_hash": shash, "state": state}, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, shash: str):
    if not path.exists():
        return None
    try:
        ck = torch.load(path, weights_only=True)  # tensors, lists, str: no pickle
    except Exception:  # a torn checkpoint: start the batch again
        return None
    if ck.get("settings_hash") != shash:
        return None
    return ck["state"]


# --------------------------------------------------------------------------------------------
# The learning rate, and one batched Adam/AdamW update with per-row state
# --------------------------------------------------------------------------------------------


def _lr(proto: CramProtocol, t_total, t_len, lr_scale, budget: int) -> torch.Tensor:
    """Per-row learning rate, float64 (b,)."""
    lr = proto.lr * lr_scale
    if proto.warmup:
        lr = lr * torch.clamp((t_total.double() + 1) / proto.warmup, max=1.0)
    if proto.schedule == "cosine":
        frac = torch.clamp(t_len.double() / budget, max=1.0)
        floor = proto.lr_floor
        lr = lr * (floor + (1 - floor) * 0.5 * (1 + torch.cos(math.pi * frac)))
    return lr


def _adam_update(proto: CramProtocol, Q, g, m1, m2, ta, lr):
    """Rows of Q after one Adam (AdamW with weight decay) update; returns (Q, m1, m2).

    The formulas of ``torch.optim.Adam`` / ``AdamW`` (decoupled decay ``Q (1 - lr wd)``),
    with a per-row step count ``ta`` (bias corrections) and per-row ``lr``.
    """
    b1, b2 = proto.betas
    shape = (-1,) + (1,) * (Q.dim() - 1)
    lr_t = lr.to(Q.dtype).reshape(shape)
    if proto.weight_decay:
        Q = Q * (1 - lr_t * proto.weight_decay)
    m1 = m1 * b1 + g * (1 - b1)
    m2 = m2 * b2 + g * g * (1 - b2)
    bc1 = (1 - b1 ** (ta.double() + 1)).to(Q.dtype).reshape(shape)
    bc2 = (1 - b2 ** (ta.double() + 1)).to(Q.dtype).reshape(shape)
    Q = Q - lr_t * (m1 / bc1) / ((m2 / bc2).sqrt() + 1e-8)
    return Q, m1, m2


# --------------------------------------------------------------------------------------------
# One batch
# --------------------------------------------------------------------------------------------


@dataclass
class _Setup:
    hf: torch.nn.Module
    emb: torch.nn.Module
    start: int | None
    mdtype: torch.dtype
    dev: torch.device
    proto: CramProtocol
    steps_per_length: int
    max_steps: int
    n_mem: int
    precision: str
    warm_start: bool
    mu: torch.Tensor
    sd: torch.Tensor
    vocab: int
    init_scale: float


def _init_rows(su: _Setup, seeds: list) -> torch.Tensor:
    d = int(su.mu.shape[0])
    z = np.stack([np.random.default_rng(s).standard_normal((su.n_mem, d)).astype(np.float32)
                  for s in seeds])
    return su.mu + su.init_scale * su.sd * torch.as_tensor(z, device=su.dev)


def _forward(su: _Setup, param: _Param, Q, rows, T, te, k):
    """Per-token cross-entropy (b, K) with grad, the argmax hits (b, K), K."""
    K = int(k.max())
    P = param.memory(Q, rows)
    x = torch.cat([prefix(P, su.emb, su.start, su.mdtype), te[rows, : K - 1]], dim=1)
    logits = _model_forward(su.hf, x, K, su.precision)
    Tk = T[rows, :K]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), Tk, reduction="none")
    with torch.no_grad():
        hits = logits.argmax(-1) == Tk
    return ce, hits, K


def _confirm_float32(su: _Setup, param: _Param, Q, rows, T, te, k):
    """Leading-right counts (b,) of a float32 forward (bf16 stops are confirmed in float32)."""
    with torch.no_grad():
        low = su.precision
        su.precision = "float32"
        try:
            _, hits, _ = _forward(su, param, Q, rows, T, te, k)
        finally:
            su.precision = low
    return hits.long().cumprod(1).sum(1)


def _embed_targets(su: _Setup, T: torch.Tensor) -> torch.Tensor:
    """Input embeddings (B, n-1, d) of the targets' tokens but the last, in the model dtype."""
    B, n_max = T.shape
    with torch.no_grad():
        return su.emb(T[:, :-1]).to(su.mdtype) if n_max > 1 else \
            torch.zeros(B, 0, su.mu.shape[0], dtype=su.mdtype, device=su.dev)


def _leading_right(su: _Setup, param: _Param, Q, rows, T, te, k, hits) -> torch.Tensor:
    """Leading tokens right (b,), within the window K, from the training forward's ``hits``;
    under bf16 a row that reached its length is confirmed by a float32 forward."""
    lead = hits.long().cumprod(1).sum(1)
    if su.precision != "float32" and bool((lead >= k).any()):
        grow_cand = lead >= k
        lead32 = _confirm_float32(su, param, Q.detach(), rows, T, te, k)
        lead = torch.where(grow_cand, lead32, lead)
    return lead


def _record_length(S: dict, i: int, c: int, P_row: torch.Tensor) -> None:
    """Row i crammed every length up to ``c`` with memory ``P_row``: log the attempt, keep the
    vector as its horizon's, and move it on to length ``c + 1`` with a fresh length budget."""
    S["lengths_steps"][i].append([int(S["k"][i]), int(S["t_len"][i])])
    S["h"][i] = c
    S["P_h"][i] = P_row
    S["k"][i] = c + 1
    S["t_len"][i] = 0
    S["best_acc"][i] = 0.0
    S["last_rise"][i] = 0


def _grow_adam_row(su: _Setup, S: dict, param: _Param, Q, rows, r: int, lead: int,
                   n_max: int) -> None:
    """Row ``r`` of the step (batch row ``rows[r]``) crammed its length: record it, grow it to
    its next length (warm: past every leading-right token; cold: by one, from the
    initialisation), reset its Adam state as the protocol says, and stop it at ``n_max``."""
    proto = su.proto
    i = int(rows[r])
    # warm: every length up to the leading-right count is crammed by this vector;
    # cold (the per-length protocol): exactly this length, the next starts afresh
    c = lead if su.warm_start else int(S["k"][i])
    _record_length(S, i, c, param.memory(Q.detach()[r : r + 1], rows[r : r + 1])[0])
    S["best_loss"][i] = math.inf
    S["since_best"][i] = 0
    S["best_Q"][i] = Q.detach()[r]
    if proto.reset_on_grow:
        S["m1"][i] = 0
        S["m2"][i] = 0
        S["ta"][i] = 0
    if not su.warm_start:  # a fresh start at every length (the per-length runs)
        S["Q"][i] = param.Q0[i]
        S["m1"][i] = 0
        S["m2"][i] = 0
        S["ta"][i] = 0
        S["lr_scale"][i] = 1.0
    if c >= n_max:
        S["done"][i] = True
        S["reason"][i] = "max_length"


def _length_means(su: _Setup, ce_tok, hits, k, K: int):
    """Each row's mean cross-entropy (b,) (with grad) and token accuracy (b,) over its own
    first ``k`` positions of a forward of window K."""
    pos = torch.arange(K, device=su.dev)
    mask = (pos[None, :] < k[:, None]).to(ce_tok.dtype)
    ce = (ce_tok * mask).sum(1) / k.to(ce_tok.dtype)
    with torch.no_grad():
        acc = (hits.to(ce_tok.dtype) * mask).sum(1) / k.to(ce_tok.dtype)
    return ce, acc


def _note_progress(S: dict, i: int, acc: float, loss: float) -> None:
    """Row i's accuracy and loss at its current length; a new best accuracy marks a rise
    (for patience)."""
    S["last_acc"][i] = acc
    S["last_loss"][i] = loss
    if acc > float(S["best_acc"][i]):
        S["best_acc"][i] = acc
        S["last_rise"][i] = int(S["t_len"][i])


def _stop_reason(su: _Setup, S: dict, i: int) -> str | None:
    """Why row i's current length has failed (its budget, the protocol's patience, the total
    cap), or None while it may go on."""
    if int(S["t_len"][i]) >= su.steps_per_length:
        return "budget"
    if su.proto.patience is not None and \
            int(S["t_len"][i]) - int(S["last_rise"][i]) >= su.proto.patience:
        return "patience"
    if int(S["t_total"][i]) >= su.max_steps:
        return "max_steps"
    return None


def _fail_length(S: dict, i: int, reason: str) -> None:
    """Row i failed its current length: log the attempt and stop the row."""
    S["lengths_steps"][i].append([int(S["k"][i]), int(S["t_len"][i])])
    S["done"][i] = True
    S["reason"][i] = reason


def _judge_adam_row(su: _Setup, S: dict, i: int, acc: float, loss: float, Q_row) -> bool:
    """Record row i's accuracy, loss and lowest-loss vector ``Q_row``; True if its length has
    failed (the row is then stopped)."""
    _note_progress(S, i, acc, loss)
    if loss < float(S["best_loss"][i]):
        S["best_loss"][i] = loss
        S["best_Q"][i] = Q_row
        S["since_best"][i] = 0
    fail = _stop_reason(su, S, i)
    if fail is not None:
        _fail_length(S, i, fail)
    return fail is not None


def _adam_step(su: _Setup, S: dict, Q, rows, ce, update) -> None:
    """One Adam update of the step's rows where ``update`` (b,) holds, from the gradient of
    their summed losses ``ce`` (b,); then the protocol's restarts."""
    proto = su.proto
    sel = update.nonzero()[:, 0]
    (g,) = torch.autograd.grad(ce[sel].sum(), Q)
    with torch.no_grad():
        ri = rows[sel]
        lr = _lr(proto, S["t_total"][ri], S["t_len"][ri], S["lr_scale"][ri], su.steps_per_length)
        Qn, m1, m2 = _adam_update(proto, Q.detach()[sel], g[sel], S["m1"][ri],
                                  S["m2"][ri], S["ta"][ri], lr)
        S["Q"][ri], S["m1"][ri], S["m2"][ri] = Qn, m1, m2
        S["ta"][ri] += 1
        S["t_len"][ri] += 1
        S["t_total"][ri] += 1
        S["since_best"][ri] += 1
        if proto.restart_after is not None:
            _restart_rows(proto, S, ri)


def _restart_rows(proto: CramProtocol, S: dict, ri) -> None:
    """Rows of ``ri`` without a new lowest loss for ``restart_after`` updates go back to their
    lowest-loss vector, with cleared moments and their lr scaled by ``restart_lr_factor``."""
    for i in ri[S["since_best"][ri] >= proto.restart_after].tolist():
        S["Q"][i] = S["best_Q"][i]
        S["m1"][i] = 0
        S["m2"][i] = 0
        S["ta"][i] = 0
        S["since_best"][i] = 0
        S["lr_scale"][i] *= proto.restart_lr_factor


def _end_step(S: dict, rows, t0: float, bar, ckpt: Path | None, shash: str,
              checkpoint_every: int) -> None:
    """Close a batch step: share its CPU time among its rows, count it, update the bar, and
    save the checkpoint every ``checkpoint_every`` steps."""
    dt = time.process_time() - t0
    S["cpu_s"][rows] += dt / len(rows)  # the step's CPU time, shared by the rows in it
    S["step"] += 1
    if bar is not None:
        bar.update(1)
        bar.set_postfix(running=int((~S["done"]).sum()),
                        horizon=f"{float(S['h'].double().mean()):.1f}")
    if ckpt is not None and S["step"] % checkpoint_every == 0:
        _save_checkpoint(ckpt, S, shash)


def _run_adam_batch(su: _Setup, T: torch.Tensor, seeds: list, state, *, ckpt: Path | None,
                    shash: str, checkpoint_every: int, bar):
    """Progressive cramming of one batch with the Adam family; fills and returns ``state``.

    Each step is one forward of the running rows: it grows the rows that crammed their length,
    judges the others at theirs, and updates those still running within the window."""
    B, n_max = T.shape
    te = _embed_targets(su, T)
    P0 = _init_rows(su, seeds)
    param = _Param(su.proto.parametrisation, P0, su.mu, su.sd, su.emb, su.vocab, su.proto.rank)
    S = _new_state(param.Q0, P0) if state is None else state
    while not bool(S["done"].all()):
        t0 = time.process_time()
        rows = (~S["done"]).nonzero()[:, 0]
        Q = S["Q"][rows].detach().requires_grad_(True)
        k = S["k"][rows]
        ce_tok, hits, K = _forward(su, param, Q, rows, T, te, k)
        with torch.no_grad():
            lead = _leading_right(su, param, Q, rows, T, te, k, hits)
            grew = lead >= k
            for r in grew.nonzero()[:, 0].tolist():
                _grow_adam_row(su, S, param, Q, rows, r, int(lead[r]), n_max)
        # the loss of every row at its (possibly new) length, from the same forward
        k_new = S["k"][rows]
        ce, acc = _length_means(su, ce_tok, hits, k_new, K)
        with torch.no_grad():
            # a row whose new length lies past this window, or that restarted cold, has no
            # loss here: it takes no update this step
            update = ~S["done"][rows] & (k_new <= K) & (su.warm_start | ~grew)
            for r in (~grew & ~S["done"][rows]).nonzero()[:, 0].tolist():
                if _judge_adam_row(su, S, int(rows[r]), float(acc[r]), float(ce[r]),
                                   Q.detach()[r]):
                    update[r] = False
        if bool(update.any()):
            _adam_step(su, S, Q, rows, ce, update)
        _end_step(S, rows, t0, bar, ckpt, shash, checkpoint_every)
    return S


#: ``max_eval`` of one L-BFGS iteration (``torch.optim.LBFGS(max_iter=1)``): the iteration then
#: spends at most ``max_eval + 1`` closure evaluations, the gradient at the current point and
#: at most ``max_eval`` trial points of the strong-Wolfe line search (torch passes it
#: ``max_ls = max_eval - 1`` and the search evaluates one point before counting). torch's
#: default, ``max_iter * 5 // 4 = 1``, leaves the search ``max_ls = 0``: it returns the step
#: ``t = 0`` whenever its first trial point fails the Armijo condition, and as a zero step
#: changes neither the point nor the curvature pairs, every later iteration repeats it and the
#: memory vectors never move. On the tests' tiny Llama the first trial (``t = lr min(1,
#: 1/|g|_1)``, about 0.02) raised the loss from 3.80 to 3.96, and 30 updates left it at 3.80
#: exactly: the preset crammed nothing. 25 trial points is torch's own line-search default.
_LBFGS_MAX_EVAL = 25


class _LbfgsRow:
    """One target's L-BFGS run: its vector ``q`` (1, m, d), the optimiser (new at every
    length), and the closure evaluations of the last iteration (each counts as one update)."""

    def __init__(self, su: _Setup, param: _Param, S: dict, i: int, T, te):
        self.su, self.param, self.S, self.i, self.T, self.te = su, param, S, i, T, te
        self.rows = torch.tensor([i], device=su.dev)
        self.q = S["Q"][i : i + 1].clone().requires_grad_(True)
        self.new_optimiser()
        self.evals = 0

    def new_optimiser(self) -> None:
        """A fresh ``torch.optim.LBFGS`` (no curvature pairs) over ``q``."""
        self.opt = torch.optim.LBFGS([self.q], lr=self.su.proto.lr,
                                     history_size=self.su.proto.lbfgs_history, max_iter=1,
                                     line_search_fn="strong_wolfe")

    def forward(self):
        """Per-token cross-entropy (1, K), argmax hits (1, K) and K at the row's length."""
        return _forward(self.su, self.param, self.q, self.rows, self.T, self.te,
                        self.S["k"][self.rows])

    def closure(self):
        """The mean cross-entropy over the row's length, with its gradient in ``q``."""
        self.opt.zero_grad()
        ce_tok, _, K = self.forward()
        loss = ce_tok[0, : int(self.S["k"][self.i])].mean()
        loss.backward()
        self.evals += 1
        return loss

    def iterate(self, bar) -> None:
        """One L-BFGS iteration, its line search held to the evaluations the length's budget
        and the total cap leave; the evaluations are counted as updates."""
        su, S, i = self.su, self.S, self.i
        self.evals = 0
        left = min(su.steps_per_length - int(S["t_len"][i]), su.max_steps - int(S["t_total"][i]))
        self.opt.param_groups[0]["max_eval"] = max(1, min(_LBFGS_MAX_EVAL, left - 1))
        self.opt.step(self.closure)
        S["t_len"][i] += self.evals
        S["t_total"][i] += self.evals
        if not bool(torch.isfinite(self.q).all()):
            raise FloatingPointError("horizons: L-BFGS produced non-finite memory vectors")
        if bar is not None:
            bar.update(self.evals)


def _run_lbfgs_row(su: _Setup, param: _Param, S: dict, i: int, T, te, n_max: int, bar) -> None:
    """Progressive cramming of batch row i with L-BFGS until it stops; fills ``S``."""
    row = _LbfgsRow(su, param, S, i, T, te)
    while True:
        with torch.no_grad():
            ce_tok, hits, K = row.forward()
        lead = int(hits.long().cumprod(1).sum(1)[0])
        k = int(S["k"][i])
        if lead >= k:
            c = lead if su.warm_start else k
            _record_length(S, i, c, row.q.detach()[0])
            if not su.warm_start:
                with torch.no_grad():
                    row.q.copy_(param.Q0[i : i + 1])
            row.new_optimiser()
            if c >= n_max:
                S["done"][i], S["reason"][i] = True, "max_length"
                break
            continue
        _note_progress(S, i, float(hits[0, :k].double().mean()), float(ce_tok[0, :k].mean()))
        fail = _stop_reason(su, S, i)
        if fail is not None:
            _fail_length(S, i, fail)
            break
        row.iterate(bar)
    S["Q"][i] = row.q.detach()[0]


def _run_lbfgs_batch(su: _Setup, T: torch.Tensor, seeds: list, state, *, bar, **_):
    """Progressive cramming with ``torch.optim.LBFGS``, one target at a time (its line search
    is per problem); every closure evaluation (forward + backward) counts as one update.

    Each ``opt.step`` is one L-BFGS iteration whose line search may try up to
    :data:`_LBFGS_MAX_EVAL` points, fewer where the length's budget or the total cap has fewer
    evaluations left: the budgets hold, except that an iteration needs two evaluations (the
    gradient and one trial point), so with one left it overshoots by one."""
    B, n_max = T.shape
    te = _embed_targets(su, T)
    P0 = _init_rows(su, seeds)
    param = _Param("full", P0, su.mu, su.sd, su.emb, su.vocab, 1)
    S = _new_state(param.Q0, P0) if state is None else state
    for i in range(B):
        if bool(S["done"][i]):
            continue
        t0 = time.process_time()
        _run_lbfgs_row(su, param, S, i, T, te, n_max, bar)
        S["cpu_s"][i] += time.process_time() - t0
    return S


# --------------------------------------------------------------------------------------------
# The records, the file, and the public function
# --------------------------------------------------------------------------------------------


def _read_records(path) -> dict:
    """Trusted finished targets in a horizons JSONL file, keyed by (settings_hash,
    target_index); a bad line (:func:`_horizon_problem`) is skipped, its target runs again,
    and it is warned about (:class:`~embgeom.cramming._curve.ResumeRecordWarning`) by
    ``warn_untrusted()`` when there is work to do and no trusted record supersedes it."""
    return _read_jsonl(path, key=lambda r: (r.get("settings_hash"), r.get("target_index")),
                       check=_horizon_problem)


def _horizon_problem(r: dict) -> str | None:
    """Why a horizon record cannot be trusted (a key missing, a wrong type, a value out of
    range or against its own settings), or None."""
    if r.get("kind") != "horizon":
        return "kind is not 'horizon'"
    for k, low in (("target_index", 0), ("n_mem", 1), ("horizon", 0), ("steps", 0)):
        if k not in r:
            return f"no {k!r}"
        if not _is_int(r[k], low):
            return f"{k} = {r[k]!r} is not an int >= {low}"
    if not isinstance(r.get("censored"), bool):
        return "censored is missing or not true/false"
    if r.get("stop_reason") not in HORIZON_STOP_REASONS:
        return f"stop_reason = {r.get('stop_reason')!r} is not one of {HORIZON_STOP_REASONS}"
    if r["censored"] != (r["stop_reason"] in ("max_length", "max_steps")):
        return f"censored = {r['censored']} does not match stop_reason {r['stop_reason']!r}"
    pairs = r.get("lengths_steps")
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and _is_int(p[0], 1) and _is_int(p[1], 0)
            for p in pairs):
        return "lengths_steps is not a list of [length >= 1, updates >= 0] pairs"
    if not isinstance(r.get("generation_ok"), (bool, type(None))):
        return "generation_ok is not true/false/null"
    problem = _settings_problem(r)
    if problem is not None:
        return problem
    st = r["settings"]
    if not _is_int(st.get("max_length"), 1) or st.get("n_mem") != r["n_mem"]:
        return "settings' max_length or n_mem do not fit the record"
    if r["horizon"] > st["max_length"]:
        return f"horizon = {r['horizon']} > max_length = {st['max_length']}"
    return None


def _targets_descriptor(T: np.ndarray) -> str:
    return "given:" + hashlib.sha256(np.ascontiguousarray(T, np.int64).tobytes()).hexdigest()[:16]


def horizons(
    model,
    n_mem: int,
    *,
    n_targets: int = 16,
    max_length: int = 64,
    target_source="random-tokens",
    targets=None,
    protocol=DEFAULT_PROTOCOL,
    steps_per_length: int = 500,
    max_steps: int | None = None,
    seed=0,
    start_token="auto",
    batch_size: int = 16,
    warm_start: bool = True,
    init_scale: float = 1.0,
    precision: str = "float32",
    jsonl=None,
    checkpoint_every: int = 25,
    check_generation: bool = True,
    n_boot: int = 1000,
    device=None,
    progress: bool = False,
    max_batches: int | None = None,
) -> HorizonCurve:
    """Each target's horizon (longest crammable prefix) by progressive cramming.

    Target j's memory vectors start at the embedding scale (as :func:`cram`, from
    ``seed_sequence(seed, 7, n_mem, j)``), are optimised on ``x_1`` until it is the argmax,
    then on ``x_1 x_2`` from there, and so on (``warm_start``): a length fails when
    ``steps_per_length`` updates (or the protocol's patience) pass without 100% teacher-forced
    token accuracy, and the target's horizon is the last length crammed. The paper's success
    criterion (100% teacher-forced accuracy) is judged by the training forward itself (float32;
    under ``"bf16-autocast"`` or ``"bf16-linear"`` a success is confirmed by a float32 forward).

    Parameters
    ----------
    model : embgeom.adapters.LoadedModel or transformers PreTrainedModel
        A causal LM that accepts ``inputs_embeds``; frozen and in eval mode for the run
        (restored afterwards).
    n_mem : int
        Memory vectors m per target (>= 1).
    n_targets : int, default 16
        Targets drawn with :func:`sample_targets` (ignored when ``targets`` is given).
    max_length : int, default 64
        The longest prefix tried (tokens); a target crammed up to it has a censored horizon
        (``stop_reason`` ``"max_length"``).
    target_source : {"random-tokens", "words", "wordlist"} or list of str
        As :func:`sample_targets`; recorded in every record.
    targets : array_like of int, shape (B, n), optional
        Explicit targets (then ``max_length = n``); 2-D only (one target is ``[target]``).
    protocol : str or CramProtocol, default :data:`DEFAULT_PROTOCOL`
        The optimiser (:data:`embgeom.cramming.PROTOCOLS` lists the presets and their sources).
    steps_per_length : int, default 500
        Updates allowed for each new length (>= 1).
    max_steps : int, optional
        Cap on a target's updates over the whole run (default: no cap).
    seed : int or SeedSequence, default 0
        Seeds the targets (as :func:`sample_targets`) and the initialisations.
    start_token : "auto", int or None
        As :func:`cram` (BOS before the memory vectors by default).
    batch_size : int, default 16
        Targets per batch (fixed by target order: a rerun forms the same batches).
    warm_start : bool, default True
        False: restart from the initialisation at every length (each length then runs as a
        fresh per-length run of the same budget: the check against per-length curves).
    init_scale : float, default 1.0
        Finite and > 0 (as :func:`cram`).
    precision : {"float32", "bf16-autocast", "bf16-linear"}, default "float32"
        The model forward of the optimisation steps (as :func:`cram`); every success is
        confirmed by a float32 forward before the target grows.
    jsonl : path, optional
        One JSON line per finished target; a rerun with the same settings skips those and
        resumes a cut batch from ``<jsonl>.ckpt/batch_<b>.pt``.
    checkpoint_every : int, default 25
        Batch updates between checkpoints (with ``jsonl``).
    check_generation : bool, default True
        Also check that greedy generation from the horizon's memory vectors alone reproduces
        the first h tokens (``generation_ok`` per record).
    n_boot : int, default 1000
        Bootstrap resamples of the n50 interval: 0 (no interval: its bounds are None) or at
        least :data:`embgeom.cramming.analysis.MIN_BOOT` (100).
    device : str or torch.device, optional
    progress : bool, default False
        tqdm bar over batch updates.
    max_batches : int, optional
        Run at most this many new batches (>= 1), then return what the file holds (for
        time-boxed sessions); None: all.

    Returns
    -------
    HorizonCurve
        The per-target horizons, ``accessibility(n) = P(h >= n)`` with Wilson intervals, and
        ``n50`` (the median horizon, tokens) with a bootstrap interval; ``records`` holds the
        per-target records (steps per length, CPU-seconds, stop reason); ``memory`` maps
        the index of each target run by this call to its horizon's memory vectors (float32
        (m, d): they cram its first h tokens), and ``targets`` holds the targets (int64
        (B, max_length)).

    Raises
    ------
    TypeError, ValueError
        Bad model, targets, protocol or budgets, a ``jsonl`` that is a folder or lies below
        a file (checked before any work).
    FloatingPointError
        The optimisation diverged.

    Warns
    -----
    embgeom.cramming.ResumeRecordWarning
        A line of ``jsonl`` that is not a trusted horizon record (not JSON, a key missing, a
        field of the wrong type, a horizon above its ``max_length``, negative steps, settings
        that do not hash to its ``settings_hash``): named by file and line number, its target
        run again. Warned about when there are batches to run, and not at all once a trusted
        record of the line's target follows it (the resume that warned appended one): the line
        stays in the file, ignored. A last line cut short by an interrupted write is removed
        without a warning.
    """
    _check_jsonl(jsonl, checkpoints=True)
    (n_mem, steps_per_length, max_steps, batch_size, checkpoint_every, n_boot, max_batches,
     proto, init_scale) = _check_arguments(
        n_mem=n_mem, steps_per_length=steps_per_length, max_steps=max_steps,
        batch_size=batch_size, checkpoint_every=checkpoint_every, n_boot=n_boot,
        max_batches=max_batches, warm_start=warm_start, check_generation=check_generation,
        progress=progress, precision=precision, protocol=protocol, init_scale=init_scale)
    hf, tok, name, _ = unwrap(model)
    emb = input_embeddings(hf)
    vocab = vocab_rows(hf)
    start = resolve_start_token(hf, tok, start_token, vocab)
    T_np, source = _horizon_targets(model, hf, vocab, start, n_mem, targets=targets,
                                    max_length=max_length, n_targets=n_targets,
                                    target_source=target_source, seed=seed)
    B_all, n_max = T_np.shape
    device = check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = model_device_dtype(hf)
    settings = _horizon_settings(
        hf, name, mdtype, start=start, n_mem=n_mem, proto=proto,
        steps_per_length=steps_per_length, max_steps=max_steps, seed=seed, source=source,
        n_max=n_max, batch_size=batch_size, warm_start=warm_start, init_scale=init_scale,
        precision=precision)
    shash = _settings_hash(settings)
    done = _read_records(jsonl)
    if jsonl is not None:
        Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
    batches, todo = _batches_to_run(B_all, batch_size, shash, done, max_batches)
    if todo:
        done.warn_untrusted()
    memory: dict = {}
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"horizons m={n_mem} {proto.name}", unit="step", leave=False,
                   **tqdm_kwargs(progress))
    try:
        with frozen(hf):
            mu, sd = _embedding_stats(emb, vocab)
            su = _Setup(hf, emb, start, mdtype, dev, proto, steps_per_length,
                        max_steps if max_steps is not None else 2**62, n_mem,
                        precision, bool(warm_start), mu, sd, vocab,
                        float(init_scale))
            for b in todo:
                memory.update(_run_batch(su, b, batches[b], T_np, seed, jsonl, shash, settings,
                                         done, checkpoint_every=checkpoint_every,
                                         check_generation=check_generation, bar=bar))
    finally:
        if bar is not None:
            bar.close()
    recs = [done[(shash, j)] for j in range(B_all) if (shash, j) in done]
    curve = HorizonCurve.from_records(recs, n_mem=n_mem, max_length=int(n_max),
                                      n_targets=B_all, settings=settings, n_boot=n_boot,
                                      seed=seed if isinstance(seed, int) else 0)
    curve.memory = memory
    curve.targets = T_np
    return curve


def _check_arguments(*, n_mem, steps_per_length, max_steps, batch_size, checkpoint_every, n_boot,
                     max_batches, warm_start, check_generation, progress, precision, protocol,
                     init_scale):
    """:func:`horizons`' counts, flags, precision, protocol and init scale, checked in that
    order; returns ``(n_mem, steps_per_length, max_steps, batch_size, checkpoint_every, n_boot,
    max_batches, proto, init_scale)`` as ints (None kept), a CramProtocol and a float."""
    n_mem = check_positive_int(n_mem, "n_mem")
    steps_per_length = check_positive_int(steps_per_length, "steps_per_length")
    max_steps = None if max_steps is None else check_positive_int(max_steps, "max_steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    checkpoint_every = check_positive_int(checkpoint_every, "checkpoint_every")
    n_boot = check_n_boot(n_boot)
    if max_batches is not None:
        max_batches = check_positive_int(max_batches, "max_batches", minimum=0)
        if max_batches == 0:  # would run nothing: an empty curve, or the file's records only
            raise ValueError("max_batches: expected a positive int (batches to run) or None "
                             "(all), got 0")
    for flag, name in ((warm_start, "warm_start"), (check_generation, "check_generation"),
                       (progress, "progress")):
        check_bool(flag, name)
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    proto = get_protocol(protocol)
    init_scale = check_positive(init_scale, "init_scale")
    return (n_mem, steps_per_length, max_steps, batch_size, checkpoint_every, n_boot, max_batches,
            proto, init_scale)


def _horizon_targets(model, hf, vocab: int, start, n_mem: int, *, targets, max_length,
                     n_targets, target_source, seed):
    """The targets (B, n) (given, or drawn by :func:`sample_targets`) and their descriptor for
    the settings; checks that start token + memory + target fit the model's positions (before
    the targets are drawn: a huge ``max_length`` is refused before it costs time and memory)."""

    def fit(n_max: int) -> None:
        check_positions(hf, (start is not None) + n_mem + n_max - 1,
                        "targets" if targets is not None else "max_length",
                        f"{int(start is not None)} start token + {n_mem} memory vectors + a "
                        f"{n_max}-token target")

    if targets is not None:
        T_np = check_targets(targets, vocab)  # refuses ragged rows, bad ids and ndim > 2
        if np.ndim(targets) == 1:  # check_targets reads 1-D as one target (as cram does): not here
            raise ValueError(f"targets: expected a (B, n) array of token ids (one row per "
                             f"target), got a 1-D array of {T_np.shape[1]} ids; pass "
                             "[targets] for one target")
        fit(T_np.shape[1])
        source = _targets_descriptor(T_np)
    else:
        max_length = check_positive_int(max_length, "max_length")
        n_targets = check_positive_int(n_targets, "n_targets")
        fit(max_length)
        T_np = sample_targets(model, max_length, n_targets, target_source=target_source,
                              seed=seed)
        source = source_descriptor(target_source)
    return T_np, source


def _horizon_settings(hf, name, mdtype, *, start, n_mem, proto, steps_per_length, max_steps,
                      seed, source, n_max, batch_size, warm_start, init_scale,
                      precision) -> dict:
    """The settings of a horizons run, as hashed into ``settings_hash`` and stored in every
    record (their keys, order and values are part of the resume format: do not change)."""
    return {
        "kind": "horizons", "model": _model_fingerprint(hf, name),
        "dtype": dtype_name(mdtype), "start_token": start, "n_mem": n_mem,
        "protocol": proto.to_dict(), "steps_per_length": steps_per_length,
        "max_steps": max_steps, "seed": seed if isinstance(seed, int) else repr(seed),
        "target_source": source, "max_length": int(n_max), "batch_size": batch_size,
        "warm_start": bool(warm_start), "init_scale": float(init_scale), "precision": precision,
    }


def _batches_to_run(B_all: int, batch_size: int, shash: str, done: dict, max_batches):
    """The fixed batches (lists of target indices, in target order) and the indices of those
    with a target not yet in ``done``, at most ``max_batches`` of them."""
    batches = [list(range(s, min(s + batch_size, B_all))) for s in range(0, B_all, batch_size)]
    todo = [b for b, idx in enumerate(batches) if any((shash, j) not in done for j in idx)]
    if max_batches is not None:
        todo = todo[:max_batches]
    return batches, todo


@torch.enable_grad()  # a caller's no_grad (or a Ray worker left in one) must not break the steps
def _run_batch(su: _Setup, b: int, idx: list, T_np, seed, jsonl, shash: str, settings: dict,
               done: dict, *, checkpoint_every: int, check_generation: bool, bar) -> dict:
    """Run batch ``b`` (targets ``idx``), from its checkpoint where one fits; its records go into
    ``done`` and ``jsonl`` (then the checkpoint is removed). Returns each target's horizon
    memory vectors, float32 (m, d), by target index."""
    T = torch.as_tensor(T_np[idx], device=su.dev)
    seeds = [seed_sequence(seed, _TAG_HORIZON, su.n_mem, j) for j in idx]
    ckpt = None
    state = None
    if jsonl is not None:
        ck_dir = Path(str(jsonl) + ".ckpt")
        ck_dir.mkdir(exist_ok=True)
        ckpt = ck_dir / f"batch_{b}.pt"
        state = _load_checkpoint(ckpt, shash)
    t_wall = time.perf_counter()
    run = _run_lbfgs_batch if su.proto.algorithm == "lbfgs" else _run_adam_batch
    S = run(su, T, seeds, state, ckpt=ckpt, shash=shash, checkpoint_every=checkpoint_every,
            bar=bar)
    wall = time.perf_counter() - t_wall
    # the batch ran whole, with its original partners (a resumed run equals the uninterrupted
    # one), but only its targets without a trusted record are recorded: the others already
    # have theirs, and a second line per target would only make the file longer
    write = [(shash, j) not in done for j in idx]
    recs = _records(su, S, idx, T_np[idx], shash, settings, wall, check_generation, su.hf,
                    write=write)
    memory = {j: S["P_h"][r, :su.n_mem].detach().cpu().numpy().copy() for r, j in enumerate(idx)}
    for r in recs:
        done[(shash, r["target_index"])] = r
    if jsonl is not None and recs:
        _append_lines(jsonl, [_json.dumps(r) for r in recs])
        if ckpt is not None and ckpt.exists():
            ckpt.unlink()
    return memory


def _records(su: _Setup, S: dict, idx, T_np, shash, settings, wall, check_generation, hf,
             write=None):
    """The records of the rows of batch ``idx`` for which ``write`` (default: all) is true."""
    h = S["h"].cpu().numpy()
    write = [True] * len(idx) if write is None else list(write)
    gen = [None] * len(idx)
    if check_generation:
        for r in range(len(idx)):
            if h[r] > 0 and write[r]:
                out = greedy_generate(hf, S["P_h"][r : r + 1, : su.n_mem].cpu().numpy(),
                                      int(h[r]), start_token=su.start)
                gen[r] = bool((out[0] == T_np[r, : h[r]]).all())
    recs = []
    for r, j in enumerate(idx):
        if not write[r]:
            continue
        recs.append({
            "settings_hash": shash, "kind": "horizon", "target_index": int(j),
            "n_mem": su.n_mem, "horizon": int(h[r]),
            "censored": S["reason"][r] in ("max_length", "max_steps"),
            "stop_reason": S["reason"][r], "protocol": su.proto.name,
            "target_source": settings["target_source"],
            "steps": int(S["t_total"][r]), "lengths_steps": S["lengths_steps"][r],
            "cpu_s": float(S["cpu_s"][r]), "batch_wall_s": float(wall),
            "accuracy_at_failure": float(S["last_acc"][r]),
            "best_accuracy_at_failure": float(S["best_acc"][r]),
            "loss_at_failure": float(S["last_loss"][r]),
            "memory_norm": float(torch.linalg.vector_norm(S["P_h"][r]).cpu()),
            "generation_ok": gen[r], "settings": settings,
        })
    return recs
