"""End to end over real HTTP: `om serve`'s local stack (API Gateway adapter → api Lambda → DynamoDB/S3 on moto,
SQS → buffer worker, Step Functions (moto's interpreter) → reflection Lambda in-process) with the real google-genai
client against the fake Gemini.

Concurrency is not tested here: moto is not atomic under threads (see tests/integration/test_dynamodb_races.py).
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import ACTOR_REPLY, wait_for

pytestmark = pytest.mark.e2e

PNG_1PX = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='


def long_text(topic: str, words: int = 260) -> str:
    """A user message comfortably over the module's messageTokens (200)."""
    vocab = f'{topic} migration plan owner deadline budget rollout table queue region review'.split()
    return ' '.join(vocab[i % len(vocab)] for i in range(words))


def user(text: str, mid: str | None = None) -> dict:
    message = {'role': 'user', 'content': text}
    if mid:
        message['id'] = mid
    return message


def assistant(text: str) -> dict:
    return {'role': 'assistant', 'content': text}


def part_types(body: dict) -> list[str]:
    return [p['type'] for p in body['parts']]


def memory(api, thread: str, resource: str) -> dict:
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, body
    return body


def assert_error_shape(body: dict, code: str | None = None) -> None:
    assert set(body) == {'error'}, body
    assert isinstance(body['error']['code'], str) and body['error']['code']
    assert isinstance(body['error']['message'], str) and body['error']['message']
    if code is not None:
        assert body['error']['code'] == code, body


def test_health(api):
    status, body = api.get('/health')
    assert status == 200 and body['status'] == 'ok'


def test_step_past_message_tokens_observes_in_the_request(api):
    # Given a new thread with more than messageTokens in one message (the Actor answers it: not observed yet)
    status, body = api.post('/threads/obs-1/steps', {'resourceId': 'alice', 'messages': [user(long_text('alpha'))]})
    assert status == 200 and 'data-om-observation-end' not in part_types(body), body
    # When the next step comes
    status, body = api.post('/threads/obs-1/steps', {'resourceId': 'alice', 'messages': [user('and then?')]})
    # Then the step observed synchronously and memory shows the observations
    assert status == 200, body
    assert 'data-om-observation-end' in part_types(body)
    assert 'data-om-status' in part_types(body)
    view = memory(api, 'obs-1', 'alice')
    assert view['observationTokens'] > 0
    assert 'migration plan' in view['observations']


def test_reflection_runs_through_the_state_machine(api, stack):
    # Given a conversation saved through turns only: each turn queues the observation that is due for the worker,
    # and the turn that finds observations past reflection.observationTokens starts the reflection workflow
    # (a step would reflect in the request itself: bufferTokens is false here)
    thread, resource = 'refl-1', 'alice'
    for i in range(4):
        status, body = api.post(
            f'/threads/{thread}/turns',
            {'resourceId': resource, 'messages': [user(long_text(f't{i}')), {'role': 'assistant', 'content': 'ok'}]},
        )
        assert status == 200, body
        # When the background work settles (the workflow runs on moto's interpreter, its tasks in this process)
        stack.drain(timeout=60)
    # Then a new generation replaced the log, committed by a SUCCEEDED execution of the reflection state machine
    view = memory(api, thread, resource)
    assert view['generationCount'] >= 1
    # (The log may be back over the threshold: the observation queued by the same turn keeps its lines; past the
    # archive bound the oldest groups, the reflection's among them, were archived.)
    assert 'condensed' in view['observations'] + ''.join(g['observations'] for g in view['archive']['groups'])
    sfn = stack.client('stepfunctions')
    mine = []
    for execution in stack.executions():
        described = sfn.describe_execution(executionArn=execution['executionArn'])
        if json.loads(described['input'])['job']['recordKey'] == f'thread:{resource}/{thread}':
            mine.append(described)
    committed = [d for d in mine if d['status'] == 'SUCCEEDED' and 'commit' in json.loads(d.get('output') or '{}')]
    assert committed, [(d['status'], d.get('output')) for d in mine]
    assert all(d['status'] == 'SUCCEEDED' for d in mine)


def test_chat_answers_with_the_actor_and_saves_both_messages(api):
    status, body = api.post('/threads/chat-1/chat', {'resourceId': 'alice', 'content': 'Hello, remember me?'})
    assert status == 200, body
    assert body['reply']['role'] == 'assistant'
    reply_text = ''.join(p.get('text', '') for p in body['reply'].get('parts') or []) or body['reply'].get('content')
    assert reply_text == ACTOR_REPLY
    assert 'data-om-status' in part_types(body)
    status, page = api.get('/threads/chat-1/messages?resourceId=alice')
    assert status == 200, page
    assert [m['role'] for m in page['messages']] == ['user', 'assistant']


def test_malformed_json_is_400_and_an_invalid_message_is_422(api):
    status, body = api.request('POST', '/threads/err-1/steps', raw=b'{"resourceId": "alice", ')
    assert status == 400
    assert_error_shape(body)
    status, body = api.post(
        '/threads/err-1/steps', {'resourceId': 'alice', 'messages': [{'role': 'robot', 'content': 'x'}]}
    )
    assert status == 422
    assert_error_shape(body)
    # A refused request writes nothing: the thread does not exist
    status, body = api.get('/threads/err-1/memory?resourceId=alice')
    assert status == 404


def test_a_thread_belongs_to_its_resource(api):
    status, body = api.post('/threads/own-1/steps', {'resourceId': 'alice', 'messages': [user('hi, I am Alice')]})
    assert status == 200, body
    status, body = api.get('/threads/own-1/memory?resourceId=mallory')
    assert status == 404
    assert_error_shape(body, 'thread_not_found')
    # Mallory's `own-1` is Mallory's own thread: she sees only what she wrote there, never Alice's
    status, body = api.post('/threads/own-1/steps', {'resourceId': 'mallory', 'messages': [user('let me in')]})
    assert status == 200 and [m['parts'][0]['text'] for m in body['messages']] == ['let me in'], body
    status, body = api.get('/threads/own-1/messages?resourceId=alice')
    assert [m['parts'][0]['text'] for m in body['messages']] == ['hi, I am Alice']


def test_a_failing_model_answers_200_keeps_the_message_and_observes_later(api, mode):
    thread, resource = 'fail-1', 'alice'
    # Given the model answers 503 to everything
    mode.fail_status = 503
    # When a step is due for observation
    api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [user(long_text('outage'), 'f1')]})
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [user('hm?', 'f2')]})
    # Then it still answers 200, says the observation failed, and the message is saved
    assert status == 200, body
    failed = [p for p in body['parts'] if p['type'] == 'data-om-observation-failed']
    assert failed, body['parts']
    status, page = api.get(f'/threads/{thread}/messages?resourceId={resource}')
    assert status == 200 and [m['id'] for m in page['messages']] == ['f1', 'f2']
    assert memory(api, thread, resource)['observationTokens'] == 0
    # And once the model is back, the turn schedules the observation and the worker does it
    mode.fail_status = None
    status, body = api.post(
        f'/threads/{thread}/turns', {'resourceId': resource, 'messages': [{'role': 'assistant', 'content': 'sorry'}]}
    )
    assert status == 200, body
    wait_for(lambda: memory(api, thread, resource)['observationTokens'] > 0, timeout=30)


def test_an_observation_past_the_time_budget_is_deferred_to_the_worker(api, mode, settings_env):
    thread, resource = 'budget-1', 'alice'
    # Given a 2 s request budget and an Observer that takes 5 s
    settings_env(OM_REQUEST_TIME_BUDGET_S='2')
    mode.observer_delay_s = 5.0
    # When a step is due for observation
    api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [user(long_text('slow'))]})
    started = time.monotonic()
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [user('so?')]})
    elapsed = time.monotonic() - started
    # Then it answers within the budget, with the observation deferred
    assert status == 200, body
    assert elapsed < 4.0, elapsed
    deferred = [p for p in body['parts'] if p['type'] == 'data-om-observation-failed']
    assert deferred and deferred[0]['data']['reason'] == 'deferred', body['parts']
    # And the worker finishes it
    wait_for(lambda: memory(api, thread, resource)['observationTokens'] > 0, timeout=40, interval=0.5)


def test_erase_leaves_nothing_of_the_thread(api, stack):
    thread, resource = f'erase-{uuid.uuid4().hex[:8]}', 'bob'
    # Given a thread with messages, an image and observations
    image = {
        'role': 'user',
        'parts': [
            {'type': 'text', 'text': long_text('secret')},
            {'type': 'image', 'mediaType': 'image/png', 'data': PNG_1PX, 'filename': 'board.png'},
        ],
    }
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [image]})
    assert status == 200, body
    status, body = api.post(f'/threads/{thread}/turns', {'resourceId': resource, 'messages': [assistant('noted')]})
    assert status == 200, body
    stack.drain(timeout=30)
    assert memory(api, thread, resource)['observationTokens'] > 0
    # When the thread is deleted
    status, body = api.delete(f'/threads/{thread}?resourceId={resource}')
    assert status == 204, body
    stack.drain(timeout=30)
    # Then nothing of it is left: only tombstones (keys and erase time) in the table, no object in the bucket
    ddb = stack.client('dynamodb')
    items = []
    for page in ddb.get_paginator('scan').paginate(TableName=stack.names.table):
        items += page['Items']
    mentioning = [i for i in items if thread in json.dumps(i)]
    for item in mentioning:
        assert set(item) <= {'PK', 'SK', 'erased_at', 'expires_at', 'inc'}, item
    assert not any('secret' in json.dumps(i) for i in items if thread in json.dumps(i))
    s3 = stack.client('s3')
    keys = [
        o['Key']
        for page in s3.get_paginator('list_objects_v2').paginate(Bucket=stack.names.bucket)
        for o in page.get('Contents', [])
    ]
    assert not [k for k in keys if thread in k], keys
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 404
    assert base64.b64decode(PNG_1PX)  # the fixture image itself is valid base64


def test_a_poison_job_ends_in_the_dead_letter_queue(stack):
    # Given a message that is not a job (e.g. written by an older version)
    sqs = stack.client('sqs')
    sqs.send_message(
        QueueUrl=stack.queue_url,
        MessageBody='{"kind": "nonsense"}',
        MessageGroupId='poison',
        MessageDeduplicationId=uuid.uuid4().hex,
    )
    # Then the worker fails it on every receive and the redrive policy moves it to the DLQ (maxReceiveCount 3)
    wait_for(lambda: stack.queue_depth(stack.dlq_url) >= 1, timeout=30, interval=0.5)
    assert stack.queue_depth() == 0


def test_a_body_over_the_api_limit_is_refused_with_413_naming_the_limit(stack):
    host, port = urlsplit(stack.url).hostname, urlsplit(stack.url).port
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.putrequest('POST', '/threads/big/steps')
        connection.putheader('Content-Type', 'application/json')
        connection.putheader('Content-Length', str(10 * 1024 * 1024 + 1))
        connection.endheaders()
        response = connection.getresponse()
        body = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 413
    assert_error_shape(body, 'too_large')
    assert f'limit of {5 * 1024 * 1024} bytes' in body['error']['message']
