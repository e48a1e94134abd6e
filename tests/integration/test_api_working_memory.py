"""Working memory and title generation through `lambda_handler` under moto, with the sample events
(events/api/working_memory_*.json, thread_create.json, thread_patch.json, steps_basic.json, chat_basic.json) and the
buffer worker's title event (events/buffer_worker/sqs_title.json)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from functions import _wiring
from tests.fakes.fake_gemini import FakeGemini, FakeReply
from tests.integration import test_api_handler as base
from tests.integration.test_api_handler import FLASH, RESOURCE, THREAD, Api, assert_error, load_json_body

aws_env = base.aws_env
aws = base.aws
api = base.api

OTHER = 'user-7'
MARKDOWN = load_json_body('working_memory_resource_put')['workingMemory']
TEMPLATE = '# User Profile\n- Name:\n- Location:\n- Timezone:\n'
SCHEMA: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'name': {'type': 'string'},
        'location': {'type': 'string'},
        'preferences': {
            'type': 'object',
            'properties': {'style': {'type': 'string'}, 'deadlines': {'type': 'array', 'items': {'type': 'string'}}},
        },
    },
    'additionalProperties': False,
}


@pytest.fixture
def configure(api: Api, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, Any]], Api]:
    """Set the OM configuration (the wiring is rebuilt) and return the API."""

    def apply(config: dict[str, Any]) -> Api:
        monkeypatch.setenv('OM_CONFIG', json.dumps(config))
        _wiring.reset()
        return api

    return apply


def wm_get(api: Api, *, thread: str | None = None, resource: str = RESOURCE) -> tuple[int, Any]:
    if thread is None:
        status, body, _ = api.call(
            'working_memory_resource_get', path=f'/resources/{resource}/working-memory', query=None
        )
    else:
        status, body, _ = api.call(
            'working_memory_thread_get', path=f'/threads/{thread}/working-memory', query={'resourceId': resource}
        )
    return status, body


def wm_put(api: Api, value: Any, *, thread: str | None = None, resource: str = RESOURCE) -> tuple[int, Any]:
    if thread is None:
        status, body, _ = api.call(
            'working_memory_resource_put',
            path=f'/resources/{resource}/working-memory',
            body={'workingMemory': value},
        )
    else:
        status, body, _ = api.call(
            'working_memory_thread_put',
            path=f'/threads/{thread}/working-memory',
            query={'resourceId': resource},
            body={'workingMemory': value},
        )
    return status, body


def create_thread(api: Api, thread: str, metadata: dict[str, Any] | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {'resourceId': RESOURCE, 'id': thread}
    if metadata is not None:
        body['metadata'] = metadata
    status, answer, _ = api.call('thread_create', body=body)
    return status, answer


# -- resource scope, Markdown (replace semantics) -------------------------------------------------------------------
def test_sample_events_put_then_get_the_resource_working_memory(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'template': TEMPLATE}})

    status, empty = wm_get(api)
    assert status == 200 and empty == {'workingMemory': None, 'scope': 'resource', 'format': 'markdown'}
    status, body, _ = api.call('working_memory_resource_put')
    assert status == 200, body
    assert body == {'workingMemory': MARKDOWN, 'scope': 'resource', 'format': 'markdown'}
    status, got, _ = api.call('working_memory_resource_get')
    assert status == 200 and got == body
    # Every thread of the resource sees it through the thread route; another resource sees nothing.
    assert api.step('hello')[0] == 200
    status, got, _ = api.call('working_memory_thread_get')
    assert status == 200 and got == body
    assert wm_get(api, resource=OTHER)[1]['workingMemory'] is None
    # A PUT through the thread route replaces the resource's text.
    status, body, _ = api.call('working_memory_thread_put', body={'workingMemory': '- Name: Ana'})
    assert status == 200 and wm_get(api)[1]['workingMemory'] == '- Name: Ana'


def test_thread_route_of_unknown_or_foreign_thread_is_404(configure) -> None:
    api = configure({'workingMemory': {'enabled': True}})
    assert api.step('hello')[0] == 200
    for thread, resource in (('nope', RESOURCE), (THREAD, OTHER)):
        status, body = wm_get(api, thread=thread, resource=resource)
        assert status == 404
        assert_error(body, 'thread_not_found')
        status, body = wm_put(api, 'x', thread=thread, resource=resource)
        assert status == 404
        assert_error(body, 'thread_not_found')
    assert wm_get(api, resource=OTHER)[1]['workingMemory'] is None


def test_markdown_refuses_an_object_and_bad_bodies(configure) -> None:
    api = configure({'workingMemory': {'enabled': True}})
    wm_put(api, 'kept')

    status, body = wm_put(api, {'name': 'Sam'})
    assert status == 422
    assert 'Markdown' in assert_error(body, 'invalid_working_memory')['message']
    for bad in ({}, {'workingMemory': None}, {'workingMemory': 3}, {'workingMemory': 'x', 'extra': 1}):
        status, answer, _ = api.call('working_memory_resource_put', body=bad)
        assert status == 422, (bad, answer)
        assert_error(answer, 'validation_error')
    status, answer, _ = api.call('working_memory_resource_put', body={'workingMemory': 'x', 'resourceId': OTHER})
    assert status == 422 and 'differs' in assert_error(answer, 'validation_error')['message']
    status, answer, _ = api.call('working_memory_thread_put', query=None, body={'workingMemory': 'x'})
    assert status == 422 and 'resourceId is required' in assert_error(answer, 'validation_error')['message']
    status, answer = wm_put(api, 'x' * 70_000)
    assert status == 413
    assert_error(answer, 'too_large')
    assert wm_get(api)[1]['workingMemory'] == 'kept'


def test_disabled_working_memory_refuses_every_route(configure) -> None:
    api = configure({})
    assert api.step('hello')[0] == 200
    for status, body in (wm_get(api), wm_put(api, 'x'), wm_get(api, thread=THREAD), wm_put(api, 'x', thread=THREAD)):
        assert status == 422
        assert 'workingMemory' in assert_error(body, 'working_memory_disabled')['message']


# -- thread scope, JSON Schema (merge semantics) --------------------------------------------------------------------
def test_thread_scope_json_merges_and_refuses_schema_violations(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'scope': 'thread', 'schema': SCHEMA}})
    assert api.step('hello')[0] == 200
    assert api.step('hello', thread='thread-2')[0] == 200

    wm_put(api, {'name': 'Sam', 'preferences': {'style': 'formal', 'deadlines': ['2025-07-01']}}, thread=THREAD)
    status, body = wm_put(api, {'name': None, 'location': 'Berlin', 'preferences': {'deadlines': []}}, thread=THREAD)

    assert status == 200, body
    assert body == {
        'workingMemory': {'location': 'Berlin', 'preferences': {'style': 'formal', 'deadlines': []}},
        'scope': 'thread',
        'format': 'json',
    }
    assert wm_get(api, thread='thread-2')[1]['workingMemory'] is None
    # Schema violations: 422 with every problem in details, nothing changed.
    status, bad = wm_put(api, {'name': 5, 'colour': 'red'}, thread=THREAD)
    assert status == 422
    error = assert_error(bad, 'invalid_working_memory')
    assert {d['field'] for d in error['details']} == {'name', '(root)'} and 'nothing was changed' in error['message']
    status, bad = wm_put(api, 'text', thread=THREAD)
    assert status == 422 and 'JSON object' in assert_error(bad, 'invalid_working_memory')['message']
    assert wm_get(api, thread=THREAD)[1] == body
    # There is no resource-wide working memory in thread scope.
    status, answer = wm_get(api)
    assert status == 422 and 'thread-scoped' in assert_error(answer, 'working_memory_disabled')['message']


def test_both_template_and_schema_is_refused_at_start_up(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'template': TEMPLATE, 'schema': SCHEMA}})
    with pytest.raises(Exception, match='not both'):
        _wiring.config()
    status, body = wm_get(api)
    assert status == 500
    assert_error(body, 'internal_error')


# -- initial values through thread metadata -------------------------------------------------------------------------
def test_thread_metadata_sets_initial_working_memory(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'scope': 'thread', 'schema': SCHEMA}})

    status, body = create_thread(api, 'wm-1', {'project': 'travel', 'workingMemory': {'name': 'Sam'}})
    assert status == 201, body
    assert body['thread']['metadata'] == {'project': 'travel'}
    assert wm_get(api, thread='wm-1')[1]['workingMemory'] == {'name': 'Sam'}

    status, patched, _ = api.call(
        'thread_patch',
        path='/threads/wm-1',
        body={'resourceId': RESOURCE, 'metadata': {'workingMemory': {'location': 'Berlin'}}},
    )
    assert status == 200, patched
    assert patched['thread']['metadata'] == {}
    assert wm_get(api, thread='wm-1')[1]['workingMemory'] == {'name': 'Sam', 'location': 'Berlin'}

    # An invalid initial value is refused before anything is written.
    status, bad = create_thread(api, 'wm-2', {'workingMemory': {'name': 1}})
    assert status == 422
    assert_error(bad, 'invalid_working_memory')
    status, _, _ = api.call('thread_get', path='/threads/wm-2', query={'resourceId': RESOURCE})
    assert status == 404
    status, bad, _ = api.call(
        'thread_patch', path='/threads/wm-1', body={'resourceId': RESOURCE, 'metadata': {'workingMemory': 'text'}}
    )
    assert status == 422 and assert_error(bad, 'invalid_working_memory')
    assert wm_get(api, thread='wm-1')[1]['workingMemory'] == {'name': 'Sam', 'location': 'Berlin'}


def test_metadata_working_memory_is_plain_metadata_when_off(configure) -> None:
    api = configure({})
    status, body = create_thread(api, 'wm-3', {'workingMemory': 'note'})
    assert status == 201 and body['thread']['metadata'] == {'workingMemory': 'note'}


# -- what the Actor gets --------------------------------------------------------------------------------------------
def test_steps_inject_working_memory_and_offer_the_tool_unless_read_only(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'template': TEMPLATE}})
    wm_put(api, '# User Profile\n- Name: Sam\n')

    status, body = api.step('hello')
    assert status == 200, body
    assert '<working_memory>' in body['system'] and '- Name: Sam' in body['system']
    assert [t['name'] for t in body['tools']] == ['updateWorkingMemory']
    assert body['tools'][0]['parameters']['required'] == ['memory']

    status, body, _ = api.call(
        'steps_basic', body={'resourceId': RESOURCE, 'messages': [{'role': 'user', 'content': 'hi'}], 'readOnly': True}
    )
    assert status == 200 and body['tools'] == [] and 'read-only' in body['system']


@pytest.fixture
def gemini(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        monkeypatch.setenv('GOOGLE_GEMINI_BASE_URL', server.url)
        monkeypatch.setenv('GEMINI_API_KEY', 'test-key')
        yield server


def test_chat_runs_update_working_memory_and_read_only_chat_does_not_offer_it(configure, gemini) -> None:
    api = configure({'workingMemory': {'enabled': True, 'template': TEMPLATE}})
    updated = '# User Profile\n- Name: Sam\n- Location: Berlin\n- Timezone:\n'
    gemini.script(
        FLASH,
        FakeReply.function_calls(('updateWorkingMemory', {'memory': updated})),
        FakeReply.text('Nice to meet you, Sam.'),
        FakeReply.text('You live in Berlin.'),
    )

    status, body, _ = api.call('chat_basic', body={'resourceId': RESOURCE, 'content': 'I am Sam from Berlin.'})
    assert status == 200, body
    assert body['reply']['parts'] == [{'type': 'text', 'text': 'Nice to meet you, Sam.'}]
    assert wm_get(api)[1]['workingMemory'] == updated
    first = gemini.requests[0]
    assert [t['name'] for t in first.tools] == ['updateWorkingMemory'] and '<working_memory>' in first.system_text

    status, body, _ = api.call(
        'chat_basic', body={'resourceId': RESOURCE, 'content': 'Where do I live?', 'readOnly': True}
    )
    assert status == 200, body
    last = gemini.requests[-1]
    assert last.tools == [] and '- Location: Berlin' in last.system_text


# -- generateTitle: a background job after the first turn -----------------------------------------------------------
@pytest.fixture
def queue(aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    sqs = boto3.client('sqs')
    url = sqs.create_queue(QueueName='om-work.fifo', Attributes={'FifoQueue': 'true'})['QueueUrl']
    monkeypatch.setenv('OM_WORK_QUEUE_URL', url)
    yield sqs, url


def test_first_turn_queues_a_title_job_that_the_buffer_worker_runs(configure, queue) -> None:
    from om_cli.local_stack import LocalLambdaContext, handler_for
    from tests.integration.test_workers import load_event

    sqs, url = queue
    api = configure({'generateTitle': True})
    status, body, _ = api.call('chat_basic', body={'resourceId': RESOURCE, 'content': 'Plan a trip to Lisbon in May'})
    assert status == 200, body
    [scheduled] = [p for p in body['parts'] if p['type'] == 'data-om-scheduled']
    assert scheduled['data']['operations'] == ['title']
    # The answer did not wait for it: the thread is untitled until the worker runs the job.
    status, thread, _ = api.call('thread_get')
    assert thread['thread']['title'] is None
    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)['Messages']
    job = json.loads(message['Body'])
    assert (job['kind'], job['threadId'], job['recordKey']) == ('title', THREAD, f'title:{RESOURCE}/{THREAD}')

    event = load_event('buffer_worker', 'sqs_title')
    event['Records'][0]['body'] = message['Body']
    assert handler_for('buffer_worker')(event, LocalLambdaContext('buffer_worker')) == {'batchItemFailures': []}
    status, thread, _ = api.call('thread_get')
    assert thread['thread']['title'] == 'Plan Trip Lisbon May'  # the offline model's title

    # A later turn queues nothing; /turns behaves like /chat for clients that run their own Actor.
    api.call('chat_basic', body={'resourceId': RESOURCE, 'content': 'And Porto?'})
    assert not sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get('Messages')
    api.step('Hello there, new topic', thread='thread-9')
    status, turn, _ = api.call(
        'turns_basic',
        path='/threads/thread-9/turns',
        body={'resourceId': RESOURCE, 'messages': [{'role': 'assistant', 'content': 'Hi!'}]},
    )
    assert status == 200 and {'type': 'data-om-scheduled', 'data': {'operations': ['title']}} in turn['parts']


def test_title_sample_event_for_a_missing_thread_succeeds(configure, queue) -> None:
    from om_cli.local_stack import LocalLambdaContext, handler_for
    from tests.integration.test_workers import load_event

    configure({'generateTitle': True})
    event = load_event('buffer_worker', 'sqs_title')
    assert handler_for('buffer_worker')(event, LocalLambdaContext('buffer_worker')) == {'batchItemFailures': []}


def test_clone_copies_thread_scoped_working_memory(configure) -> None:
    api = configure({'workingMemory': {'enabled': True, 'scope': 'thread'}})
    assert api.step('hello')[0] == 200
    wm_put(api, '- Name: Sam', thread=THREAD)

    status, body, _ = api.call(
        'thread_clone', path=f'/threads/{THREAD}/clone', body={'resourceId': RESOURCE, 'newThreadId': 'copy-1'}
    )

    assert status == 201, body
    assert wm_get(api, thread='copy-1')[1] == {'workingMemory': '- Name: Sam', 'scope': 'thread', 'format': 'markdown'}
    wm_put(api, '- Name: Ana', thread='copy-1')
    assert wm_get(api, thread=THREAD)[1]['workingMemory'] == '- Name: Sam'
