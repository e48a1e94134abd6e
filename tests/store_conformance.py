"""One conformance suite for every `MemoryStore` (langgraph's idea: the fake and the real store cannot drift).

Use it by subclassing `StoreConformance` in a test module and providing a `store` fixture.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from om_lib.errors import (
    ErasedError,
    MessageConflictError,
    ThreadExistsError,
    ThreadNotFoundError,
    VersionConflictError,
)
from om_lib.messages import Message
from om_lib.records import BufferedChunk, FailureNote, Lease, OMRecord

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def msg(mid: str, text: str = 'hello', role: str = 'user', minutes: int = 0) -> Message:
    return Message.model_validate(
        {'id': mid, 'role': role, 'createdAt': (T0 + timedelta(minutes=minutes)).isoformat(), 'content': text}
    )


def record(key: str = 'thread:r1/t1', **update: object) -> OMRecord:
    base = OMRecord(id='rec-1', key=key, scope='thread', resource_id='r1', thread_id='t1', created_at=T0, updated_at=T0)
    return base.model_copy(update=update)


class StoreConformance:
    """Behaviour every store must have. Subclasses provide a `store` fixture."""

    # -- messages -------------------------------------------------------------------------------------------------
    def test_append_assigns_increasing_seq_and_creates_thread(self, store):
        result = store.append_messages('r1', 't1', [msg('a'), msg('b'), msg('c')], now=T0)
        assert [m.id for m in result.messages] == ['a', 'b', 'c']
        seqs = [m.seq for m in result.messages]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert result.created_ids == ('a', 'b', 'c')
        assert result.thread.resource_id == 'r1'
        assert store.get_thread('r1', 't1') is not None

    def test_seq_follows_arrival_not_client_clock(self, store):
        store.append_messages('r1', 't1', [msg('late', minutes=10)], now=T0)
        store.append_messages('r1', 't1', [msg('early', minutes=-10)], now=T0)
        page = store.list_messages('r1', 't1')
        assert [m.id for m in page.messages] == ['late', 'early']

    def test_same_id_same_content_is_one_message(self, store):
        first = store.append_messages('r1', 't1', [msg('a', 'x')], now=T0)
        again = store.append_messages('r1', 't1', [msg('a', 'x', minutes=5)], now=T0)
        assert again.created_ids == ()
        assert again.messages[0].seq == first.messages[0].seq
        assert len(store.list_messages('r1', 't1').messages) == 1

    def test_same_id_other_content_conflicts_and_writes_nothing(self, store):
        store.append_messages('r1', 't1', [msg('a', 'x')], now=T0)
        with pytest.raises(MessageConflictError):
            store.append_messages('r1', 't1', [msg('new'), msg('a', 'changed')], now=T0)
        ids = [m.id for m in store.list_messages('r1', 't1').messages]
        assert ids == ['a']

    def test_thread_of_other_resource_reads_as_missing(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        assert store.get_thread('r2', 't1') is None
        assert store.list_messages('r2', 't1').messages == ()
        assert store.get_messages('r2', 't1', ['a']) == []
        with pytest.raises(ThreadNotFoundError):
            store.delete_messages('r2', 't1', None)
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a']

    def test_list_after_cursor_pages(self, store):
        result = store.append_messages('r1', 't1', [msg(f'm{i}', f'text {i}') for i in range(7)], now=T0)
        seqs = [m.seq for m in result.messages]
        page = store.list_messages('r1', 't1', after_seq=seqs[2], limit=3)
        assert [m.id for m in page.messages] == ['m3', 'm4', 'm5'] and page.has_more
        last = store.list_messages('r1', 't1', after_seq=page.messages[-1].seq, limit=3)
        assert [m.id for m in last.messages] == ['m6'] and not last.has_more

    def test_list_newest_first_and_before(self, store):
        result = store.append_messages('r1', 't1', [msg(f'm{i}', f'text {i}') for i in range(5)], now=T0)
        page = store.list_messages('r1', 't1', before_seq=result.messages[3].seq, limit=2, newest_first=True)
        assert [m.id for m in page.messages] == ['m2', 'm1'] and page.has_more

    def test_stored_message_round_trips(self, store):
        rich = Message.model_validate(
            {
                'id': 'rich',
                'role': 'assistant',
                'createdAt': T0.isoformat(),
                'parts': [
                    {'type': 'text', 'text': 'see image'},
                    {'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'search', 'args': {'q': 'x', 'n': 2}},
                    {'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'search', 'result': {'hits': [1, 2]}},
                    {
                        'type': 'image',
                        'mediaType': 'image/png',
                        'url': 'https://example.com/a.png',
                        'width': 10,
                        'height': 20,
                    },
                    {'type': 'reasoning', 'text': 'hmm'},
                ],
                'tokenCounts': {'version': 'v', 'parts': [3, 4, 5, 258, None]},
            }
        )
        store.append_messages('r1', 't1', [rich], now=T0)
        got = store.list_messages('r1', 't1').messages[0]
        assert got.parts == rich.parts
        assert got.token_counts == rich.token_counts
        assert got.created_at == rich.created_at

    def test_update_thread_keeps_owner_and_hints(self, store):
        thread = store.append_messages('r1', 't1', [msg('a')], now=T0).thread
        updated = store.update_thread(thread.model_copy(update={'title': 'Trip', 'current_task': 'book hotel'}))
        assert updated.title == 'Trip'
        got = store.get_thread('r1', 't1')
        assert got.current_task == 'book hotel' and got.title == 'Trip'
        with pytest.raises(ThreadNotFoundError):
            store.update_thread(thread.model_copy(update={'resource_id': 'r2'}))

    # -- records --------------------------------------------------------------------------------------------------
    def test_create_record_once(self, store):
        created = store.put_record(record(), expected_version=None)
        assert created.version == 1
        with pytest.raises(VersionConflictError):
            store.put_record(record(), expected_version=None)
        assert store.get_record('thread:r1/t1') == created

    def test_conditional_update_bumps_version_and_refuses_stale_writer(self, store):
        created = store.put_record(record(), expected_version=None)
        first = store.put_record(created.model_copy(update={'active_observations': 'one'}), expected_version=1)
        assert first.version == 2
        with pytest.raises(VersionConflictError):
            store.put_record(created.model_copy(update={'active_observations': 'stale'}), expected_version=1)
        assert store.get_record('thread:r1/t1').active_observations == 'one'

    def test_record_fields_round_trip(self, store):
        lease = Lease(owner='w1', expires_at=T0 + timedelta(minutes=2))
        rich = record(
            active_observations='Date: Mar 1, 2025\n* 🔴 (12:00) User likes tea',
            observation_tokens=12,
            cursors={'t1': 7},
            last_observed_at=T0,
            observing=lease,
            reflection_stalled_at_tokens=99,
        )
        created = store.put_record(rich, expected_version=None)
        got = store.get_record('thread:r1/t1')
        assert got == created
        assert got.observing == lease and got.cursors == {'t1': 7}

    def test_generations_keep_history(self, store):
        head = store.put_record(record(active_observations='old'), expected_version=None)
        new = head.model_copy(
            update={'id': 'rec-2', 'generation': 1, 'origin': 'reflection', 'active_observations': 'new'}
        )
        committed = store.put_generation(new, expected_version=head.version)
        assert store.get_record('thread:r1/t1').active_observations == 'new'
        history = store.list_generations('thread:r1/t1')
        assert [r.generation for r in history] == [1, 0]
        assert history[1].active_observations == 'old'
        with pytest.raises(VersionConflictError):
            store.put_generation(new.model_copy(update={'id': 'rec-3', 'generation': 2}), expected_version=head.version)
        assert committed.generation == 1

    def test_earlier_generations_page_and_can_be_rewritten_or_dropped_but_never_the_head(self, store):
        head = store.put_record(record(active_observations='gen 0 ' + 'x' * 20_000), expected_version=None)
        for n in range(1, 5):  # large logs: a store may keep them apart from the item (S3)
            new = head.model_copy(update={'id': f'rec-{n}', 'generation': n, 'active_observations': f'gen {n} ' * 3000})
            head = store.put_generation(new, expected_version=head.version)
        key = 'thread:r1/t1'
        assert [r.generation for r in store.list_generations(key, limit=2, before=4)] == [3, 2]
        assert [r.generation for r in store.list_generations(key, limit=10, before=2)] == [1, 0]
        assert store.list_generations(key, before=0) == []
        # Rewritten: the same generation with other content; the head cannot be rewritten this way
        earlier = store.list_generations(key, limit=1, before=2)[0]
        store.rewrite_generation(earlier.model_copy(update={'active_observations': 'gen 1, cleaned'}))
        store.rewrite_generation(head.model_copy(update={'active_observations': 'not through here'}))
        # Dropped: earlier generations only (the head and unknown ones are ignored)
        store.delete_generations(key, [0, 2, 4, 99])
        listed = store.list_generations(key, limit=10)
        assert [r.generation for r in listed] == [4, 3, 1]
        assert listed[0] == store.get_record(key) and listed[0].active_observations.startswith('gen 4 ')
        assert listed[2].active_observations == 'gen 1, cleaned' and listed[2].id == 'rec-1'
        store.delete_generations(key, [0, 2])  # idempotent
        assert [r.generation for r in store.list_generations(key, limit=10)] == [4, 3, 1]

    def test_update_of_retired_generation_is_refused(self, store):
        head = store.put_record(record(active_observations='old'), expected_version=None)
        store.put_generation(
            head.model_copy(update={'id': 'rec-2', 'generation': 1, 'active_observations': 'new'}),
            expected_version=head.version,
        )
        with pytest.raises(VersionConflictError):
            store.put_record(head.model_copy(update={'active_observations': 'late'}), expected_version=head.version)

    def test_records_are_per_key(self, store):
        store.put_record(record(), expected_version=None)
        assert store.get_record('thread:r2/t1') is None

    def test_buffered_chunks_round_trip_append_conditionally_and_carry_into_a_generation(self, store):
        def chunk(n: int) -> BufferedChunk:
            return BufferedChunk(
                id=f'ombuf-{n}', cycle_id=f'buffer-obs-{n}', thread_id='t1', observations=f'* 🟡 (12:0{n}) chunk {n}',
                token_count=6, message_ids=(f'm{n}',), message_tokens=40, start_seq=n, end_seq=n,
                last_observed_at=T0, created_at=T0, current_task='Primary: tea', suggested_response=None,
            )  # fmt: skip

        hint = Lease(owner='buffer-obs-1', expires_at=T0 + timedelta(minutes=2))
        head = store.put_record(
            record(buffered_chunks=(chunk(1),), last_buffered_at_tokens=40, buffering_observation=hint),
            expected_version=None,
        )
        assert store.get_record('thread:r1/t1') == head
        # Two workers append a chunk from the same version: one wins, the other must re-read (no lost chunk).
        appended = head.model_copy(update={'buffered_chunks': (*head.buffered_chunks, chunk(2))})
        second = store.put_record(appended, expected_version=head.version)
        with pytest.raises(VersionConflictError):
            store.put_record(
                head.model_copy(update={'buffered_chunks': (*head.buffered_chunks, chunk(9))}),
                expected_version=head.version,
            )
        staged = store.put_record(
            second.model_copy(
                update={
                    'buffered_reflection': '* condensed',
                    'buffered_reflection_tokens': 3,
                    'buffered_reflection_input_tokens': 20,
                    'reflected_line_count': 4,
                }
            ),
            expected_version=second.version,
        )
        assert store.get_record('thread:r1/t1') == staged
        new = staged.model_copy(update={'id': 'rec-2', 'generation': 1, 'buffered_reflection': None})
        store.put_generation(new, expected_version=staged.version)
        assert [c.id for c in store.get_record('thread:r1/t1').buffered_chunks] == ['ombuf-1', 'ombuf-2']

    # -- added with the DynamoDB store: behaviour every store must share -------------------------------------------
    def test_same_id_twice_in_one_call_with_other_content_writes_nothing(self, store):
        with pytest.raises(MessageConflictError):
            store.append_messages('r1', 't1', [msg('a', 'x'), msg('b'), msg('a', 'y')], now=T0)
        assert store.list_messages('r1', 't1').messages == ()

    def test_append_can_return_the_thread_record(self, store):
        first = store.append_messages('r1', 't1', [msg('a')], now=T0, include_record=True)
        assert first.record_included and first.record is None
        created = store.put_record(record(), expected_version=None)
        second = store.append_messages('r1', 't1', [msg('b')], now=T0, include_record=True)
        assert second.record == created
        assert store.append_messages('r1', 't1', [msg('c')], now=T0).record_included is False

    def test_list_threads_of_a_resource_pages_oldest_first(self, store):
        for i in range(3):
            store.append_messages('r1', f't{i}', [msg(f'm{i}')], now=T0 + timedelta(minutes=i))
        store.append_messages('r2', 'other', [msg('x')], now=T0)
        first = store.list_threads('r1', limit=2)
        assert [t.id for t in first.threads] == ['t0', 't1'] and first.next_cursor is not None
        rest = store.list_threads('r1', limit=2, cursor=first.next_cursor)
        assert [t.id for t in rest.threads] == ['t2'] and rest.next_cursor is None

    def test_list_threads_newest_first_pages_backwards(self, store):
        for i in range(3):
            store.append_messages('r1', f't{i}', [msg(f'm{i}')], now=T0 + timedelta(minutes=i))
        store.append_messages('r2', 'other', [msg('x')], now=T0 + timedelta(minutes=9))
        first = store.list_threads('r1', limit=2, newest_first=True)
        assert [t.id for t in first.threads] == ['t2', 't1'] and first.next_cursor is not None
        rest = store.list_threads('r1', limit=2, cursor=first.next_cursor, newest_first=True)
        assert [t.id for t in rest.threads] == ['t0'] and rest.next_cursor is None

    def test_pending_threads_are_marked_by_append_and_cleared_once_observed(self, store):
        # Given appends in three threads of r1 (two marked pending) and one of r2
        store.append_messages('r1', 'a', [msg('a1')], now=T0, mark_pending=True)
        store.append_messages('r1', 'b', [msg('b1')], now=T0 + timedelta(minutes=1), mark_pending=True)
        store.append_messages('r1', 'quiet', [msg('q1')], now=T0)
        store.append_messages('r2', 'c', [msg('c1')], now=T0, mark_pending=True)
        # A later append keeps the time the thread first became pending
        store.append_messages('r1', 'a', [msg('a2')], now=T0 + timedelta(minutes=5), mark_pending=True)
        pending = store.list_pending_threads('r1')
        assert [(p.thread_id, p.pending_since) for p in pending] == [('a', T0), ('b', T0 + timedelta(minutes=1))]
        assert [p.thread_id for p in store.list_pending_threads('r1', limit=1)] == ['a']
        assert [p.thread_id for p in store.list_pending_threads('r2')] == ['c']
        # When a's first message only is observed, a stays pending; when both are, it is cleared
        assert store.clear_pending('r1', 'a', observed_through=1) is False
        assert store.clear_pending('r1', 'a', observed_through=2) is True
        assert [p.thread_id for p in store.list_pending_threads('r1')] == ['b']
        # Another resource cannot clear it, an erased thread leaves the list, and nothing is created for either
        assert store.clear_pending('r2', 'b', observed_through=99) is False
        store.delete_thread('r1', 'b')
        assert store.list_pending_threads('r1') == []
        assert store.clear_pending('r1', 'b', observed_through=99) is False
        assert store.get_thread('r1', 'b') is None
        # Marking again (observations dropped) works for a live thread only, and keeps an earlier time
        store.mark_pending('r1', 'a', now=T0 + timedelta(hours=1))
        store.mark_pending('r1', 'b', now=T0)
        store.mark_pending('r2', 'a', now=T0)
        assert [(p.thread_id, p.pending_since) for p in store.list_pending_threads('r1')] == [
            ('a', T0 + timedelta(hours=1))
        ]
        assert store.get_thread('r1', 'b') is None and [p.thread_id for p in store.list_pending_threads('r2')] == ['c']

    def test_delete_thread_erases_it_and_refuses_late_work(self, store):
        store.append_messages('r1', 't1', [msg('a'), msg('b')], now=T0)
        head = store.put_record(record(active_observations='secret'), expected_version=None)
        store.append_messages('r1', 't2', [msg('keep')], now=T0)
        store.delete_thread('r1', 't1')
        assert store.get_thread('r1', 't1') is None
        assert store.list_messages('r1', 't1').messages == ()
        assert store.get_record('thread:r1/t1') is None
        assert store.list_generations('thread:r1/t1') == []
        assert [t.id for t in store.list_threads('r1').threads] == ['t2']
        # Late background work of the erased thread cannot write it back.
        with pytest.raises(ErasedError):
            store.put_record(head.model_copy(update={'active_observations': 'late'}), expected_version=head.version)
        with pytest.raises(ErasedError):
            store.put_record(record(id='rec-late'), expected_version=None)
        with pytest.raises(ErasedError):
            store.put_generation(
                head.model_copy(update={'id': 'rec-2', 'generation': 1}), expected_version=head.version
            )
        with pytest.raises(ThreadNotFoundError):
            store.update_thread(store.get_thread('r1', 't2').model_copy(update={'id': 't1', 'title': 'late'}))
        assert store.get_record('thread:r1/t1') is None
        assert [m.id for m in store.list_messages('r1', 't2').messages] == ['keep']

    def test_delete_thread_of_another_resource_is_not_found(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        with pytest.raises(ThreadNotFoundError):
            store.delete_thread('r2', 't1')
        with pytest.raises(ThreadNotFoundError):
            store.delete_thread('r1', 'missing')
        assert store.get_thread('r1', 't1') is not None

    def test_erased_thread_id_starts_over_and_old_work_still_fails(self, store):
        store.append_messages('r1', 't1', [msg('a', 'old')], now=T0)
        head = store.put_record(record(), expected_version=None)
        store.delete_thread('r1', 't1')
        again = store.append_messages('r1', 't1', [msg('a', 'new content'), msg('b')], now=T0 + timedelta(hours=1))
        assert again.created_ids == ('a', 'b')
        assert [m.text() for m in store.list_messages('r1', 't1').messages] == ['new content', 'hello']
        assert again.thread.created_at == T0 + timedelta(hours=1)
        with pytest.raises(VersionConflictError):
            store.put_record(head.model_copy(update={'active_observations': 'late'}), expected_version=head.version)
        fresh = store.put_record(record(id='rec-new'), expected_version=None)
        assert store.get_record('thread:r1/t1') == fresh

    def test_delete_resource_erases_every_thread_and_record(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r1', 't2', [msg('b')], now=T0)
        store.append_messages('r2', 't3', [msg('c')], now=T0)
        thread_head = store.put_record(record(), expected_version=None)
        res = OMRecord(
            id='res-1',
            key='resource:r1',
            scope='resource',
            resource_id='r1',
            thread_id=None,
            created_at=T0,
            updated_at=T0,
        )
        res_head = store.put_record(res, expected_version=None)
        store.delete_resource('r1')
        assert store.get_thread('r1', 't1') is None and store.get_thread('r1', 't2') is None
        assert store.list_threads('r1').threads == ()
        assert store.get_record('resource:r1') is None and store.get_record('thread:r1/t1') is None
        with pytest.raises(ErasedError):
            store.put_record(res_head, expected_version=res_head.version)
        with pytest.raises(ErasedError):
            store.put_record(res, expected_version=None)
        with pytest.raises(ErasedError):
            store.put_record(thread_head, expected_version=thread_head.version)
        assert [m.id for m in store.list_messages('r2', 't3').messages] == ['c']
        # A new thread is a new incarnation of the resource: its records may be created again.
        store.append_messages('r1', 't9', [msg('z')], now=T0)
        assert store.put_record(res, expected_version=None).version == 1

    # -- kept failures (recentFailures) ---------------------------------------------------------------------------
    def test_failures_are_kept_per_memory_newest_first_and_erased_with_it(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r2', 't1', [msg('b')], now=T0)
        for n in range(25):
            note = FailureNote(
                operation_type='observation', reason='model_unavailable', message=f'm{n}', at=T0 + timedelta(seconds=n)
            )
            store.add_failure('r1', 't1', note)
        store.add_failure(
            'r1',
            None,
            FailureNote(operation_type='reflection', reason='invalid_reflection', message='res', at=T0, thread_id='t1'),
        )
        kept = store.recent_failures('r1', 't1')
        assert [f.message for f in kept] == [f'm{n}' for n in range(24, 4, -1)]  # the newest 20
        assert [f.message for f in store.recent_failures('r1', None)] == ['res']
        assert store.recent_failures('r2', 't1') == []  # another resource's thread of the same id
        store.delete_thread('r1', 't1')
        assert store.recent_failures('r1', 't1') == []
        store.add_failure('r1', 't1', kept[0])  # a late failure of an erased thread is not kept
        assert store.recent_failures('r1', 't1') == []
        store.delete_resource('r1')
        assert store.recent_failures('r1', None) == []

    # -- added with threads and message history (issue 8) ----------------------------------------------------------
    def test_create_thread_then_append_keeps_title_and_metadata(self, store):
        created = store.create_thread('r1', 't1', title='Trip', metadata={'project': 'travel', 'n': 2}, now=T0)
        assert (created.id, created.resource_id, created.title) == ('t1', 'r1', 'Trip')
        assert created.created_at == T0 and created.metadata == {'project': 'travel', 'n': 2}
        got = store.get_thread('r1', 't1')
        assert got.title == 'Trip' and got.metadata == {'project': 'travel', 'n': 2} and got.created_at == T0
        assert store.list_messages('r1', 't1').messages == ()
        assert [t.id for t in store.list_threads('r1').threads] == ['t1']
        later = T0 + timedelta(minutes=1)
        result = store.append_messages('r1', 't1', [msg('a')], now=later)
        assert result.created_ids == ('a',) and result.messages[0].seq == 1
        got = store.get_thread('r1', 't1')
        assert got.title == 'Trip' and got.created_at == T0 and got.metadata['project'] == 'travel'

    def test_create_thread_refuses_a_taken_id_of_the_same_resource_only(self, store):
        store.create_thread('r1', 't1', now=T0)
        store.append_messages('r1', 't2', [msg('a')], now=T0)
        for thread in ('t1', 't2'):
            with pytest.raises(ThreadExistsError):
                store.create_thread('r1', thread, title='taken', now=T0)
        assert store.get_thread('r1', 't1').title is None
        # Another resource's ids are its own: the same ids are free for r2, and r1's threads stay as they were.
        for thread in ('t1', 't2'):
            assert store.create_thread('r2', thread, title='mine', now=T0).resource_id == 'r2'
        assert [t.title for t in store.list_threads('r2').threads] == ['mine', 'mine']
        assert store.get_thread('r1', 't1').title is None
        assert [m.id for m in store.list_messages('r1', 't2').messages] == ['a']

    def test_create_thread_after_erase_starts_over(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.delete_thread('r1', 't1')
        created = store.create_thread('r1', 't1', title='again', now=T0 + timedelta(hours=1))
        assert created.title == 'again'
        assert store.list_messages('r1', 't1').messages == ()
        assert store.append_messages('r1', 't1', [msg('b')], now=T0).messages[0].seq == 1

    def test_get_messages_by_id_in_seq_order(self, store):
        store.append_messages('r1', 't1', [msg(f'm{i}', f'text {i}') for i in range(5)], now=T0)
        got = store.get_messages('r1', 't1', ['m3', 'missing', 'm0', 'm3'])
        assert [m.id for m in got] == ['m0', 'm3']
        assert got[1].text() == 'text 3' and got[1].seq == 4
        assert store.get_messages('r2', 't1', ['m0']) == []
        assert store.get_messages('r1', 'nope', ['m0']) == []
        assert store.get_messages('r1', 't1', []) == []

    def test_delete_messages_by_id_is_idempotent_and_reads_skip_the_holes(self, store):
        store.append_messages('r1', 't1', [msg(f'm{i}', f'text {i}') for i in range(6)], now=T0)
        assert store.delete_messages('r1', 't1', ['m1', 'm3', 'unknown']) == 2
        assert store.delete_messages('r1', 't1', ['m1', 'm3']) == 0
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['m0', 'm2', 'm4', 'm5']
        page = store.list_messages('r1', 't1', after_seq=1, limit=2)
        assert [m.id for m in page.messages] == ['m2', 'm4'] and page.has_more
        newest = store.list_messages('r1', 't1', limit=3, newest_first=True)
        assert [m.id for m in newest.messages] == ['m5', 'm4', 'm2']
        assert store.get_messages('r1', 't1', ['m1', 'm2']) == store.get_messages('r1', 't1', ['m2'])
        # New messages keep counting up; a deleted id may be sent again as a new message.
        again = store.append_messages('r1', 't1', [msg('m1', 'back'), msg('m6')], now=T0)
        assert again.created_ids == ('m1', 'm6') and again.messages[0].seq > 6
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['m0', 'm2', 'm4', 'm5', 'm1', 'm6']
        assert store.get_thread('r1', 't1') is not None

    def test_delete_all_messages_clears_the_thread_but_keeps_it(self, store):
        store.append_messages('r1', 't1', [msg('a'), msg('b')], now=T0)
        head = store.put_record(record(active_observations='kept'), expected_version=None)
        assert store.delete_messages('r1', 't1', None) == 2
        assert store.list_messages('r1', 't1').messages == ()
        assert store.delete_messages('r1', 't1', None) == 0
        assert store.get_thread('r1', 't1') is not None
        assert store.get_record('thread:r1/t1') == head
        later = store.append_messages('r1', 't1', [msg('c')], now=T0)
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['c']
        assert later.messages[0].seq == 3

    def test_delete_messages_of_another_resource_is_not_found(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        with pytest.raises(ThreadNotFoundError):
            store.delete_messages('r2', 't1', ['a'])
        with pytest.raises(ThreadNotFoundError):
            store.delete_messages('r2', 't1', None)
        with pytest.raises(ThreadNotFoundError):
            store.delete_messages('r1', 'missing', None)
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a']


class ScopedThreadIdsConformance:
    """Thread ids are scoped to their resource: two resources may each own `t1`, and neither can read, change, block
    or detect the other's (CONTRACT §2). Mixed into every store's suite."""

    def test_two_resources_each_own_a_thread_of_the_same_id(self, store):
        mine = store.append_messages('r1', 't1', [msg('a', 'mine'), msg('b')], now=T0)
        # The same thread id and even the same message id, with other content: no conflict, another thread.
        theirs = store.append_messages('r2', 't1', [msg('a', 'theirs')], now=T0 + timedelta(minutes=1))
        assert theirs.created_ids == ('a',) and theirs.messages[0].seq == 1
        assert theirs.thread.resource_id == 'r2' and theirs.thread.created_at == T0 + timedelta(minutes=1)
        assert [m.text() for m in store.list_messages('r1', 't1').messages] == ['mine', 'hello']
        assert [m.text() for m in store.list_messages('r2', 't1').messages] == ['theirs']
        assert [m.text() for m in store.get_messages('r2', 't1', ['a', 'b'])] == ['theirs']
        assert store.get_thread('r1', 't1').created_at == mine.thread.created_at == T0
        assert [t.id for t in store.list_threads('r1').threads] == ['t1']
        assert [t.resource_id for t in store.list_threads('r2').threads] == ['r2']

    def test_changing_one_resources_thread_leaves_the_others_alone(self, store):
        store.append_messages('r1', 't1', [msg('a'), msg('b')], now=T0)
        store.append_messages('r2', 't1', [msg('a'), msg('c')], now=T0)
        updated = store.update_thread(store.get_thread('r2', 't1').model_copy(update={'title': 'theirs'}))
        assert updated.title == 'theirs' and store.get_thread('r1', 't1').title is None
        assert store.delete_messages('r2', 't1', ['a']) == 1
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a', 'b']
        store.delete_messages('r2', 't1', None)
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a', 'b']
        store.delete_thread('r2', 't1')
        assert store.get_thread('r2', 't1') is None and store.get_thread('r1', 't1') is not None
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a', 'b']
        with pytest.raises(ThreadNotFoundError):
            store.delete_thread('r2', 't1')
        store.delete_resource('r2')
        assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a', 'b']

    def test_records_of_two_resources_threads_are_separate(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r2', 't1', [msg('a')], now=T0)
        mine = store.put_record(record(active_observations='mine'), expected_version=None)
        theirs = store.put_record(
            record('thread:r2/t1', id='rec-2', resource_id='r2', active_observations='theirs'), expected_version=None
        )
        assert store.append_messages('r1', 't1', [msg('b')], now=T0, include_record=True).record == mine
        assert store.append_messages('r2', 't1', [msg('b')], now=T0, include_record=True).record == theirs
        store.put_generation(
            theirs.model_copy(update={'id': 'rec-3', 'generation': 1, 'active_observations': 'condensed'}),
            expected_version=theirs.version,
        )
        assert [r.generation for r in store.list_generations('thread:r1/t1')] == [0]
        store.delete_thread('r2', 't1')
        assert store.get_record('thread:r1/t1') == mine and store.get_record('thread:r2/t1') is None
        with pytest.raises(ErasedError):
            store.put_record(theirs.model_copy(update={'active_observations': 'late'}), expected_version=None)
        assert store.put_record(mine.model_copy(update={'active_observations': 'on'}), expected_version=1).version == 2

    def test_marks_and_working_memory_are_per_resource_thread(self, store):
        from om_lib.records import WorkingMemoryRecord

        store.append_messages('r1', 't1', [msg('a')], now=T0, mark_pending=True)
        store.append_messages('r2', 't1', [msg('a')], now=T0 + timedelta(minutes=1), mark_pending=True)
        assert [p.thread_id for p in store.list_pending_threads('r1')] == ['t1']
        assert store.clear_pending('r2', 't1', observed_through=1) is True
        assert [p.thread_id for p in store.list_pending_threads('r1')] == ['t1']
        assert store.list_pending_threads('r2') == []
        for resource, text in (('r1', 'mine'), ('r2', 'theirs')):
            memory = WorkingMemoryRecord(
                scope='thread', resource_id=resource, thread_id='t1', format='markdown', content=text, updated_at=T0
            )
            store.put_working_memory(memory, expected_version=None)
        assert store.get_working_memory('r1', 't1').content == 'mine'
        assert store.get_working_memory('r2', 't1').content == 'theirs'
        store.delete_thread('r2', 't1')
        assert store.get_working_memory('r1', 't1').content == 'mine'

    def test_nothing_new_changes_nothing(self, store):
        # Given a thread whose message was stored at T0
        store.append_messages('r1', 't1', [msg('a', 'x')], now=T0)
        # When the same message is sent again later, and then other content under its id
        again = store.append_messages('r1', 't1', [msg('a', 'x')], now=T0 + timedelta(hours=1))
        with pytest.raises(MessageConflictError):
            store.append_messages('r1', 't1', [msg('a', 'changed')], now=T0 + timedelta(hours=2))
        store.append_messages('r1', 't1', [], now=T0 + timedelta(hours=3))
        # Then the thread is as it was: same update time, and the next message gets the next sequence number
        assert again.created_ids == () and again.thread.updated_at == T0
        assert store.get_thread('r1', 't1').updated_at == T0
        assert store.append_messages('r1', 't1', [msg('b')], now=T0).messages[0].seq == 2


class AttentionConformance:
    """The sweeper's attention list (mixed into StoreConformance subclasses that support it)."""

    def test_append_marks_thread_and_quiet_filter_applies(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        assert store.list_attention(quiet_since=T0 - timedelta(seconds=1)) == []
        items = store.list_attention(quiet_since=T0 + timedelta(minutes=1))
        assert [(i.resource_id, i.thread_id) for i in items] == [('r1', 't1')]

    def test_two_resources_threads_of_the_same_id_are_marked_apart(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r2', 't1', [msg('a')], now=T0 + timedelta(seconds=1))
        items = store.list_attention(quiet_since=T0 + timedelta(minutes=1))
        assert sorted((i.resource_id, i.thread_id) for i in items) == [('r1', 't1'), ('r2', 't1')]
        store.clear_attention(next(i for i in items if i.resource_id == 'r2'))
        left = store.list_attention(quiet_since=T0 + timedelta(minutes=1))
        assert [(i.resource_id, i.thread_id) for i in left] == [('r1', 't1')]

    def test_an_append_of_nothing_new_does_not_mark_the_thread(self, store):
        store.append_messages('r1', 't1', [msg('a', 'x')], now=T0)
        store.clear_attention(store.list_attention(quiet_since=T0 + timedelta(minutes=1))[0])
        store.append_messages('r1', 't1', [msg('a', 'x')], now=T0 + timedelta(minutes=5))
        with pytest.raises(MessageConflictError):
            store.append_messages('r1', 't1', [msg('a', 'changed')], now=T0 + timedelta(minutes=6))
        assert store.list_attention(quiet_since=T0 + timedelta(hours=1)) == []

    def test_clear_removes_mark_unless_new_activity(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r1', 't2', [msg('b')], now=T0)
        first = {i.thread_id: i for i in store.list_attention(quiet_since=T0 + timedelta(minutes=1))}
        store.append_messages('r1', 't2', [msg('c')], now=T0 + timedelta(minutes=5))
        store.clear_attention(first['t1'])
        store.clear_attention(first['t2'])  # stale mark: t2 had new activity, it stays listed
        later = store.list_attention(quiet_since=T0 + timedelta(minutes=10))
        assert [i.thread_id for i in later] == ['t2']


class WorkingMemoryConformance:
    """Working memory: per resource (or per thread in thread scope), optimistic locking, erased with its owner."""

    @staticmethod
    def _wm(resource_id: str = 'r1', thread_id: str | None = None, content: object = 'hello', **update: object):
        from om_lib.records import WorkingMemoryRecord

        base = WorkingMemoryRecord(
            scope='thread' if thread_id else 'resource',
            resource_id=resource_id,
            thread_id=thread_id,
            format='json' if isinstance(content, dict) else 'markdown',
            content=content,
            updated_at=T0,
        )
        return base.model_copy(update=update)

    def test_resource_working_memory_round_trips_with_versions(self, store):
        assert store.get_working_memory('r1', None) is None
        first = store.put_working_memory(self._wm(content={'name': 'Sam', 'tags': ['a']}), expected_version=None)
        assert first.version == 1
        got = store.get_working_memory('r1', None)
        assert got == first and got.content == {'name': 'Sam', 'tags': ['a']} and got.format == 'json'
        second = store.put_working_memory(self._wm(content='# Me'), expected_version=1)
        assert second.version == 2 and store.get_working_memory('r1', None).content == '# Me'
        assert store.get_working_memory('r2', None) is None

    def test_working_memory_writes_are_conditional(self, store):
        store.put_working_memory(self._wm(), expected_version=None)
        with pytest.raises(VersionConflictError):
            store.put_working_memory(self._wm(content='again'), expected_version=None)
        with pytest.raises(VersionConflictError):
            store.put_working_memory(self._wm(content='stale'), expected_version=7)
        assert store.get_working_memory('r1', None).content == 'hello'

    def test_thread_working_memory_needs_the_owner_and_is_kept_per_thread(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.append_messages('r1', 't2', [msg('b')], now=T0)
        store.put_working_memory(self._wm(thread_id='t1', content='one'), expected_version=None)
        assert store.get_working_memory('r1', 't1').content == 'one'
        assert store.get_working_memory('r1', 't2') is None
        assert store.get_working_memory('r2', 't1') is None
        assert store.get_working_memory('r1', None) is None
        with pytest.raises(ThreadNotFoundError):
            store.put_working_memory(self._wm('r2', 't1', 'not yours'), expected_version=None)
        with pytest.raises(ThreadNotFoundError):
            store.put_working_memory(self._wm('r1', 'missing', 'x'), expected_version=None)

    def test_erase_removes_working_memory(self, store):
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        store.put_working_memory(self._wm(thread_id='t1', content='thread'), expected_version=None)
        store.put_working_memory(self._wm(content='resource'), expected_version=None)
        store.delete_thread('r1', 't1')
        store.append_messages('r1', 't1', [msg('a')], now=T0)
        assert store.get_working_memory('r1', 't1') is None
        # The new incarnation starts without one and may create it.
        assert store.put_working_memory(self._wm(thread_id='t1', content='new'), expected_version=None).version == 1
        store.delete_resource('r1')
        assert store.get_working_memory('r1', None) is None
        assert store.get_working_memory('r1', 't1') is None

    # -- turn claims (who answers a user message) -----------------------------------------------------------------
    def test_a_turn_claim_is_held_until_released_or_expired(self, store):
        lease = timedelta(seconds=30)
        assert store.claim_turn('r1', 't1', 'm1', owner='a', now=T0, lease=lease) is None
        # Another owner sees when the holder's lease ends; the holder itself renews.
        held = store.claim_turn('r1', 't1', 'm1', owner='b', now=T0 + timedelta(seconds=1), lease=lease)
        assert held == T0 + lease
        assert store.claim_turn('r1', 't1', 'm1', owner='a', now=T0 + timedelta(seconds=2), lease=lease) is None
        # Claims are per message, thread and resource.
        assert store.claim_turn('r1', 't1', 'm2', owner='b', now=T0, lease=lease) is None
        assert store.claim_turn('r2', 't1', 'm1', owner='b', now=T0, lease=lease) is None
        # Only the holder releases; then anyone may claim.
        store.release_turn('r1', 't1', 'm1', owner='b')
        assert store.claim_turn('r1', 't1', 'm1', owner='c', now=T0 + timedelta(seconds=3), lease=lease) is not None
        store.release_turn('r1', 't1', 'm1', owner='a')
        assert store.claim_turn('r1', 't1', 'm1', owner='c', now=T0 + timedelta(seconds=3), lease=lease) is None
        # An expired claim is taken over.
        later = T0 + timedelta(seconds=3) + lease + timedelta(seconds=1)
        assert store.claim_turn('r1', 't1', 'm1', owner='d', now=later, lease=lease) is None
