"""`Embedder` on Amazon Titan text embeddings (`bedrock/amazon.titan-embed-text-v2:0`) through InvokeModel.

Shares a `BedrockLanguageModel`'s client (credentials, endpoint, retries off, per-request timeouts, the error table).
Titan embeds one text per request, so a batch runs a few requests at once on the client's connection pool, all within
the one timeout. v2 is asked for `dimensions` (256, 512 or 1024) with `normalize`; v1 always returns 1536.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from om_lib.adapters.models.bedrock import READ_TIMEOUT_PARAM, BedrockLanguageModel, map_bedrock_errors
from om_lib.adapters.models.provider_calls import embedding_text, time_left
from om_lib.errors import ModelOutputError
from om_lib.ports import EmbeddingKind
from om_lib.vectors import normalise

# model id (geography prefix removed) → the dimensions it can return.
TITAN_DIMENSIONS: dict[str, tuple[int, ...]] = {
    'amazon.titan-embed-text-v2:0': (256, 512, 1024),
    'amazon.titan-embed-text-v1': (1536,),
}
# Requests in flight at once for one batch (botocore's pool holds 10 connections).
PARALLEL_REQUESTS = 8
# Titan v2 takes up to 8,192 tokens (50,000 characters); a message's start is what a search needs to find it.
MAX_CHARS = 8000


def check_titan_model(model_id: str, dimensions: int) -> None:
    """Refuse, at start-up, a Bedrock embedding model or size this embedder cannot produce.

    Raises:
        ValueError: Not a Titan text embedding model, or a size it does not return; the message says what would do.
    """
    sizes = TITAN_DIMENSIONS.get(model_id)
    if sizes is None:
        raise ValueError(
            f'OM_EMBEDDING_MODEL=bedrock/{model_id}: Bedrock embeddings support '
            + ', '.join(f'bedrock/{m}' for m in TITAN_DIMENSIONS)
        )
    if dimensions not in sizes:
        raise ValueError(
            f'OM_EMBEDDING_DIMENSIONS={dimensions} is not a size bedrock/{model_id} returns; use one of '
            + ', '.join(str(size) for size in sizes)
        )


class BedrockEmbedder:
    """Normalised Titan text embeddings, `dimensions` long (see `check_titan_model` for the sizes)."""

    def __init__(self, bedrock: BedrockLanguageModel, *, model_id: str, dimensions: int) -> None:
        """Raises ValueError for a model or size Titan does not offer (the wiring calls this at start-up)."""
        check_titan_model(model_id, dimensions)
        self.bedrock = bedrock
        self.model_id = model_id
        self.dimensions = dimensions
        self.name = f'bedrock/{model_id}@{dimensions}'

    def embed(self, texts: Sequence[str], *, kind: EmbeddingKind, timeout_s: float) -> list[list[float]]:
        """One normalised vector per text (see `Embedder.embed`). Titan has no query/document distinction."""
        if not texts:
            return []
        deadline = time.monotonic() + timeout_s
        client = self.bedrock.client()
        if len(texts) == 1:
            return [self._one(client, texts[0], deadline)]
        with ThreadPoolExecutor(max_workers=min(PARALLEL_REQUESTS, len(texts)), thread_name_prefix='titan') as pool:
            return list(pool.map(lambda text: self._one(client, text, deadline), texts))

    def _one(self, client: Any, text: str, deadline: float) -> list[float]:
        left = time_left(deadline, f'bedrock/{self.model_id}')
        body: dict[str, Any] = {'inputText': embedding_text(text, MAX_CHARS)}
        if self.model_id != 'amazon.titan-embed-text-v1':
            body |= {'dimensions': self.dimensions, 'normalize': True}
        with map_bedrock_errors(self.model_id, self.bedrock.region):
            response = client.invoke_model(
                modelId=self.model_id,
                body=json.dumps(body),
                contentType='application/json',
                accept='application/json',
                **{READ_TIMEOUT_PARAM: left},
            )
            payload = json.loads(response['body'].read())
        vector = payload.get('embedding') if isinstance(payload, dict) else None
        if not isinstance(vector, list) or len(vector) != self.dimensions:
            size = len(vector) if isinstance(vector, list) else 'no'
            raise ModelOutputError(
                f'bedrock/{self.model_id} returned {size} values, expected {self.dimensions}', model=self.model_id
            )
        return normalise([float(value) for value in vector])
