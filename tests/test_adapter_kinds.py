"""The wrong kind of model, given to every adapter entry point: one clear error naming ``model``.

Issue 21, the CLI/bad-input kind: a non-causal model reached a raw ``AttributeError`` in
``embgeom/_hf.py``. Each kind below (a bidirectional encoder with a head, a base model without
an unembedding, a classifier, an encoder-decoder, a plain ``nn.Module``, a module with a head but
no config) must give a ``TypeError`` or ``ValueError`` whose message starts with ``model:``,
names the model's class and says what is expected (a causal LM with an unembedding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embgeom import _hf
from embgeom.adapters import (
    hidden_states,
    input_embedding_scale,
    logits,
    sample_hidden_states,
    unembedding,
)

transformers = pytest.importorskip("transformers")

VOCAB, D = 64, 16
IDS = np.array([[3, 5, 7, 9]])


def _bert_config():
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=32)


def _t5_config():
    return transformers.T5Config(vocab_size=VOCAB, d_model=D, d_kv=8, d_ff=32, num_layers=1,
                                 num_heads=2)


class _HeadNoConfig(torch.nn.Module):
    """Embeddings and a head with the transformers getters, but no config."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.head = torch.nn.Linear(D, VOCAB)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


def _build(kind):
    torch.manual_seed(0)
    return {
        "masked_lm": lambda: transformers.BertForMaskedLM(_bert_config()),
        "encoder_base": lambda: transformers.BertModel(_bert_config()),
        "classifier": lambda: transformers.BertForSequenceClassification(_bert_config()),
        "decoder_base": lambda: transformers.GPT2Model(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=D, n_layer=1, n_head=2, n_positions=32)),
        "encoder_decoder": lambda: transformers.T5ForConditionalGeneration(_t5_config()),
        "encoder_decoder_base": lambda: transformers.T5Model(_t5_config()),
        "plain_module": lambda: torch.nn.Linear(D, VOCAB),
        "head_no_config": _HeadNoConfig,
    }[kind]().eval()


# kind -> (what the message must say, whether input_embedding_scale refuses it too)
KINDS = {
    "masked_lm": ("is not a causal language model", False),
    "encoder_base": ("has no unembedding", False),
    "classifier": ("has no unembedding", False),
    "decoder_base": ("has no unembedding", False),
    "encoder_decoder": ("is an encoder-decoder model", True),
    "encoder_decoder_base": ("is an encoder-decoder model", True),
    "plain_module": ("has no config", True),
    "head_no_config": ("has no config", True),
}

CALLS = {
    "unembedding": lambda m: unembedding(m),
    "hidden_states": lambda m: hidden_states(m, IDS),
    "logits": lambda m: logits(m, IDS),
    "sample_hidden_states": lambda m: sample_hidden_states(m, [3], 2, progress=False),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_wrong_kind_of_model_is_one_clear_error(kind, call):
    model = _build(kind)
    why, _ = KINDS[kind]
    with pytest.raises((TypeError, ValueError)) as info:
        CALLS[call](model)
    assert not isinstance(info.value, AttributeError)
    msg = str(info.value)
    assert msg.startswith("model: ") and type(model).__name__ in msg, msg
    assert why in msg, msg
    assert "causal" in msg, msg  # says what is expected


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_input_embedding_scale_refuses_a_model_without_config_or_an_encoder_decoder(kind):
    model = _build(kind)
    why, refused = KINDS[kind]
    if not refused:  # an encoder's input embeddings have a scale: it is well defined
        assert input_embedding_scale(model) > 0
        return
    with pytest.raises((TypeError, ValueError), match=f"^model: {type(model).__name__} .*{why}"):
        input_embedding_scale(model)


def test_the_wrapped_model_is_checked_too():
    """A LoadedModel-like wrapper of a masked LM: the same refusal as the bare model."""
    from types import SimpleNamespace

    wrapped = SimpleNamespace(model=_build("masked_lm"), tokenizer=None, name="bert-tiny")
    with pytest.raises(ValueError, match="not a causal language model"):
        unembedding(wrapped)


def test_a_bert_decoder_passes_the_causality_probe():
    """``is_decoder=True`` makes BERT causal: the probe lets it through to the head check, which
    refuses its transform head for another reason (named)."""
    torch.manual_seed(0)
    cfg = _bert_config()
    cfg.is_decoder = True
    model = transformers.BertLMHeadModel(cfg).eval()
    with pytest.raises(ValueError) as info:
        unembedding(model)
    assert "not a causal" not in str(info.value)
    assert "differs from the model's own logits" in str(info.value)
    assert logits(model, IDS).shape == (1, VOCAB)  # its own logits: a causal model's


@pytest.mark.parametrize("helper", [
    lambda m: _hf.config_vocab(m),
    lambda m: _hf.max_positions(m),
    lambda m: _hf.check_positions(m, 4, "lengths"),
])
def test_hf_helpers_name_a_missing_config(helper):
    """The _hf helpers that read the config: one clear error for a module without one (they
    raised AttributeError: 'Linear' object has no attribute 'config')."""
    with pytest.raises(_hf.UnsupportedModelError, match="^model: Linear has no config"):
        helper(torch.nn.Linear(2, 2))


def test_hf_config_vocab_refuses_a_missing_vocab_size():
    from types import SimpleNamespace

    m = torch.nn.Linear(2, 2)
    m.config = SimpleNamespace(vocab_size=None)
    with pytest.raises(_hf.UnsupportedModelError, match="vocab_size = None"):
        _hf.config_vocab(m)
