"""Deleting messages removes what was derived from them from every holder (om_lib.history.forgetting): earlier
generations, buffered chunks, staged reflections, work in flight and vectors, on the in-memory store."""

from __future__ import annotations

from datetime import timedelta

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.adapters.memory.vectors import InMemoryVectorIndex
from om_lib.history import history
from om_lib.history.forgetting import GENERATIONS_PAGE
from om_lib.history.semantic import SemanticMemory
from om_lib.models.embedders import HashingEmbedder
from om_lib.records import BufferedChunk, Lease, ObservationGroup, OMRecord
from tests.unit.test_buffering import Harness, buffering_config
from tests.unit.test_history import KEY, NOW, T0, group, msg, observed

RES_KEY = 'resource:r1'


def store_with_messages() -> InMemoryStore:
    s = InMemoryStore()
    s.append_messages('r1', 't1', [msg(i) for i in range(10)], now=T0)  # seqs 1..10
    return s


def next_generation(store: InMemoryStore, key: str, **update) -> OMRecord:
    head = store.get_record(key)
    assert head is not None
    new = head.model_copy(update={'id': f'rec-{head.generation + 1}', 'generation': head.generation + 1, **update})
    return store.put_generation(new, expected_version=head.version)


def generations(store: InMemoryStore, key: str = KEY) -> dict[int, OMRecord]:
    return {r.generation: r for r in store.list_generations(key, limit=100)}


# -- thread scope ---------------------------------------------------------------------------------------------------
def test_only_the_generations_that_observed_a_deleted_message_are_dropped():
    store = store_with_messages()
    observed(store, group(1, 4))  # generation 0 observed m0..m3
    next_generation(store, KEY, origin='reflection', active_observations='* condensed m0..m7', cursors={'t1': 8},
                    groups=(group(1, 4), group(5, 8, 'g2')))  # fmt: skip
    next_generation(store, KEY, active_observations='* condensed again', cursors={'t1': 8})  # generation 2, head

    history.forget_messages(store, 'r1', 't1', ['m6'], now=NOW)  # seq 7: observed by generations 1 and 2

    kept = generations(store)
    # The head was reset (generation 3); 1 and 2 held m6's content and are gone; 0 never saw it and stays
    assert sorted(kept) == [0, 3]
    assert kept[3].active_observations == '' and kept[3].cursor('t1') == 0
    assert kept[0].active_observations.endswith('User is planning a trip')


def test_a_long_history_is_read_a_page_at_a_time_and_cleaned_whole():
    store = store_with_messages()
    observed(store, group(1, 2))
    for n in range(GENERATIONS_PAGE * 2 + 3):
        next_generation(store, KEY, origin='reflection', active_observations=f'* reflection {n}')
    calls = []
    real = store.list_generations
    store.list_generations = lambda key, **kw: calls.append(kw) or real(key, **kw)  # type: ignore[method-assign]

    history.forget_messages(store, 'r1', 't1', ['m0'], now=NOW)

    assert list(generations(store)) == [GENERATIONS_PAGE * 2 + 4]  # only the reset head is left
    assert all(kw.get('limit') == GENERATIONS_PAGE for kw in calls if 'before' in kw) and len(calls) >= 3


def test_deleting_an_unobserved_message_drops_the_chunks_and_generations_that_buffered_it_and_disowns_work_in_flight():
    store = store_with_messages()
    chunk = BufferedChunk(
        id='c1', cycle_id='cy', thread_id='t1', observations='* buffered m5 m6', token_count=3,
        message_ids=('m5', 'm6'), message_tokens=20, start_seq=6, end_seq=7, last_observed_at=T0, created_at=T0,
    )  # fmt: skip
    lease = Lease(owner='observer-1', expires_at=NOW + timedelta(minutes=1))
    observed(store, group(1, 4), buffered_chunks=(chunk,))
    head = next_generation(store, KEY, origin='reflection', observing=lease, buffering_observation=lease)

    history.forget_messages(store, 'r1', 't1', ['m6'], now=NOW)

    new = store.get_record(KEY)
    assert new.generation == head.generation and new.active_observations == head.active_observations
    assert new.buffered_chunks == () and new.observing is None and new.buffering_observation is None
    assert new.deletions == head.deletions + 1
    assert sorted(generations(store)) == [1]  # generation 0 still held the chunk


def test_a_buffering_job_that_read_a_message_deleted_meanwhile_stores_no_chunk():
    h = Harness(buffering_config())
    h.turn()
    (job,) = h.jobs('buffer')
    doomed = h.store.list_messages('r1', 't1').messages[0].id

    def observe_while_it_is_deleted(request) -> str:
        history.forget_messages(h.store, 'r1', 't1', [doomed], now=h.clock.now())
        return '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User said the deleted thing\n</observations>'

    h.model.script('observer', observe_while_it_is_deleted)
    h.engine.run_job(job)

    record = h.record()
    assert record.buffered_chunks == () and 'deleted thing' not in record.model_dump_json()
    assert len(h.model.calls_for('observer')) == 1


# -- resource scope -------------------------------------------------------------------------------------------------
LOG = (
    '<thread id="t1">\nDate: Jan 1, 2025\n* t1 fact\n</thread>\n\n--- message boundary (2025-01-01T09:00:00.000Z) ---'
    '\n\n<thread id="other">\nDate: Jan 1, 2025\n* other fact\n</thread>'
)


def resource_record(**update) -> OMRecord:
    base = OMRecord(
        id='res-0', key=RES_KEY, scope='resource', resource_id='r1', thread_id=None, created_at=T0, updated_at=T0,
        active_observations=LOG, cursors={'t1': 5, 'other': 3},
        groups=(group(1, 5), ObservationGroup(id='go', thread_id='other', start_id='o0', end_id='o2', start_seq=1,
                                              end_seq=3, created_at=T0)),
    )  # fmt: skip
    return base.model_copy(update=update)


def test_resource_generations_lose_the_threads_sections_or_go_when_a_reflection_merged_them():
    store = store_with_messages()
    store.put_record(resource_record(), expected_version=None)  # 0: sections, cut exactly
    next_generation(store, RES_KEY, origin='reflection', active_observations='* t1 and other, condensed')  # 1
    next_generation(store, RES_KEY, origin='initial', active_observations=LOG + '\n* later')  # 2 (head)
    store.put_record(
        store.get_record(RES_KEY).model_copy(
            update={'buffered_reflection': '* staged: t1 fact and other fact', 'buffered_reflection_tokens': 9}
        ),
        expected_version=store.get_record(RES_KEY).version,
    )

    history.forget_messages(store, 'r1', 't1', ['m0'], now=NOW)

    kept = generations(store, RES_KEY)
    # 1 was condensed from t1's lines: dropped; 0 and 2 (the head until now) lose t1's sections; 3 is the new head
    assert sorted(kept) == [0, 2, 3]
    for record in kept.values():
        assert 't1 fact' not in record.model_dump_json() and 'other fact' in record.active_observations
        assert 't1' not in record.cursors and all(g.thread_id == 'other' for g in record.groups)
    assert kept[3].buffered_reflection is None  # the staged reflection was made from the whole log
    assert kept[3].active_observations.endswith('* later')
    assert [p.thread_id for p in store.list_pending_threads('r1')] == ['t1']


def test_erasing_a_thread_cleans_the_resource_memorys_earlier_generations():
    store = store_with_messages()
    store.put_record(resource_record(), expected_version=None)
    next_generation(store, RES_KEY, active_observations=LOG + '\n* later')

    store.delete_thread('r1', 't1')
    history.erase_thread_from_resource_memory(store, 'r1', 't1', now=NOW)

    assert all('t1 fact' not in r.active_observations for r in generations(store, RES_KEY).values())
    assert len(generations(store, RES_KEY)) == 3


# -- vectors --------------------------------------------------------------------------------------------------------
def test_an_indexing_job_that_embedded_a_message_deleted_meanwhile_removes_its_vector():
    store = store_with_messages()
    index = InMemoryVectorIndex()
    embedder = HashingEmbedder()

    class DeletingEmbedder:
        name, dimensions = embedder.name, embedder.dimensions

        def embed(self, texts, *, kind, timeout_s):
            # The message is deleted (and its vectors, none yet) while its batch is being embedded
            history.forget_messages(store, 'r1', 't1', ['m3'], now=NOW)
            return embedder.embed(texts, kind=kind, timeout_s=timeout_s)

    semantic = SemanticMemory(store, index, DeletingEmbedder())
    semantic.index_thread('r1', 't1')

    found = {h.message_id for h in index.search('r1', embedder.embed(['text 3'], kind='query', timeout_s=1)[0],
                                                space=embedder.name, top_k=20)}  # fmt: skip
    assert 'm3' not in found and found == {f'm{i}' for i in range(10) if i != 3}
