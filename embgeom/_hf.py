"""The one home of embgeom's Hugging Face plumbing (torch).

:mod:`embgeom.adapters`, :mod:`embgeom.cramming` and :mod:`embgeom.copying` reach a model only
through these helpers:

- model access: :func:`unwrap` (a ``LoadedModel``-like object or a torch module ->
  ``(hf_model, tokenizer, name, source_dtype)``), :func:`input_embeddings`,
  :func:`output_embeddings`, :func:`base_model`, :func:`model_device_dtype`, :func:`frozen`,
  :func:`check_device`;
- the caller's torch state: :func:`measuring` (eval mode, no gradient, no autocast, float32
  default dtype for embgeom's own forward passes, the caller's state restored after);
- vocabulary: :func:`config_vocab`, :func:`vocab_rows`, :func:`special_token_ids` (the one
  special-token rule), :func:`allowed_token_ids`, :func:`max_positions`,
  :func:`check_positions`;
- input embeddings: :func:`embed_rows` (the module's own output, so any scale applied inside the
  module, e.g. Gemma-3's ``sqrt(d)``, is included: the one place that scale is measured);
- the start token before soft-prompt vectors: :func:`resolve_start_token`, :func:`prefix`;
- forward passes and decoding: :func:`last_logits`, :func:`greedy_decode` (``model.generate``
  with greedy settings and a KV cache).

Nothing here sets environment variables or leaves global state changed; :func:`frozen`,
:func:`measuring` and :func:`greedy_decode` restore what they touch.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any

import numpy as np
import torch

__all__ = [
    "UnsupportedModelError",
    "allowed_token_ids",
    "base_model",
    "check_device",
    "config_vocab",
    "dtype_name",
    "embed_rows",
    "frozen",
    "greedy_decode",
    "input_embeddings",
    "last_logits",
    "check_positions",
    "max_positions",
    "measuring",
    "model_device_dtype",
    "model_name",
    "output_embeddings",
    "prefix",
    "resolve_start_token",
    "special_token_ids",
    "unwrap",
    "vocab_rows",
]


class UnsupportedModelError(TypeError, ValueError):
    """The model lacks a part embgeom needs (input embeddings, an unembedding, a base model).

    Subclasses both ``TypeError`` (it is the wrong kind of model) and ``ValueError`` (the
    historical type of this error in :mod:`embgeom.cramming`), so either ``except`` works.
    """


# --------------------------------------------------------------------------------------------
# Model access
# --------------------------------------------------------------------------------------------


def model_name(hf) -> str:
    """The name of a bare model: ``config.name_or_path`` when set, else its class name."""
    cfg = getattr(hf, "config", None)
    name = getattr(cfg, "name_or_path", "") or getattr(cfg, "_name_or_path", "") or ""
    return str(name or type(hf).__name__)


def unwrap(model) -> tuple[Any, Any, str, str | None]:
    """``(hf_model, tokenizer or None, name, source_dtype or None)`` of a model argument.

    Parameters
    ----------
    model : embgeom.adapters.LoadedModel, an object with ``.model`` and ``.tokenizer``, or a
        torch module (a transformers model)
        A wrapper's ``name`` and ``source_dtype`` attributes are used when present.

    Returns
    -------
    tuple
        The torch module, its tokenizer (``None`` for a bare module), its name
        (:func:`model_name` for a bare module), how its weights were stored (``None`` unknown).

    Raises
    ------
    TypeError
        Neither a torch module nor a wrapper of one.
    """
    if isinstance(model, torch.nn.Module):
        return model, None, model_name(model), None
    if hasattr(model, "model") and hasattr(model, "tokenizer"):
        hf = model.model
        if not isinstance(hf, torch.nn.Module):
            raise TypeError(
                f"model: expected model.model to be a torch module, got {type(hf).__name__}"
            )
        name = getattr(model, "name", None) or type(hf).__name__
        return hf, model.tokenizer, str(name), getattr(model, "source_dtype", None)
    raise TypeError(
        "model: expected an embgeom.adapters.LoadedModel or a Hugging Face causal LM "
        f"(torch.nn.Module), got {type(model).__name__}"
    )


def _module_with_weight(hf, getter_name: str):
    getter = getattr(hf, getter_name, None)
    mod = None
    if callable(getter):
        try:
            mod = getter()
        except (NotImplementedError, AttributeError):  # a base class without the part
            mod = None
    if not isinstance(mod, torch.nn.Module) or getattr(mod, "weight", None) is None:
        return None
    return mod


def input_embeddings(hf) -> torch.nn.Module:
    """The input-embedding module (``get_input_embeddings()``), with a ``weight``.

    Raises
    ------
    UnsupportedModelError
        The model has none (cramming feeds ``inputs_embeds`` and needs one).
    """
    emb = _module_with_weight(hf, "get_input_embeddings")
    if emb is None:
        raise UnsupportedModelError(
            f"model: {type(hf).__name__} has no input embeddings (get_input_embeddings() returned "
            "no module with a weight); pass a causal LM that accepts inputs_embeds"
        )
    return emb


def output_embeddings(hf) -> torch.nn.Module:
    """The unembedding module (``get_output_embeddings()``), with a ``weight``.

    Raises
    ------
    UnsupportedModelError
        The model has none (a base model without a language-modelling head).
    """
    out = _module_with_weight(hf, "get_output_embeddings")
    if out is None:
        raise UnsupportedModelError(
            f"model: {type(hf).__name__} has no unembedding (get_output_embeddings() returned "
            "None); pass a causal LM with a head, e.g. an *ForCausalLM model"
        )
    return out


def base_model(hf) -> torch.nn.Module:
    """The base transformer (``hf.base_model``) whose ``last_hidden_state`` is after the final norm.

    Raises
    ------
    UnsupportedModelError
        No distinct base model.
    """
    base = getattr(hf, "base_model", None)
    if base is None or base is hf:
        raise UnsupportedModelError(f"model: cannot find the base transformer of {type(hf).__name__}")
    return base


def model_device_dtype(hf) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's first parameter.

    Raises
    ------
    ValueError
        A model without parameters.
    """
    p = next(iter(hf.parameters()), None)
    if p is None:
        raise ValueError("model: has no parameters")
    return p.device, p.dtype


def dtype_name(dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).replace("torch.", "")


def check_device(device):
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


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module):
    """Every submodule in eval mode; each one's own ``training`` flag restored after (a model in
    training mode with a frozen eval-mode part keeps that mix)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in modes:
            m.training = flag


@contextlib.contextmanager
def frozen(hf):
    """Freeze every parameter (``requires_grad`` False) and switch to eval mode; restore after.

    Each parameter's ``requires_grad`` and each submodule's ``training`` flag come back as they
    were, also when the body raises.
    """
    params = list(hf.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        with _eval_mode(hf):
            yield
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)


def _device_types(module: torch.nn.Module) -> list[str]:
    """``"cpu"`` and the device types of ``module``'s tensors that autocast knows."""
    types = {"cpu"} | {t.device.type for t in module.parameters()}
    types |= {t.device.type for t in module.buffers()}
    return sorted(t for t in types if torch.amp.is_autocast_available(t))


@contextlib.contextmanager
def measuring(module: torch.nn.Module, *, grad: bool = False):
    """Run ``module``'s forward passes in the state embgeom measures them in; restore after.

    Inside the block: every submodule in eval mode (no dropout), no gradient (unless
    ``grad``), autocast off on every device type of the module and on the CPU (an enclosing
    ``torch.autocast`` of the caller does not reach the module, so it computes in the dtype of
    its own weights), and ``torch.get_default_dtype()`` float32 (the dtype transformers
    models are built and tested under; a caller's float64 default does not change the
    tensors the model creates inside its forward). After it, the caller's training flags,
    grad mode and default dtype are back, also when the body raises; ``requires_grad`` of
    the parameters is never touched.

    Parameters
    ----------
    module : torch.nn.Module
        The model (or a part of it, e.g. its embedding module).
    grad : bool, default False
        Keep the caller's grad mode instead of switching gradients off.

    Examples
    --------
    >>> import torch
    >>> lin = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    >>> with torch.autocast("cpu", dtype=torch.bfloat16), measuring(lin):
    ...     y = lin(torch.ones(1, 2))
    >>> y.dtype, y.requires_grad, lin.training
    (torch.float32, False, True)
    """
    default = torch.get_default_dtype()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_eval_mode(module))
        if not grad:
            stack.enter_context(torch.no_grad())
        for device_type in _device_types(module):
            stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(default)


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------


def _text_config(hf):
    """``hf.config`` (its text config for multimodal configs).

    Raises
    ------
    UnsupportedModelError
        A module without a ``config`` (a plain ``torch.nn.Module``).
    """
    cfg = getattr(hf, "config", None)
    if cfg is None:
        raise UnsupportedModelError(
            f"model: {type(hf).__name__} has no config, so it is not a Hugging Face model; pass a "
            "causal language model with an unembedding (a transformers *ForCausalLM model)"
        )
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def config_vocab(hf) -> int:
    """``config.vocab_size`` (of the text config for multimodal configs).

    Raises
    ------
    UnsupportedModelError
        No config, or a config without a positive integer ``vocab_size``.
    """
    v = getattr(_text_config(hf), "vocab_size", None)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
        raise UnsupportedModelError(
            f"model: the config of {type(hf).__name__} has vocab_size = {v!r}; expected a "
            "positive integer (a language model's vocabulary)"
        )
    return int(v)


def vocab_rows(hf) -> int:
    """Number of token ids that can be both embedded and predicted (min of the two row counts).

    Raises
    ------
    UnsupportedModelError
        No input embeddings.
    """
    n = int(input_embeddings(hf).weight.shape[0])
    head = _module_with_weight(hf, "get_output_embeddings")
    if head is not None:
        n = min(n, int(head.weight.shape[0]))
    return n


def max_positions(hf) -> int | None:
    """The model's maximum position (``max_position_embeddings`` or its synonyms), or None."""
    cfg = _text_config(hf)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, numbers.Integral) and v > 0:
            return int(v)
    return None


def check_positions(hf, n_positions: int, name: str, what: str = "") -> None:
    """Refuse an input of ``n_positions`` positions longer than the model's maximum position.

    A model with a position table (GPT-2, OPT) fails inside torch with an ``IndexError`` that
    names nothing; a rotary one runs outside the range it was trained on. Either way the
    argument that asked for it is named here.

    Parameters
    ----------
    hf : transformers.PreTrainedModel
    n_positions : int
        Positions the longest input takes (start token and soft prompt included).
    name : str
        The argument that set it, for the message (e.g. ``"lengths"``).
    what : str, optional
        How the positions arise, for the message (e.g. ``"1 start token + 2 memory vectors +
        a 70-token target"``).

    Raises
    ------
    ValueError
        ``n_positions`` above :func:`max_positions` (nothing when the model has no maximum).
    """
    limit = max_positions(hf)
    if limit is not None and n_positions > limit:
        how = f" ({what})" if what else ""
        raise ValueError(f"{name}: {n_positions} positions{how} exceed the model's maximum "
                         f"position ({limit} tokens)")


def special_token_ids(hf, tokenizer) -> set[int]:
    """The special tokens, the one rule: the tokenizer's ``all_special_ids``; without a
    tokenizer, the config's ``bos_token_id``, ``eos_token_id`` and ``pad_token_id``."""
    if tokenizer is not None:
        ids = getattr(tokenizer, "all_special_ids", None) or []
    else:
        ids = []
        cfg = getattr(hf, "config", None)
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = getattr(cfg, attr, None)
            ids.extend(v if isinstance(v, (list, tuple)) else [v])
    return {int(i) for i in ids if i is not None}


def allowed_token_ids(hf, tokenizer, vocab: int) -> np.ndarray:
    """Ids ``0 .. vocab-1`` without the special tokens (:func:`special_token_ids`), int64 sorted.

    Raises
    ------
    ValueError
        Nothing left.
    """
    special = np.fromiter(special_token_ids(hf, tokenizer), dtype=np.int64)
    ids = np.setdiff1d(np.arange(vocab, dtype=np.int64), special)
    if ids.size == 0:
        raise ValueError("model: no non-special token left to sample from")
    return ids


# --------------------------------------------------------------------------------------------
# Input embeddings and the start token
# --------------------------------------------------------------------------------------------


def embed_rows(emb: torch.nn.Module, ids, *, chunk: int = 8192) -> torch.Tensor:
    """The embedding module's output for token ids, float32 ``(len(ids), d)``, no gradient.

    Calling the module (not reading its weight) includes any scale applied inside it (Gemma-3's
    ``Gemma3TextScaledWordEmbedding`` multiplies by ``sqrt(d)``), so these are the
    ``inputs_embeds`` the model expects. Computed in chunks of ``chunk`` ids, under
    :func:`measuring` (eval mode, no autocast: the caller's torch state does not reach it).
    """
    ids = torch.as_tensor(ids, dtype=torch.long, device=emb.weight.device).reshape(-1)
    with measuring(emb):
        parts = [emb(ids[s : s + chunk]).float() for s in range(0, max(1, ids.numel()), chunk)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def resolve_start_token(hf, tokenizer, start_token, vocab: int) -> int | None:
    """The start token placed before soft-prompt vectors, as an int id, or ``None`` for none.

    ``"auto"``: the tokenizer's ``bos_token_id`` when a tokenizer is known, else the model
    config's ``bos_token_id``, else ``None`` (also ``None`` when that id is outside
    ``[0, vocab)``).

    Raises
    ------
    TypeError
        ``start_token`` is not ``"auto"``, ``None`` or an int.
    ValueError
        Another string, or an id outside ``[0, vocab)``.
    """
    if isinstance(start_token, str):
        if start_token != "auto":
            raise ValueError(f'start_token: expected "auto", None or a token id, got {start_token!r}')
        cand = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
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


def prefix(memory: torch.Tensor, emb, start: int | None, mdtype) -> torch.Tensor:
    """``[e(start), memory]`` ``(b, [1 +] m, d)`` in the model dtype: what a soft prompt feeds.

    ``memory`` is ``(b, m, d)`` on the ``inputs_embeds`` scale; with ``start=None`` the memory
    vectors alone.
    """
    x = memory.to(mdtype)
    if start is None:
        return x
    s = emb(torch.full((x.shape[0], 1), start, dtype=torch.long, device=x.device)).to(mdtype)
    return torch.cat([s, x], dim=1)


# --------------------------------------------------------------------------------------------
# Forward passes and greedy decoding
# --------------------------------------------------------------------------------------------


def _contiguous_input(module, args):
    """Forward pre-hook: the module's first input, contiguous (a no-op when it already is)."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


@contextlib.contextmanager
def _contiguous_head(hf):
    """During the block, the unembedding module's input is made contiguous before its product.

    ``torch.nn.functional.linear`` folds a contiguous ``(b, n, d)`` input into one ``(b n, d)``
    matrix product; a strided one (the ``logits_to_keep`` slice) takes a batched product over a
    broadcast weight, twice as slow in float32 and 19x in bfloat16 on CPU. Same values up to the
    summation order of the kernel. A model without a head module is left as it is.
    """
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    handle = head.register_forward_pre_hook(_contiguous_input) if isinstance(head, torch.nn.Module) else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def last_logits(hf, inputs_embeds: torch.Tensor, keep: int, **kw):
    """Logits of the last ``keep`` positions, float32 ``(b, keep, n_rows)``, and the output.

    Passes ``logits_to_keep`` so the full ``(b, L, |V|)`` logits are never formed where the
    model supports it. The kept hidden states are a strided slice of ``(b, L, d)``; the
    unembedding sees them contiguous (:func:`_contiguous_head`), so its product is one matrix
    product instead of a batched one over a broadcast copy of the weight: on SmolLM2 (1 thread,
    4 x 32 kept positions) forward and input gradient took 0.116 s instead of 0.216 in float32,
    0.038 s instead of 0.717 in bfloat16 (``benchmarks/bench_cram_step.py``).
    """
    with _contiguous_head(hf):
        try:
            out = hf(inputs_embeds=inputs_embeds, logits_to_keep=keep, **kw)
        except TypeError:  # older models without logits_to_keep
            out = hf(inputs_embeds=inputs_embeds, **kw)
    logits = out.logits
    if logits.shape[1] != keep:
        logits = logits[:, -keep:]
    return logits.float(), out


@contextlib.contextmanager
def _plain_generation_config(hf):
    """Swap in a default ``GenerationConfig`` for the call and restore the model's own.

    ``generate`` fills every setting the call leaves unset from ``hf.generation_config``: a
    model's shipped config can add a repetition penalty, banned n-grams, forced tokens or an
    end-of-sequence id that stops a row early. Any of these makes the output differ from the
    plain argmax of the logits, so the decoding runs against a clean config.
    """
    from transformers import GenerationConfig

    had = hasattr(hf, "generation_config")
    saved = getattr(hf, "generation_config", None)
    hf.generation_config = GenerationConfig()
    try:
        yield
    finally:
        if had:
            hf.generation_config = saved
        else:  # pragma: no cover - every GenerationMixin model has one
            del hf.generation_config


def greedy_decode(hf, n_new: int, *, input_ids=None, inputs_embeds=None,
                  use_cache: bool = True) -> torch.Tensor:
    """Greedy decoding of ``n_new`` tokens: argmax over every row of the unembedding, fed back.

    The one decoder of embgeom (the copy task decodes from token ids, cramming from
    soft-prompt vectors). It is ``hf.generate(..., do_sample=False, num_beams=1)`` against a
    clean generation config (no repetition penalty, no forced or suppressed tokens, no
    end-of-sequence stop: exactly ``n_new`` tokens), with an all-ones attention mask, so its
    tokens are those of a hand-written loop ``argmax(logits[:, -1])`` over full forward passes
    (checked in ``tests/test_hf.py`` on a model whose shipped config has a repetition penalty
    and whose end-of-sequence token is often the argmax). It runs under :func:`measuring`: a
    model left in training mode decodes without dropout, an enclosing ``torch.autocast`` does
    not reach it, and the caller's state is restored after.

    Parameters
    ----------
    hf : transformers.PreTrainedModel
        A causal LM with ``generate`` (transformers' ``GenerationMixin``).
    n_new : int
        Tokens to generate (>= 1).
    input_ids : torch.Tensor of int64, shape (b, p), optional
        A prompt of token ids (one common length, no padding).
    inputs_embeds : torch.Tensor of shape (b, p, d), optional
        A prompt of input vectors in the model dtype (e.g. :func:`prefix`). Exactly one of
        ``input_ids`` and ``inputs_embeds``.
    use_cache : bool, default True
        Decode with the KV cache; False recomputes the whole prefix for each token.

    Returns
    -------
    torch.Tensor of int64, shape (b, n_new)
        The generated tokens only (the prompt is not repeated).

    Raises
    ------
    TypeError
        A model without ``generate``; both or neither prompt given.
    ValueError
        ``n_new < 1``; an empty prompt.
    """
    from ._validation import check_positive_int

    n_new = check_positive_int(n_new, "n_new")
    if (input_ids is None) == (inputs_embeds is None):
        raise TypeError("greedy_decode: pass exactly one of input_ids and inputs_embeds")
    if not callable(getattr(hf, "generate", None)):
        raise TypeError(f"model: {type(hf).__name__} has no generate(); pass a transformers "
                        "causal LM")
    prompt = input_ids if input_ids is not None else inputs_embeds
    if prompt.ndim < 2 or prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(f"prompt: expected a non-empty (b, p[, d]) prompt, got {tuple(prompt.shape)}")
    b, p = int(prompt.shape[0]), int(prompt.shape[1])
    mask = torch.ones((b, p), dtype=torch.long, device=prompt.device)
    kw = {"input_ids": input_ids} if input_ids is not None else {"inputs_embeds": inputs_embeds}
    with _plain_generation_config(hf), measuring(hf):
        out = hf.generate(
            **kw, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=n_new,
            eos_token_id=None, pad_token_id=0, use_cache=use_cache,
        )
    # decoder-only models return the prompt ids followed by the new tokens for an id prompt,
    # and the new tokens alone for an embedding prompt
    return out[:, -n_new:]
