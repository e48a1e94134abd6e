"""Lifecycle events (published once, where the outcome is made, with the model's usage), pinned titles,
`observeAttachments`, and the operations a client runs on demand (observe, imported history, reflect, buffer), over
the in-memory store, a scripted model and a clock the test moves."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from om_lib.adapters.aws.eventbridge import EventBridgePublisher
from om_lib.adapters.memory.events import InMemoryEventLog
from om_lib.errors import BufferingDisabledError, ImportTooLargeError, ThreadNotFoundError
from om_lib.events import MAX_OBSERVATIONS_BYTES, LifecycleEvent, lifecycle_events
from om_lib.llm import CallUsage, InlineBlob, Usage
from om_lib.messages import Message
from om_lib.observation.observation import attachment_observed
from om_lib.parts import ObservationEnd, Status, StoredPart
from om_lib.service import MemoryService
from tests.unit.test_buffering import OBS, Harness, buffering_config, words

PNG = base64.b64encode(b'\x89PNG\r\n\x1a\n' + b'p' * 32).decode()
JPEG = base64.b64encode(b'\xff\xd8\xff' + b'j' * 32).decode()


def service(h: Harness) -> tuple[MemoryService, InMemoryEventLog]:
    log = InMemoryEventLog()
    return MemoryService(h.engine, events=log), log


def sync_config(**extra: Any) -> dict[str, Any]:
    return {
        'model': 'default',
        'observation': {'messageTokens': 300, 'bufferTokens': False},
        'reflection': {'observationTokens': 100000},
        **extra,
    }


# -- lifecycle events -------------------------------------------------------------------------------------------------
def test_events_carry_the_parts_fields_the_resource_and_the_models_usage() -> None:
    h = Harness(sync_config(), work=False)
    svc, log = service(h)
    svc.step('r1', 't1', [h.user(words(200))])
    svc.turn('r1', 't1', [h.assistant(words(150))])
    step = svc.step('r1', 't1', [h.user(words(5))])
    types = [e.detail_type for e in log.events]
    assert types == ['data-om-observation-start', 'data-om-observation-end']
    end = log.events[1].detail
    assert end['resourceId'] == 'r1' and end['threadId'] == 't1' and end['sequence'] == 1
    assert end['cycleId'] == log.events[0].detail['cycleId']
    made = [p for p in step.parts.own() if isinstance(p, ObservationEnd)][0]
    assert end['tokensObserved'] == made.tokens_observed and end['observations'] == made.observations
    usage = end['usage']
    assert usage['model'] == 'google/gemini-2.5-flash' and usage['calls'] == 1
    assert usage['inputTokens'] > 0 and usage['outputTokens'] > 0
    assert usage['totalTokens'] == usage['inputTokens'] + usage['outputTokens']
    # The usage is ours to publish: the part clients get keeps the reference's fields only.
    assert 'usage' not in next(p for p in step.parts.to_json() if p['type'] == 'data-om-observation-end')['data']
    assert 'usage' not in log.events[0].detail  # a start has no model call behind it yet
    # One publish per call that made outcomes; a step that made none publishes nothing.
    assert log.published_calls == 1


def test_parts_background_work_kept_for_a_step_are_published_by_that_work_not_again() -> None:
    h = Harness(buffering_config())
    svc, log = service(h)
    svc.step('r1', 't1', [h.user(words(100))])
    svc.turn('r1', 't1', [h.assistant(words(120))])
    while h.work.jobs:
        svc.run_job(h.work.jobs.pop(0))  # the worker publishes what its job made
    after_worker = [e.detail_type for e in log.events]
    assert 'data-om-buffering-end' in after_worker
    buffered = next(e for e in log.events if e.detail_type == 'data-om-buffering-end').detail
    assert buffered['usage']['calls'] == 1 and buffered['observations']
    step = svc.step('r1', 't1', [h.user(words(5))])
    assert any(isinstance(p, StoredPart) for p in step.parts)  # the step answers the worker's part ...
    assert [e.detail_type for e in log.events] == after_worker  # ... and publishes nothing twice


def test_status_parts_are_not_events_and_a_large_log_is_cut() -> None:
    big = ObservationEnd(
        cycle_id='c',
        operation_type='reflection',
        completed_at=datetime(2026, 1, 1, tzinfo=UTC),
        duration_ms=1,
        tokens_observed=10,
        observation_tokens=5,
        observations='* 🟡 ' + 'x' * (MAX_OBSERVATIONS_BYTES + 10),
        record_id='r',
        thread_id='t',
        usage=CallUsage('google/gemini-2.5-flash', Usage(1000, 200, 50, 0), 2),
    )
    status = Status(
        message_tokens=1,
        message_threshold=2,
        observation_tokens=3,
        observation_threshold=4,
        record_id='r',
        thread_id='t',
        step_number=0,
        generation_count=0,
    )
    (event,) = lifecycle_events('res', [status, big])
    assert event.detail['observationsTruncated'] is True
    assert len(event.detail['observations'].encode()) <= MAX_OBSERVATIONS_BYTES
    assert event.detail['usage'] == {
        'model': 'google/gemini-2.5-flash',
        'calls': 2,
        'inputTokens': 1000,
        'outputTokens': 200,
        'totalTokens': 1200,
        'cacheReadTokens': 50,
    }


class FakeEvents:
    def __init__(self, fail: bool = False, refuse: int = 0) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.fail, self.refuse = fail, refuse

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.calls.append(Entries)
        if self.fail:
            raise ConnectionError('the bus is unreachable')
        return {'FailedEntryCount': self.refuse, 'Entries': [{'ErrorCode': 'ThrottlingException'}] * self.refuse}


def test_the_eventbridge_publisher_batches_ten_and_never_raises() -> None:
    events = [LifecycleEvent('data-om-observation-end', {'n': n}) for n in range(23)]
    client = FakeEvents()
    EventBridgePublisher('om-lifecycle', client=client).publish(events)
    assert [len(c) for c in client.calls] == [10, 10, 3]
    first = client.calls[0][0]
    assert first['Source'] == 'observational-memory' and first['EventBusName'] == 'om-lifecycle'
    assert first['DetailType'] == 'data-om-observation-end' and json.loads(first['Detail']) == {'n': 0}
    lost: list[int] = []
    EventBridgePublisher('b', client=FakeEvents(fail=True), on_failure=lost.append).publish(events[:12])
    EventBridgePublisher('b', client=FakeEvents(refuse=2), on_failure=lost.append).publish(events[:3])
    assert lost == [12, 2]
    # Entries are batched by size as well: PutEvents takes 256 KB per call.
    large = [LifecycleEvent('t', {'text': 'x' * 100_000}) for _ in range(5)]
    client = FakeEvents()
    EventBridgePublisher('b', client=client).publish(large)
    assert [len(c) for c in client.calls] == [2, 2, 1]


def test_a_publisher_that_breaks_its_promise_does_not_fail_the_step() -> None:
    class Broken:
        def publish(self, events: Any) -> None:
            raise RuntimeError('boom')

    h = Harness(sync_config(), work=False)
    svc = MemoryService(h.engine, events=Broken())
    svc.step('r1', 't1', [h.user(words(200))])
    svc.turn('r1', 't1', [h.assistant(words(150))])
    step = svc.step('r1', 't1', [h.user(words(5))])
    assert any(p.kind() == 'data-om-observation-end' for p in step.parts)


# -- pinned titles ----------------------------------------------------------------------------------------------------
def titled_answer(request: Any) -> str:
    return OBS.format(n=1) + '<thread-title>\nObserver title\n</thread-title>'


def test_a_title_set_through_the_api_is_never_replaced_and_clearing_it_unpins() -> None:
    h = Harness(sync_config(observation={'messageTokens': 300, 'bufferTokens': False, 'threadTitle': True}), work=False)
    h.model._fallback = titled_answer
    svc, _ = service(h)
    svc.create_thread('r1', 't1')
    pinned = svc.update_thread('r1', 't1', {'title': '  My trip  '})
    assert pinned.title == 'My trip' and pinned.title_pinned
    svc.step('r1', 't1', [h.user(words(200))])
    svc.turn('r1', 't1', [h.assistant(words(150))])
    step = svc.step('r1', 't1', [h.user(words(5))])
    assert any(p.kind() == 'data-om-observation-end' for p in step.parts)
    assert not any(p.kind() == 'data-om-thread-update' for p in step.parts)
    assert svc.get_thread('r1', 't1').title == 'My trip'
    cleared = svc.update_thread('r1', 't1', {'title': ''})
    assert cleared.title is None and not cleared.title_pinned
    svc.turn('r1', 't1', [h.assistant(words(300))])
    step = svc.step('r1', 't1', [h.user(words(5))])
    assert any(p.kind() == 'data-om-thread-update' for p in step.parts)
    assert svc.get_thread('r1', 't1').title == 'Observer title'


# -- observeAttachments ----------------------------------------------------------------------------------------------
def test_attachment_patterns_match_case_insensitively() -> None:
    assert attachment_observed('image/png', True) and not attachment_observed('image/png', False)
    assert attachment_observed('IMAGE/PNG', ('image/*',)) and attachment_observed('application/pdf', ('*',))
    assert not attachment_observed('image/jpeg', ('image/png',)) and not attachment_observed(None, ('image/*',))
    assert not attachment_observed('image/png', ())


def test_only_allowed_attachments_reach_the_observer_and_the_actor_keeps_them_all() -> None:
    config = sync_config(observation={'messageTokens': 300, 'bufferTokens': False, 'observeAttachments': ['image/png']})
    h = Harness(config, work=False)
    images = Message.model_validate(
        {
            'id': 'pics',
            'role': 'user',
            'createdAt': h.clock.now().isoformat(),
            'parts': [
                {'type': 'text', 'text': words(200)},
                {'type': 'image', 'mediaType': 'image/png', 'data': PNG, 'filename': 'plan.png'},
                {'type': 'image', 'mediaType': 'image/jpeg', 'data': JPEG, 'filename': 'face.jpg'},
            ],
        }
    )
    h.engine.prepare_step('r1', 't1', [images])
    h.engine.complete_turn('r1', 't1', [h.assistant(words(150))])
    h.engine.prepare_step('r1', 't1', [h.user(words(5))])
    (call,) = h.model.calls_for('observer')
    blobs = [p for c in call.request.contents for p in c.parts if isinstance(p, InlineBlob)]
    assert [b.mime_type for b in blobs] == ['image/png']
    prompt = ''.join(p for c in call.request.contents for p in c.parts if isinstance(p, str))
    assert '[Image #1: plan.png]' in prompt and '[Image #2: face.jpg]' in prompt  # placeholders for both
    stored = h.store.get_messages('r1', 't1', ['pics'])[0]
    assert [getattr(p, 'media_type', None) for p in stored.parts] == [None, 'image/png', 'image/jpeg']


# -- on demand: observe, imported history, reflect, buffer ------------------------------------------------------------
def imported_history(start: datetime) -> list[Message]:
    return [
        Message.model_validate(
            {
                'id': f'ext-{n}',
                'role': 'user' if n % 2 == 0 else 'assistant',
                'createdAt': (start + timedelta(minutes=n)).isoformat(),
                'content': f'Imported fact {n}: my sister Maya lives in Porto.',
            }
        )
        for n in range(4)
    ]


def test_imported_history_is_observed_with_its_own_dates_and_never_added_to_the_thread() -> None:
    h = Harness(sync_config(), work=False)
    svc, log = service(h)
    svc.create_thread('r1', 't1')
    svc.step('r1', 't1', [h.user('hello')])
    dated = datetime(2019, 5, 4, 8, 0, tzinfo=UTC)
    result = svc.observe('r1', 't1', imported_history(dated))
    assert result.status == 'done'
    (call,) = h.model.calls_for('observer')
    prompt = ''.join(p for c in call.request.contents for p in c.parts if isinstance(p, str))
    assert 'May 4 2019:' in prompt and 'Imported fact 3' in prompt and 'hello' not in prompt
    record = h.record()
    assert record.cursor('t1') == 0  # the thread's own message is still unobserved
    assert [g.kind for g in record.groups] == ['import'] and record.groups[0].start_seq == 0
    assert 'User talked about' in record.active_observations
    assert [m.text() for m in h.store.list_messages('r1', 't1').messages] == ['hello']
    assert [e.detail_type for e in log.events][-1] == 'data-om-observation-end'
    # The same import again (other ids, same messages and dates) is observed once.
    again = [m.model_copy(update={'id': f'again-{m.id}'}) for m in imported_history(dated)]
    assert svc.observe('r1', 't1', again).status == 'nothing_to_do'
    assert len(h.model.calls_for('observer')) == 1


def test_an_import_too_large_or_for_a_missing_thread_is_refused_before_any_model_call() -> None:
    h = Harness(sync_config(), work=False)
    svc, _ = service(h)
    svc.create_thread('r1', 't1')
    huge = [
        Message.model_validate({'id': 'x', 'role': 'user', 'createdAt': '2020-01-01T00:00:00Z', 'content': words(400)})
    ]
    with pytest.raises(ImportTooLargeError, match='smaller parts'):
        svc.observe('r1', 't1', huge)
    with pytest.raises(ThreadNotFoundError):
        svc.observe('r1', 'nope', imported_history(datetime(2020, 1, 1, tzinfo=UTC)))
    assert h.model.calls == []


def test_observe_now_takes_the_threads_messages_below_the_threshold_once() -> None:
    h = Harness(sync_config(), work=False)
    svc, _ = service(h)
    svc.step('r1', 't1', [h.user(words(20))])
    svc.turn('r1', 't1', [h.assistant(words(20))])
    first = svc.observe('r1', 't1')
    assert first.status == 'done' and first.record is not None and first.record.cursor('t1') == 2
    assert svc.observe('r1', 't1').status == 'nothing_to_do'
    assert len(h.model.calls_for('observer')) == 1


def test_reflect_now_runs_below_the_threshold_and_a_retry_does_not_reflect_again() -> None:
    h = Harness(sync_config(), work=False)
    svc, log = service(h)
    svc.step('r1', 't1', [h.user(words(200))])
    svc.turn('r1', 't1', [h.assistant(words(150))])
    svc.observe('r1', 't1')
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) condensed\n</observations>')
    reflected = svc.reflect('r1', 't1')
    assert reflected.status == 'done' and reflected.record is not None and reflected.record.generation == 1
    assert reflected.record.active_observations.endswith('condensed')
    end = [e for e in log.events if e.detail_type == 'data-om-observation-end'][-1].detail
    assert end['operationType'] == 'reflection' and end['usage']['calls'] == 1
    assert svc.reflect('r1', 't1').status == 'nothing_to_do'
    assert len(h.model.calls_for('reflector')) == 1


def test_buffer_now_makes_a_chunk_and_is_refused_where_nothing_is_buffered() -> None:
    h = Harness(buffering_config())
    svc, log = service(h)
    svc.step('r1', 't1', [h.user(words(30))])
    svc.turn('r1', 't1', [h.assistant(words(30))])
    h.work.jobs.clear()  # the interval was not crossed: nothing queued anyway
    result = svc.buffer('r1', 't1')
    assert result.status == 'done'
    assert [p.kind() for p in result.parts] == ['data-om-buffering-start', 'data-om-buffering-end']
    record = h.record()
    assert len(record.buffered_chunks) == 1 and record.background_parts == ()  # answered now, not kept for later
    assert svc.buffer('r1', 't1').status == 'nothing_to_do'
    assert [e.detail_type for e in log.events][-2:] == ['data-om-buffering-start', 'data-om-buffering-end']
    off = Harness(sync_config(), work=False)
    with pytest.raises(BufferingDisabledError, match='buffers nothing'):
        MemoryService(off.engine).buffer('r1', 't1')
