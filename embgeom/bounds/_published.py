"""Published numbers from the paper (docs/paper.md, "The published table"): empirical slopes, sizes, rates."""

from __future__ import annotations

__all__ = ["PUBLISHED"]

#: Published numbers (docs/paper.md, from the paper): empirical slope ``c_emp`` (tokens per prompt
#: vector, random text), hidden size ``d``, vocabulary size ``vocab_size``, and the paper's
#: non-uniform-cell rate ``rate_lambda`` (nats per token) where it was given.
PUBLISHED: dict[str, dict] = {
    "pythia-160m": {"c_emp": 90.4, "d": 768, "vocab_size": 50304, "rate_lambda": 12.87},
    "pythia-410m": {"c_emp": 112.4, "d": 1024, "vocab_size": 50304, "rate_lambda": None},
    "pythia-1b": {"c_emp": 287.4, "d": 2048, "vocab_size": 50304, "rate_lambda": None},
    "pythia-1.4b": {"c_emp": 261.4, "d": 2048, "vocab_size": 50304, "rate_lambda": None},
    "pythia-2.8b": {"c_emp": 197.9, "d": 2560, "vocab_size": 50304, "rate_lambda": None},
    "pythia-6.9b": {"c_emp": 283.55, "d": 4096, "vocab_size": 50304, "rate_lambda": None},
    "qwen2.5-0.5b": {"c_emp": 71.0, "d": 896, "vocab_size": 151936, "rate_lambda": 16.50},
    "qwen2.5-1.5b": {"c_emp": 79.6, "d": 1536, "vocab_size": 151936, "rate_lambda": None},
    "llama-3.2-1b": {"c_emp": 137.8, "d": 2048, "vocab_size": 128256, "rate_lambda": 15.79},
    "gemma-3-270m": {"c_emp": 44.54, "d": 640, "vocab_size": 262144, "rate_lambda": None},
}

#: Significant bits (mantissa + implicit bit) of the float formats.
