"""The torch adapter: a Hugging Face causal LM -> its unembedding and its hidden states.

This is the only geometry-facing package that imports torch. It turns a model into the numpy
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

One module per job, imports going one way (``_load``; ``_head`` <- ``_forward`` <-
``_unembedding``; ``_forward`` <- ``_sample``), all model access through :mod:`embgeom._hf`:

- ``_load``: the registry of offline models, :class:`LoadedModel`, :func:`load_model`;
- ``_head``: what sits between the last hidden state and the logits (:class:`FinalNorm`, the
  logit scale, the soft-cap), read from the model and checked by running its modules;
- ``_forward``: :func:`hidden_states`, :func:`logits` and the once-per-model check that
  ``s * (W h + b)`` gives the model's own logits;
- ``_unembedding``: :class:`Unembedding`, :func:`unembedding`, :func:`input_embedding_scale`;
- ``_sample``: :func:`sample_hidden_states` and its cache on disk.
"""

from ._load import MODEL_REGISTRY, LoadedModel, load_model
from ._head import FinalNorm
from ._forward import hidden_states, logits
from ._unembedding import Unembedding, input_embedding_scale, unembedding
from ._sample import default_cache_dir, sample_hidden_states

__all__ = [
    "FinalNorm",
    "LoadedModel",
    "MODEL_REGISTRY",
    "Unembedding",
    "default_cache_dir",
    "hidden_states",
    "input_embedding_scale",
    "load_model",
    "logits",
    "sample_hidden_states",
    "unembedding",
]
