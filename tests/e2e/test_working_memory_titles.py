"""End to end over real HTTP on the local stack: working memory (routes, the Actor's `updateWorkingMemory` tool,
read-only requests, initial values through thread metadata), `generateTitle` (a background job after the first
turn, run by the buffer worker) and the Observer's `observation.threadTitle`, with the real google-genai client
against the fake Gemini.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from functions import _wiring
from om_cli.local_stack import LocalStack
from om_lib.errors import ConfigError
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

pytestmark = pytest.mark.e2e

SCHEMA: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'name': {'type': 'string'},
        'location': {'type': 'string'},
        'preferences': {'type': 'object', 'properties': {'food': {'type': 'array', 'items': {'type': 'string'}}}},
    },
    'additionalProperties': False,
}
TITLE_INSTRUCTIONS = 'Title in three words'
CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 200, 'bufferTokens': False, 'threadTitle': True},
    'reflection': {'observationTokens': 50_000},
    'workingMemory': {'enabled': True, 'schema': SCHEMA},
    'generateTitle': {'model': 'google/gemini-2.5-flash-lite', 'instructions': TITLE_INSTRUCTIONS},
}


def user(text: str) -> dict[str, str]:
    return {'role': 'user', 'content': text}


def long_text(topic: str, words: int = 260) -> str:
    vocab = f'{topic} plan owner deadline budget rollout review schedule'.split()
    return ' '.join(vocab[i % len(vocab)] for i in range(words))


class Gemini:
    """Observer (with a thread title from the message's topic), title model and Actor (with tool calls)."""

    def __init__(self) -> None:
        self.requests: list[FakeRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        with self._lock:
            self.requests.append(request)
        system = request.system_text
        texts = ' '.join(request.user_texts)
        if 'You are the memory of an AI assistant' in system:
            topic = 'Zebra Habitat Research' if 'zebra' in texts else 'Budget Rollout Review'
            return FakeReply.text(
                '<observations>\nDate: Mar 3, 2025\n* 🔴 (09:00) User talked about ' + topic + '\n</observations>\n'
                f'<thread-title>{topic}</thread-title>'
            )
        if system == TITLE_INSTRUCTIONS:
            return FakeReply.text('Lisbon Trip Plans')
        last = (request.body.get('contents') or [{}])[-1]
        answered = any('functionResponse' in part for part in last.get('parts') or [])
        tools = [t['name'] for t in request.tools]
        if not answered and 'updateWorkingMemory' in tools:
            if 'bad update' in texts:
                return FakeReply.function_calls(('updateWorkingMemory', {'memory': {'name': 5}}))
            if 'My name is Sam' in texts:
                memory = {'name': 'Sam', 'location': 'Berlin', 'preferences': {'food': ['vegetarian']}}
                return FakeReply.function_calls(('updateWorkingMemory', {'memory': memory}))
        if answered:
            result = json.dumps(last['parts'][0]['functionResponse'].get('response', {}))
            return FakeReply.text(f'Tool said: {result}')
        return FakeReply.text('Noted.')


@pytest.fixture(scope='module')
def wm_gemini() -> Iterator[tuple[FakeGemini, Gemini]]:
    behaviour = Gemini()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture(scope='module')
def wm_api(wm_gemini) -> Iterator[Api]:
    with running_stack(wm_gemini[0], CONFIG) as running:
        yield Api(running.url)


def put(api: Api, path: str, body: Any) -> tuple[int, Any]:
    return api.request('PUT', path, body)


def error_code(body: Any) -> str:
    assert set(body) == {'error'} and body['error']['message'], body
    return body['error']['code']


def test_both_template_and_schema_is_refused_at_start_up() -> None:
    # Runs before the module's stack starts (it does not use it).
    bad = {**CONFIG, 'workingMemory': {'enabled': True, 'template': '- Name:', 'schema': SCHEMA}}
    stack = LocalStack(port=0, config=bad, workers=False, http=False, sweep_interval_s=None)
    with pytest.raises(ConfigError, match=r'workingMemory: set either `template` or `schema`, not both'):
        stack.start()
    _wiring.reset()


def test_working_memory_routes_over_http(wm_api: Api) -> None:
    api = wm_api
    status, _ = api.post(
        '/threads', {'resourceId': 'ana', 'id': 'wm-e2e-1', 'metadata': {'workingMemory': {'name': 'Ana'}}}
    )
    assert status == 201

    assert api.get('/resources/ana/working-memory') == (
        200,
        {'workingMemory': {'name': 'Ana'}, 'scope': 'resource', 'format': 'json'},
    )
    status, body = put(api, '/threads/wm-e2e-1/working-memory?resourceId=ana', {'workingMemory': {'location': 'Porto'}})
    assert status == 200 and body['workingMemory'] == {'name': 'Ana', 'location': 'Porto'}
    status, body = put(api, '/resources/ana/working-memory', {'workingMemory': {'name': None}})
    assert status == 200 and body['workingMemory'] == {'location': 'Porto'}
    assert api.get('/threads/wm-e2e-1/working-memory?resourceId=ana')[1]['workingMemory'] == {'location': 'Porto'}

    # Bad input: unknown thread, another resource's thread, a schema violation, a wrong type, a bad body.
    for path in ('/threads/nope/working-memory?resourceId=ana', '/threads/wm-e2e-1/working-memory?resourceId=bob'):
        status, body = api.get(path)
        assert status == 404 and error_code(body) == 'thread_not_found'
        status, body = put(api, path, {'workingMemory': {'name': 'Bob'}})
        assert status == 404 and error_code(body) == 'thread_not_found'
    status, body = put(api, '/resources/ana/working-memory', {'workingMemory': {'name': 5, 'shoe': 42}})
    assert status == 422 and error_code(body) == 'invalid_working_memory'
    assert {d['field'] for d in body['error']['details']} == {'name', '(root)'}
    status, body = put(api, '/resources/ana/working-memory', {'workingMemory': 'plain text'})
    assert status == 422 and error_code(body) == 'invalid_working_memory'
    status, body = put(api, '/resources/ana/working-memory', {'memory': {}})
    assert status == 422 and error_code(body) == 'validation_error'
    status, body = api.request('PUT', '/resources/ana/working-memory', raw=b'not json')
    assert status == 400
    status, body = api.post('/threads', {'resourceId': 'ana', 'id': 'wm-e2e-2', 'metadata': {'workingMemory': 'x'}})
    assert status == 422 and error_code(body) == 'invalid_working_memory'
    assert api.get('/threads/wm-e2e-2?resourceId=ana')[0] == 404
    assert api.get('/resources/ana/working-memory')[1]['workingMemory'] == {'location': 'Porto'}
    assert api.get('/resources/bob/working-memory')[1]['workingMemory'] is None


def test_chat_updates_working_memory_and_titles_the_thread_in_the_background(wm_api: Api, wm_gemini) -> None:
    api, (server, _) = wm_api, wm_gemini

    status, body = api.post('/threads/wm-chat/chat', {'resourceId': 'sam', 'content': 'My name is Sam, Berlin.'})

    assert status == 200, body
    assert body['reply']['parts'][0]['text'] == 'Tool said: {"success": true}'
    assert {'type': 'data-om-scheduled', 'data': {'operations': ['title']}} in body['parts']
    memory = {'name': 'Sam', 'location': 'Berlin', 'preferences': {'food': ['vegetarian']}}
    assert api.get('/resources/sam/working-memory')[1]['workingMemory'] == memory
    # The title job runs in the worker, after the answer, on the configured title model.
    title = wait_for(lambda: api.get('/threads/wm-chat?resourceId=sam')[1]['thread']['title'])
    assert title == 'Lisbon Trip Plans'
    assert any(c.model == 'gemini-2.5-flash-lite' for c in server.calls)

    # An invalid update is refused, the model is told why, and nothing changes.
    status, body = api.post('/threads/wm-chat/chat', {'resourceId': 'sam', 'content': 'bad update please'})
    assert status == 200 and '"success": false' in body['reply']['parts'][0]['text']
    assert api.get('/resources/sam/working-memory')[1]['workingMemory'] == memory
    messages = api.get('/threads/wm-chat/messages?resourceId=sam')[1]['messages']
    [error] = [
        p for m in messages for p in m['parts'] if p['type'] == 'tool-result' and p['result']['success'] is False
    ]
    assert 'schema' in error['result']['error']

    # Read-only: the memory is shown, no tool is offered. Another thread of the resource sees the same memory.
    status, body = api.post('/threads/wm-chat-2/chat', {'resourceId': 'sam', 'content': 'Hi', 'readOnly': True})
    assert status == 200 and body['reply']['parts'][0]['text'] == 'Noted.'
    last_actor = [r for r in server.requests if '<working_memory>' in r.system_text][-1]
    assert last_actor.tools == [] and '"location": "Berlin"' in last_actor.system_text
    status, step = api.post(
        '/threads/wm-chat-2/steps', {'resourceId': 'sam', 'messages': [{'role': 'user', 'content': 'x'}]}
    )
    assert status == 200 and [t['name'] for t in step['tools']] == ['updateWorkingMemory']


def test_observer_thread_title_follows_the_topic(wm_api: Api) -> None:
    api = wm_api

    def say(text: str) -> dict:
        # A step observes what came before its own input: the step after a long message observes it
        for content in (text, 'ok'):
            status, body = api.post('/threads/tt-1/steps', {'resourceId': 'tia', 'messages': [user(content)]})
            assert status == 200, body
        return body

    body = say(long_text('budget'))
    [update] = [p for p in body['parts'] if p['type'] == 'data-om-thread-update']
    assert update['data']['newTitle'] == 'Budget Rollout Review'
    assert api.get('/threads/tt-1?resourceId=tia')[1]['thread']['title'] == 'Budget Rollout Review'

    body = say(long_text('zebra'))
    [update] = [p for p in body['parts'] if p['type'] == 'data-om-thread-update']
    assert (update['data']['oldTitle'], update['data']['newTitle']) == (
        'Budget Rollout Review',
        'Zebra Habitat Research',
    )
    assert api.get('/threads/tt-1?resourceId=tia')[1]['thread']['title'] == 'Zebra Habitat Research'
