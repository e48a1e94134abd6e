"""Hostile input over HTTP on the local stack (issue 20): every bad request is refused cleanly and writes nothing, and
no resource can see or block another's threads.

One test per point of the issue. "Nothing was written" is checked on the storage itself: a snapshot of every item of
the table (thread item, messages, index keys, counters) and every object of the bucket, before and after the refused
request, must be identical.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from functions.api import limits
from om_cli.local_stack import LocalStack
from tests.e2e.conftest import Api, Storage, running_stack

pytestmark = pytest.mark.e2e

# Thresholds out of reach: no background work, so the storage only changes when a request writes.
CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 1_000_000, 'bufferTokens': False},
    'reflection': {'observationTokens': 1_000_000},
    'workingMemory': {'enabled': True},
    'retrieval': True,
}
ERROR_KEYS = {'code', 'message', 'details'}


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, _ = gemini
    with running_stack(server, CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def storage(stack) -> Storage:
    return Storage(stack)


def send(stack: LocalStack, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    """A raw HTTP request (http.client sends exactly these headers: no Content-Type unless given)."""
    parts = urlsplit(stack.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None
    finally:
        connection.close()


def refused(status: int, body: Any, expected_status: int, code: str) -> dict[str, Any]:
    """Assert the answer is the contract's error shape with this status and code; return the error."""
    assert status == expected_status, (status, body)
    assert set(body) == {'error'} and set(body['error']) == ERROR_KEYS, body
    error = body['error']
    assert error['code'] == code and error['message'], body
    assert isinstance(error['details'], list)
    return error


def user(text: str, mid: str | None = None) -> dict[str, Any]:
    return {'role': 'user', 'content': text, **({'id': mid} if mid else {})}


def step(api: Api, thread: str, resource: str, *messages: dict[str, Any]) -> tuple[int, Any]:
    return api.post(f'/threads/{quote(thread, safe="")}/steps', {'resourceId': resource, 'messages': list(messages)})


# ---------------------------------------------------------------------------------------------------------------------
# 1. Body parsing at the edge
# ---------------------------------------------------------------------------------------------------------------------
def test_json_media_types_are_read_in_any_case_and_other_types_are_415(stack, api, storage):
    body = json.dumps({'resourceId': 'media', 'messages': [user('hello')]}).encode()
    for content_type in ('APPLICATION/JSON', 'application/json; charset=UTF-8', 'Application/Merge-Patch+JSON'):
        status, answer = send(stack, 'POST', '/threads/media-1/steps', body, {'Content-Type': content_type})
        assert status == 200, (content_type, answer)

    before = storage.snapshot()
    for headers in (
        {'Content-Type': 'text/plain'},
        {'Content-Type': 'application/x-www-form-urlencoded'},
        {'Content-Type': 'application/json; charset=latin-1'},
        {},  # no Content-Type: a browser sends such a body to any site without asking first
    ):
        status, answer = send(stack, 'POST', '/threads/media-3/steps', body, headers)
        error = refused(status, answer, 415, 'unsupported_media_type')
        assert 'application/json' in error['message']
    assert storage.snapshot() == before
    assert api.get('/threads/media-3?resourceId=media')[0] == 404


@pytest.mark.parametrize(
    ('case', 'raw', 'kind'),
    [
        ('invalid UTF-8', b'{"resourceId": "bad", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None),
        ('lone surrogate', b'{"resourceId": "bad", "messages": [{"role": "user", "content": "a\\ud800"}]}', None),
        ('NaN', b'{"resourceId": "bad", "messages": [{"role": "user", "content": "x"}], "stepNumber": NaN}', None),
        ('Infinity', b'{"resourceId": "bad", "messages": [], "stepNumber": -Infinity}', 'json_constant'),
        ('float overflow', b'{"resourceId": "bad", "messages": [], "stepNumber": 1e400}', 'json_overflow'),
        ('integer overflow', b'{"resourceId": "bad", "messages": [], "stepNumber": 1' + b'0' * 400 + b'}', None),
        ('too deep', b'{"resourceId": "bad", "messages": [], "x": ' + b'[' * 40 + b']' * 40 + b'}', 'json_too_deep'),
        ('runaway nesting', b'[' * 200_000, 'json_too_deep'),
        ('not JSON', b'{"resourceId": "bad", "messages": [', None),
    ],
)
def test_bodies_that_are_not_strict_json_are_400_before_anything_is_written(stack, api, storage, case, raw, kind):
    before = storage.snapshot()
    status, answer = send(stack, 'POST', '/threads/strict-1/steps', raw, {'Content-Type': 'application/json'})
    error = refused(status, answer, 400, 'invalid_json')
    if kind is not None:
        assert error['details'][0]['type'] == kind, error
    # Nothing was written: not the thread, not a message
    assert storage.snapshot() == before
    assert api.get('/threads/strict-1?resourceId=bad')[0] == 404


def test_a_lone_surrogate_names_the_field_it_is_in(stack):
    raw = b'{"resourceId": "bad", "messages": [{"role": "user", "parts": [{"type": "text", "text": "\\udfff"}]}]}'
    status, answer = send(stack, 'POST', '/threads/strict-2/steps', raw, {'Content-Type': 'application/json'})
    error = refused(status, answer, 400, 'invalid_json')
    assert error['details'][0]['field'] == 'messages[0].parts[0].text'


# ---------------------------------------------------------------------------------------------------------------------
# 2. Documented limits
# ---------------------------------------------------------------------------------------------------------------------
def _over_the_limits(thread: str) -> list[tuple[str, str, dict[str, Any], str, int]]:
    """(method, path, body, the field named, the limit) of one request just over each documented limit."""
    r = 'limits'
    many = limits.MAX_MESSAGES_PER_REQUEST + 1
    return [
        ('POST', f'/threads/{thread}/steps', {'resourceId': r, 'messages': [user(f'm{i}') for i in range(many)]},
         'messages', limits.MAX_MESSAGES_PER_REQUEST),
        ('POST', f'/threads/{thread}/turns',
         {'resourceId': r, 'messages': [{'role': 'assistant', 'parts': [{'type': 'text', 'text': 'p'}] * 101}]},
         'messages[0].parts', limits.MAX_PARTS_PER_MESSAGE),
        ('POST', f'/threads/{thread}/steps',
         {'resourceId': r, 'messages': [{'role': 'user', 'parts': [{'type': 'text', 'text': 'x' * 1_000_001}]}]},
         'messages[0].parts[0]', limits.MAX_TEXT_CHARS),
        ('POST', f'/threads/{thread}/chat', {'resourceId': r, 'content': 'x' * 1_000_001},
         'content', limits.MAX_TEXT_CHARS),
        ('POST', '/threads', {'resourceId': r, 'id': thread, 'metadata': {'notes': 'x' * 16_384}},
         'metadata', limits.MAX_METADATA_BYTES),
        ('POST', '/threads', {'resourceId': r, 'id': thread, 'title': 't' * 1001}, 'title', limits.MAX_TITLE_CHARS),
        ('PATCH', f'/threads/{thread}', {'resourceId': r, 'title': 't' * 1001}, 'title', limits.MAX_TITLE_CHARS),
        ('POST', f'/threads/{thread}/messages/query', {'resourceId': r, 'vectorSearchString': 'q' * 4001},
         'vectorSearchString', limits.MAX_QUERY_CHARS),
        ('POST', f'/threads/{thread}/messages/query', {'resourceId': r, 'include': [{'id': 'a'}] * 101},
         'include', limits.MAX_INCLUDES),
        ('POST', f'/threads/{thread}/messages/query',
         {'resourceId': r, 'include': [{'id': 'a', 'withPreviousMessages': 101}]},
         'include[0].withPreviousMessages', limits.MAX_CONTEXT_MESSAGES),
        ('DELETE', f'/threads/{thread}/messages', {'resourceId': r, 'messageIds': [f'm{i}' for i in range(1001)]},
         'messageIds', limits.MAX_DELETE_IDS),
        ('PUT', f'/resources/{r}/working-memory', {'workingMemory': 'w' * 70_000},
         'workingMemory', limits.MAX_WORKING_MEMORY_BYTES),
        ('PUT', f'/threads/{thread}/working-memory?resourceId={r}', {'workingMemory': 'w' * 70_000},
         'workingMemory', limits.MAX_WORKING_MEMORY_BYTES),
        ('POST', '/recall', {'resourceId': r, 'threadId': thread, 'mode': 'search', 'query': 'q' * 4001},
         'query', limits.MAX_QUERY_CHARS),
        ('POST', '/attachments',
         {'resourceId': r, 'threadId': thread, 'filename': 'a.pdf', 'mediaType': 'application/pdf',
          'size': limits.MAX_ATTACHMENT_BYTES + 1},
         'size', limits.MAX_ATTACHMENT_BYTES),
        ('POST', '/attachments',
         {'resourceId': r, 'threadId': thread, 'filename': 'f' * 256, 'mediaType': 'application/pdf', 'size': 1},
         'filename', limits.MAX_FILENAME_CHARS),
    ]  # fmt: skip


def test_every_documented_limit_is_a_413_naming_the_field_and_the_limit(api, storage):
    # Given a thread with a message (so every route has something it could change)
    assert step(api, 'lim-1', 'limits', user('hello', 'lim-m1'))[0] == 200
    before = storage.snapshot()
    for method, path, body, field, limit in _over_the_limits('lim-1'):
        status, answer = api.request(method, path, body)
        error = refused(status, answer, 413, 'too_large')
        assert field in error['message'] or field == 'workingMemory', (path, error)
        assert any(d.get('field') == field and d.get('limit') == limit for d in error['details']), (path, error)
        assert str(limit) in error['message'] or str(limit) in json.dumps(error['details']), (path, error)
    assert storage.snapshot() == before


def test_the_body_size_limit_is_a_413_and_a_request_at_the_limits_is_accepted(api, storage):
    before = storage.snapshot()
    big = json.dumps({'resourceId': 'limits', 'messages': [user('x' * (limits.MAX_BODY_BYTES // 2))] * 2}).encode()
    status, answer = api.request('POST', '/threads/lim-2/steps', raw=big)
    error = refused(status, answer, 413, 'too_large')
    assert str(limits.MAX_BODY_BYTES) in error['message']
    assert storage.snapshot() == before
    # Exactly at the limits: 100 messages, a message of 100 parts, a title of 1000 characters
    status, answer = step(api, 'lim-3', 'limits', *[user(f'n{i}', f'lim3-{i}') for i in range(100)])
    assert status == 200 and len(answer['messages']) == 100, answer
    parts = [{'type': 'text', 'text': f'p{i}'} for i in range(100)]
    assert step(api, 'lim-3', 'limits', {'role': 'user', 'parts': parts})[0] == 200
    status, answer = api.post('/threads', {'resourceId': 'limits', 'id': 'lim-4', 'title': 't' * 1000})
    assert status == 201, answer


# ---------------------------------------------------------------------------------------------------------------------
# 3. One id grammar
# ---------------------------------------------------------------------------------------------------------------------
BAD_IDS = ['a/b', 'a?b', 'a#b', '100%', 'a b', 'tab\there', 'nul\x00', 'zero\u200bwidth', '..', 'x' * 129, '🙂']
GOOD_IDS = ['user:123', 'first.last+tag@example.com', '123e4567-e89b-12d3-a456-426614174000', 'Ünïcode_ok']


def _id_routes(bad: str) -> list[tuple[str, str, Any]]:
    """Every route that takes or creates an id, with `bad` in that id (path, query or body)."""
    b = quote(bad, safe='')
    ok = {'resourceId': 'ids', 'messages': [user('hi')]}
    return [
        ('POST', '/threads', {'resourceId': 'ids', 'id': bad}),
        ('POST', '/threads', {'resourceId': bad}),
        ('POST', f'/threads/{b}/steps', ok),
        ('POST', '/threads/ids-1/steps', {'resourceId': bad, 'messages': [user('hi')]}),
        ('POST', '/threads/ids-1/steps', {'resourceId': 'ids', 'messages': [user('hi', bad)]}),
        ('POST', f'/threads/{b}/turns', {'resourceId': 'ids', 'messages': [{'role': 'assistant', 'content': 'ok'}]}),
        ('POST', f'/threads/{b}/chat', {'resourceId': 'ids', 'content': 'hi'}),
        ('POST', '/threads/ids-1/clone', {'resourceId': 'ids', 'newThreadId': bad}),
        ('GET', f'/threads/{b}?resourceId=ids', None),
        ('GET', f'/threads/ids-1?resourceId={b}', None),
        ('GET', f'/threads/ids-1/memory?resourceId={b}', None),
        ('GET', f'/threads/{b}/messages?resourceId=ids', None),
        ('PATCH', f'/threads/{b}', {'resourceId': 'ids', 'title': 'x'}),
        ('DELETE', f'/threads/{b}?resourceId=ids', None),
        ('DELETE', '/threads/ids-1/messages', {'resourceId': 'ids', 'messageIds': [bad]}),
        ('POST', '/threads/ids-1/messages/query', {'resourceId': 'ids', 'include': [{'id': bad}]}),
        ('GET', f'/resources/{b}/threads', None),
        ('DELETE', f'/resources/{b}', None),
        ('GET', f'/resources/{b}/working-memory', None),
        ('PUT', f'/resources/{b}/working-memory', {'workingMemory': '# me'}),
        ('GET', f'/threads/{b}/working-memory?resourceId=ids', None),
        ('PUT', f'/threads/ids-1/working-memory?resourceId={b}', {'workingMemory': '# me'}),
        ('POST', '/recall', {'resourceId': 'ids', 'threadId': bad}),
        (
            'POST',
            '/attachments',
            {'resourceId': 'ids', 'threadId': bad, 'filename': 'a', 'mediaType': 'a/b', 'size': 1},
        ),
    ]


def test_ids_outside_the_grammar_are_422_invalid_id_on_every_route(api, storage):
    assert step(api, 'ids-1', 'ids', user('hello', 'ids-m1'))[0] == 200
    before = storage.snapshot()
    for bad in BAD_IDS:
        for method, path, body in _id_routes(bad):
            status, answer = api.request(method, path, body)
            if status == 404 and answer['error']['code'] == 'not_found' and bad == 'a/b':
                continue  # a decoded `/` in a path is another path: no route (the API never sees an id there)
            error = refused(status, answer, 422, 'invalid_id')
            assert 'ids are 1-128' in error['message'], (method, path, error)
    assert storage.snapshot() == before
    # The thread is as it was
    status, body = api.get('/threads/ids-1/messages?resourceId=ids')
    assert [m['id'] for m in body['messages']] == ['ids-m1']


def test_ids_in_the_grammar_work_everywhere(api):
    for good in GOOD_IDS:
        q = quote(good, safe='')
        status, body = api.post('/threads', {'resourceId': good, 'id': good, 'title': 'ok'})
        assert status == 201 and body['thread']['id'] == good, body
        status, body = step(api, good, good, user('hello', good))
        assert status == 200 and body['messages'][-1]['id'] == good, body
        assert api.get(f'/threads/{q}?resourceId={q}')[1]['thread']['resourceId'] == good
        status, body = api.post(f'/threads/{q}/clone', {'resourceId': good, 'newThreadId': f'{good}.copy'})
        assert status == 201 and body['thread']['id'] == f'{good}.copy', body
        assert [t['id'] for t in api.get(f'/resources/{q}/threads?direction=ASC')[1]['threads']] == [
            good,
            f'{good}.copy',
        ]
        assert api.request('PUT', f'/threads/{q}/working-memory?resourceId={q}', {'workingMemory': '# ok'})[0] == 200
        assert api.delete(f'/threads/{q}?resourceId={q}')[0] == 204
        assert api.delete(f'/resources/{q}')[0] == 204
        assert api.get(f'/resources/{q}/threads')[1]['threads'] == []


# ---------------------------------------------------------------------------------------------------------------------
# 4. Thread ids are scoped to their resource
# ---------------------------------------------------------------------------------------------------------------------
def _probes(thread: str) -> list[tuple[str, str, Any]]:
    """Every way bob could touch or detect a thread `thread` that is not his."""
    bob = 'bob'
    return [
        ('GET', f'/threads/{thread}?resourceId={bob}', None),
        ('GET', f'/threads/{thread}/memory?resourceId={bob}', None),
        ('GET', f'/threads/{thread}/messages?resourceId={bob}', None),
        ('POST', f'/threads/{thread}/messages/query', {'resourceId': bob}),
        ('PATCH', f'/threads/{thread}', {'resourceId': bob, 'title': 'mine now'}),
        ('POST', f'/threads/{thread}/clone', {'resourceId': bob, 'newThreadId': 'stolen'}),
        ('DELETE', f'/threads/{thread}/messages', {'resourceId': bob}),
        ('DELETE', f'/threads/{thread}?resourceId={bob}', None),
        ('GET', f'/threads/{thread}/working-memory?resourceId={bob}', None),
        ('PUT', f'/threads/{thread}/working-memory?resourceId={bob}', {'workingMemory': '# bob'}),
        ('POST', '/recall', {'resourceId': bob, 'threadId': thread}),
        (
            'POST',
            '/attachments',
            {'resourceId': bob, 'threadId': thread, 'filename': 'a', 'mediaType': 'a/b', 'size': 1},
        ),
        ('GET', f'/resources/{bob}/threads', None),
    ]


def test_no_answer_tells_another_resources_thread_from_a_missing_one(api, storage):
    # Bob's answers about `shared-1` before it exists ...
    before_alice = [api.request(m, p, b) for m, p, b in _probes('shared-1')]
    # ... and after Alice created it (with messages and working memory)
    assert step(api, 'shared-1', 'alice', user('alice was here', 'a-1'), user('more', 'a-2'))[0] == 200
    assert api.request('PUT', '/threads/shared-1/working-memory?resourceId=alice', {'workingMemory': '# A'})[0] == 200
    snapshot = storage.snapshot()
    after_alice = [api.request(m, p, b) for m, p, b in _probes('shared-1')]
    # Then every answer is the same (a 404 thread_not_found, or an empty list), and nothing of Alice's changed
    assert after_alice == before_alice
    assert {status for status, _ in after_alice} <= {200, 404}
    assert storage.snapshot() == snapshot


def test_two_resources_each_own_a_thread_of_the_same_id(api):
    # Alice's `t-same` first; Bob can still create his own, and neither blocks nor sees the other
    assert step(api, 't-same', 'alice', user('alice secret', 'm-1'))[0] == 200
    status, body = api.post('/threads', {'resourceId': 'bob', 'id': 't-same', 'title': 'bob'})
    assert status == 201 and body['thread']['resourceId'] == 'bob', body
    # Bob may even reuse Alice's message id with other content: another thread, so no 409
    status, body = step(api, 't-same', 'bob', user('bob secret', 'm-1'))
    assert status == 200 and [m['parts'][0]['text'] for m in body['messages']] == ['bob secret'], body
    alice = api.get('/threads/t-same/messages?resourceId=alice')[1]['messages']
    bob = api.get('/threads/t-same/messages?resourceId=bob')[1]['messages']
    assert [m['parts'][0]['text'] for m in alice] == ['alice secret']
    assert [m['parts'][0]['text'] for m in bob] == ['bob secret']
    # Erasing Bob's leaves Alice's; a clone into an id Bob uses is Alice's own thread
    assert api.delete('/threads/t-same?resourceId=bob')[0] == 204
    assert api.get('/threads/t-same?resourceId=alice')[0] == 200
    assert api.post('/threads', {'resourceId': 'bob', 'id': 'bob-only'})[0] == 201
    status, body = api.post('/threads/t-same/clone', {'resourceId': 'alice', 'newThreadId': 'bob-only'})
    assert status == 201 and body['thread']['resourceId'] == 'alice', body
    assert [t['id'] for t in api.get('/resources/bob/threads')[1]['threads']] == ['bob-only']
    assert api.get('/threads/bob-only?resourceId=bob')[1]['thread']['metadata'] == {}


# ---------------------------------------------------------------------------------------------------------------------
# 5. A refused request changes nothing
# ---------------------------------------------------------------------------------------------------------------------
def test_a_refused_request_changes_nothing_not_even_updated_at_or_the_indexes(api, storage):
    # Given a thread with a stored message (its item holds updatedAt, the attention mark and the seq counter)
    assert step(api, 'ref-1', 'carol', user('original', 'c-1'))[0] == 200
    assert (
        api.post(
            '/threads/ref-1/turns',
            {'resourceId': 'carol', 'messages': [{'id': 'c-2', 'role': 'assistant', 'content': 'ok'}]},
        )[0]
        == 200
    )
    before = storage.snapshot()
    thread = api.get('/threads/ref-1?resourceId=carol')[1]['thread']
    refusals = [
        ('POST', '/threads/ref-1/steps', {'resourceId': 'carol', 'messages': [user('changed', 'c-1')]}, 409),
        ('POST', '/threads/ref-1/turns',
         {'resourceId': 'carol', 'messages': [{'id': 'c-2', 'role': 'assistant', 'content': 'changed'}]}, 409),
        ('POST', '/threads/ref-1/chat', {'resourceId': 'carol', 'message': user('changed', 'c-1')}, 409),
        ('POST', '/threads/ref-1/steps',
         {'resourceId': 'carol', 'messages': [user('new', 'c-9'), user('changed', 'c-1')]}, 409),
        ('POST', '/threads', {'resourceId': 'carol', 'id': 'ref-1'}, 409),
        ('POST', '/threads/ref-1/clone', {'resourceId': 'carol', 'newThreadId': 'ref-1'}, 409),
        ('PATCH', '/threads/ref-1', {'resourceId': 'carol', 'metadata': {'workingMemory': 5}}, 422),
        ('POST', '/threads/ref-1/steps', {'resourceId': 'carol', 'messages': [{'role': 'robot', 'content': 'x'}]}, 422),
    ]  # fmt: skip
    for method, path, body, expected in refusals:
        status, answer = api.request(method, path, body)
        assert status == expected and set(answer) == {'error'}, (path, status, answer)
        assert storage.snapshot() == before, (method, path, body)
    # A retry of stored messages is accepted and changes nothing either
    assert step(api, 'ref-1', 'carol', user('original', 'c-1'))[0] == 200
    assert storage.snapshot() == before
    assert api.get('/threads/ref-1?resourceId=carol')[1]['thread']['updatedAt'] == thread['updatedAt']
    # And the next message still gets the next sequence number (no hole was burned)
    assert step(api, 'ref-1', 'carol', user('next', 'c-3'))[0] == 200
    status, body = api.get('/threads/ref-1/messages?resourceId=carol')
    assert [m['id'] for m in body['messages']] == ['c-1', 'c-2', 'c-3']
