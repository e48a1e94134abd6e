"""Async buffering end to end on the local stack (issue 5): a slow (3 s) fake Observer runs only in the buffer worker,
steps never wait on it, chunks activate at the threshold, and duplicated or interrupted jobs make one chunk each.

The module runs its own stack with buffering on (the shared E2E_CONFIG turns it off).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from functions import _wiring
from om_cli.local_stack import LocalStack
from om_lib.work import Job
from tests.e2e.conftest import Api, running_stack, wait_for

pytestmark = pytest.mark.e2e

OBSERVER_DELAY_S = 3.0
BUFFER_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 600, 'bufferTokens': 150, 'bufferActivation': 0.8, 'blockAfter': 5},
    'reflection': {'observationTokens': 20000},
}
OBSERVER_SYSTEM = 'You are the memory of an AI assistant'


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, behaviour = gemini
    behaviour.mode.observer_delay_s = OBSERVER_DELAY_S
    with running_stack(server, BUFFER_CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


def sentence(tag: str, n: int, words: int = 60) -> str:
    vocab = 'migration plan owner deadline budget rollout table queue region review'.split()
    return f'{tag}-{n} ' + ' '.join(vocab[i % len(vocab)] for i in range(words))


def observer_calls(server) -> list[Any]:
    return [c for c in server.calls if OBSERVER_SYSTEM in c.request.system_text]


def observer_calls_mentioning(server, marker: str) -> list[Any]:
    return [c for c in observer_calls(server) if any(marker in text for text in c.request.user_texts)]


def record_of(resource: str, thread: str):
    return _wiring.engine().store.get_record(f'thread:{resource}/{thread}')


def test_steps_never_wait_for_the_observer_and_activation_loses_nothing(api, stack, gemini):
    server, _ = gemini
    resource, thread = 'buf-user', f'buf-{uuid.uuid4().hex[:8]}'
    steps: list[tuple[float, float]] = []
    step_parts: list[list[dict[str, Any]]] = []
    sent: list[str] = []

    def step(text: str) -> dict[str, Any]:
        mid = f'{thread}-u{len(sent)}'
        sent.append(mid)
        started = time.monotonic()
        status, body = api.post(
            f'/threads/{thread}/steps',
            {'resourceId': resource, 'messages': [{'id': mid, 'role': 'user', 'content': text}]},
        )
        steps.append((started, time.monotonic()))
        assert status == 200, body
        step_parts.append(body['parts'])
        return body

    def turn(n: int) -> None:
        step(sentence('user', n))
        mid = f'{thread}-a{n}'
        sent.append(mid)
        status, body = api.post(
            f'/threads/{thread}/turns',
            {'resourceId': resource, 'messages': [{'id': mid, 'role': 'assistant', 'content': sentence('reply', n)}]},
        )
        assert status == 200, body
        time.sleep(0.3)

    for n in range(8):
        turn(n)
    stack.drain(timeout=120)
    body = None
    for n in range(8, 14):
        body = step(sentence('user', n))
        if any(p['type'] == 'data-om-activation' for p in body['parts']):
            break
        stack.drain(timeout=120)
    else:
        pytest.fail('no activation happened')

    # No step made a model call: none took as long as one Observer call, none contained one, none observed.
    assert all(end - start < OBSERVER_DELAY_S - 0.5 for start, end in steps), steps
    calls = observer_calls(server)
    assert calls, 'the worker observed in the background'
    contained = [c for c in calls for start, end in steps if c.received_at >= start and (c.answered_at or 1e18) <= end]
    assert contained == []
    assert not any(p['type'] == 'data-om-observation-start' for parts in step_parts for p in parts)
    # The worker's outcomes reach the client: a later step answers each buffering-end, with the chunk's text.
    ended = [p['data'] for parts in step_parts for p in parts if p['type'] == 'data-om-buffering-end']
    assert ended and all(d['operationType'] == 'observation' and d['observations'] for d in ended)

    # Activation: observations are active, the activated messages left the context, the status shows the windows.
    assert body is not None and body['system']
    activation = next(p for p in body['parts'] if p['type'] == 'data-om-activation')['data']
    assert activation['cycleId'].startswith('buffer-obs-') and activation['messagesActivated'] > 0
    status = next(p for p in body['parts'] if p['type'] == 'data-om-status')['data']
    assert 'projectedMessageRemoval' in status['windows']['buffered']['observations']
    record = record_of(resource, thread)
    cursor = record.cursor(thread)
    visible = {m.get('id') for m in body['messages']}
    stored = _wiring.engine().store.list_messages(resource, thread, limit=1000).messages
    assert {m.id for m in stored} == set(sent)
    # Nothing is lost: every message is observed (at or before the cursor) or still in the Actor's context.
    for message in stored:
        assert (message.seq or 0) <= cursor or message.id in visible, message.id
    # Observed messages reached an Observer call (each one, once per chunk).
    for message in stored:
        if (message.seq or 0) <= cursor:
            assert observer_calls_mentioning(server, message.text().split(' ')[0] + ' '), message.id


def _seed_one_slice(api, stack, resource: str, thread: str, marker: str) -> None:
    # One message over bufferTokens, and the turn that answers it: the turn queues one buffering job for both.
    status, body = api.post(
        f'/threads/{thread}/steps',
        {'resourceId': resource, 'messages': [{'role': 'user', 'content': sentence(marker, 0, words=170)}]},
    )
    assert status == 200, body
    assert not any(p['type'] == 'data-om-buffering-start' for p in body['parts']), body['parts']
    status, body = api.post(
        f'/threads/{thread}/turns', {'resourceId': resource, 'messages': [{'role': 'assistant', 'content': 'ok'}]}
    )
    assert status == 200, body
    assert any(p['type'] == 'data-om-buffering-start' for p in body['parts']), body['parts']


def test_a_job_delivered_twice_makes_one_chunk(api, stack, gemini):
    server, _ = gemini
    resource, thread = 'buf-user', f'dup-{uuid.uuid4().hex[:8]}'
    marker = f'dup{uuid.uuid4().hex[:6]}'
    _seed_one_slice(api, stack, resource, thread, marker)
    # The same job, twice more, under fresh de-duplication ids (so the queue delivers both).
    job = Job('buffer', resource, thread, f'thread:{resource}/{thread}', 'interval', start_seq=1, end_seq=1)
    sqs = stack.client('sqs')
    for _ in range(2):
        sqs.send_message(
            QueueUrl=stack.queue_url,
            MessageBody=json.dumps(job.to_json()),
            MessageGroupId=job.record_key,
            MessageDeduplicationId=uuid.uuid4().hex,
        )
    stack.drain(timeout=60)
    record = wait_for(lambda: record_of(resource, thread))
    assert len(record.buffered_chunks) == 1
    assert len(observer_calls_mentioning(server, marker)) == 1
    # The listing says where each message stands: both are in the chunk, waiting to activate
    status, page = api.get(f'/threads/{thread}/messages?resourceId={resource}')
    assert status == 200 and [m['omStatus'] for m in page['messages']] == ['buffered', 'buffered']


def test_a_worker_that_dies_before_its_write_is_rerun_and_makes_one_chunk(api, stack, gemini, monkeypatch):
    server, _ = gemini
    resource, thread = 'buf-user', f'die-{uuid.uuid4().hex[:8]}'
    marker = f'die{uuid.uuid4().hex[:6]}'
    store = _wiring.engine().store
    real_put = store.put_record
    died: list[str] = []

    def dying_put(record, *, expected_version):
        if record.key.endswith(f'/{thread}') and record.buffered_chunks and not died:
            died.append(record.key)
            raise RuntimeError('worker died after the model call, before its write')
        return real_put(record, expected_version=expected_version)

    monkeypatch.setattr(store, 'put_record', dying_put)
    _seed_one_slice(api, stack, resource, thread, marker)
    # SQS redelivers the failed job after its visibility timeout; the re-run makes the chunk.
    wait_for(lambda: (record_of(resource, thread) or None) and record_of(resource, thread).buffered_chunks, timeout=60)
    stack.drain(timeout=60)
    assert died
    assert len(record_of(resource, thread).buffered_chunks) == 1
    assert len(observer_calls_mentioning(server, marker)) == 2
