"""The logits must be the model's own, for every architecture the adapter accepts (issue 12, kind 3).

For each architecture below, a tiny random causal LM is built from its transformers config class
(hidden size 32, 2 layers, vocabulary 96, no download). Either the adapter reproduces the model's
own last-position logits, ``Unembedding.logits(hidden_states(model, ids, mask))``, with and
without left/right padding, and the greedy tokens agree; or :func:`unembedding` and
:func:`hidden_states` refuse the model with a ValueError that names the architecture.

The architectures tested are a representative set (``ACCEPTED`` and ``REFUSED``): every head
convention the adapter models (plain ``W h``, output bias, Cohere's ``logit_scale``, Granite's and
MiniCPM3's ``logits_scaling``, Gemma-2's soft-cap), every position scheme (RoPE, learned
absolute positions, ALiBi, sinusoidal, none: SSMs), and the known ways to fail (a transform head,
a projection after the final norm, a final norm of an unknown convention). The other
architectures in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` are covered by the refusal rule, which
is not a list but a check: :func:`unembedding` and :func:`hidden_states` compare the adapter's
formula with the model's own logits on a probe batch and refuse a model that fails
(``test_refusal_rule_*``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embgeom import adapters
from embgeom.adapters import hidden_states, logits, unembedding

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

VOCAB, D = 96, 32
TINY = dict(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, head_dim=8, max_position_embeddings=64,
            num_local_experts=4, num_experts_per_tok=2, initializer_range=0.2, pad_token_id=0)

# model_type -> config overrides beyond TINY (values that make the head convention visible)
ACCEPTED = {
    "llama": {},
    "mistral": {},
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {},
    "gemma": {},
    "gemma2": {"final_logit_softcapping": 3.0},
    "gemma3_text": {"final_logit_softcapping": 3.0, "sliding_window": 4},
    "cohere": {"logit_scale": 0.0625},
    "cohere2": {"logit_scale": 0.25},
    "granite": {"logits_scaling": 8.0},
    "minicpm3": {"logits_scaling": 4.0, "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
                 "v_head_dim": 8, "kv_lora_rank": 8, "q_lora_rank": 8},
    "gpt2": {},
    "gpt_neox": {},
    "opt": {},
    "bloom": {},
    "falcon": {},
    "mpt": {},
    "phi": {},
    "stablelm": {},
    "starcoder2": {},
    "gpt_bigcode": {},
    "xglm": {},
    "biogpt": {},
    "openai-gpt": {},
    "ctrl": {},
    "bart": {},
    "mixtral": {},
    "olmo2": {},
    "nemotron": {},
    "persimmon": {},
    "mamba": {},
    "rwkv": {},
    "nanochat": {"final_logit_softcapping": 3.0},  # a weightless RMSNorm: width from the head
}

# model_type -> what the refusal must say (besides the architecture's class name)
_ENCODER_FAMILIES = ("bert", "roberta", "rembert")  # bidirectional unless is_decoder=True
REFUSED = {
    "bert": "differs from the model's own logits",  # dense + GELU + LayerNorm transform head
    "roberta": "differs from the model's own logits",
    "olmo": "OlmoLayerNorm",  # a LayerNorm without a stored epsilon
    "rembert": "dimension 1664",  # the head projects the hidden state up before W
    "llama4_text": "base transformer",  # no base_model attribute to read hidden states from
}


def _tiny(model_type: str, overrides: dict):
    cfg_cls = CONFIG_MAPPING[model_type]
    fields = set(getattr(cfg_cls, "__dataclass_fields__", {})) | set(getattr(cfg_cls, "attribute_map", {}))
    kw = {k: v for k, v in {**TINY, **overrides}.items() if k in fields}
    cfg = cfg_cls(**kw)
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random nonzero norm gains and biases: a wrong convention shows
        for mod in model.modules():
            if "norm" in type(mod).__name__.lower():
                if isinstance(getattr(mod, "weight", None), torch.Tensor):
                    mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) * 1.5 - 0.5)
                if isinstance(getattr(mod, "bias", None), torch.Tensor):
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=gen) * 0.3)
    return model


def _own_last_logits(model, ids):
    """The model's own forward pass on unpadded ids, logits at the last position (float64)."""
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids), use_cache=False).logits[:, -1].double().numpy()


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("model_type", sorted(ACCEPTED))
def test_adapter_reproduces_the_models_own_logits(model_type):
    model = _tiny(model_type, ACCEPTED[model_type])
    u = unembedding(model)
    ids = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))

    # unpadded: the adapter's formula equals the model's logits, and the greedy tokens agree
    z_own = _own_last_logits(model, ids)
    z = u.logits(hidden_states(model, ids))
    assert _rel_err(z, z_own) <= 1e-4
    np.testing.assert_array_equal(z.argmax(1), z_own.argmax(1))

    # padded: row 0 left-padded by 4 (mask [0, 0, 0, 0, 1, ...]), row 1 left-padded by 2,
    # row 2 right-padded by 2; each row must give the logits of its unpadded sequence
    spans = [(4, 7), (2, 7), (0, 5)]
    mask = torch.zeros_like(ids)
    padded = torch.zeros_like(ids)
    for i, (a, b) in enumerate(spans):
        mask[i, a:b] = 1
        padded[i, a:b] = ids[i, a:b]
    ref = np.concatenate([_own_last_logits(model, ids[i:i + 1, a:b]) for i, (a, b) in enumerate(spans)])
    z_pad = u.logits(hidden_states(model, padded, mask))
    assert _rel_err(z_pad, ref) <= 1e-4
    np.testing.assert_array_equal(z_pad.argmax(1), ref.argmax(1))
    assert _rel_err(logits(model, padded, mask), ref) <= 1e-4  # the model's own, via the adapter


def test_logit_scale_and_softcap_are_recorded():
    cohere = unembedding(_tiny("cohere", ACCEPTED["cohere"]))
    assert cohere.logit_scale == 0.0625 and cohere.logit_softcap is None
    assert cohere.to_dict()["logit_scale"] == 0.0625
    granite = unembedding(_tiny("granite", ACCEPTED["granite"]))
    assert granite.logit_scale == 1 / 8
    gemma2 = unembedding(_tiny("gemma2", ACCEPTED["gemma2"]))
    assert gemma2.logit_scale == 1.0 and gemma2.logit_softcap == 3.0
    # the effective map (s W, s b) gives the logits before soft-capping: margins in nats
    H = np.random.default_rng(0).standard_normal((5, D)).astype(np.float32)
    W, b = cohere.effective_weight_bias()
    np.testing.assert_allclose(H @ W.T, cohere.logits(H), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cohere.logits(H), 0.0625 * (H @ cohere.weight.T), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_adapter_refuses_what_it_cannot_reproduce(model_type):
    # BERT-like heads are causal only as decoders (is_decoder=True); otherwise the earlier
    # refusal, "not a causal language model", comes first (tests/test_adapter_kinds.py)
    model = _tiny(model_type, {"is_decoder": True} if model_type in _ENCODER_FAMILIES else {})
    arch = type(model).__name__
    for call in (lambda: unembedding(model), lambda: hidden_states(model, [[1, 2, 3]])):
        with pytest.raises(ValueError, match=arch) as info:
            call()
        assert REFUSED[model_type] in str(info.value)


def test_refused_transform_head_really_differs():
    """The refusal of BERT is justified: W h + b from the base model's last hidden state is not
    the model's logits (its head applies dense + GELU + LayerNorm first)."""
    model = _tiny("bert", {"is_decoder": True})
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        h = model.base_model(input_ids=ids).last_hidden_state[:, -1].double()
        out = model.get_output_embeddings()
        z = (h @ out.weight.double().T + out.bias.double()).numpy()
    assert _rel_err(z, _own_last_logits(model, ids)) > 0.1


def test_refusal_rule_unknown_logit_convention():
    """A model that scales its logits in a way no config attribute declares is refused by name."""
    model = _tiny("llama", {})
    real = model.forward

    def scaled_forward(*args, **kwargs):
        out = real(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out

    model.forward = scaled_forward
    with pytest.raises(ValueError, match=r"LlamaForCausalLM \(model_type 'llama'\).*differs"):
        unembedding(model)
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        hidden_states(model, [[1, 2, 3]])


def test_refusal_rule_projection_after_final_norm():
    """OPT with ``word_embed_proj_dim < hidden_size`` projects after its final norm: the logits
    are reproducible but the final-norm facts would describe the wrong vector, so it is refused."""
    model = _tiny("opt", {"word_embed_proj_dim": 16})
    assert model.model.decoder.project_out is not None
    with pytest.raises(ValueError, match="OPTForCausalLM.*final norm"):
        unembedding(model)


def test_refusal_rule_swapped_head_is_rechecked():
    """The check is cached per model object but keyed by the head: a replaced head is rechecked."""
    model = _tiny("llama", {})
    assert unembedding(model).bias is None
    model.lm_head = torch.nn.Linear(D, VOCAB, bias=True)  # plain W h + b: still reproduced
    with torch.no_grad():
        model.lm_head.bias.copy_(torch.randn(VOCAB, generator=torch.Generator().manual_seed(4)))
    u = unembedding(model)
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    assert u.bias is not None and _rel_err(u.logits(hidden_states(model, ids)), _own_last_logits(model, ids)) <= 1e-4
    model.lm_head = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(D, VOCAB))
    model.get_output_embeddings = lambda: model.lm_head[1]
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        unembedding(model)


def test_non_positive_logit_scale_is_refused():
    model = _tiny("cohere", {"logit_scale": 0.0625})
    model.config.logit_scale = -1.0
    with pytest.raises(ValueError, match=r"CohereForCausalLM.*logit_scale = -1\.0"):
        unembedding(model)


def test_every_listed_architecture_is_a_causal_lm():
    """The representative sets name real entries of transformers' causal-LM mapping (a renamed
    or removed architecture shows here, not as a silently shorter test)."""
    missing = sorted((set(ACCEPTED) | set(REFUSED)) - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    assert not missing, missing
    assert len(ACCEPTED) + len(REFUSED) >= 25
