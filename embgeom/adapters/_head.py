"""What sits between a model's last hidden state and its logits: the final norm, the logit
scale and the soft-cap, read from the model and checked by running its modules.

Shared by the forward checks (:mod:`._forward`) and the unembedding (:mod:`._unembedding`);
it imports no sibling.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np
import torch

from .._hf import base_model as _base_model
from .._hf import measuring as _measuring

__all__ = ["FinalNorm"]



@dataclasses.dataclass(frozen=True, eq=False)
class FinalNorm:
    """The normalisation applied to the last hidden state right before the unembedding.

    Attributes
    ----------
    kind : {"rmsnorm", "layernorm"} or None
        ``"rmsnorm"``: ``y = x / sqrt(mean(x**2) + eps) * weight``;
        ``"layernorm"``: ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias``;
        ``None``: no final norm was found (the other fields are then ``None``/0).
    weight : numpy.ndarray of shape (d,), float32, or None
        The *effective* gain: for Gemma-style RMSNorm, whose module computes
        ``x_hat * (1 + w)``, this is ``1 + w`` already (see ``gain_offset``). A norm without
        learned gain reports ones.
    bias : numpy.ndarray of shape (d,), float32, or None
        The LayerNorm bias, or ``None``.
    eps : float
        The epsilon inside the square root.
    gain_offset : float
        ``1.0`` when the module adds one to its stored weight (Gemma), else ``0.0``. Found by
        evaluating the module on a probe vector, not from its class name.
    module : str
        The class name of the norm module (e.g. ``"LlamaRMSNorm"``), for reports.
    """

    kind: str | None
    weight: np.ndarray | None
    bias: np.ndarray | None
    eps: float
    gain_offset: float = 0.0
    module: str = ""

    def apply(self, x) -> np.ndarray:
        """Apply the norm to pre-norm vectors in numpy (float64).

        Parameters
        ----------
        x : array_like of shape (N, d) or (d,)

        Returns
        -------
        numpy.ndarray, float64, same shape as ``x``
        """
        x = np.asarray(x, dtype=np.float64)
        if self.kind is None:
            return x.copy()
        if self.kind == "layernorm":
            xc = x - x.mean(axis=-1, keepdims=True)
            y = xc / np.sqrt((xc**2).mean(axis=-1, keepdims=True) + self.eps)
        else:
            y = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + self.eps)
        y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y

    def to_dict(self) -> dict:
        """JSON-able facts (no arrays): kind, eps, gain offset, module, gain/bias summaries."""
        out = {"kind": self.kind, "eps": float(self.eps), "gain_offset": float(self.gain_offset),
               "module": self.module, "has_bias": self.bias is not None}
        if self.weight is not None:
            w = np.abs(self.weight.astype(np.float64))
            out.update(gain_abs_max=float(w.max()), gain_abs_mean=float(w.mean()),
                       gain_l2=float(np.linalg.norm(w)))
        return out


# --------------------------------------------------------------------------------------------
# The final norm (model access itself: embgeom._hf)
# --------------------------------------------------------------------------------------------


_NORM_NAMES = ("norm", "final_layer_norm", "ln_f", "norm_f", "final_norm", "final_layernorm")


def _find_final_norm(hf) -> torch.nn.Module | None:
    """The final norm module: ``base_model.<name>`` for the usual names (Llama/Qwen2/Gemma3
    ``model.norm``, GPT-NeoX ``gpt_neox.final_layer_norm``, GPT-2 ``transformer.ln_f``), then the
    same names one level down (``decoder.final_layer_norm`` in OPT)."""
    base = _base_model(hf)
    scopes = [base] + [getattr(base, n) for n in ("decoder", "language_model", "model")
                       if isinstance(getattr(base, n, None), torch.nn.Module)]
    for scope in scopes:
        for n in _NORM_NAMES:
            mod = getattr(scope, n, None)
            if isinstance(mod, torch.nn.Module):
                return mod
    return None


def _norm_eps(mod) -> float:
    for attr in ("eps", "variance_epsilon", "epsilon"):
        v = getattr(mod, attr, None)
        if isinstance(v, numbers.Real):
            return float(v)
    raise ValueError(f"final norm {type(mod).__name__}: cannot find its epsilon")


def _describe_norm(mod: torch.nn.Module | None, width: int | None = None) -> FinalNorm:
    """Read a final norm module and check the reading by evaluating the module.

    The kind comes from the class (``LayerNorm`` or ``RMSNorm`` in its name, or an
    ``nn.LayerNorm``); the effective gain is the stored weight or ``1 + weight``, whichever
    reproduces the module's output on a random probe (float64 arithmetic, float32 tolerance).
    The probe's width is the weight's, else the module's ``normalized_shape``, else ``width``
    (the hidden size); a norm whose width none of these gives is refused by name (a probe of
    width 0 used to average an empty slice).
    """
    if mod is None:
        return FinalNorm(kind=None, weight=None, bias=None, eps=0.0)
    cls = type(mod).__name__
    if isinstance(mod, torch.nn.LayerNorm) or "layernorm" in cls.lower():
        kind = "layernorm"
    elif "rmsnorm" in cls.lower():
        kind = "rmsnorm"
    else:
        raise ValueError(f"final norm {cls}: neither a LayerNorm nor an RMSNorm")
    eps = _norm_eps(mod)
    w = getattr(mod, "weight", None)
    b = getattr(mod, "bias", None)
    p = next(mod.parameters(), None)
    shape = getattr(mod, "normalized_shape", None)
    d = (int(w.shape[-1]) if w is not None
         else int(shape[-1]) if isinstance(shape, (tuple, list)) and shape
         else int(shape) if isinstance(shape, numbers.Integral)
         else int(width or 0))
    if d <= 0:
        raise ValueError(f"final norm {cls}: cannot find its width (no weight, no "
                         "normalized_shape, no hidden size)")
    raw_w = (w.detach().double().cpu().numpy() if w is not None else np.zeros(d))
    bias = b.detach().double().cpu().numpy() if isinstance(b, torch.Tensor) else None

    gen = torch.Generator().manual_seed(1234)
    probe = torch.randn(3, d, generator=gen, dtype=torch.float64) * 3.0 + 0.5
    dtype = p.dtype if p is not None else torch.float32
    with _measuring(mod):
        got = mod(probe.to(dtype)).double().numpy()
    base = FinalNorm(kind=kind, weight=np.ones(d), bias=bias, eps=eps).apply(probe.numpy())
    scale = max(1.0, float(np.abs(got).max()))
    candidates = [(0.0, raw_w if w is not None else np.ones(d))] + ([(1.0, 1.0 + raw_w)] if w is not None else [])
    for offset, gain in candidates:
        pred = base * gain if bias is None else (base - bias) * gain + bias
        if np.abs(pred - got).max() <= 1e-4 * scale:
            return FinalNorm(kind=kind, weight=gain.astype(np.float32),
                             bias=None if bias is None else bias.astype(np.float32),
                             eps=eps, gain_offset=offset, module=cls)
    raise ValueError(
        f"final norm {cls}: its output matches neither x_hat * weight nor x_hat * (1 + weight); "
        "this norm convention is not supported"
    )


def _is_tied(out: torch.nn.Module, inp: torch.nn.Module | None) -> bool:
    if inp is None or getattr(inp, "weight", None) is None:
        return False
    a, b = out.weight, inp.weight
    return a is b or (a.shape == b.shape and a.data_ptr() == b.data_ptr())


def _architecture(hf) -> str:
    """``"GPT2LMHeadModel (model_type 'gpt2')"``: how errors name a model's architecture."""
    return f"{type(hf).__name__} (model_type {getattr(hf.config, 'model_type', None)!r})"


def _head_config(hf):
    cfg = getattr(hf, "config", None)
    return getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None


def _positive_config_value(hf, attr: str) -> float | None:
    v = getattr(_head_config(hf), attr, None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (np.isfinite(v) and v > 0):
        raise ValueError(
            f"model: {_architecture(hf)} has config.{attr} = {v!r}; expected a positive finite "
            "number (a zero, negative or NaN value changes or destroys the argmax of the logits)"
        )
    return float(v)


def _softcap(hf) -> float | None:
    """``config.final_logit_softcapping`` (Gemma 2/3, NanoChat), ``None`` when absent."""
    return _positive_config_value(hf, "final_logit_softcapping")


# config attribute -> exponent of the factor it applies to ``W h + b``: Cohere multiplies the
# logits by ``logit_scale``; Granite divides them by ``logits_scaling`` (MiniCPM3 divides the
# hidden state by it, the same without an output bias); Inkling divides the hidden state by
# ``logits_mup_width_multiplier``. Any other convention fails the check in _check_model.
_LOGIT_SCALE_ATTRS = (("logit_scale", 1), ("logits_scaling", -1), ("logits_mup_width_multiplier", -1))


def _logit_scale(hf) -> float:
    """The positive factor ``s`` of ``z = s * (W h + b)`` read from the config (1.0 if none)."""
    s = 1.0
    for attr, power in _LOGIT_SCALE_ATTRS:
        v = _positive_config_value(hf, attr)
        if v is not None:
            s *= v ** power
    return s



def _hidden_width(hf) -> int | None:
    """The width of the final hidden state: the unembedding's input size, else the config's
    ``hidden_size`` / ``n_embd`` / ``d_model`` (None when neither is there)."""
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    w = getattr(head, "weight", None)
    if isinstance(w, torch.Tensor) and w.ndim == 2:
        return int(w.shape[-1])
    cfg = getattr(hf, "config", None)
    for attr in ("hidden_size", "n_embd", "d_model"):
        v = getattr(cfg, attr, None)
        if isinstance(v, numbers.Integral) and v > 0:
            return int(v)
    return None


def _final_norm_of(hf) -> FinalNorm:
    """:func:`_describe_norm` of the final norm, a ValueError naming the architecture if the
    norm's convention is unknown."""
    try:
        return _describe_norm(_find_final_norm(hf), _hidden_width(hf))
    except ValueError as exc:
        raise ValueError(f"model: {_architecture(hf)} is not supported: {exc}") from None

