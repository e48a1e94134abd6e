"""Message history (om_lib.history.history) on the in-memory store: recall queries, cloning, deleting with OM kept
honest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.errors import InvalidInputError, ThreadExistsError, ThreadNotFoundError
from om_lib.history.history import Include, clone_thread, forget_messages, query_messages
from om_lib.messages import Message
from om_lib.records import BufferedChunk, ObservationGroup, OMRecord

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=1)
KEY = 'thread:r1/t1'


def msg(i: int, *, minutes: int | None = None) -> Message:
    at = T0 + timedelta(minutes=i if minutes is None else minutes)
    return Message.model_validate({'id': f'm{i}', 'role': 'user', 'createdAt': at.isoformat(), 'content': f'text {i}'})


@pytest.fixture
def store() -> InMemoryStore:
    s = InMemoryStore()
    s.append_messages('r1', 't1', [msg(i) for i in range(10)], now=T0)  # seqs 1..10, createdAt T0+0..9 min
    return s


def group(start: int, end: int, gid: str = 'g1') -> ObservationGroup:
    return ObservationGroup(
        id=gid, thread_id='t1', start_id=f'm{start - 1}', end_id=f'm{end - 1}', start_seq=start, end_seq=end,
        created_at=T0,
    )  # fmt: skip


def observed(store: InMemoryStore, *groups: ObservationGroup, cursor: int | None = None, **extra) -> OMRecord:
    """A thread record that observed `groups` (cursor: the last group's end unless given)."""
    rec = OMRecord(
        id='rec-1',
        key=KEY,
        scope='thread',
        resource_id='r1',
        thread_id='t1',
        created_at=T0,
        updated_at=T0,
        active_observations='Date: Mar 1, 2025\n* 🔴 (12:00) User is planning a trip',
        observation_tokens=12,
        cursors={'t1': cursor if cursor is not None else max((g.end_seq for g in groups), default=0)},
        last_observed_at=T0,
        groups=groups,
        **extra,
    )
    return store.put_record(rec, expected_version=None)


def ids(messages) -> list[str]:
    return [m.id for m in messages]


# -- query --------------------------------------------------------------------------------------------------------
def test_query_pages_oldest_first(store):
    first, more = query_messages(store, 'r1', 't1', page=0, per_page=4)
    assert ids(first) == ['m0', 'm1', 'm2', 'm3'] and more
    last, more = query_messages(store, 'r1', 't1', page=2, per_page=4)
    assert ids(last) == ['m8', 'm9'] and not more
    beyond, more = query_messages(store, 'r1', 't1', page=5, per_page=4)
    assert beyond == [] and not more
    everything, more = query_messages(store, 'r1', 't1', per_page=None)
    assert len(everything) == 10 and not more
    default, more = query_messages(store, 'r1', 't1')
    assert len(default) == 10 and not more  # 40 per page by default


def test_query_date_range_is_inclusive_on_created_at(store):
    got, more = query_messages(store, 'r1', 't1', date_range=(T0 + timedelta(minutes=2), T0 + timedelta(minutes=5)))
    assert ids(got) == ['m2', 'm3', 'm4', 'm5'] and not more
    paged, more = query_messages(store, 'r1', 't1', per_page=3, page=1, date_range=(T0 + timedelta(minutes=2), None))
    assert ids(paged) == ['m5', 'm6', 'm7'] and more
    until, _ = query_messages(store, 'r1', 't1', date_range=(None, T0 + timedelta(minutes=1)))
    assert ids(until) == ['m0', 'm1']


def test_query_include_adds_context_merged_and_deduplicated(store):
    only, more = query_messages(
        store,
        'r1',
        't1',
        per_page=0,
        include=[Include('m5', with_previous=2, with_next=1), Include('m3'), Include('missing'), Include('m9', 0, 5)],
    )
    assert ids(only) == ['m3', 'm4', 'm5', 'm6', 'm9'] and not more
    merged, more = query_messages(store, 'r1', 't1', per_page=2, include=[Include('m1', with_next=2)])
    assert ids(merged) == ['m0', 'm1', 'm2', 'm3'] and more
    # Included messages ignore the date range; the page honours it.
    dated, _ = query_messages(
        store, 'r1', 't1', date_range=(T0 + timedelta(minutes=8), None), include=[Include('m0', with_next=1)]
    )
    assert ids(dated) == ['m0', 'm1', 'm8', 'm9']


def test_query_context_skips_deleted_messages(store):
    store.delete_messages('r1', 't1', ['m4', 'm6'])
    got, _ = query_messages(store, 'r1', 't1', per_page=0, include=[Include('m5', with_previous=2, with_next=2)])
    assert ids(got) == ['m2', 'm3', 'm5', 'm7', 'm8']
    page, more = query_messages(store, 'r1', 't1', page=1, per_page=3)
    assert ids(page) == ['m3', 'm5', 'm7'] and more


def test_query_refuses_unknown_threads_vectors_and_bad_paging(store):
    with pytest.raises(ThreadNotFoundError):
        query_messages(store, 'r2', 't1')
    with pytest.raises(ThreadNotFoundError):
        query_messages(store, 'r1', 'nope')
    with pytest.raises(InvalidInputError, match='vector search is not enabled'):
        query_messages(store, 'r1', 't1', vector_search_string='deadline')
    with pytest.raises(InvalidInputError):
        query_messages(store, 'r1', 't1', page=-1)


# -- clone --------------------------------------------------------------------------------------------------------
def test_clone_copies_messages_with_new_ids_and_traceable_metadata(store):
    store.update_thread(store.get_thread('r1', 't1').model_copy(update={'title': 'Trip', 'metadata': {'p': 'x'}}))
    thread, cloned = clone_thread(store, 'r1', 't1', new_thread_id='c1', now=NOW)
    assert thread.id == 'c1' and thread.title == 'Clone of Trip' and thread.metadata['p'] == 'x'
    assert thread.metadata['clonedFrom'] == {
        'threadId': 't1',
        'resourceId': 'r1',
        'messageCount': 10,
        'clonedAt': '2025-03-02T12:00:00Z',
        'lastMessageId': 'm9',
    }
    source = store.list_messages('r1', 't1').messages
    assert [m.text() for m in cloned] == [m.text() for m in source]
    assert [m.created_at for m in cloned] == [m.created_at for m in source]
    assert not set(ids(cloned)) & set(ids(source))
    assert ids(store.list_messages('r1', 'c1').messages) == ids(cloned)
    assert store.get_thread('r1', 'c1').metadata['clonedFrom']['lastMessageId'] == 'm9'
    assert store.get_record('thread:r1/c1') is None  # nothing was observed: nothing to carry


def test_clone_filters_by_date_then_limit_and_generates_an_id(store):
    thread, cloned = clone_thread(
        store, 'r1', 't1', title='Branch', message_limit=2, date_range=(None, T0 + timedelta(minutes=6)), now=NOW
    )
    assert [m.text() for m in cloned] == ['text 5', 'text 6']
    assert thread.title == 'Branch' and len(thread.id) == 36
    assert thread.metadata['clonedFrom']['messageCount'] == 2
    empty, none = clone_thread(store, 'r1', 't1', message_limit=0, now=NOW)
    assert none == [] and empty.metadata['clonedFrom']['lastMessageId'] is None
    more, all_of_them = clone_thread(store, 'r1', 't1', message_limit=50, now=NOW)
    assert len(all_of_them) == 10


def test_clone_refuses_taken_ids_of_its_resource_and_foreign_sources(store):
    store.append_messages('r1', 'mine', [msg(1)], now=T0)
    store.append_messages('r2', 'other', [msg(1)], now=T0)
    with pytest.raises(ThreadExistsError):
        clone_thread(store, 'r1', 't1', new_thread_id='mine', now=NOW)
    with pytest.raises(ThreadNotFoundError):
        clone_thread(store, 'r2', 't1', now=NOW)
    # Another resource's thread id is no obstacle (ids are scoped to their resource), and its thread is untouched.
    thread, cloned = clone_thread(store, 'r1', 't1', new_thread_id='other', now=NOW)
    assert thread.resource_id == 'r1' and len(cloned) == 10
    assert [m.seq for m in store.list_messages('r2', 'other').messages] == [1]


def test_clone_carries_observations_when_every_observed_group_is_copied(store):
    observed(store, group(1, 4, 'g1'), group(5, 7, 'g2'))
    store.update_thread(store.get_thread('r1', 't1').model_copy(update={'current_task': 'book a hotel'}))
    thread, cloned = clone_thread(store, 'r1', 't1', new_thread_id='c1', now=NOW)
    rec = store.get_record('thread:r1/c1')
    assert rec is not None and rec.active_observations == store.get_record(KEY).active_observations
    assert rec.thread_id == 'c1' and rec.observation_tokens == 12
    assert rec.cursors == {'c1': cloned[6].seq}
    assert [(g.start_id, g.end_id, g.thread_id) for g in rec.groups] == [
        (cloned[0].id, cloned[3].id, 'c1'),
        (cloned[4].id, cloned[6].id, 'c1'),
    ]
    assert thread.current_task == 'book a hotel'
    # Observed messages kept, unobserved ones dropped by the date range: still carried.
    _, partial = clone_thread(
        store, 'r1', 't1', new_thread_id='c2', date_range=(None, T0 + timedelta(minutes=7)), now=NOW
    )
    assert len(partial) == 8 and store.get_record('thread:r1/c2').cursor('c2') == partial[6].seq


def test_clone_starts_without_observations_when_an_observed_group_is_cut(store):
    observed(store, group(1, 4, 'g1'), group(5, 7, 'g2'))
    _, cloned = clone_thread(store, 'r1', 't1', new_thread_id='c1', message_limit=5, now=NOW)
    assert len(cloned) == 5 and store.get_record('thread:r1/c1') is None
    # A date range that leaves out an observed message cuts its group too.
    _, dated = clone_thread(
        store, 'r1', 't1', new_thread_id='c2', date_range=(T0 + timedelta(minutes=2), None), now=NOW
    )
    assert store.get_record('thread:r1/c2') is None and len(dated) == 8


# -- forget -------------------------------------------------------------------------------------------------------
def test_clearing_a_thread_resets_its_memory_and_drops_the_generation_that_observed_it(store):
    head = observed(store, group(1, 6))
    store.update_thread(
        store.get_thread('r1', 't1').model_copy(update={'current_task': 't', 'suggested_response': 's'})
    )
    assert forget_messages(store, 'r1', 't1', None, now=NOW) == 10
    assert store.list_messages('r1', 't1').messages == ()
    new = store.get_record(KEY)
    assert new.generation == head.generation + 1 and new.id != head.id
    assert new.active_observations == '' and new.groups == () and new.cursor('t1') == 0
    assert new.observation_tokens == 0 and new.last_observed_at is None
    # The generation that observed the thread is gone with it, not kept readable as history
    assert [r.generation for r in store.list_generations(KEY)] == [1]
    thread = store.get_thread('r1', 't1')
    assert thread.current_task is None and thread.suggested_response is None


def test_deleting_an_observed_message_drops_the_observations(store):
    head = observed(store, group(1, 4), group(5, 6, 'g2'))
    assert forget_messages(store, 'r1', 't1', ['m2'], now=NOW) == 1  # seq 3, inside g1
    new = store.get_record(KEY)
    assert new.generation == head.generation + 1
    assert new.active_observations == '' and new.cursor('t1') == 0 and new.groups == ()
    assert ids(store.list_messages('r1', 't1').messages) == ['m0', 'm1', 'm3', 'm4', 'm5', 'm6', 'm7', 'm8', 'm9']


def test_deleting_only_unobserved_messages_keeps_the_observations(store):
    head = observed(store, group(1, 4))
    assert forget_messages(store, 'r1', 't1', ['m7', 'm8', 'unknown'], now=NOW) == 2
    after = store.get_record(KEY)
    assert after.generation == head.generation and after.active_observations == head.active_observations
    assert after.groups == head.groups and after.cursors == head.cursors
    assert after.deletions == head.deletions + 1  # work in flight that read them throws its result away
    assert forget_messages(store, 'r1', 't1', ['unknown'], now=NOW) == 0
    assert store.get_record(KEY) == after


def test_deleting_a_buffered_message_drops_the_buffered_chunk(store):
    chunk = BufferedChunk(
        id='c1', cycle_id='cy', thread_id='t1', observations='* buffered', token_count=3, message_ids=('m5', 'm6'),
        message_tokens=20, start_seq=6, end_seq=7, last_observed_at=T0, created_at=T0,
    )  # fmt: skip
    head = observed(store, group(1, 4), buffered_chunks=(chunk,), last_buffered_at_tokens=20)
    forget_messages(store, 'r1', 't1', ['m6'], now=NOW)
    new = store.get_record(KEY)
    assert new.generation == head.generation and new.buffered_chunks == () and new.last_buffered_at_tokens == 0
    assert new.active_observations == head.active_observations and new.cursor('t1') == 4


def test_forget_without_a_record_and_on_foreign_threads(store):
    assert forget_messages(store, 'r1', 't1', ['m0'], now=NOW) == 1
    assert store.get_record(KEY) is None
    with pytest.raises(ThreadNotFoundError):
        forget_messages(store, 'r2', 't1', None, now=NOW)
    assert len(store.list_messages('r1', 't1').messages) == 9


def test_forget_in_resource_scope_drops_that_threads_sections_and_marks_it_pending(store):
    log = '<thread id="t1">\nDate: Jan 1, 2025\n* t1 fact\n</thread>'
    log += '\n\n--- message boundary (2025-01-01T09:00:00.000Z) ---\n\n'
    log += '<thread id="other">\nDate: Jan 1, 2025\n* other fact\n</thread>'
    res = OMRecord(
        id='res-1', key='resource:r1', scope='resource', resource_id='r1', thread_id=None, created_at=T0,
        updated_at=T0, active_observations=log, cursors={'t1': 5, 'other': 3}, groups=(group(1, 5),),
    )  # fmt: skip
    head = store.put_record(res, expected_version=None)
    forget_messages(store, 'r1', 't1', ['m9'], now=NOW)  # seq 10: unobserved
    unobserved = store.get_record('resource:r1')
    assert unobserved.generation == head.generation and unobserved.active_observations == head.active_observations
    forget_messages(store, 'r1', 't1', ['m0'], now=NOW)
    new = store.get_record('resource:r1')
    assert new.generation == head.generation + 1 and new.cursors == {'other': 3}
    assert 't1 fact' not in new.active_observations and 'other fact' in new.active_observations
    assert [p.thread_id for p in store.list_pending_threads('r1')] == ['t1']


def test_forget_resets_a_reflected_resource_record_and_observes_every_thread_again(store):
    store.append_messages('r1', 'other', [msg(100)], now=T0)
    res = OMRecord(
        id='res-1', key='resource:r1', scope='resource', resource_id='r1', thread_id=None, created_at=T0,
        updated_at=T0, active_observations='* condensed facts', cursors={'t1': 5, 'other': 1}, origin='reflection',
    )  # fmt: skip
    store.put_record(res, expected_version=None)
    forget_messages(store, 'r1', 't1', ['m0'], now=NOW)
    new = store.get_record('resource:r1')
    assert new.active_observations == '' and new.cursors == {}
    assert sorted(p.thread_id for p in store.list_pending_threads('r1')) == ['other', 't1']
