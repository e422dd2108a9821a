"""Forward probing: last-position hidden states and logits of a causal LM, and the once-per-model
check that the adapter's formula ``s * (W h + b)`` gives the model's own logits.

Imports :mod:`._head` only.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import weakref

import numpy as np
import torch

from .._hf import UnsupportedModelError
from .._hf import _module_with_weight
from .._hf import base_model as _base_model
from .._hf import check_positions as _check_positions
from .._hf import config_vocab as _config_vocab
from .._hf import measuring as _measuring
from .._hf import output_embeddings as _output_embeddings
from .._hf import unwrap as _unwrap
from .._validation import check_int_array
from ._head import _architecture, _final_norm_of, _find_final_norm, _logit_scale, _softcap

__all__ = ["hidden_states", "logits"]

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Hidden states and logits
# --------------------------------------------------------------------------------------------


_EXPECTED = ("pass a decoder-only causal language model with an unembedding (an lm_head), e.g. a "
             "transformers *ForCausalLM model, or an embgeom LoadedModel")


def _causal_lm(model, *, head: bool = True):
    """``_hf.unwrap(model)`` after the structural checks every adapter entry point makes.

    Raises
    ------
    embgeom._hf.UnsupportedModelError (a TypeError and a ValueError)
        ``model`` is not a torch module or a wrapper of one, has no ``config`` (a plain
        ``nn.Module``), is an encoder-decoder model (T5, BART), or (with ``head``) has no
        unembedding (a base model, a classifier). Each message starts with ``model:``.
    """
    hf, tokenizer, name, source_dtype = _unwrap(model)
    if getattr(hf, "config", None) is None:
        raise UnsupportedModelError(
            f"model: {type(hf).__name__} has no config, so it is not a Hugging Face model; "
            + _EXPECTED)
    if getattr(hf.config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"model: {_architecture(hf)} is an encoder-decoder model (its last hidden state is "
            "the decoder's, given an encoder input); " + _EXPECTED)
    if head:
        _output_embeddings(hf)  # UnsupportedModelError naming the missing unembedding
    return hf, tokenizer, name, source_dtype


def _id_limit(hf) -> int:
    """Token ids a forward pass can take: below both the input table's and the head's rows (a
    larger id fails inside torch's embedding lookup with an IndexError that names nothing)."""
    n = int(_output_embeddings(hf).weight.shape[0])
    emb = _module_with_weight(hf, "get_input_embeddings")
    if emb is not None:
        n = min(n, int(emb.weight.shape[0]))
    return n


def _check_ids(input_ids, attention_mask, hf) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(ids, mask)`` as tensors, after every check that torch would otherwise fail deep inside:
    integer ids in ``[0, n_rows)`` (negative ids and ids past the embedding table refused), a
    length within the model's maximum position (a learned position table such as GPT-2's fails
    with ``IndexError: index out of range in self``), a 0/1 mask of the same shape."""
    arr = check_int_array(input_ids, "input_ids", ndim=(1, 2), low=0, high=_id_limit(hf))
    if arr.ndim == 1:
        arr = arr[None]
    if arr.shape[1] == 0:
        raise ValueError(f"input_ids: expected a non-empty (batch, length) array, got {arr.shape}")
    _check_positions(hf, int(arr.shape[1]), "input_ids",
                     f"sequences of {arr.shape[1]} tokens, shape {tuple(arr.shape)}")
    ids = torch.from_numpy(arr)
    mask = None
    if attention_mask is not None:
        mask = torch.as_tensor(np.asarray(attention_mask) if not isinstance(attention_mask, torch.Tensor)
                               else attention_mask.detach().cpu())
        if mask.ndim == 1:
            mask = mask.unsqueeze(0)
        if tuple(mask.shape) != tuple(ids.shape):
            raise ValueError(f"attention_mask: expected shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
        mask = mask.to(torch.long)
        if not bool(((mask == 0) | (mask == 1)).all()) or bool((mask.sum(1) == 0).any()):
            raise ValueError("attention_mask: expected 0/1 entries with at least one 1 per row")
    return ids, mask


def _last_index(mask: torch.Tensor | None, length: int, batch: int) -> torch.Tensor:
    """Index of the last attended position of each row (right padding), or ``length - 1``."""
    if mask is None:
        return torch.full((batch,), length - 1, dtype=torch.long)
    return length - 1 - torch.argmax(torch.flip(mask, dims=[1]), dim=1)


def _position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only: ``max(cumsum(mask) - 1, 0)``.

    With left padding the first real token gets position 0, as in the unpadded sequence (what
    ``generate`` passes); models with absolute position embeddings (GPT-2, OPT, XGLM) need it.
    """
    return (mask.cumsum(dim=1) - 1).clamp(min=0)


@functools.lru_cache(maxsize=None)
def _accepts(forward_cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(forward_cls.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def _call_kwargs(module, ids: torch.Tensor, mask: torch.Tensor | None) -> dict:
    kw = {"input_ids": ids, "use_cache": False}
    if mask is not None:
        kw["attention_mask"] = mask
        if _accepts(type(module), "position_ids"):
            kw["position_ids"] = _position_ids(mask)
    return kw


def _base_sequence(hf, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``base_model(...).last_hidden_state`` at every position, (B, L, d)."""
    base = _base_model(hf)
    with _measuring(hf), torch.inference_mode():
        out = base(**_call_kwargs(base, ids, mask))
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _base_last_hidden(hf, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``base_model(...).last_hidden_state`` at each row's last attended position, (B, d)."""
    last = _base_sequence(hf, ids, mask)
    idx = _last_index(mask, ids.shape[1], ids.shape[0])
    return last[torch.arange(ids.shape[0]), idx]


def _own_last_logits(hf, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The model's own forward pass, logits at each row's last attended position, (B, cols)."""
    kw = _call_kwargs(hf, ids, mask)
    keep_last = mask is None or bool(mask[:, -1].all())
    if keep_last and _accepts(type(hf), "logits_to_keep"):
        kw["logits_to_keep"] = 1
    with _measuring(hf), torch.inference_mode():
        z = hf(**kw).logits
        if z.shape[1] == 1:
            return z[:, 0]
        idx = _last_index(mask, ids.shape[1], ids.shape[0])
        return z[torch.arange(ids.shape[0]), idx]


def _by_row(fn, hf, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``fn`` on each row's attended tokens without padding, rows of equal length batched.

    Only for masks that are one contiguous run of ones per row (left or right padding).
    """
    first = torch.argmax(mask, dim=1)
    last = _last_index(mask, ids.shape[1], ids.shape[0])
    counts = mask.sum(dim=1)
    holes = torch.nonzero(counts != last - first + 1).flatten()
    if holes.numel():
        raise ValueError(
            f"attention_mask: {_architecture(hf)} does not give the hidden states of the unpadded "
            "sequences in a padded batch, so each row's mask must be one run of ones (left or "
            f"right padding); row {int(holes[0])} has zeros between ones"
        )
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(counts.tolist()):
        groups.setdefault(n, []).append(i)
    out = None
    for n, rows in groups.items():
        sub = torch.stack([ids[i, int(first[i]):int(first[i]) + n] for i in rows])
        res = fn(hf, sub, None)
        if out is None:
            out = res.new_empty((ids.shape[0],) + tuple(res.shape[1:]))
        out[rows] = res
    return out


@dataclasses.dataclass(frozen=True)
class _Checked:
    """What the probe in :func:`_check_model` established about one model object."""

    key: tuple
    padding_ok: bool  # a padded batch (mask + position ids) reproduces the unpadded rows
    error: str | None  # why the adapter refuses the model, None if it does not
    causal_error: str | None = None  # why the model is not causal (then ``error`` says so too)


_CHECKED: "weakref.WeakKeyDictionary[torch.nn.Module, _Checked]" = weakref.WeakKeyDictionary()
_PROBE_LENGTH, _PROBE_PAD = 6, 3
_CAUSAL_TOL = {False: 1e-6, True: 1e-3}  # relative, for float32 / 16-bit weights


def _model_key(hf) -> tuple:
    """What the check's verdict depends on, and only that: the head module and its weight's
    storage and dtype, the final norm, the configured logit scale and soft-cap, the attention
    implementation (it decides how padded batches behave). A swapped head or norm re-runs the
    check. The training flag is not part of it: the probe runs in eval mode whatever the
    caller's mode (:func:`embgeom._hf.measuring`), so a verdict holds in either mode."""
    out = _output_embeddings(hf)
    norm = _find_final_norm(hf)
    return (id(out), out.weight.data_ptr(), tuple(out.weight.shape), out.weight.dtype, id(norm),
            _logit_scale(hf), _softcap(hf), getattr(hf.config, "_attn_implementation", None))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.to(torch.float64), b.to(torch.float64)
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return float("inf")
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    return 0.0 if diff == 0.0 else diff / max(scale, 1e-30)


def _check_model(hf, *, require: bool = True) -> _Checked:
    """Check, once per model object, that the adapter's formula gives the model's own logits.

    On a fixed probe batch (two rows of :data:`_PROBE_LENGTH` token ids, seeded): (0) the model
    is causal: changing the last token changes no earlier position's hidden state (a
    bidirectional encoder such as BERT fails); (1) the final
    norm's output at the last position is the base model's last hidden state ``h``; (2)
    ``s * (W h + b)``, soft-capped, equals the model's own last-position logits; (3) the same
    rows, one left- and one right-padded by :data:`_PROBE_PAD`, give the same ``h`` through a
    padded batch. (0), (1) and (2) are required: with ``require`` a failure is a ValueError
    naming the architecture. (3) only decides how padded batches are run (batched, or row by row
    without the padding). Tolerance: 1e-3 of the largest magnitude for float32 weights, 3e-2
    for 16-bit weights.
    """
    _causal_lm(hf)  # a TypeError for the wrong kind of model (not an architecture issue)
    try:
        _base_model(hf)
    except TypeError as exc:
        raise ValueError(f"model: {_architecture(hf)} is not supported: {exc}") from None
    key = _model_key(hf)
    hit = _CHECKED.get(hf)
    if hit is None or hit.key != key:
        ids = _probe_ids(hf)
        causal_error = _probe_causal(hf, ids)
        error, h = (causal_error, None) if causal_error else _probe_head(hf, ids)
        hit = _Checked(key=key, padding_ok=_probe_padding(hf, ids, h), error=error,
                       causal_error=causal_error)
        _CHECKED[hf] = hit
    if require and hit.error is not None:
        raise ValueError(hit.error)
    return hit


def _probe_ids(hf) -> torch.Tensor:
    vocab = max(1, min(int(_output_embeddings(hf).weight.shape[0]), _config_vocab(hf)))
    return torch.randint(0, vocab, (2, _PROBE_LENGTH), generator=torch.Generator().manual_seed(0))


def _probe_tol(hf) -> float:
    low_precision = _output_embeddings(hf).weight.dtype in (torch.float16, torch.bfloat16)
    return 3e-2 if low_precision else 1e-3


def _probe_causal(hf, ids: torch.Tensor) -> str | None:
    """Check (0) of :func:`_check_model`: ``None``, or why the model is not causal.

    The last token of each probe row is replaced by another id; a causal model's hidden states
    at the earlier positions do not move (to the probe's tolerance), a bidirectional encoder's
    do. Decided by running the model, not from its class or config (``config.is_decoder`` is
    False for GPT-2 too).
    """
    vocab = min(int(_output_embeddings(hf).weight.shape[0]), _config_vocab(hf))
    if vocab < 2 or ids.shape[1] < 2:
        return None
    other = ids.clone()
    other[:, -1] = (ids[:, -1] + 1) % vocab
    before = _base_sequence(hf, ids, None)[:, :-1]
    after = _base_sequence(hf, other, None)[:, :-1]
    err = _rel_err(after, before)
    # a causal model computes the earlier positions without the last token: the same numbers up
    # to rounding, while a bidirectional encoder moves them by the weight its attention gives
    # the changed token (3e-4 of their scale in a tiny random BERT, far more in a trained one)
    if err <= _CAUSAL_TOL[_probe_tol(hf) > 1e-3]:
        return None
    return (
        f"model: {_architecture(hf)} is not a causal language model: changing the last token "
        f"changes the hidden states of the earlier positions (by {err:.2g} of their scale), as "
        "in a bidirectional encoder (BERT, a masked LM), so a last-position hidden state is not "
        "what the model predicts the next token from; " + _EXPECTED
    )


def _probe_head(hf, ids: torch.Tensor) -> tuple[str | None, torch.Tensor | None]:
    """Checks (1) and (2) of :func:`_check_model` on ``ids``: (``None`` or why the model is
    refused, the last hidden states ``h`` of ``ids`` or ``None`` if they were not computed)."""
    arch = _architecture(hf)
    try:
        _final_norm_of(hf)
    except ValueError as exc:
        return str(exc), None
    out = _output_embeddings(hf)
    n_rows = out.weight.shape[0]
    tol = _probe_tol(hf)
    norm = _find_final_norm(hf)
    seen: list[torch.Tensor] = []
    handle = None
    if norm is not None:
        handle = norm.register_forward_hook(lambda mod, args, res: seen.append(
            (res[0] if isinstance(res, tuple) else res).detach()))
    try:
        h = _base_last_hidden(hf, ids, None)
    finally:
        if handle is not None:
            handle.remove()
    if norm is not None:
        normed = seen[-1][:, -1] if seen and seen[-1].ndim == 3 else None
        if normed is None or normed.shape != h.shape or not _rel_err(h, normed) <= tol:
            return (
                f"model: {arch} is not supported: the output of its final norm "
                f"({type(norm).__name__}) is not the hidden state its head receives (a projection "
                "or another transform sits between them), so the final-norm facts would be wrong"
            ), h
    if out.weight.shape[1] != h.shape[-1]:
        return (
            f"model: {arch} is not supported: its unembedding takes vectors of dimension "
            f"{out.weight.shape[1]} but its last hidden state has {h.shape[-1]} (a projection "
            "between them that the adapter does not model)"
        ), h
    z_own = _own_last_logits(hf, ids, None)
    if z_own.shape != (2, n_rows):
        return (
            f"model: {arch} is not supported: its logits have {z_own.shape[-1]} columns but its "
            f"output projection has {n_rows} rows"
        ), h
    z = h.to(torch.float64) @ out.weight.detach().to(torch.float64).T
    b = getattr(out, "bias", None)
    if isinstance(b, torch.Tensor):
        z = z + b.detach().to(torch.float64)
    scale, cap = _logit_scale(hf), _softcap(hf)
    z = z * scale
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    err = _rel_err(z, z_own)
    if not err <= tol:
        return (
            f"model: {arch} is not supported: s * (W h + b) from its last hidden state (s = "
            f"{scale:g}, soft-cap {cap}) differs from the model's own logits by {err:.2g} of "
            "their scale; the model applies something between the final hidden state and the "
            "unembedding that the adapter does not model (supported: final norm, W, output bias, "
            "logit scale, final-logit soft-cap)"
        ), h
    return None, h


def _probe_padding(hf, ids: torch.Tensor, h: torch.Tensor | None) -> bool:
    """Check (3) of :func:`_check_model`: does a padded batch of ``ids`` reproduce their
    unpadded last hidden states ``h`` (computed here when ``None``)?"""
    pad = torch.zeros((2, _PROBE_PAD), dtype=torch.long)
    one = torch.ones((2, _PROBE_LENGTH), dtype=torch.long)
    padded = torch.cat([torch.cat([pad[:1], ids[:1]], 1), torch.cat([ids[1:], pad[1:]], 1)])
    mask = torch.cat([torch.cat([pad[:1], one[:1]], 1), torch.cat([one[1:], pad[1:]], 1)])
    try:
        if h is None:
            h = _base_last_hidden(hf, ids, None)
        return _rel_err(_base_last_hidden(hf, padded, mask), h) <= _probe_tol(hf)
    except Exception as exc:  # noqa: BLE001 - a model that cannot run a padded batch at all
        _log.debug("padded probe of %s failed (%s); padded batches run row by row",
                   _architecture(hf), exc)
        return False


def hidden_states(model, input_ids, attention_mask=None) -> np.ndarray:
    """Last-position final hidden states, after the final norm: the vectors multiplied by ``W``.

    Parameters
    ----------
    model : LoadedModel or transformers.PreTrainedModel
    input_ids : array_like of int, shape (B, L) or (L,)
        Token ids in ``[0, n_rows)``, ``L`` at most the model's maximum position.
    attention_mask : array_like of {0, 1}, shape (B, L), optional
        Left or right padding: the "last position" of a row is its last attended one, and
        positions are counted over attended tokens (``max(cumsum(mask) - 1, 0)``), so a padded
        row gives the hidden state of the unpadded sequence.

    Returns
    -------
    numpy.ndarray of shape (B, d), float32
        ``h`` such that the model's last-position logits are ``s * (W h + b)`` (soft-capped for
        Gemma 2/3), see :meth:`Unembedding.logits`; checked against the model's own logits on a
        probe batch before use, and in ``tests/test_adapter_architectures.py`` for dozens of
        architectures, with and without padding.

    Raises
    ------
    TypeError
        Not a model or not integer ids.
    embgeom._hf.UnsupportedModelError (a TypeError and a ValueError)
        The wrong kind of model: a module without a ``config`` (a plain ``nn.Module``), an
        encoder-decoder model (T5, BART), a model without an unembedding (a base model such as
        ``BertModel`` or ``LlamaModel``, a classifier). The message starts with ``model:`` and
        says what is expected (a causal LM with an ``lm_head``).
    ValueError
        Empty ids, ids out of range (negative, or past the embedding table or the head), more
        positions than the model's maximum (``max_position_embeddings``), a mask of the wrong shape or content; a model that is not
        causal (a masked LM such as ``BertForMaskedLM``: changing the last token moves the
        earlier hidden states on the probe); an architecture whose logits the adapter does not
        reproduce (named, see :func:`unembedding`); a mask with zeros between ones for a model
        that does not handle padding in a batch.

    Notes
    -----
    Computed as ``base_model(...).last_hidden_state`` in eval mode (no dropout, also for a
    model left in training mode, whose flags are restored after), under
    ``torch.inference_mode``, with autocast off and a float32 default dtype (see
    :func:`embgeom._hf.measuring`); the full ``(B, L, |V|)`` logits are never formed. Models whose padded batches do not reproduce the
    unpadded rows on the probe (e.g. RWKV, which ignores the mask) are run row by row without
    the padding, rows of equal length batched.
    """
    hf, _, _, _ = _causal_lm(model)
    ids, mask = _check_ids(input_ids, attention_mask, hf)
    _check_model(hf)
    return _hidden(hf, ids, mask).numpy()


def _hidden(hf, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is not None and bool(mask.all()):
        mask = None
    if mask is not None and not _check_model(hf, require=False).padding_ok:
        h = _by_row(_base_last_hidden, hf, ids, mask)
    else:
        h = _base_last_hidden(hf, ids, mask)
    return h.to(torch.float32).cpu().clone()


def logits(model, input_ids, attention_mask=None) -> np.ndarray:
    """The model's own last-position logits (its full forward pass, head and soft-cap included).

    Parameters
    ----------
    model : LoadedModel or transformers.PreTrainedModel
    input_ids : array_like of int, shape (B, L) or (L,)
    attention_mask : array_like of {0, 1}, shape (B, L), optional
        As in :func:`hidden_states`: positions are counted over attended tokens, and a model
        that does not handle padding in a batch is run row by row without it.

    Returns
    -------
    numpy.ndarray of shape (B, n_rows), float32
        In nats, exactly what the model's forward pass returns at the last attended position,
        run in eval mode without autocast (:func:`embgeom._hf.measuring`), whatever the
        caller's mode, autocast and default dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`hidden_states`: bad ids or mask, the wrong kind of model, a model that is not
        causal. The head formula ``s * (W h + b)`` is not checked, since these are the model's
        own logits.
    """
    hf, _, _, _ = _causal_lm(model)
    ids, mask = _check_ids(input_ids, attention_mask, hf)
    checked = _check_model(hf, require=False)
    if checked.causal_error is not None:
        raise ValueError(checked.causal_error)
    if mask is not None and bool(mask.all()):
        mask = None
    if mask is not None and not checked.padding_ok:
        z = _by_row(_own_last_logits, hf, ids, mask)
    else:
        z = _own_last_logits(hf, ids, mask)
    return z.to(torch.float32).cpu().numpy()


