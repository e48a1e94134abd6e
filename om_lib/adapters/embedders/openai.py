"""`Embedder` on an OpenAI-compatible embeddings endpoint (`openai/text-embedding-3-small` and gateways' models).

Shares an `OpenAILanguageModel`'s client (key, key rotation, base URL, retries off, the error table). The
`text-embedding-3` models are asked for `dimensions` (they are trained so that a shorter vector is still a good one);
other models return their own size, which must then be what `OM_EMBEDDING_DIMENSIONS` says. Vectors are normalised
here. One request embeds up to `BATCH` texts; longer lists take several within the same timeout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from om_lib.adapters.models.openai import OpenAILanguageModel, _sdk, map_openai_errors
from om_lib.adapters.models.provider_calls import embedding_batches
from om_lib.errors import ModelOutputError
from om_lib.ports import EmbeddingKind
from om_lib.vectors import normalise

BATCH = 100
# text-embedding-3 takes 8,191 tokens per input; a message's start is what a search needs to find it.
MAX_CHARS = 8000


class OpenAIEmbedder:
    """Normalised embeddings from an OpenAI-compatible model, `dimensions` long."""

    def __init__(self, openai: OpenAILanguageModel, *, model_id: str, dimensions: int) -> None:
        self.openai = openai
        self.model_id = model_id
        self.dimensions = dimensions
        # Only the text-embedding-3 family takes `dimensions`; older models and most gateways refuse the field.
        self.sends_dimensions = model_id.startswith('text-embedding-3')
        self.name = f'openai/{model_id}@{dimensions}'

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One normalised vector per text (see `Embedder.embed`); OpenAI models have no query/document distinction."""
        if not texts:
            return []
        deadline = time.monotonic() + timeout_s
        sdk = _sdk()
        client = self.openai.client()
        out: list[list[float]] = []
        batches = embedding_batches(
            texts, size=BATCH, max_chars=MAX_CHARS, deadline=deadline, model_name=f'openai/{self.model_id}'
        )
        for batch, left in batches:
            # float: what every compatible gateway returns (the client would otherwise ask for base64).
            request: dict[str, Any] = {'model': self.model_id, 'input': batch, 'encoding_format': 'float'}
            if self.sends_dimensions:
                request['dimensions'] = self.dimensions
            with map_openai_errors(sdk, self.model_id):
                response = client.embeddings.create(**request, timeout=left)
            vectors = [item.embedding for item in sorted(response.data, key=lambda item: item.index)]
            if len(vectors) != len(batch):
                raise ModelOutputError(
                    f'openai/{self.model_id} returned {len(vectors)} embeddings for {len(batch)} texts',
                    model=self.model_id,
                )
            for vector in vectors:
                if len(vector) != self.dimensions:
                    raise ModelOutputError(
                        f'openai/{self.model_id} returned {len(vector)} values, expected {self.dimensions}: set '
                        f'OM_EMBEDDING_DIMENSIONS={len(vector)} for this model',
                        model=self.model_id,
                    )
            out.extend(normalise([float(value) for value in vector]) for vector in vectors)
        return out
