"""The two success checks of cramming: greedy generation and teacher-forced accuracy."""

from __future__ import annotations

import numpy as np
import torch

from embgeom._hf import (
    frozen,
    greedy_decode,
    input_embeddings,
    last_logits,
    model_device_dtype,
    prefix,
    resolve_start_token,
    unwrap,
    vocab_rows,
)
from embgeom._validation import check_array, check_positive_int

from ._targets import check_targets

__all__ = ["greedy_generate", "teacher_forced_accuracy"]


def greedy_generate(model, memory, n_tokens: int, *, start_token="auto", use_cache: bool = True,
                    batch_size: int = 64):
    """Greedy generation from memory vectors alone (no target tokens).

    The model is fed ``[e(s), mem_1, ..., mem_m]`` (the memory vectors alone with
    ``start_token=None``) and emits ``n_tokens`` argmax tokens, each fed back
    (:func:`embgeom._hf.greedy_decode`, ``model.generate`` with greedy settings).

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
    hf, tokenizer, _, _ = unwrap(model)
    emb = input_embeddings(hf)
    start = resolve_start_token(hf, tokenizer, start_token, vocab_rows(hf))
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    batch_size = check_positive_int(batch_size, "batch_size")
    M = check_array(memory, "memory", ndim=(2, 3), dtype=np.float32)
    if M.ndim == 2:
        M = M[None]
    d = int(emb.weight.shape[1])
    if M.shape[2] != d:
        raise ValueError(f"memory: expected last dimension {d} (hidden size), got {M.shape}")
    dev, mdtype = model_device_dtype(hf)
    out = np.zeros((M.shape[0], n_tokens), np.int64)
    with frozen(hf), torch.no_grad():
        for s in range(0, M.shape[0], batch_size):
            x = prefix(torch.as_tensor(M[s : s + batch_size], device=dev), emb, start, mdtype)
            toks = greedy_decode(hf, n_tokens, inputs_embeds=x, use_cache=use_cache)
            out[s : s + x.shape[0]] = toks.cpu().numpy()
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

    Raises
    ------
    TypeError, ValueError
        Bad model, memory or targets (shapes, dtypes, token ids out of range).
    """
    hf, tok, _, _ = unwrap(model)
    emb = input_embeddings(hf)
    vocab = vocab_rows(hf)
    T_np = check_targets(targets, vocab)
    start = resolve_start_token(hf, tok, start_token, vocab)
    M = check_array(memory, "memory", ndim=3, dtype=np.float32, shape=(T_np.shape[0], None, None))
    dev, mdtype = model_device_dtype(hf)
    n = T_np.shape[1]
    with frozen(hf), torch.no_grad():
        T = torch.as_tensor(T_np, device=dev)
        x = torch.cat([prefix(torch.as_tensor(M, device=dev), emb, start, mdtype),
                       emb(T[:, :-1]).to(mdtype)], 1)
        logits, _ = last_logits(hf, x, n, use_cache=False)
        return (logits.argmax(-1) == T).double().mean(1).cpu().numpy()
