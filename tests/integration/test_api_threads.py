"""Thread and message-history routes through `lambda_handler` under moto, with the sample events
(events/api/thread_*.json, messages_query.json, messages_delete.json)."""

from __future__ import annotations

from typing import Any

from tests.integration import test_api_handler as base
from tests.integration.test_api_handler import RESOURCE, THREAD, Api, assert_error, load_json_body

# The API fixtures of the handler tests (moto, environment, the handler), shared rather than copied.
aws_env = base.aws_env
aws = base.aws
api = base.api

OTHER = 'user-7'


def seed(api: Api, count: int, *, thread: str = THREAD, resource: str = RESOURCE) -> None:
    for n in range(count):
        status, _ = api.step(
            f'message {n}', thread=thread, resource=resource, id=f'm{n}', createdAt=f'2025-03-0{n % 9 + 1}T09:00:00Z'
        )
        assert status == 200


def get_thread(api: Api, thread: str, resource: str = RESOURCE) -> tuple[int, Any]:
    status, body, _ = api.call('thread_get', path=f'/threads/{thread}', query={'resourceId': resource})
    return status, body


def query(api: Api, thread: str = THREAD, **body: Any) -> tuple[int, Any]:
    status, answer, _ = api.call(
        'messages_query', path=f'/threads/{thread}/messages/query', body={'resourceId': RESOURCE, **body}
    )
    return status, answer


def ids(body: Any) -> list[str]:
    return [m['id'] for m in body['messages']]


# -- create and get -----------------------------------------------------------------------------------------------
def test_create_then_get_a_thread(api: Api) -> None:
    status, body, _ = api.call('thread_create')

    assert status == 201, body
    thread = body['thread']
    assert set(thread) == {'id', 'resourceId', 'title', 'titlePinned', 'createdAt', 'updatedAt', 'metadata'}
    assert (thread['id'], thread['resourceId'], thread['title']) == ('trip-planning', RESOURCE, 'Lisbon trip')
    assert thread['metadata'] == {'project': 'travel'} and thread['createdAt'].endswith('Z')
    status, got = get_thread(api, 'trip-planning')
    assert status == 200 and got == body
    # Listed with the resource's threads, and usable by the conversation routes.
    status, listed, _ = api.call('resource_threads_list')
    assert status == 200 and [t['id'] for t in listed['threads']] == ['trip-planning']
    assert api.step('hello', thread='trip-planning')[0] == 200
    assert get_thread(api, 'trip-planning')[1]['thread']['title'] == 'Lisbon trip'


def test_create_without_id_assigns_one(api: Api) -> None:
    status, body, _ = api.call('thread_create', body={'resourceId': RESOURCE})

    assert status == 201, body
    assert len(body['thread']['id']) == 36 and body['thread']['title'] is None and body['thread']['metadata'] == {}


def test_create_with_an_id_the_resource_has_is_409_and_another_resources_id_is_free(api: Api) -> None:
    seed(api, 1)
    status, body, _ = api.call('thread_create', body={'resourceId': RESOURCE, 'id': THREAD, 'title': 'x'})
    assert status == 409, body
    assert_error(body, 'thread_exists')
    assert_error(get_thread(api, THREAD, OTHER)[1], 'thread_not_found')
    # Thread ids are scoped to their resource: OTHER gets its own THREAD, and RESOURCE's stays as it was.
    status, body, _ = api.call('thread_create', body={'resourceId': OTHER, 'id': THREAD, 'title': 'x'})
    assert status == 201 and body['thread']['resourceId'] == OTHER, body
    assert get_thread(api, THREAD)[1]['thread']['title'] is None
    assert get_thread(api, THREAD, OTHER)[1]['thread']['title'] == 'x'


def test_get_of_another_resource_or_unknown_thread_is_404(api: Api) -> None:
    seed(api, 1)
    for thread, resource in ((THREAD, OTHER), ('nope', RESOURCE)):
        status, body = get_thread(api, thread, resource)
        assert status == 404
        assert_error(body, 'thread_not_found')


def test_create_refuses_bad_input(api: Api) -> None:
    for bad in ({'id': 'x'}, {'resourceId': RESOURCE, 'metadata': []}, {'resourceId': RESOURCE, 'colour': 'red'}):
        status, body, _ = api.call('thread_create', body=bad)
        assert status == 422, (bad, body)
        assert_error(body, 'validation_error')


# -- patch --------------------------------------------------------------------------------------------------------
def test_patch_updates_title_and_replaces_metadata(api: Api) -> None:
    seed(api, 1)

    status, body, _ = api.call('thread_patch')

    assert status == 200, body
    assert body['thread']['title'] == 'Lisbon in May'
    assert body['thread']['metadata'] == {'project': 'travel', 'status': 'active'}
    assert get_thread(api, THREAD)[1] == body
    # Fields left out stay; metadata is replaced as a whole.
    status, body, _ = api.call('thread_patch', body={'resourceId': RESOURCE, 'metadata': {'status': 'done'}})
    assert status == 200
    assert body['thread']['title'] == 'Lisbon in May' and body['thread']['metadata'] == {'status': 'done'}
    status, body, _ = api.call('thread_patch', body={'resourceId': RESOURCE, 'title': None})
    assert body['thread']['title'] is None and body['thread']['metadata'] == {'status': 'done'}


def test_patch_of_another_resource_is_404_and_bad_input_422(api: Api) -> None:
    seed(api, 1)
    status, body, _ = api.call('thread_patch', body={'resourceId': OTHER, 'title': 'stolen'})
    assert status == 404
    assert_error(body, 'thread_not_found')
    status, body, _ = api.call('thread_patch', body={'resourceId': RESOURCE, 'title': 7})
    assert status == 422
    assert_error(body, 'validation_error')
    assert get_thread(api, THREAD)[1]['thread']['title'] is None


# -- clone --------------------------------------------------------------------------------------------------------
def test_clone_copies_messages_into_a_traceable_thread(api: Api) -> None:
    seed(api, 3)

    status, body, _ = api.call('thread_clone')

    assert status == 201, body
    assert set(body) == {'thread', 'clonedMessages'}
    thread = body['thread']
    assert (thread['id'], thread['title']) == ('thread-1-branch', 'Branched trip plan')
    cloned_from = thread['metadata']['clonedFrom']
    assert {k: cloned_from[k] for k in ('threadId', 'resourceId', 'messageCount', 'lastMessageId')} == {
        'threadId': THREAD,
        'resourceId': RESOURCE,
        'messageCount': 3,
        'lastMessageId': 'm2',
    }
    copies = body['clonedMessages']
    assert [m['parts'][0]['text'] for m in copies] == ['message 0', 'message 1', 'message 2']
    assert not {m['id'] for m in copies} & {'m0', 'm1', 'm2'}
    _, page = api.messages(thread='thread-1-branch')
    assert [m['id'] for m in page['messages']] == [m['id'] for m in copies]
    # Cloning again into the same id is a conflict; a limit and a date range select the messages.
    status, body, _ = api.call('thread_clone')
    assert status == 409
    assert_error(body, 'thread_exists')
    status, body, _ = api.call(
        'thread_clone',
        body={'resourceId': RESOURCE, 'messageLimit': 1, 'dateRange': {'end': '2025-03-02T09:00:00Z'}},
    )
    assert status == 201, body
    assert [m['parts'][0]['text'] for m in body['clonedMessages']] == ['message 1']


def test_clone_of_another_resource_is_404_and_bad_input_422(api: Api) -> None:
    seed(api, 1)
    status, body, _ = api.call('thread_clone', body={'resourceId': OTHER})
    assert status == 404
    assert_error(body, 'thread_not_found')
    for bad in ({'resourceId': RESOURCE, 'messageLimit': -1}, {'resourceId': RESOURCE, 'dateRange': {'start': 'x'}}):
        status, body, _ = api.call('thread_clone', body=bad)
        assert status == 422, body
        assert_error(body, 'validation_error')


# -- query --------------------------------------------------------------------------------------------------------
def test_query_pages_filters_and_includes_context(api: Api) -> None:
    seed(api, 6)

    status, body = query(api, perPage=2, page=1)
    assert status == 200, body
    assert set(body) == {'messages', 'hasMore'}
    assert ids(body) == ['m2', 'm3'] and body['hasMore'] is True
    assert not {'seq', 'tokenCounts', 'threadId', 'resourceId'} & set(body['messages'][0])

    status, body = query(api, perPage=False)
    assert ids(body) == ['m0', 'm1', 'm2', 'm3', 'm4', 'm5'] and body['hasMore'] is False

    status, body = query(api, dateRange={'start': '2025-03-02T09:00:00Z', 'end': '2025-03-04T09:00:00Z'})
    assert ids(body) == ['m1', 'm2', 'm3']

    status, body = query(api, perPage=0, include=[{'id': 'm3', 'withPreviousMessages': 2, 'withNextMessages': 1}])
    assert ids(body) == ['m1', 'm2', 'm3', 'm4'] and body['hasMore'] is False


def test_query_sample_event(api: Api) -> None:
    seed(api, 2)
    api.step('the one', id='msg-123', createdAt='2025-03-05T09:00:00Z')
    seed(api, 0)

    status, body, _ = api.call('messages_query')

    assert status == 200, body
    assert ids(body) == ['m0', 'm1', 'msg-123']


def test_query_refuses_vectors_bad_input_and_foreign_threads(api: Api) -> None:
    seed(api, 1)
    status, body = query(api, vectorSearchString='deadline')
    assert status == 422
    assert 'vector search is not enabled' in assert_error(body, 'invalid_input')['message']
    for bad in (
        {'perPage': 1001},
        {'perPage': True},
        {'page': -1},
        {'dateRange': {'start': '2025-03-02T00:00:00Z', 'end': '2025-03-01T00:00:00Z'}},
        {'include': [{'withNextMessages': 1}]},
    ):
        status, body = query(api, **bad)
        assert status == 422, (bad, body)
        assert_error(body, 'validation_error')
    status, body, _ = api.call('messages_query', body={'resourceId': OTHER})
    assert status == 404
    assert_error(body, 'thread_not_found')


# -- delete -------------------------------------------------------------------------------------------------------
def test_delete_messages_by_id_then_clear(api: Api) -> None:
    seed(api, 4)

    status, body, _ = api.call('messages_delete', body={'resourceId': RESOURCE, 'messageIds': ['m1', 'unknown']})

    assert status == 204 and body is None
    assert [m['id'] for m in api.messages()[1]['messages']] == ['m0', 'm2', 'm3']
    status, _, _ = api.call('messages_delete', body={'resourceId': RESOURCE})
    assert status == 204
    assert api.messages()[1]['messages'] == []
    assert get_thread(api, THREAD)[0] == 200  # the thread stays
    assert api.step('again', id='m9')[0] == 200
    assert [m['id'] for m in api.messages()[1]['messages']] == ['m9']


def test_delete_sample_event_and_resource_id_in_the_query(api: Api) -> None:
    api.step('the one', id='msg-123')
    seed(api, 1)

    assert api.call('messages_delete')[0] == 204
    assert [m['id'] for m in api.messages()[1]['messages']] == ['m0']
    status, _, _ = api.call('messages_delete', raw_body='', query={'resourceId': RESOURCE})
    assert status == 204
    assert api.messages()[1]['messages'] == []


def test_delete_of_another_resource_is_404_and_bad_input_422(api: Api) -> None:
    seed(api, 1)
    status, body, _ = api.call('messages_delete', body={'resourceId': OTHER})
    assert status == 404
    assert_error(body, 'thread_not_found')
    status, body, _ = api.call('messages_delete', body={'messageIds': ['m0']})
    assert status == 422
    assert_error(body, 'validation_error')
    status, body, _ = api.call('messages_delete', body={'resourceId': RESOURCE}, query={'resourceId': OTHER})
    assert status == 422
    assert_error(body, 'validation_error')
    status, body, _ = api.call('messages_delete', body={'resourceId': RESOURCE, 'messageIds': 'm0'})
    assert status == 422
    assert [m['id'] for m in api.messages()[1]['messages']] == ['m0']


def test_openapi_lists_the_thread_routes(api: Api) -> None:
    status, body, _ = api.call('openapi_get')
    assert status == 200
    paths = body['paths']
    assert {'post'} <= set(paths['/threads'])
    assert {'get', 'patch', 'delete'} <= set(paths['/threads/{threadId}'])
    assert 'post' in paths['/threads/{threadId}/clone'] and 'post' in paths['/threads/{threadId}/messages/query']
    assert 'delete' in paths['/threads/{threadId}/messages'] and 'get' in paths['/threads/{threadId}/messages']
    assert load_json_body('thread_create')['resourceId'] == RESOURCE
