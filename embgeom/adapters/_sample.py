"""Hidden-state sampling (the paper's protocol) and its cache on disk.

Imports :mod:`._forward` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

from .._hf import allowed_token_ids as _allowed_token_ids
from .._hf import check_positions as _check_positions
from .._hf import config_vocab as _config_vocab
from .._hf import output_embeddings as _output_embeddings
from .._validation import check_positive_int, seed_sequence
from ._forward import _causal_lm, _check_model, _hidden

__all__ = ["sample_hidden_states"]


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
    embgeom._hf.UnsupportedModelError (a TypeError and a ValueError)
        The wrong kind of model (see :func:`hidden_states`): no ``config``, an encoder-decoder
        model, no unembedding.
    ValueError
        Empty ``lengths``, a length or count <= 0, a length above the model's maximum
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
    hf, tokenizer, name, _ = _causal_lm(model)
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
