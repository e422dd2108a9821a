"""Hidden-state sampling (the paper's protocol) and its cache on disk.

Imports :mod:`._forward` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from .._hf import allowed_token_ids as _allowed_token_ids
from .._hf import check_positions as _check_positions
from .._hf import config_vocab as _config_vocab
from .._hf import output_embeddings as _output_embeddings
from .._progress import progress_enabled, tqdm_kwargs
from .._validation import check_positive_int, seed_sequence
from ._forward import _causal_lm, _check_model, _hidden

__all__ = ["default_cache_dir", "sample_hidden_states"]

_log = logging.getLogger(__name__)

#: bumped whenever the sampling protocol or the file format changes (old files are then ignored)
_CACHE_VERSION = 4


# --------------------------------------------------------------------------------------------
# Sampling hidden states (the paper's protocol)
# --------------------------------------------------------------------------------------------


def _length_seed(seed: int, length: int) -> int:
    """An independent torch seed per (seed, length), so adding a length leaves the others."""
    return int(seed_sequence(seed, length).generate_state(1, dtype=np.uint64)[0] >> 1)


def _check_progress(progress) -> bool:
    """``progress`` as a bool: True or False as given; None (the default) for bars only where
    ``sys.stderr`` is a terminal, the rule of the cramming entry points and the CLI."""
    if progress is None:
        return progress_enabled()
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"progress: expected True, False or None, got {type(progress).__name__}")
    return bool(progress)


def default_cache_dir() -> Path:
    """The folder where hidden states are cached when ``cache_dir="auto"`` (the report's default).

    The user's cache folder, as transformers chooses its own: ``$EMBGEOM_CACHE`` when set (the
    embgeom cache root), else ``$XDG_CACHE_HOME/embgeom``, else ``~/.cache/embgeom``; the hidden
    states go in its ``hidden_states`` subfolder. Nothing is created here (the first write
    creates it).

    Returns
    -------
    pathlib.Path
        ``<root>/hidden_states``, with ``~`` expanded.

    Raises
    ------
    ValueError
        ``$EMBGEOM_CACHE`` (or its ``hidden_states``) exists and is not a folder; the message
        names ``EMBGEOM_CACHE``.

    Examples
    --------
    >>> default_cache_dir().name
    'hidden_states'
    """
    return _cache_root() / "hidden_states"


def _cache_root() -> Path:
    """The embgeom cache root: ``$EMBGEOM_CACHE``, else ``$XDG_CACHE_HOME/embgeom``, else
    ``~/.cache/embgeom`` (``~`` expanded); hidden states go in its ``hidden_states``, converted
    GGUF models in its ``models``. Raises the ValueError of :func:`default_cache_dir`."""
    root = os.getenv("EMBGEOM_CACHE") or ""
    if root:
        _check_env_root(root)
    if not root:
        xdg = os.getenv("XDG_CACHE_HOME") or ""
        root = os.path.join(xdg, "embgeom") if xdg else os.path.join("~", ".cache", "embgeom")
    return Path(root).expanduser()


def _check_env_root(root: str) -> None:
    """Refuse an ``$EMBGEOM_CACHE`` (or its ``hidden_states`` folder) that exists and is not a
    folder: the user asked for a cache there, so a silent uncached run would hide the mistake
    (``--cache-dir <file>`` is refused the same way)."""
    base = Path(root).expanduser()
    for p in (base, base / "hidden_states"):
        if p.exists() and not p.is_dir():
            raise ValueError(f"EMBGEOM_CACHE: {str(p)!r} exists and is not a folder; point "
                             "EMBGEOM_CACHE at a folder (it is created when missing) or unset it")


def _cache_folder(cache_dir) -> Path | None:
    """``cache_dir`` as a folder: ``None`` (no cache), ``"auto"`` (:func:`default_cache_dir`) or
    a path.

    Raises
    ------
    TypeError
        Anything else, naming ``cache_dir``.
    ValueError
        An empty path (``''`` would be the current folder, never what was meant), or a path that
        exists and is not a folder, naming ``cache_dir``; with ``"auto"``, an
        ``$EMBGEOM_CACHE`` that exists and is not a folder, naming ``EMBGEOM_CACHE``.
    """
    if cache_dir is None:
        return None
    if isinstance(cache_dir, str) and cache_dir == "auto":
        return default_cache_dir()
    if not isinstance(cache_dir, (str, os.PathLike)) or isinstance(cache_dir, bool):
        raise TypeError(f"cache_dir: expected None, 'auto' or a folder path, got "
                        f"{type(cache_dir).__name__}")
    text = os.fspath(cache_dir)
    if not str(text).strip():
        raise ValueError("cache_dir: expected a folder path, None or 'auto', got an empty path "
                         "(it would cache into the current folder)")
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"cache_dir: {str(folder)!r} exists and is not a folder")
    return folder


def _cache_key(hf, allowed: np.ndarray, lengths: list[int], n: int, seed: int) -> dict:
    """Everything that decides the sampled hidden states, and nothing else.

    The model (:func:`_weights_fingerprint`: class, result-changing config, every tensor's name,
    dtype, shape and bytes, so the weights' precision is in it), the attention implementation
    (eager and SDPA round differently), the torch and transformers versions (a new version may
    change a model's forward or the generator's draws), the protocol (uniform random token ids
    from ``allowed``, no BOS, the last position) and its sizes (``lengths``, ``n``, ``seed``).
    Not in it, since they do not change the states beyond float32 rounding: the batch size, the
    device (the weights are hashed on the CPU), the training flag and ``requires_grad`` (the
    forward runs in eval mode, :func:`embgeom._hf.measuring`), the model's name and path.
    """
    import transformers

    n_rows, d = _output_embeddings(hf).weight.shape
    return {"version": _CACHE_VERSION, "weights": _weights_fingerprint(hf),
            "attn_implementation": str(getattr(hf.config, "_attn_implementation", None)),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "n_rows": int(n_rows), "d": int(d), "text": "uniform random token ids, no BOS",
            "allowed": hashlib.sha256(allowed.astype("<i8").tobytes()).hexdigest(),
            "lengths": [int(v) for v in lengths], "n_per_length": int(n), "seed": int(seed)}


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True)


def _cache_path(cache_dir: Path, name: str, key: dict) -> Path:
    """``hidden_<name>_<sha256 of key, 32 hex>.npz``: the name is for people, the key decides
    (and is stored inside the file, where :func:`_load_cache` checks it)."""
    digest = hashlib.sha256(_key_text(key).encode()).hexdigest()[:32]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[-60:] or "model"
    return cache_dir / f"hidden_{safe}_{digest}.npz"


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
    """``cfg`` without the naming and result-free entries, recursively (sub-configs).

    A GGUF ``quantization_config`` (``quant_method "gguf"``) goes too: transformers dequantises
    GGUF tensors to float32 at load, so it only names the file the weights came from, and the
    weights enter the key themselves. The same model loaded from its GGUF file and from the
    converted folder of the model cache (:func:`embgeom.adapters.load_model`) then shares its
    hidden-state entries. Any other quantisation config stays: its forward differs."""
    out = {}
    for k, v in cfg.items():
        if k in _NAMING_CONFIG_KEYS or k in _RESULT_FREE_CONFIG_KEYS or (
                isinstance(k, str) and _RESULT_FREE_CONFIG_PATTERN.search(k)):
            continue
        if k == "quantization_config" and isinstance(v, dict) and v.get("quant_method") == "gguf":
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


def _read_cache(path: Path) -> tuple[np.ndarray, str]:
    """``(H, stored key text)`` of a cache file; what numpy and zipfile raise for a bad file."""
    # np.load on a path opens the file itself and leaves it open when reading fails part-way
    # (a truncated .npz: "ResourceWarning: unclosed file"); the file is ours to close here
    with open(path, "rb") as fh:
        f = np.load(fh, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):  # a bare .npy array
            raise ValueError("not an embgeom hidden-state file (an .npz of 'H' and 'key')")
        with f:
            if set(f.files) != {"H", "key"}:
                raise ValueError(f"not an embgeom hidden-state file (arrays {sorted(f.files)}, "
                                 "expected 'H' and 'key')")
            return f["H"], str(f["key"][()])


def _load_cache(path: Path, key: dict, shape: tuple[int, int]) -> tuple[np.ndarray | None, str]:
    """``(the cached array at path, "")``, or ``(None, why)`` (with a warning naming the file)
    when it is unreadable or truncated, was written for another key (a renamed or copied file, a
    hash collision), or has the wrong shape or dtype or values that are not finite."""
    try:
        H, stored = _read_cache(path)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        why = f"unreadable ({type(exc).__name__}: {exc})"
    else:
        if stored != _key_text(key):
            why = "written for another model or protocol (its stored key differs)"
        elif H.shape != shape or H.dtype != np.float32:
            why = f"shape {H.shape} dtype {H.dtype}, expected {shape} float32"
        elif not np.isfinite(H).all():
            why = "non-finite values"
        else:
            return H, ""
    warnings.warn(f"cache file {path} is not trusted ({why}); recomputing it", RuntimeWarning,
                  stacklevel=4)
    return None, why


def _save_cache(path: Path, key: dict, H: np.ndarray) -> bool:
    """Write ``H`` and its key atomically (temporary file, then rename); a failure is a warning,
    not a loss of the computed result. True when the file was written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, H=H, key=np.array(_key_text(key)))
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as exc:
        warnings.warn(f"cannot write cache file {path} ({exc}); the result is not cached",
                      RuntimeWarning, stacklevel=4)
        return False
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
    progress: bool | None = None,
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
        Sequence lengths in tokens, each in ``[1, max_position_embeddings]``, without repeats
        (the draws for a length depend only on ``seed`` and the length, so a repeated length
        would repeat its rows exactly; use a larger ``n_per_length`` or another seed).
    n_per_length : int
        Number of sequences per length (the paper: 10,000 for l in {4, 8, ..., 4096}).
    batch_size : int, default 32
        Sequences per forward pass.
    seed : int, default 0
        Seed (>= 0). Each length gets its own ``torch.Generator`` seeded from ``(seed, l)``, so
        the draws for one length do not depend on the other lengths.
    cache_dir : None, "auto", str or path-like, default None
        ``None``: nothing is cached. ``"auto"``: the user's cache folder,
        :func:`default_cache_dir` (``$EMBGEOM_CACHE``, else ``$XDG_CACHE_HOME/embgeom``, else
        ``~/.cache/embgeom``; what ``embgeom report`` uses unless ``--no-cache``). A folder:
        that folder. The result is stored there as ``hidden_<model>_<hash>.npz`` (the array and
        its key), the key being everything that decides the states (:func:`_cache_key`: a
        fingerprint of the model's class, config and every byte of its weights with their
        dtypes, the attention implementation, the torch and transformers versions, the
        lengths, ``n_per_length``, the seed and the token ids that may be drawn); a later call
        with the same key loads it instead of running the model. A cache file that cannot be
        read, whose stored key differs, or that has the wrong shape, dtype or non-finite values
        is recomputed and rewritten, with a ``RuntimeWarning`` naming it; a cache folder that
        cannot be written is a warning, and the result is returned uncached.
    progress : bool or None, default None
        tqdm progress bar over sequences. ``None``: a bar only when ``sys.stderr`` is a
        terminal (:func:`embgeom._progress.progress_enabled`), so a job logging to a file or a
        pipe is not flooded with redraws.

    Returns
    -------
    H : numpy.ndarray of shape (len(lengths) * n_per_length, d), float32
        Hidden states, grouped by length in the order of ``lengths``.
    row_lengths : numpy.ndarray of shape (len(lengths) * n_per_length,), int64
        The sequence length of each row.

    Raises
    ------
    TypeError
        Non-integer lengths, counts or seed; a ``cache_dir`` that is not None, ``"auto"`` or a
        path; not a model; a ``progress`` that is not True, False or None.
    embgeom._hf.UnsupportedModelError (a TypeError and a ValueError)
        The wrong kind of model (see :func:`hidden_states`): no ``config``, an encoder-decoder
        model, no unembedding.
    ValueError
        Empty ``lengths``, a repeated length, an empty ``cache_dir`` or one that is a file (an
        ``$EMBGEOM_CACHE`` that is a file with ``"auto"``, naming ``EMBGEOM_CACHE``), a length or count <= 0, a length above the model's maximum
        position, a negative seed; a model that is not causal (a masked LM); an architecture whose logits the adapter does not reproduce
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
    H, row_lengths, _ = _sample_with_provenance(model, lengths, n_per_length, batch_size, seed,
                                                cache_dir, progress)
    return H, row_lengths


def _sample_with_provenance(model, lengths, n_per_length, batch_size, seed, cache_dir,
                            progress) -> tuple[np.ndarray, np.ndarray, dict]:
    """:func:`sample_hidden_states` and where its result came from: ``{"cache": status,
    "path": the cache file or None, "why": why a cache file was not trusted or ""}``, the status
    one of ``"off"`` (no ``cache_dir``), ``"hit"`` (loaded), ``"written"`` (computed and
    cached), ``"rebuilt"`` (a cache file was not trusted: computed and rewritten) and
    ``"not written"`` (computed; the folder could not be written). The report records it."""
    hf, tokenizer, name, _ = _causal_lm(model)
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"lengths: expected a sequence of positive integers, got {type(lengths).__name__}")
    lengths = [check_positive_int(v, "lengths") for v in list(lengths)]
    if not lengths:
        raise ValueError("lengths: expected at least one sequence length, got none")
    repeated = sorted({v for v in lengths if lengths.count(v) > 1})
    if repeated:
        raise ValueError(f"lengths: expected distinct lengths, got {repeated} more than once (the "
                         "draws for a length depend only on seed and the length, so a repeat "
                         "would duplicate its hidden states exactly); raise n_per_length or use "
                         "another seed for more states")
    n = check_positive_int(n_per_length, "n_per_length")
    batch_size = check_positive_int(batch_size, "batch_size")
    seed = check_positive_int(seed, "seed", minimum=0)
    progress = _check_progress(progress)
    _check_positions(hf, max(lengths), "lengths", "the longest random token sequence")
    n_rows, d = _output_embeddings(hf).weight.shape
    vocab = min(len(tokenizer) if tokenizer is not None else _config_vocab(hf), n_rows)
    allowed = _allowed_token_ids(hf, tokenizer, vocab)
    row_lengths = np.repeat(np.asarray(lengths, dtype=np.int64), n)
    folder = _cache_folder(cache_dir)
    _check_model(hf)

    path = key = None
    why = ""
    if folder is not None:
        key = _cache_key(hf, allowed, lengths, n, seed)
        path = _cache_path(folder, name, key)
        if path.is_file():
            H, why = _load_cache(path, key, (row_lengths.size, int(d)))
            if H is not None:
                _log.info("hidden states from the cache %s", path)
                return H, row_lengths, {"cache": "hit", "path": str(path), "why": ""}

    from tqdm.auto import tqdm

    allowed_t = torch.from_numpy(allowed)
    H = np.empty((row_lengths.size, d), dtype=np.float32)
    row = 0
    with tqdm(total=row_lengths.size, desc=f"hidden states ({name})", unit="seq",
              leave=False, **tqdm_kwargs(progress)) as bar:
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
    if path is None:
        return H, row_lengths, {"cache": "off", "path": None, "why": ""}
    written = _save_cache(path, key, H)
    if written:
        _log.info("hidden states cached in %s", path)
    status = ("rebuilt" if why else "written") if written else "not written"
    return H, row_lengths, {"cache": status, "path": str(path), "why": why}
