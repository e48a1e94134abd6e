"""Semantic search (om_lib/history/semantic.py, om_lib/vectors.py): indexing, scope, recall's search mode,
vectorSearchString, semantic recall context and erase, over the in-memory store and index with the hashing embedder
(keywords only)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from om_lib import vectors as vec
from om_lib.adapters.memory.store import InMemoryStore
from om_lib.adapters.memory.vectors import InMemoryVectorIndex
from om_lib.config import SemanticRecallSettings
from om_lib.context.tokens import TokenCounter
from om_lib.errors import InvalidInputError
from om_lib.history import history
from om_lib.history.recall import RecallRequest, recall, recall_tool, step_tools
from om_lib.history.semantic import SemanticMemory, embed_job, embedding_text, format_recalled
from om_lib.messages import Message
from om_lib.models.embedders import HashingEmbedder
from om_lib.work import CollectingWork, Job

RES, OTHER_RES = 'r1', 'r2'
T0 = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


COUNTER = TokenCounter(WordTokenizer())


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(64)
        self.calls: list[tuple[str, int]] = []

    def embed(self, texts: Any, *, kind: Any, timeout_s: float) -> list[list[float]]:
        self.calls.append((kind, len(texts)))
        return super().embed(texts, kind=kind, timeout_s=timeout_s)


def msg(mid: str, minute: int, text: str, role: str = 'user') -> Message:
    return Message.model_validate(
        {'id': mid, 'role': role, 'createdAt': T0 + timedelta(minutes=minute), 'content': text}
    )


TRIP = [
    msg('t1', 0, 'I am planning a trip to Lisbon in May'),
    msg('t2', 1, 'Lisbon in May is lovely, book the tram tour early', 'assistant'),
    msg('t3', 2, 'What about the pastel de nata bakeries there?'),
    msg('t4', 3, 'Try the bakery in Belem for pastel de nata', 'assistant'),
]
GARDEN = [
    msg('g1', 10, 'My tomato plants have yellow leaves'),
    msg('g2', 11, 'Yellow leaves on tomato plants often mean overwatering', 'assistant'),
]


@pytest.fixture
def store() -> InMemoryStore:
    s = InMemoryStore()
    s.append_messages(RES, 'trip', TRIP, now=T0)
    s.append_messages(RES, 'garden', GARDEN, now=T0)
    s.append_messages(OTHER_RES, 'secret', [msg('s1', 0, 'my tomato plants and my Lisbon bank pin 1234')], now=T0)
    return s


@pytest.fixture
def semantic(store: InMemoryStore) -> SemanticMemory:
    memory = SemanticMemory(store, InMemoryVectorIndex(), CountingEmbedder())
    for resource, thread in ((RES, 'trip'), (RES, 'garden'), (OTHER_RES, 'secret')):
        memory.index_thread(resource, thread)
    return memory


# -- vectors -----------------------------------------------------------------------------------------------------
def test_quantised_vectors_round_trip_and_score_like_cosine() -> None:
    rng = random.Random(7)
    raw = [[rng.gauss(0, 1) for _ in range(256)] for _ in range(50)]
    packed = [vec.quantise(f'm{i}', i + 1, v) for i, v in enumerate(raw)]
    back = list(vec.unpack(vec.pack(packed), 256))
    assert [(e.message_id, e.seq) for e in back] == [(f'm{i}', i + 1) for i in range(50)]
    query = raw[3]
    exact = sorted(
        (
            (sum(a * b for a, b in zip(vec.normalise(query), vec.normalise(v), strict=True)), i)
            for i, v in enumerate(raw)
        ),
        reverse=True,
    )
    best = vec.top_k(query, [('t', e) for e in back], 5)
    assert best[0][2].message_id == 'm3' and best[0][0] == pytest.approx(1.0, abs=0.01)
    for (score, _, entry), (cosine, i) in zip(best, exact[:5], strict=True):
        assert entry.message_id == f'm{i}'
        assert score == pytest.approx(cosine, abs=0.01)
    assert len(vec.pack(packed[:1])) == vec.packed_size('m0', 256) == 256 + 10 + 2


def test_int8_dot_products_are_exact() -> None:
    from array import array
    from operator import mul

    rng = random.Random(11)
    for dims in (1, 8, 256, 384):
        rows = [array('b', (rng.randint(-128, 127) for _ in range(dims))) for _ in range(300)]
        query = array('b', (rng.randint(-127, 127) for _ in range(dims)))
        assert vec.int8_dot_products(query, rows) == [sum(map(mul, query, row)) for row in rows]
    extreme = [array('b', [127] * 3072), array('b', [-128] * 3072)]
    query = array('b', [-127] * 3072)
    assert vec.int8_dot_products(query, extreme) == [-127 * 127 * 3072, 127 * 128 * 3072]
    assert vec.int8_dot_products(query, []) == []


# -- indexing ----------------------------------------------------------------------------------------------------
def test_indexing_is_incremental_and_idempotent(store: InMemoryStore, semantic: SemanticMemory) -> None:
    embedder = semantic.embedder
    assert isinstance(embedder, CountingEmbedder)
    assert semantic.index.stats(RES)['vectors'] == 6
    embedder.calls.clear()
    assert semantic.index_thread(RES, 'trip') == 0
    assert embedder.calls == []  # nothing new: no embedding call
    store.append_messages(RES, 'trip', [msg('t5', 4, 'And a day trip to Sintra?')], now=T0)
    assert semantic.index_thread(RES, 'trip') == 1
    assert embedder.calls == [('document', 1)]
    assert semantic.index.indexed_through(RES, 'trip', space=semantic.space) == 5


def test_system_and_empty_messages_are_not_embedded_but_the_watermark_moves(store: InMemoryStore) -> None:
    memory = SemanticMemory(store, InMemoryVectorIndex(), HashingEmbedder(32))
    store.append_messages(RES, 'sys', [msg('x1', 0, 'You are terse', 'system')], now=T0)
    assert memory.index_thread(RES, 'sys') == 0
    assert memory.index.indexed_through(RES, 'sys', space=memory.space) == 1
    assert embedding_text(msg('x2', 0, 'You are terse', 'system')) == ''


def test_a_gone_thread_indexes_nothing_and_loses_its_vectors(store: InMemoryStore, semantic: SemanticMemory) -> None:
    store.delete_thread(RES, 'garden')
    assert semantic.index_thread(RES, 'garden') == 0
    assert semantic.index.stats(RES)['vectors'] == 4


def test_schedule_submits_a_job_in_its_own_group_or_indexes_inline(store: InMemoryStore) -> None:
    work = CollectingWork()
    memory = SemanticMemory(store, InMemoryVectorIndex(), HashingEmbedder(32), work=work)
    memory.schedule(RES, 'trip')
    assert work.jobs == [embed_job(RES, 'trip')]
    job = work.jobs[0]
    assert job.kind == 'embed' and job.record_key == f'vec:{RES}/trip'
    assert Job.from_json(job.to_json()) == job
    assert memory.index.stats(RES)['vectors'] == 0
    memory.work = None
    memory.schedule(RES, 'trip')
    assert memory.index.stats(RES)['vectors'] == 4


# -- search and scope --------------------------------------------------------------------------------------------
def test_search_ranks_by_similarity_within_the_resource(semantic: SemanticMemory) -> None:
    results = semantic.search(RES, 'yellow tomato leaves', current_thread_id='trip', top_k=3)
    assert [r.message.id for r in results][:2] in (['g2', 'g1'], ['g1', 'g2'])
    assert all(r.message.thread_id in ('trip', 'garden') for r in results)
    assert results[0].score > results[-1].score


def test_search_never_leaves_the_callers_resource(semantic: SemanticMemory) -> None:
    results = semantic.search(RES, 'bank pin 1234', current_thread_id='trip', top_k=10)
    assert 's1' not in {r.message.id for r in results}
    theirs = semantic.search(OTHER_RES, 'tomato plants', current_thread_id=None, top_k=10)
    assert [r.message.id for r in theirs] == ['s1']


def test_thread_scope_searches_only_the_current_thread(semantic: SemanticMemory) -> None:
    results = semantic.search(RES, 'yellow tomato leaves', current_thread_id='trip', scope='thread', top_k=10)
    assert {r.message.thread_id for r in results} == {'trip'}


def test_search_catches_up_the_current_thread_first(store: InMemoryStore, semantic: SemanticMemory) -> None:
    store.append_messages(RES, 'trip', [msg('t9', 9, 'the hotel is called Casa Azul')], now=T0)
    results = semantic.search(RES, 'hotel Casa Azul', current_thread_id='trip', top_k=1)
    assert results[0].message.id == 't9'


def test_search_excludes_messages_already_in_context(semantic: SemanticMemory) -> None:
    results = semantic.search(RES, 'yellow tomato leaves', current_thread_id='garden', top_k=2, exclude_ids={'g1'})
    assert 'g1' not in {r.message.id for r in results}
    assert len(results) == 2


# -- the recall tool ---------------------------------------------------------------------------------------------
def run_recall(store: InMemoryStore, semantic: SemanticMemory | None, scope: str = 'resource', **args: Any) -> Any:
    return recall(
        store,
        COUNTER,
        resource_id=RES,
        current_thread_id='trip',
        request=RecallRequest.from_args(args),
        scope=scope,  # type: ignore[arg-type]
        semantic=semantic,
    )


def test_recall_search_mode_groups_results_by_thread_with_cursors(
    store: InMemoryStore, semantic: SemanticMemory
) -> None:
    store.update_thread(store.get_thread(RES, 'garden').model_copy(update={'title': 'Garden'}))  # type: ignore[union-attr]
    result = run_recall(store, semantic, mode='search', query='yellow leaves tomato plants', limit=3)
    assert set(result) == {'results', 'count'}
    assert result['count'] == 3
    text = result['results']
    assert '### Garden' in text and 'threadId: garden' in text
    assert 'cursor="g2"' in text and 'score ' in text
    # The cursor of a result browses into that thread.
    page = run_recall(store, semantic, cursor='g1', threadId='garden')
    assert '[g2]' in page['messages']


def test_recall_search_needs_a_query_and_vectors(store: InMemoryStore, semantic: SemanticMemory) -> None:
    with pytest.raises(InvalidInputError, match='query is required'):
        run_recall(store, semantic, mode='search')
    with pytest.raises(InvalidInputError, match='vector: true'):
        run_recall(store, None, mode='search', query='tomato')


def test_recall_search_in_thread_scope_stays_in_the_thread(store: InMemoryStore, semantic: SemanticMemory) -> None:
    result = run_recall(store, semantic, scope='thread', mode='search', query='yellow tomato leaves')
    assert 'garden' not in result['results']


def test_the_tool_describes_search_only_with_vectors() -> None:
    assert 'mode "search"' in recall_tool('resource', vector=True).description
    assert 'mode "search"' not in recall_tool('resource').description
    from om_lib.config import RetrievalSettings

    assert 'mode "search"' in step_tools(RetrievalSettings(vector=True, scope='thread'))[0]['description']


def test_search_with_no_match_says_so(store: InMemoryStore) -> None:
    memory = SemanticMemory(store, InMemoryVectorIndex(), HashingEmbedder(32))
    result = recall(
        store,
        COUNTER,
        resource_id='nobody',
        current_thread_id='none',
        request=RecallRequest(mode='search', query='anything'),
        semantic=memory,
    )
    assert result == {'results': 'No matching messages found.', 'count': 0}


# -- semantic recall: topK, messageRange, scope ------------------------------------------------------------------
def test_recall_context_takes_top_k_with_message_range(semantic: SemanticMemory) -> None:
    settings = SemanticRecallSettings(top_k=1, before=1, after=0, scope='resource')
    found = semantic.recall_context(RES, 'trip', 'often mean overwatering', settings)
    assert [m.id for m in found] == ['g1', 'g2']
    assert {m.thread_id for m in found} == {'garden'}
    text = format_recalled(found, 'trip')
    assert 'From another conversation:' in text and 'overwatering' in text
    assert format_recalled([], 'trip') == ''


def test_recall_context_in_thread_scope(semantic: SemanticMemory) -> None:
    settings = SemanticRecallSettings(top_k=2, before=0, after=0, scope='thread')
    found = semantic.recall_context(RES, 'trip', 'yellow tomato leaves', settings, exclude_ids={'t1'})
    assert found and all(m.thread_id == 'trip' for m in found) and 't1' not in {m.id for m in found}


def test_query_messages_vector_search_string(store: InMemoryStore, semantic: SemanticMemory) -> None:
    settings = SemanticRecallSettings(top_k=1, before=0, after=1, scope='resource')
    messages, _ = history.query_messages(
        store,
        RES,
        'trip',
        per_page=1,
        vector_search_string='tomato plants yellow leaves',
        semantic=semantic,
        semantic_recall=settings,
    )
    # The other thread's match (and its next message) first, then this thread's page.
    assert [m.id for m in messages][:2] in (['g1', 'g2'], ['g2'])
    assert messages[-1].id == 't1'
    with pytest.raises(InvalidInputError, match='vector search is not enabled'):
        history.query_messages(store, RES, 'trip', vector_search_string='x')
    thread_only, _ = history.query_messages(
        store,
        RES,
        'trip',
        per_page=0,
        vector_search_string='Belem bakery pastel de nata',
        semantic=semantic,
        semantic_recall=SemanticRecallSettings(top_k=1, before=0, after=0, scope='thread'),
    )
    assert [m.id for m in thread_only] == ['t4']


# -- erase -------------------------------------------------------------------------------------------------------
def test_forgetting_messages_removes_their_vectors(store: InMemoryStore, semantic: SemanticMemory) -> None:
    history.forget_messages(store, RES, 'garden', ['g1'], now=T0)
    assert semantic.forget_messages(RES, 'garden', ['g1']) == 1
    assert semantic.index.stats(RES)['vectors'] == 5
    results = semantic.search(RES, 'yellow tomato leaves', current_thread_id=None, top_k=10)
    assert 'g1' not in {r.message.id for r in results}
    # The watermark stays: the deleted message is not embedded again.
    assert semantic.index_thread(RES, 'garden') == 0


def test_erasing_threads_and_resources_removes_vectors(store: InMemoryStore, semantic: SemanticMemory) -> None:
    store.delete_thread(RES, 'garden')
    semantic.erase_thread(RES, 'garden')
    assert semantic.index.stats(RES)['vectors'] == 4
    store.delete_resource(RES)
    semantic.erase_resource(RES)
    assert semantic.index.stats(RES) == {'vectors': 0, 'bytes': 0, 'items': 0}
    assert semantic.index.stats(OTHER_RES)['vectors'] == 1
