"""The thread, message-history and recall routes over real HTTP on the local stack (retrieval on).

One journey per concern, as a user of the API would take it: create and list threads, page and query history with
context, clone a thread, delete messages and clear a thread, and page through raw history with the recall tool.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from om_cli.local_stack import LocalStack
from tests.e2e.conftest import E2E_CONFIG, Api, running_stack

RESOURCE = 'hist-user'


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    """This module's own stack: the e2e configuration with retrieval (the recall tool) on."""
    config = {**E2E_CONFIG, 'observation': {'messageTokens': 100_000, 'bufferTokens': False}, 'retrieval': True}
    with running_stack(gemini[0], config) as running:
        yield running


def step(api: Api, thread: str, text: str, mid: str, created: str, resource: str = RESOURCE) -> None:
    message = {'id': mid, 'role': 'user', 'createdAt': created, 'parts': [{'type': 'text', 'text': text}]}
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [message]})
    assert status == 200, body


def seed(api: Api, thread: str, count: int) -> None:
    for n in range(count):
        step(api, thread, f'note number {n}', f'{thread}-m{n}', f'2025-03-{n + 1:02d}T09:00:00Z')


def ids(body: dict) -> list[str]:
    return [m['id'] for m in body['messages']]


def test_threads_are_created_listed_in_order_updated_and_kept_apart(api):
    for n in range(3):
        status, body = api.post('/threads', {'resourceId': RESOURCE, 'id': f'list-{n}', 'metadata': {'n': n}})
        assert status == 201, body
    # Newest first by default; oldest first on request; a page at a time
    status, body = api.get(f'/resources/{RESOURCE}/threads?perPage=2')
    assert status == 200 and [t['id'] for t in body['threads']][:2] == ['list-2', 'list-1'], body
    status, body = api.get(f'/resources/{RESOURCE}/threads?direction=ASC&perPage=100')
    listed = [t['id'] for t in body['threads'] if t['id'].startswith('list-')]
    assert listed == ['list-0', 'list-1', 'list-2']
    # A metadata filter, and an update of title and metadata
    status, body = api.get(f'/resources/{RESOURCE}/threads?metadata.n=1')
    assert status == 200 and [t['id'] for t in body['threads']] == ['list-1'], body
    status, body = api.request('PATCH', '/threads/list-1', {'resourceId': RESOURCE, 'title': 'Renamed'})
    assert status == 200 and body['thread']['title'] == 'Renamed', body
    # Another resource can neither read nor rename it; the id is its own to create (ids are scoped per resource)
    assert api.get('/threads/list-1?resourceId=someone-else')[0] == 404
    assert api.request('PATCH', '/threads/list-1', {'resourceId': 'someone-else', 'title': 'x'})[0] == 404
    assert api.post('/threads', {'resourceId': 'someone-else', 'id': 'list-1'})[0] == 201
    assert api.get(f'/threads/list-1?resourceId={RESOURCE}')[1]['thread']['title'] == 'Renamed'


def test_history_pages_and_includes_context_around_chosen_messages(api):
    seed(api, 'hist', 8)
    status, body = api.post('/threads/hist/messages/query', {'resourceId': RESOURCE, 'page': 1, 'perPage': 3})
    assert status == 200 and ids(body) == ['hist-m3', 'hist-m4', 'hist-m5'] and body['hasMore'] is True, body
    status, body = api.post(
        '/threads/hist/messages/query',
        {
            'resourceId': RESOURCE,
            'perPage': 0,
            'include': [{'id': 'hist-m5', 'withPreviousMessages': 1, 'withNextMessages': 1}],
        },
    )
    assert status == 200 and ids(body) == ['hist-m4', 'hist-m5', 'hist-m6'], body
    status, body = api.post(
        '/threads/hist/messages/query',
        {'resourceId': RESOURCE, 'perPage': False, 'dateRange': {'start': '2025-03-02', 'end': '2025-03-03T23:59:59Z'}},
    )
    assert status == 200 and ids(body) == ['hist-m1', 'hist-m2'], body
    # Bad input: unknown thread, negative page
    assert api.post('/threads/nope/messages/query', {'resourceId': RESOURCE})[0] == 404
    assert api.post('/threads/hist/messages/query', {'resourceId': RESOURCE, 'page': -1})[0] == 422


def test_a_clone_copies_the_chosen_messages_and_names_its_source(api):
    seed(api, 'src', 5)
    status, body = api.post(
        '/threads/src/clone', {'resourceId': RESOURCE, 'newThreadId': 'src-copy', 'messageLimit': 2}
    )
    assert status == 201, body
    assert [m['content'] if 'content' in m else m['parts'][0]['text'] for m in body['clonedMessages']] == [
        'note number 3',
        'note number 4',
    ]
    assert 'src' in str(body['thread']['metadata'])
    status, copied = api.post('/threads/src-copy/messages/query', {'resourceId': RESOURCE, 'perPage': False})
    assert status == 200 and len(copied['messages']) == 2
    # The source is untouched
    status, source = api.post('/threads/src/messages/query', {'resourceId': RESOURCE, 'perPage': False})
    assert len(source['messages']) == 5


def test_deleting_messages_and_clearing_a_thread(api):
    seed(api, 'del', 4)
    status, _ = api.request('DELETE', '/threads/del/messages', {'resourceId': RESOURCE, 'messageIds': ['del-m1']})
    assert status == 204
    status, body = api.post('/threads/del/messages/query', {'resourceId': RESOURCE, 'perPage': False})
    assert ids(body) == ['del-m0', 'del-m2', 'del-m3']
    status, _ = api.request('DELETE', f'/threads/del/messages?resourceId={RESOURCE}')
    assert status == 204
    status, body = api.post('/threads/del/messages/query', {'resourceId': RESOURCE, 'perPage': False})
    assert status == 200 and body['messages'] == []
    status, memory = api.get(f'/threads/del/memory?resourceId={RESOURCE}')
    assert status == 200 and memory['observationTokens'] == 0


def test_recall_pages_through_raw_history_and_stays_inside_the_resource(api):
    seed(api, 'rec', 6)
    status, body = api.post(
        '/recall',
        {'resourceId': RESOURCE, 'threadId': 'rec', 'mode': 'messages', 'cursor': 'rec-m1', 'page': 1, 'limit': 2},
    )
    assert status == 200, body
    assert body['count'] == 2 and body['hasNextPage'] is True
    assert 'note number 2' in body['messages'] and 'note number 3' in body['messages']
    status, body = api.post('/recall', {'resourceId': RESOURCE, 'threadId': 'rec', 'mode': 'threads'})
    assert status == 200 and 'rec' in body['threads'], body
    # Another resource's thread is out of reach
    status, body = api.post(
        '/recall', {'resourceId': 'someone-else', 'threadId': 'rec', 'mode': 'messages', 'cursor': 'rec-m1'}
    )
    assert status in (404, 422), body
