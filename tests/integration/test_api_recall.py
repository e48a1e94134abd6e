"""`POST /recall` and the Actor's recall tool in chat, through `lambda_handler` under moto (events/api/recall_*)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from functions import _wiring
from tests.fakes.fake_gemini import FakeGemini, FakeReply
from tests.integration import test_api_handler as base
from tests.integration.test_api_handler import FLASH, THREAD, Api, assert_error, load_json_body

RETRIEVAL_ON = json.dumps({'model': 'default', 'retrieval': True})


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler tests' environment, with retrieval on."""
    base.set_aws_env(monkeypatch)
    monkeypatch.setenv('OM_CONFIG', RETRIEVAL_ON)


aws = base.aws
api = base.api


@pytest.fixture
def gemini(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        monkeypatch.setenv('GOOGLE_GEMINI_BASE_URL', server.url)
        monkeypatch.setenv('GEMINI_API_KEY', 'test-key')
        yield server


def seed_history(api: Api, count: int = 5, *, thread: str = THREAD) -> None:
    for n in range(count):
        status, _ = api.step(f'note number {n}', id=f'{thread}-m{n}', thread=thread)
        assert status == 200


def recall_call(api: Api, scenario: str = 'recall_messages', **body: object) -> tuple[int, object]:
    status, answer, _ = api.call(scenario, body={**load_json_body(scenario), **body})
    return status, answer


# ---------------------------------------------------------------------------------------------------------------------
# POST /recall
# ---------------------------------------------------------------------------------------------------------------------
def test_sample_event_pages_forward_from_its_cursor(api: Api) -> None:
    api.step('first', id='msg-client-1')
    api.step('second', id='msg-client-2')

    status, body, headers = api.call('recall_messages')

    assert status == 200, body
    assert headers['Content-Type'] == 'application/json'
    assert set(body) == {
        'messages',
        'count',
        'cursor',
        'page',
        'limit',
        'detail',
        'hasNextPage',
        'hasPrevPage',
        'truncated',
        'tokenOffset',
    }
    assert body['count'] == 1 and '[msg-client-2]' in body['messages'] and '[p0] second' in body['messages']
    assert (body['cursor'], body['page'], body['hasNextPage'], body['hasPrevPage']) == ('msg-client-1', 1, False, False)


def test_recall_pages_backward_and_reads_parts(api: Api) -> None:
    seed_history(api)

    status, back = recall_call(api, cursor=f'{THREAD}-m3', page=-1, limit=2)
    part_status, part = recall_call(api, cursor=f'{THREAD}-m3', partIndex=0)
    bad_status, bad = recall_call(api, cursor=f'{THREAD}-m3', partIndex=4)
    hint_status, hint = recall_call(api, cursor=f'{THREAD}-m1:{THREAD}-m3')

    assert status == 200 and back['count'] == 2 and back['hasPrevPage'] is True  # type: ignore[index]
    assert f'[{THREAD}-m1]' in back['messages'] and f'[{THREAD}-m2]' in back['messages']  # type: ignore[index]
    assert part_status == 200 and part['text'] == 'note number 3' and part['role'] == 'user'  # type: ignore[index]
    assert bad_status == 422 and 'Available indices: 0' in assert_error(bad, 'invalid_input')['message']
    assert hint_status == 200 and hint['count'] == 0 and 'looks like a range' in hint['messages']  # type: ignore[index]


def test_recall_without_a_cursor_reads_the_thread_from_its_start(api: Api) -> None:
    seed_history(api, 3)

    status, body = recall_call(api, cursor=None, limit=2)

    assert status == 200, body
    assert body['count'] == 2 and body['hasNextPage'] is True  # type: ignore[index]
    assert f'[{THREAD}-m0]' in body['messages'] and f'[{THREAD}-m2]' not in body['messages']  # type: ignore[index]


def test_recall_threads_marks_the_current_thread(api: Api) -> None:
    seed_history(api, 1)
    seed_history(api, 1, thread='thread-2')
    api.step('not mine', resource='user-99', thread='foreign')

    status, body, _ = api.call('recall_threads')

    assert status == 200, body
    assert set(body) == {'threads', 'count', 'page', 'hasMore'}
    assert body['count'] == 2 and body['hasMore'] is False
    assert '← current\n  id: thread-1' in body['threads'] and 'id: thread-2' in body['threads']
    assert 'foreign' not in body['threads']


def test_recall_of_another_resources_thread_is_404(api: Api) -> None:
    api.step('not mine', resource='user-99', thread='foreign')

    status, body = recall_call(api, threadId='foreign', cursor=None)

    assert status == 404 and assert_error(body, 'thread_not_found')


def test_recall_never_reads_another_resources_messages(api: Api) -> None:
    seed_history(api, 1)
    api.step('secret', resource='user-99', thread='foreign', id='foreign-1')

    status, body = recall_call(api, cursor='foreign-1')

    assert status == 422 and 'Could not resolve cursor message' in assert_error(body, 'invalid_input')['message']


def test_recall_search_and_bad_input_are_422(api: Api) -> None:
    seed_history(api, 1)

    search_status, search = recall_call(api, mode='search', query='lisbon', cursor=None)
    invalid_status, invalid = recall_call(api, limit=0)

    assert search_status == 422
    assert 'semantic search needs retrieval: {vector: true}' in assert_error(search, 'invalid_input')['message']
    assert invalid_status == 422 and assert_error(invalid, 'validation_error')


def test_recall_is_refused_when_retrieval_is_off(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('OM_CONFIG', json.dumps({'model': 'default'}))
    _wiring.reset()
    seed_history(api, 1)

    status, body, _ = api.call('recall_messages')

    assert status == 422
    assert 'retrieval: true' in assert_error(body, 'retrieval_disabled')['message']


def test_steps_list_the_recall_tool_when_retrieval_is_on(api: Api) -> None:
    status, body, _ = api.call('steps_basic')

    assert status == 200, body
    [tool] = body['tools']
    assert tool['name'] == 'recall' and tool['parameters']['type'] == 'object'
    assert {'cursor', 'partIndex', 'threadId'} <= set(tool['parameters']['properties'])


# ---------------------------------------------------------------------------------------------------------------------
# The Actor calls recall during chat (fake Gemini)
# ---------------------------------------------------------------------------------------------------------------------
def test_chat_runs_recall_for_the_actor_and_saves_the_tool_round(gemini: FakeGemini, api: Api) -> None:
    seed_history(api, 3)
    gemini.script(
        FLASH,
        FakeReply.function_calls(('recall', {'cursor': f'{THREAD}-m0', 'limit': 2})),
        FakeReply.text('You first wrote "note number 1".'),
    )

    status, body, _ = api.call('chat_basic')

    assert status == 200, body
    assert body['reply']['parts'] == [{'type': 'text', 'text': 'You first wrote "note number 1".'}]
    first, second = gemini.requests
    assert [t['name'] for t in first.tools] == ['recall']
    responses = [
        part['functionResponse']
        for content in second.body['contents']
        for part in content.get('parts') or []
        if 'functionResponse' in part
    ]
    [response] = responses
    assert response['name'] == 'recall'
    assert response['response']['count'] == 2 and f'[{THREAD}-m1]' in response['response']['messages']
    _, page = api.messages()
    roles = [m['role'] for m in page['messages']]
    assert roles[-4:] == ['user', 'assistant', 'tool', 'assistant']
    call_message, tool_message, reply = page['messages'][-3:]
    assert call_message['parts'][0]['type'] == 'tool-call' and call_message['parts'][0]['toolName'] == 'recall'
    assert tool_message['parts'][0]['type'] == 'tool-result'
    assert tool_message['parts'][0]['toolCallId'] == call_message['parts'][0]['toolCallId']
    assert reply['id'] == body['reply']['id']


def test_chat_hands_recall_errors_back_to_the_model(gemini: FakeGemini, api: Api) -> None:
    gemini.script(
        FLASH,
        FakeReply.function_calls(('recall', {'cursor': 'no-such-message'})),
        FakeReply.text('I could not find that.'),
    )

    status, body, _ = api.call('chat_basic')

    assert status == 200, body
    assert body['reply']['parts'][0]['text'] == 'I could not find that.'
    second = gemini.requests[1]
    [response] = [
        part['functionResponse']
        for content in second.body['contents']
        for part in content.get('parts') or []
        if 'functionResponse' in part
    ]
    assert response['response'] == {'error': 'Could not resolve cursor message: no-such-message'}
