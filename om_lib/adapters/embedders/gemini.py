"""`Embedder` on Gemini's embedding API (`batchEmbedContents`) through the google-genai client.

Reuses a `GeminiLanguageModel`'s client (the same key, key rotation, base URL and error table). Vectors are asked for
with a reduced `output_dimensionality` (256 by default: gemini-embedding-001 is trained so that a prefix of its 3,072
dimensions is itself a good embedding) and are normalised here, since only the full size comes back normalised.
One call embeds up to `BATCH` texts; longer lists take several calls within the same timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from om_lib.adapters.models.gemini import GeminiLanguageModel, _map_errors, _sdk
from om_lib.adapters.models.provider_calls import embedding_batches
from om_lib.errors import ModelOutputError
from om_lib.ports import EmbeddingKind
from om_lib.vectors import normalise

DEFAULT_EMBEDDING_MODEL = 'gemini-embedding-001'
DEFAULT_DIMENSIONS = 256
BATCH = 100
# Gemini embeds at most 2,048 tokens per text; a message longer than this many characters is cut (its start is what
# a search needs to find it; recall then shows it whole).
MAX_CHARS = 6000
_TASK_TYPES = {'document': 'RETRIEVAL_DOCUMENT', 'query': 'RETRIEVAL_QUERY'}


class GeminiEmbedder:
    """Embeddings from a Gemini embedding model (`google/<model>`), `dimensions` long."""

    def __init__(
        self,
        gemini: GeminiLanguageModel,
        *,
        model_id: str = DEFAULT_EMBEDDING_MODEL,
        dimensions: int = DEFAULT_DIMENSIONS,
    ) -> None:
        self.gemini = gemini
        self.model_id = model_id
        self.dimensions = dimensions
        self.name = f'google/{model_id}@{dimensions}'

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One normalised vector per text (see `Embedder.embed`)."""
        if not texts:
            return []
        deadline = time.monotonic() + timeout_s
        sdk = _sdk()
        client = self.gemini.client()
        out: list[list[float]] = []
        for batch, left in embedding_batches(
            texts, size=BATCH, max_chars=MAX_CHARS, deadline=deadline, model_name=self.model_id
        ):
            config = sdk.types.EmbedContentConfig(
                task_type=_TASK_TYPES[kind],
                output_dimensionality=self.dimensions,
                http_options=sdk.types.HttpOptions(
                    timeout=max(1, math.ceil(left * 1000)), retry_options=sdk.types.HttpRetryOptions(attempts=1)
                ),
            )
            with _map_errors(sdk, self.model_id):
                # The SDK's `contents` union changes with the optional packages installed (Pillow adds its Image).
                contents: list[Any] = list(batch)
                response = client.models.embed_content(model=self.model_id, contents=contents, config=config)
            embeddings = response.embeddings or []
            if len(embeddings) != len(batch) or any(not e.values for e in embeddings):
                raise ModelOutputError(
                    f'{self.model_id} returned {len(embeddings)} embeddings for {len(batch)} texts', model=self.model_id
                )
            out.extend(normalise(list(e.values or [])) for e in embeddings)
        return out
