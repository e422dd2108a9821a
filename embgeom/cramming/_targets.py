"""Cramming targets: the token pools, seeded target draws, and the target check."""

from __future__ import annotations

import hashlib

import numpy as np

from embgeom._hf import allowed_token_ids, input_embeddings, special_token_ids, unwrap, vocab_rows
from embgeom._validation import check_int_array, check_positive_int, seed_sequence

#: Word-boundary markers of the two common subword vocabularies: GPT-2 byte-level BPE ("Ġ",
#: U+0120, used by SmolLM2, Pythia, Qwen) and SentencePiece ("▁", U+2581, used by Llama-2, Gemma).
WORD_BOUNDARY_MARKERS = ("\u0120", "\u2581")

_TARGET_CHUNK = 64  # targets are drawn in chunks of this many tokens, so shorter ones are prefixes
_NEEDS_TOKENIZER = ("needs the model's tokenizer: pass a LoadedModel "
                    "(embgeom.adapters.load_model), or a model folder that holds its tokenizer "
                    "files")
_TAG_TARGET = 0  # seed-domain tags, so target draws and memory initialisations never share streams
_TAG_INIT = 1
_TAG_WORDS = 2

#: Words per chunk of a ``"wordlist"`` target (more chunks are drawn until the text is long
#: enough), and the size of the word list (the paper's GloVe list has 100k words).
_WORD_CHUNK = 64
WORDLIST_SIZE = 100_000


def english_wordlist(size: int = WORDLIST_SIZE) -> list:
    """The ``size`` most frequent English words of wordfreq's list, letters a-z only.

    The paper's "random text" (Meyer et al., ICML 2026, code ``cramming/``) draws random words
    from a 100k-word list (GloVe's vocabulary). GloVe does not install offline; wordfreq's
    frequency-ranked English list does (it ships inside the PyPI package ``wordfreq``): of its
    top 100,000 entries, 93,628 are made of the letters a-z alone, and those are the pool.

    Returns
    -------
    list of str

    Raises
    ------
    ImportError
        wordfreq is not installed (it is a dependency of embgeom).
    """
    import re

    import wordfreq

    size = check_positive_int(size, "size")
    return [w for w in wordfreq.top_n_list("en", size) if re.fullmatch(r"[a-z]+", w)]


def _wordlist_targets(tok, length: int, n_targets: int, seed, start: int) -> np.ndarray:
    """Random-word targets: words drawn uniformly from :func:`english_wordlist`, joined by
    single spaces, tokenised without special tokens, cut to ``length`` tokens. Target j's words
    come from ``seed_sequence(seed, 2, j, c)`` in chunks of 64, so a shorter target is a prefix
    of a longer one (byte-level BPE and SentencePiece pre-tokenise at the spaces)."""
    words = np.array(english_wordlist())
    out = np.empty((n_targets, length), np.int64)
    for r, j in enumerate(range(start, start + n_targets)):
        ids: list = []
        drawn: list = []
        c = 0
        while len(ids) <= length:  # one token more than needed: the cut never ends a partial word
            rng = np.random.default_rng(seed_sequence(seed, _TAG_WORDS, j, c))
            drawn.extend(words[rng.integers(0, words.size, _WORD_CHUNK)].tolist())
            ids = tok(" ".join(drawn), add_special_tokens=False)["input_ids"]
            c += 1
        out[r] = ids[:length]
    return out


def check_targets(targets, vocab: int) -> np.ndarray:
    """Targets as a C-contiguous int64 ``(B, n)`` array of token ids in ``[0, vocab)``.

    A 1-D array is one target. Raises TypeError (not integers) or ValueError (empty, wrong
    ndim, ids out of range) naming ``targets``.
    """
    _refuse_ragged(targets)
    arr = check_int_array(targets, "targets", ndim=(1, 2), low=0, high=vocab)
    return arr[None, :] if arr.ndim == 1 else arr


def _refuse_ragged(targets) -> None:
    """A list of rows of different lengths (``[[1, 2], [3]]``) is one error naming ``targets``,
    not numpy's "inhomogeneous shape" message from inside the array conversion."""
    if not isinstance(targets, (list, tuple)) or not targets:
        return
    rows = [t for t in targets if hasattr(t, "__len__") and not isinstance(t, (str, bytes))]
    if not rows:
        return
    if len(rows) != len(targets):
        raise ValueError("targets: expected a (B, n) array of token ids (rows of one length) or "
                         "one target, got a mix of rows and single ids")
    lengths = [len(t) for t in rows]
    if len(set(lengths)) > 1:
        raise ValueError(f"targets: expected targets of one common length (a (B, n) array), "
                         f"got rows of lengths {lengths[:8]}{' ...' if len(lengths) > 8 else ''};"
                         " cut them to a common length, or run each length separately")


def _token_pool(hf, tok, source: str) -> np.ndarray:
    """Token ids targets are drawn from (int64, sorted)."""
    rows = vocab_rows(hf)
    size = rows if tok is None else min(rows, len(tok))
    if source == "random-tokens":
        return allowed_token_ids(hf, tok, size)
    if source != "words":
        raise ValueError(
            f'target_source: expected "random-tokens", "words", "wordlist" or a list of texts, '
            f'got {source!r}'
        )
    if tok is None:
        raise ValueError('target_source: "words" ' + _NEEDS_TOKENIZER)
    special = special_token_ids(hf, tok)
    pieces = tok.convert_ids_to_tokens(list(range(size)))
    pool = np.array(
        [
            i
            for i, p in enumerate(pieces)
            if i not in special
            and isinstance(p, str)
            and len(p) >= 3
            and p[0] in WORD_BOUNDARY_MARKERS
            and p[1:].isascii()
            and p[1:].isalpha()
        ],
        np.int64,
    )
    if pool.size < 16:
        raise ValueError(
            'target_source: "words" found fewer than 16 word tokens (tokens starting with a '
            f"word-boundary marker {WORD_BOUNDARY_MARKERS}) in this tokenizer"
        )
    return pool


def sample_targets(model, length: int, n_targets: int, *, target_source="random-tokens", seed=0,
                   start: int = 0) -> np.ndarray:
    """Seeded targets for cramming.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    length : int
        Target length n (tokens).
    n_targets : int
        How many targets (rows), with indices ``start, ..., start + n_targets - 1``.
    target_source : {"random-tokens", "words", "wordlist"} or list of str, default "random-tokens"
        - ``"random-tokens"``: i.i.d. uniform over the vocabulary rows, special tokens excluded
          (the paper's "random text"; the special tokens are
          :func:`embgeom._hf.special_token_ids`: the tokenizer's, else the config's bos/eos/pad).
        - ``"words"``: i.i.d. uniform over *word tokens*: vocabulary entries made of a
          word-boundary marker ("Ġ" for byte-level BPE, "▁" for SentencePiece) followed by at
          least two ASCII letters, i.e. whole words that start with a space. A target is a
          sequence of random words (more text-like than random tokens, still incompressible).
        - ``"wordlist"``: the paper's "random text": random words from a 100k-word English list
          (:func:`english_wordlist`), joined by spaces, tokenised, cut to n tokens (needs the
          tokenizer).
        - a list of texts: tokenised without special tokens and concatenated, separated by a
          space, into one cyclic token stream; target j starts at the first token of text
          ``j mod len(texts)``.
    seed : seed, default 0
        Anything ``numpy.random.default_rng`` accepts; chunk ``c`` of target ``j`` draws from
        ``seed_sequence(seed, 0, j, c)`` (for an int: ``default_rng([seed, 0, j, c])``).
    start : int, default 0
        Index of the first target (targets are indexed, so a rerun can draw target j alone).

    Returns
    -------
    numpy.ndarray of int64, shape (n_targets, length)
        Target j of length n is the prefix of target j of any longer length (random sources draw
        in chunks of 64 tokens).

    Raises
    ------
    ValueError
        Unknown source, a source that needs a tokenizer without one, empty texts.
    """
    length = check_positive_int(length, "length")
    n_targets = check_positive_int(n_targets, "n_targets")
    start = check_positive_int(start, "start", minimum=0)
    hf, tok, _, _ = unwrap(model)
    if target_source == "wordlist":
        input_embeddings(hf)
        if tok is None:
            raise ValueError('target_source: "wordlist" ' + _NEEDS_TOKENIZER)
        return _wordlist_targets(tok, length, n_targets, seed, start)
    if isinstance(target_source, str):
        input_embeddings(hf)  # a clear error for a model without input embeddings
        pool = _token_pool(hf, tok, target_source)
        out = np.empty((n_targets, length), np.int64)
        n_chunks = -(-length // _TARGET_CHUNK)
        for r, j in enumerate(range(start, start + n_targets)):
            draws = [
                np.random.default_rng(seed_sequence(seed, _TAG_TARGET, j, c)).integers(
                    0, pool.size, _TARGET_CHUNK)
                for c in range(n_chunks)
            ]
            out[r] = pool[np.concatenate(draws)[:length]]
        return out
    texts = list(target_source)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError("target_source: expected a non-empty list of non-empty texts")
    if tok is None:
        raise ValueError("target_source: a list of texts " + _NEEDS_TOKENIZER)
    pieces = [tok(t if i == 0 else " " + t, add_special_tokens=False)["input_ids"]
              for i, t in enumerate(texts)]
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    stream = np.array([i for p in pieces for i in p], np.int64)
    if stream.size == 0:
        raise ValueError("target_source: the texts tokenise to nothing")
    out = np.empty((n_targets, length), np.int64)
    for r, j in enumerate(range(start, start + n_targets)):
        s0 = starts[j % len(texts)]
        out[r] = stream[(s0 + np.arange(length)) % stream.size]
    return out


def source_descriptor(target_source) -> str:
    """The target source as recorded in the settings (a list of texts by count and digest)."""
    if isinstance(target_source, str):
        return target_source
    h = hashlib.sha256("\x1e".join(target_source).encode()).hexdigest()[:16]
    return f"texts:{len(target_source)}:{h}"
