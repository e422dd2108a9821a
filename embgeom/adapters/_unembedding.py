"""Unembedding extraction: :class:`Unembedding` (``W``, its bias, the final norm, the vocabulary
facts) and :func:`input_embedding_scale`.

Imports :mod:`._head` and :mod:`._forward` (the model is checked before anything is extracted).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._hf import config_vocab as _config_vocab
from .._hf import embed_rows, input_embeddings
from .._hf import output_embeddings as _output_embeddings
from .._validation import check_positive_int
from ._forward import _causal_lm, _check_model
from ._head import FinalNorm, _final_norm_of, _is_tied, _logit_scale, _softcap

__all__ = ["Unembedding", "input_embedding_scale", "unembedding"]


@dataclasses.dataclass(frozen=True, eq=False)
class Unembedding:
    """The unembedding (output projection) of a causal LM and its final norm.

    Logits are ``z = s * (weight @ h + bias)`` for a final hidden state ``h`` (the output of the
    final norm) and the model's ``logit_scale = s > 0`` (1 for most models; Cohere's
    ``logit_scale``, ``1 / logits_scaling`` for Granite and MiniCPM3), then, for models with
    ``logit_softcap = c``, ``c * tanh(z / c)`` (Gemma 2/3). Both maps are strictly increasing,
    so they change no argmax: decoder cells depend on ``weight`` and ``bias`` only, while
    logit *differences* (margins, in nats) scale with ``s`` (see
    :meth:`effective_weight_bias`). :func:`unembedding` checks this formula against the
    model's own logits and refuses a model it does not reproduce.

    Attributes
    ----------
    weight : numpy.ndarray of shape (n_rows, d), float32
        The unembedding matrix ``W`` (rows are tokens).
    bias : numpy.ndarray of shape (n_rows,), float32, or None
        The output bias ``b``, or ``None`` when the projection has none.
    norm : FinalNorm
        The final norm applied before ``W``.
    tied : bool
        ``W`` is the same parameter (same storage) as the input embedding.
    vocab_size : int
        The tokenizer's vocabulary size (``len(tokenizer)``, added tokens included); when no
        tokenizer is known, ``config.vocab_size`` (``vocab_source == "config"``) or the value the
        caller passed (``"argument"``).
    n_rows : int
        Number of rows of ``W``.
    padded_rows : int
        ``n_rows - vocab_size`` when positive, else 0: rows no tokenizer id reaches (padding to
        a multiple of 64/128). They are reported, never silently mixed in; use
        ``weight[:vocab_size]`` for the real vocabulary.
    hidden_size : int
        ``d``.
    name : str
        The model's name.
    dtype : str
        dtype of the arrays as extracted (``"float32"``).
    logit_softcap : float or None
        The ``final_logit_softcapping`` of Gemma 2/3 and others (``None`` when absent).
    vocab_source : {"tokenizer", "config", "argument"}
        Where ``vocab_size`` came from.
    source_dtype : str or None
        How the weights were stored (from :class:`LoadedModel`), ``None`` for a raw model.
    logit_scale : float
        The positive factor ``s`` the model applies to ``W h + b`` (1.0 for most models).
    """

    weight: np.ndarray
    bias: np.ndarray | None
    norm: FinalNorm
    tied: bool
    vocab_size: int
    n_rows: int
    padded_rows: int
    hidden_size: int
    name: str
    dtype: str
    logit_softcap: float | None = None
    vocab_source: str = "tokenizer"
    source_dtype: str | None = None
    logit_scale: float = 1.0

    def logits(self, H, *, softcap: bool = True, dtype=np.float32) -> np.ndarray:
        """The model's logits of final hidden states, ``s * (W h + b)``, then soft-capped.

        Parameters
        ----------
        H : array_like of shape (N, d) or (d,)
            Final hidden states (after the final norm).
        softcap : bool, default True
            Apply ``logit_softcap`` when the model has one.
        dtype : {numpy.float32, numpy.float64}, default float32
            Arithmetic precision (float32 is what the model computes; float64 copies ``W``).

        Returns
        -------
        numpy.ndarray of shape (N, n_rows) or (n_rows,), of ``dtype``
            In nats (natural-log units, as the model's own logits), ``logit_scale`` included.

        Raises
        ------
        ValueError
            ``H`` that is not 1-D or 2-D or whose last dimension is not ``hidden_size``.
        TypeError
            ``dtype`` other than float32/float64.
        """
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype: expected float32 or float64, got {dtype}")
        H = np.asarray(H, dtype=dtype)
        if H.ndim not in (1, 2) or H.shape[-1] != self.hidden_size:
            raise ValueError(
                f"H: expected shape (N, {self.hidden_size}) or ({self.hidden_size},), got {H.shape}"
            )
        z = H @ self.weight.T.astype(dtype, copy=False)
        if self.bias is not None:
            z = z + self.bias
        if self.logit_scale != 1.0:
            z = z * dtype.type(self.logit_scale)
        if softcap and self.logit_softcap is not None:
            z = self.logit_softcap * np.tanh(z / self.logit_softcap)
        return z

    def effective_weight_bias(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``(s * W, s * b)``: the affine map whose values are the model's logits before soft-capping.

        Use these (not ``weight``/``bias``) wherever logit *values* or *differences* matter,
        e.g. decoder margins in nats; the argmax cells are the same for both since ``s > 0``.

        Returns
        -------
        weight : numpy.ndarray of shape (n_rows, d), float32
            ``weight`` itself when ``logit_scale == 1``, else a scaled copy.
        bias : numpy.ndarray of shape (n_rows,), float32, or None
        """
        if self.logit_scale == 1.0:
            return self.weight, self.bias
        s = np.float32(self.logit_scale)
        return self.weight * s, (None if self.bias is None else self.bias * s)

    def to_dict(self) -> dict:
        """JSON-able model facts (no arrays): sizes, tied, bias, norm, soft-cap, dtypes."""
        return {
            "name": self.name,
            "hidden_size": int(self.hidden_size),
            "vocab_size": int(self.vocab_size),
            "vocab_source": self.vocab_source,
            "n_rows": int(self.n_rows),
            "padded_rows": int(self.padded_rows),
            "tied": bool(self.tied),
            "has_bias": self.bias is not None,
            "final_norm": self.norm.to_dict(),
            "logit_softcap": self.logit_softcap,
            "logit_scale": float(self.logit_scale),
            "dtype": self.dtype,
            "source_dtype": self.source_dtype,
        }


# --------------------------------------------------------------------------------------------
# Unembedding
# --------------------------------------------------------------------------------------------


def unembedding(model, *, vocab_size: int | None = None) -> Unembedding:
    """Extract the unembedding ``W``, its bias and the final norm of a causal LM.

    Parameters
    ----------
    model : LoadedModel or transformers.PreTrainedModel
        A causal LM with an output projection (``get_output_embeddings()``).
    vocab_size : int, optional
        The vocabulary size to report against the rows of ``W``. Default: ``len(tokenizer)``
        for a :class:`LoadedModel` with a tokenizer, else ``config.vocab_size`` (recorded as
        ``vocab_source="config"``: such a model cannot reveal padded rows).

    Returns
    -------
    Unembedding
        ``weight`` float32 (n_rows, d), ``bias`` float32 (n_rows,) or None, ``norm``
        (:class:`FinalNorm`, effective gain), ``tied``, ``vocab_size``, ``n_rows``,
        ``padded_rows``, ``hidden_size``, ``name``, ``dtype``, ``logit_softcap``.

    Raises
    ------
    TypeError
        ``model`` is neither a LoadedModel nor a torch module.
    embgeom._hf.UnsupportedModelError (a TypeError and a ValueError)
        The wrong kind of model (see :func:`hidden_states`): no ``config``, an encoder-decoder
        model, no unembedding (``get_output_embeddings()`` is None: a base model, a
        classifier). The message starts with ``model:`` and says what is expected.
    ValueError
        ``vocab_size`` not a positive integer, a model that is not causal (a masked LM), a
        final norm of an unknown convention, a non-positive logit scale or soft-cap, or an
        architecture whose logits the adapter does not reproduce (the message names it).

    Notes
    -----
    The final norm is found as ``base_model.norm`` (Llama, Qwen2, Gemma3: RMSNorm; Gemma's
    gain is ``1 + w``), ``base_model.final_layer_norm`` (GPT-NeoX: LayerNorm with bias) or
    ``base_model.ln_f`` (GPT-2). Gemma also multiplies its *input* embeddings by ``sqrt(d)``
    (see :func:`input_embedding_scale`); that does not touch the unembedding. Gemma's
    ``final_logit_softcapping`` is monotone, so the argmax cells of ``W h + b`` are those of the
    model; it is recorded in ``logit_softcap``. A scale between the hidden state and the logits
    (Cohere's ``logit_scale``, Granite's and MiniCPM3's ``logits_scaling``) is recorded in
    ``logit_scale``.

    Before anything is extracted, the model is checked on a fixed probe batch (see
    :func:`hidden_states`): the final norm's output must be the hidden state the head receives,
    and ``s * (W h + b)`` (soft-capped) must equal the model's own last-position logits to
    1e-3 of their largest magnitude (3e-2 for 16-bit weights). A model that fails (a transform
    head as in BERT, a projection after the final norm, an unknown logit convention) is
    refused with a ValueError naming its architecture; no partial object is returned. The
    check runs once per model object (about three forward passes of 2 x 9 tokens).
    """
    hf, tokenizer, name, source_dtype = _causal_lm(model)
    _check_model(hf)
    out = _output_embeddings(hf)
    weight = out.weight.detach().to(torch.float32).cpu().numpy().copy()
    if weight.ndim != 2:
        raise TypeError(f"model: output projection weight has shape {tuple(weight.shape)}, not 2-D")
    b = getattr(out, "bias", None)
    bias = b.detach().to(torch.float32).cpu().numpy().copy() if isinstance(b, torch.Tensor) else None
    n_rows, d = weight.shape
    if vocab_size is not None:
        vocab, source = check_positive_int(vocab_size, "vocab_size"), "argument"
    elif tokenizer is not None:
        vocab, source = len(tokenizer), "tokenizer"
    else:
        vocab, source = _config_vocab(hf), "config"
    if vocab > n_rows:
        raise ValueError(
            f"vocab_size: the vocabulary ({vocab}, from the {source}) is larger than the "
            f"unembedding ({n_rows} rows): tokens without a row have no cell; pass the real "
            "vocabulary size"
        )
    inp = hf.get_input_embeddings() if hasattr(hf, "get_input_embeddings") else None
    return Unembedding(
        weight=weight,
        bias=bias,
        norm=_final_norm_of(hf),
        tied=_is_tied(out, inp),
        vocab_size=int(vocab),
        n_rows=int(n_rows),
        padded_rows=int(max(0, n_rows - vocab)),
        hidden_size=int(d),
        name=name,
        dtype=str(weight.dtype),
        logit_softcap=_softcap(hf),
        vocab_source=source,
        source_dtype=source_dtype,
        logit_scale=_logit_scale(hf),
    )


def input_embedding_scale(model) -> float:
    """Mean L2 norm of the input-embedding vectors the model actually feeds its first layer.

    The mean is over the rows of the real vocabulary (the first ``vocab_size`` rows, see
    :func:`unembedding`), multiplied by any embedding multiplier: the module's own (Gemma's
    ``sqrt(d)``, measured by calling the embedding module, not read from a name) and a config
    ``embedding_multiplier`` (Granite). Position embeddings (GPT-2) are not included. This is the
    scale at which soft-prompt (memory) vectors are initialised in cramming.

    Parameters
    ----------
    model : LoadedModel or transformers.PreTrainedModel

    Returns
    -------
    float
        The scale, in the units of the hidden state.

    Raises
    ------
    TypeError
        Not a model; a module without a ``config`` or an encoder-decoder model, or a model
        without input embeddings (``embgeom._hf.UnsupportedModelError``, also a ValueError).
    """
    hf, tokenizer, _, _ = _causal_lm(model, head=False)
    emb = input_embeddings(hf)
    vocab = min(len(tokenizer) if tokenizer is not None else _config_vocab(hf), emb.weight.shape[0])
    # the module's own output (embed_rows): includes a multiplier applied inside the module
    mean_norm = float(embed_rows(emb, torch.arange(vocab)).double().norm(dim=1).mean())
    return mean_norm * float(getattr(hf.config, "embedding_multiplier", 1.0) or 1.0)


