"""The API Lambda invoked in-process with the sample events (events/api/*.json) under moto.

Everything a client would notice: status codes, the error shape, server-assigned ids, what is saved and what is not.
The model is the built-in offline model (no credentials + OM_OFFLINE_FALLBACK=1), except where a test starts the
loopback fake Gemini server to script the Actor's answers.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions import _wiring
from om_lib.adapters.aws.dynamodb.schema import create_table
from tests.fakes.fake_gemini import FakeGemini, FakeReply

ROOT = Path(__file__).resolve().parents[2]
TABLE, BUCKET = 'om-memory', 'om-memory-blobs'
RESOURCE, THREAD = 'user-42', 'thread-1'
FLASH = 'gemini-2.5-flash'


class Context:
    """The parts of the Lambda context Powertools reads."""

    function_name = 'om-api'
    function_version = '$LATEST'
    invoked_function_arn = 'arn:aws:lambda:eu-west-1:123456789012:function:om-api'
    memory_limit_in_mb = 1024
    aws_request_id = '5f0c4f3e-0000-4000-8000-000000000001'
    log_group_name = '/aws/lambda/om-api'
    log_stream_name = 'test'

    def get_remaining_time_in_millis(self) -> int:
        return 29_000


def load_event(scenario: str) -> dict[str, Any]:
    return json.loads((ROOT / 'events' / 'api' / f'{scenario}.json').read_text())


class Api:
    """Sends sample events (tweaked) through `lambda_handler` and decodes the answers."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def call(
        self,
        scenario: str,
        *,
        body: Any = ...,
        raw_body: str | None = None,
        path: str | None = None,
        method: str | None = None,
        query: dict[str, str] | None | Any = ...,
        authorizer: dict[str, Any] | None | Any = ...,
        identity: dict[str, Any] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        event = copy.deepcopy(load_event(scenario))
        if body is not ...:
            event['body'] = json.dumps(body)
        if raw_body is not None:
            event['body'] = raw_body
        if path is not None:
            event['path'] = path
            event['requestContext']['path'] = '/prod' + path
        if method is not None:
            event['httpMethod'] = method
            event['requestContext']['httpMethod'] = method
        if query is not ...:
            event['queryStringParameters'] = query
            event['multiValueQueryStringParameters'] = {k: [v] for k, v in query.items()} if query else None
        if authorizer is not ...:
            event['requestContext']['authorizer'] = authorizer
        if identity is not None:
            event['requestContext']['identity'].update(identity)
        result = self.handler.lambda_handler(event, Context())
        text = result.get('body') or ''
        headers = {k: ', '.join(v) for k, v in (result.get('multiValueHeaders') or {}).items()}
        headers.update(result.get('headers') or {})
        return result['statusCode'], json.loads(text) if text else None, headers

    def step(self, text: str, *, thread: str = THREAD, resource: str = RESOURCE, **message: Any) -> tuple[int, Any]:
        status, body, _ = self.call(
            'steps_basic',
            path=f'/threads/{thread}/steps',
            body={'resourceId': resource, 'messages': [{'role': 'user', 'content': text, **message}]},
        )
        return status, body

    def messages(self, *, thread: str = THREAD, resource: str = RESOURCE, **query: str) -> tuple[int, Any]:
        status, body, _ = self.call(
            'messages_get', path=f'/threads/{thread}/messages', query={'resourceId': resource, **query}
        )
        return status, body


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    set_aws_env(monkeypatch)


def set_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The functions' environment for these tests: moto credentials, the table and bucket, offline model."""
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_SESSION_TOKEN': 'testing',
        'AWS_DEFAULT_REGION': 'eu-west-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
        'POWERTOOLS_TRACE_DISABLED': '1',
        'OM_TABLE_NAME': TABLE,
        'OM_BUCKET_NAME': BUCKET,
        'OM_AUTH_MODE': 'iam',
        'OM_OFFLINE_FALLBACK': '1',
    }.items():
        monkeypatch.setenv(name, value)
    for name in (
        'AWS_ENDPOINT_URL',
        'AWS_ENDPOINT_URL_DYNAMODB',
        'AWS_ENDPOINT_URL_S3',
        'AWS_PROFILE',
        'AWS_LAMBDA_FUNCTION_NAME',
        'OM_CONFIG',
        'OM_CONFIG_FILE',
        'OM_WORK_QUEUE_URL',
        'OM_REFLECTION_STATE_MACHINE_ARN',
        'OM_GEMINI_SECRET_ARN',
        'GEMINI_API_KEY',
        'GOOGLE_API_KEY',
        'GOOGLE_GEMINI_BASE_URL',
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def aws(aws_env: None) -> Iterator[None]:
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        create_table(boto3.client('dynamodb'), TABLE)
        boto3.client('s3').create_bucket(Bucket=BUCKET, CreateBucketConfiguration={'LocationConstraint': 'eu-west-1'})
        yield


@pytest.fixture
def api(aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    from functions.api import handler

    _wiring.reset()
    _wiring.upload_signer.cache_clear()
    yield Api(handler)
    _wiring.reset()
    _wiring.upload_signer.cache_clear()


def assert_error(body: Any, code: str) -> dict[str, Any]:
    assert set(body) == {'error'}, body
    error = body['error']
    assert set(error) == {'code', 'message', 'details'}, error
    assert error['code'] == code, error
    assert isinstance(error['message'], str) and error['message']
    assert isinstance(error['details'], list)
    return error


# ---------------------------------------------------------------------------------------------------------------------
# Happy paths, one per route
# ---------------------------------------------------------------------------------------------------------------------
def test_steps_saves_input_and_returns_server_ids(api: Api) -> None:
    status, body, headers = api.call('steps_basic')

    assert status == 200, body
    assert headers['Content-Type'] == 'application/json'
    assert set(body) == {'threadId', 'resourceId', 'system', 'messages', 'tools', 'parts'}
    assert (body['threadId'], body['resourceId'], body['tools']) == (THREAD, RESOURCE, [])
    [message] = body['messages']
    assert message['id'].startswith('msg_') and len(message['id']) == 4 + 32
    assert message['createdAt'].endswith('Z')
    assert message['parts'] == [{'type': 'text', 'text': load_json_body('steps_basic')['messages'][0]['content']}]
    assert not {'seq', 'tokenCounts', 'threadId', 'resourceId'} & set(message)
    assert [p['type'] for p in body['parts']] == ['data-om-status']
    # The message is stored under the id the answer named.
    status, page = api.messages()
    assert status == 200
    assert [m['id'] for m in page['messages']] == [message['id']]


def load_json_body(scenario: str) -> Any:
    return json.loads(load_event(scenario)['body'])


def test_steps_retry_with_client_id_saves_once(api: Api) -> None:
    first = api.step('Hello', id='msg-client-1', createdAt='2025-03-03T09:00:00Z')
    again = api.step('Hello', id='msg-client-1', createdAt='2025-03-03T09:00:00Z')

    assert first[0] == again[0] == 200
    status, page = api.messages()
    assert [m['id'] for m in page['messages']] == ['msg-client-1']
    assert page['messages'][0]['createdAt'] == '2025-03-03T09:00:00Z'


def test_turns_saves_outputs(api: Api) -> None:
    api.call('steps_basic')

    status, body, _ = api.call('turns_basic')

    assert status == 200, body
    assert set(body) == {'saved', 'parts'}
    [saved_id] = body['saved']
    assert saved_id.startswith('msg_')
    _, page = api.messages()
    assert [m['role'] for m in page['messages']] == ['user', 'assistant']
    assert page['messages'][1]['id'] == saved_id


def test_chat_offline_replies_and_saves_both_messages(api: Api) -> None:
    status, body, _ = api.call('chat_basic')

    assert status == 200, body
    assert set(body) == {'reply', 'parts'}
    assert body['reply']['role'] == 'assistant' and body['reply']['id'].startswith('msg_')
    assert body['reply']['parts'][0]['type'] == 'text' and body['reply']['parts'][0]['text']
    _, page = api.messages()
    assert [m['role'] for m in page['messages']] == ['user', 'assistant']
    assert page['messages'][0]['parts'][0]['text'] == 'What should I pack for Lisbon in May?'
    assert page['messages'][1]['id'] == body['reply']['id']


def test_memory_of_a_thread(api: Api) -> None:
    api.call('steps_basic')

    status, body, _ = api.call('memory_get')

    assert status == 200, body
    assert body['scope'] == 'thread'
    assert body['observations'] == '' and body['generationCount'] == 0
    assert body['pendingMessageTokens'] > 0
    assert set(body['thresholds']) == {'messageTokens', 'observationTokens', 'blockAfter'}
    # The default configuration buffers: blockAfter is 1.2 × each threshold, in tokens
    block = body['thresholds']['blockAfter']
    assert block == {
        'observation': round(1.2 * body['thresholds']['messageTokens']),
        'reflection': round(1.2 * body['thresholds']['observationTokens']),
    }
    assert set(body['buffered']) == {'observations', 'reflection'}


def test_messages_pages_oldest_first(api: Api) -> None:
    for n in range(5):
        api.step(f'message {n}', id=f'm{n}')

    first = api.messages(page='0', perPage='2')[1]
    second = api.messages(page='1', perPage='2')[1]
    last = api.messages(page='2', perPage='2')[1]
    beyond = api.messages(page='3', perPage='2')[1]

    assert [m['id'] for m in first['messages']] == ['m0', 'm1'] and first['hasMore'] is True
    assert (first['page'], first['perPage']) == (0, 2)
    assert [m['id'] for m in second['messages']] == ['m2', 'm3'] and second['hasMore'] is True
    assert [m['id'] for m in last['messages']] == ['m4'] and last['hasMore'] is False
    assert beyond['messages'] == [] and beyond['hasMore'] is False


def test_messages_newest_first_pages_back_from_the_newest(api: Api) -> None:
    for n in range(5):
        api.step(f'message {n}', id=f'm{n}')

    pages = [api.messages(page=str(p), perPage='2', direction='DESC')[1] for p in range(4)]

    assert [[m['id'] for m in p['messages']] for p in pages] == [['m4', 'm3'], ['m2', 'm1'], ['m0'], []]
    assert [p['hasMore'] for p in pages] == [True, True, False, False]
    assert all(m['omStatus'] == 'unobserved' for m in pages[0]['messages'])
    status, body = api.messages(direction='newest')
    assert status == 422 and assert_error(body, 'validation_error')['details'][0]['field'] == 'direction'


def test_messages_per_page_limit_is_1000(api: Api) -> None:
    api.call('steps_basic')

    status, body = api.messages(perPage='1001')

    error = assert_error(body, 'validation_error')
    assert status == 422
    assert error['details'][0]['field'] == 'perPage' and error['details'][0]['location'] == 'query'


def test_resource_threads_list_filters_and_orders(api: Api) -> None:
    api.step('a', thread='t-a')
    api.step('b', thread='t-b')
    api.step('c', thread='t-c', resource='someone-else')

    status, body, _ = api.call('resource_threads_list', query={'orderBy': 'createdAt', 'direction': 'ASC'})

    assert status == 200, body
    assert [t['id'] for t in body['threads']] == ['t-a', 't-b']
    assert body['hasMore'] is False
    assert set(body['threads'][0]) == {'id', 'resourceId', 'title', 'titlePinned', 'createdAt', 'updatedAt', 'metadata'}
    # The sample event filters on metadata.project=travel: no thread carries it.
    status, filtered, _ = api.call('resource_threads_list')
    assert status == 200 and filtered['threads'] == []


def test_thread_delete_makes_the_thread_unreadable(api: Api) -> None:
    api.call('steps_basic')

    status, body, _ = api.call('thread_delete')

    assert (status, body) == (204, None)
    status, body, _ = api.call('memory_get')
    assert status == 404 and assert_error(body, 'thread_not_found')
    status, body = api.messages()
    assert status == 404 and assert_error(body, 'thread_not_found')
    status, body, _ = api.call('thread_delete')
    assert status == 404 and assert_error(body, 'thread_not_found')


def test_resource_delete_erases_every_thread(api: Api) -> None:
    api.step('a', thread='t-a')
    api.step('b', thread='t-b')

    status, body, _ = api.call('resource_delete')

    assert (status, body) == (204, None)
    for thread in ('t-a', 't-b'):
        status, body = api.messages(thread=thread)
        assert status == 404 and assert_error(body, 'thread_not_found')
    _, listing, _ = api.call('resource_threads_list', query=None)
    assert listing['threads'] == []


def test_attachments_presign_an_upload_under_the_resource(api: Api) -> None:
    api.call('steps_basic')

    status, body, _ = api.call('attachments_create')

    assert status == 201, body
    assert set(body) == {'url', 'uploadUrl', 'expiresAt'}
    assert body['url'].startswith(f's3://{BUCKET}/user-42/threads/thread-1/attachments/')
    assert body['url'].endswith('/itinerary.pdf')
    assert body['uploadUrl'].startswith('https://') and 'X-Amz-Signature=' in body['uploadUrl']
    assert body['expiresAt'].endswith('Z')


def test_attachments_refuse_large_files_and_foreign_threads(api: Api) -> None:
    api.call('steps_basic')
    request = load_json_body('attachments_create')

    too_big, body, _ = api.call('attachments_create', body={**request, 'size': 10**9})
    assert too_big == 413 and assert_error(body, 'too_large')

    foreign, body, _ = api.call('attachments_create', body={**request, 'resourceId': 'someone-else'})
    assert foreign == 404 and assert_error(body, 'thread_not_found')


def test_openapi_document_lists_our_routes(api: Api) -> None:
    status, body, _ = api.call('openapi_get')

    assert status == 200
    assert body['openapi'].startswith('3.')
    assert body['info']['title'] == 'Observational Memory API'
    assert {
        '/threads/{threadId}/steps',
        '/threads/{threadId}/turns',
        '/threads/{threadId}/chat',
        '/threads/{threadId}/memory',
        '/threads/{threadId}/messages',
        '/threads/{threadId}',
        '/resources/{resourceId}',
        '/resources/{resourceId}/threads',
        '/attachments',
        '/health',
    } <= set(body['paths'])
    steps = body['paths']['/threads/{threadId}/steps']['post']
    assert 'requestBody' in steps and '200' in steps['responses'] and '422' in steps['responses']
    validator = pytest.importorskip('openapi_spec_validator')
    validator.validate(body)


def test_health(api: Api) -> None:
    status, body, _ = api.call('health_get', identity={'userArn': None, 'caller': None})

    assert status == 200
    assert body['status'] == 'ok' and isinstance(body['version'], str) and body['version']


# ---------------------------------------------------------------------------------------------------------------------
# Errors, in the CONTRACT's shape
# ---------------------------------------------------------------------------------------------------------------------
def test_body_that_is_not_json_is_400(api: Api) -> None:
    status, body, _ = api.call('steps_invalid_body')

    assert status == 400
    assert_error(body, 'invalid_json')
    assert api.messages()[0] == 404  # nothing was written: the thread does not exist


def test_missing_body_is_400(api: Api) -> None:
    event_body = None
    status, body, _ = api.call('steps_basic', body=event_body)

    assert status == 400
    assert_error(body, 'invalid_json')


def test_body_that_is_not_an_object_is_400(api: Api) -> None:
    status, body, _ = api.call('steps_basic', body=[1, 2, 3])

    assert status == 400
    assert_error(body, 'invalid_json')


def test_invalid_message_is_422_with_its_field_path_and_writes_nothing(api: Api) -> None:
    status, body, _ = api.call(
        'steps_basic',
        body={
            'resourceId': RESOURCE,
            'messages': [{'role': 'user', 'content': 'fine'}, {'role': 'robot', 'content': 'beep'}],
        },
    )

    assert status == 422
    error = assert_error(body, 'validation_error')
    assert {'location': 'body', 'field': 'messages[1].role'}.items() <= error['details'][0].items()
    assert 'messages[1].role' in error['message']
    assert api.messages()[0] == 404  # the valid first message was not saved either


def test_missing_resource_id_is_422(api: Api) -> None:
    status, body, _ = api.call('memory_get', query={})

    assert status == 422
    error = assert_error(body, 'validation_error')
    assert error['details'][0]['field'] == 'resourceId'


def test_another_resources_thread_reads_as_missing(api: Api) -> None:
    api.call('steps_basic')

    memory, body, _ = api.call('memory_get', query={'resourceId': 'someone-else'})
    assert memory == 404
    assert_error(body, 'thread_not_found')
    missing, missing_body, _ = api.call('memory_get', path='/threads/no-such-thread/memory')
    assert missing == 404
    assert missing_body['error']['code'] == body['error']['code']

    deleted, body, _ = api.call('thread_delete', query={'resourceId': 'someone-else'})
    assert deleted == 404 and assert_error(body, 'thread_not_found')
    # Thread ids are scoped to their resource: a step of another resource is a step in its own thread of that id.
    status, body = api.step('let me in', resource='someone-else')
    assert status == 200 and [m['parts'][0]['text'] for m in body['messages']] == ['let me in']
    # The owner's thread is untouched.
    assert [m['role'] for m in api.messages()[1]['messages']] == ['user']
    assert len(api.messages(resource='someone-else')[1]['messages']) == 1


def test_same_id_different_content_is_409(api: Api) -> None:
    api.step('original', id='msg-1')

    status, body = api.step('changed', id='msg-1')

    assert status == 409
    assert_error(body, 'message_conflict')
    assert [m['parts'][0]['text'] for m in api.messages()[1]['messages']] == ['original']


def test_too_many_messages_is_413(api: Api) -> None:
    messages = [{'role': 'user', 'content': f'm{n}'} for n in range(101)]

    status, body, _ = api.call('steps_basic', body={'resourceId': RESOURCE, 'messages': messages})

    assert status == 413
    assert_error(body, 'too_large')
    assert api.messages()[0] == 404


def test_body_over_the_limit_is_413(api: Api) -> None:
    huge = json.dumps({'resourceId': RESOURCE, 'messages': [{'role': 'user', 'content': 'x' * (7 * 1024 * 1024)}]})

    status, body, _ = api.call('steps_basic', raw_body=huge)

    assert status == 413
    assert_error(body, 'too_large')


def test_unknown_route_is_404_and_wrong_method_is_405(api: Api) -> None:
    status, body, _ = api.call('health_get', path='/nope')
    assert status == 404
    assert_error(body, 'not_found')

    status, body, headers = api.call('steps_basic', method='GET')
    assert status == 405
    assert_error(body, 'method_not_allowed')
    assert headers['Allow'] == 'POST'


def test_iam_mode_without_identity_is_401(api: Api) -> None:
    status, body, _ = api.call('steps_basic', identity={'userArn': None, 'caller': None})

    assert status == 401
    assert_error(body, 'unauthenticated')
    assert api.messages()[0] == 404


def test_jwt_claim_must_equal_resource_id(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('OM_AUTH_MODE', 'jwt')
    _wiring.reset()

    ok, body, _ = api.call('steps_jwt')
    assert ok == 200, body

    other = {**load_json_body('steps_jwt'), 'resourceId': 'someone-else'}
    status, body, _ = api.call('steps_jwt', body=other)
    assert status == 403
    assert_error(body, 'forbidden')

    status, body, _ = api.call('memory_get', query={'resourceId': 'someone-else'}, authorizer=None)
    assert status == 401
    assert_error(body, 'unauthenticated')

    status, body, _ = api.call(
        'memory_get', authorizer={'jwt': {'claims': {'sub': RESOURCE}}}, identity={'userArn': None, 'caller': None}
    )
    assert status == 200, body  # HTTP-API-style claims are read too


# ---------------------------------------------------------------------------------------------------------------------
# Metrics (EMF on stdout)
# ---------------------------------------------------------------------------------------------------------------------
def emf_metrics(stdout: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in stdout.splitlines():
        if '"_aws"' not in line:
            continue
        blob = json.loads(line)
        assert blob['_aws']['CloudWatchMetrics'][0]['Namespace'] == 'ObservationalMemory'
        for metric in blob['_aws']['CloudWatchMetrics'][0]['Metrics']:
            value = blob[metric['Name']]
            totals[metric['Name']] = totals.get(metric['Name'], 0) + (sum(value) if isinstance(value, list) else value)
    return totals


def test_observation_emits_metrics(api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # Small thresholds: a few messages are due for observation (offline Observer, synchronous in the step).
    monkeypatch.setenv(
        'OM_CONFIG', json.dumps({'model': 'default', 'observation': {'messageTokens': 120, 'bufferTokens': False}})
    )
    _wiring.reset()
    capsys.readouterr()

    parts: list[dict[str, Any]] = []
    for n in range(6):
        _, body = api.step(f'I am planning trip number {n} to Lisbon with my sister, who loves old trams and fado.')
        parts += body['parts']

    assert 'data-om-observation-end' in [p['type'] for p in parts]
    metrics = emf_metrics(capsys.readouterr().out)
    assert metrics['ObservationsCompleted'] >= 1
    assert metrics['TokensObserved'] > 0 and metrics['ObservationTokens'] > 0
    assert metrics['ModelCalls'] >= metrics['ObservationsCompleted']
    _, memory, _ = api.call('memory_get')
    assert memory['observations'] and memory['generationCount'] == 0


# ---------------------------------------------------------------------------------------------------------------------
# Chat against the fake Gemini server (the real google-genai client)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def gemini(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        monkeypatch.setenv('GOOGLE_GEMINI_BASE_URL', server.url)
        monkeypatch.setenv('GEMINI_API_KEY', 'test-key')
        yield server


def _no_backoff() -> None:
    _wiring.engine().router._sleep = lambda _s: None  # retries without waiting: the test is about the outcome


def test_chat_with_gemini_returns_the_reply_and_saves_both(gemini: FakeGemini, api: Api) -> None:
    gemini.script(FLASH, FakeReply.text('Pack light layers and comfortable shoes.'))

    status, body, _ = api.call('chat_basic')

    assert status == 200, body
    assert body['reply']['parts'] == [{'type': 'text', 'text': 'Pack light layers and comfortable shoes.'}]
    [request] = gemini.requests
    assert request.user_texts[-1] == 'What should I pack for Lisbon in May?'
    assert 'helpful assistant' in request.system_text
    _, page = api.messages()
    assert [(m['role'], m['parts'][0]['text']) for m in page['messages']] == [
        ('user', 'What should I pack for Lisbon in May?'),
        ('assistant', 'Pack light layers and comfortable shoes.'),
    ]


def test_chat_when_the_actor_fails_still_saves_the_user_message(gemini: FakeGemini, api: Api) -> None:
    gemini.script(FLASH, *[FakeReply.error(503)] * 5)
    _no_backoff()

    status, body, _ = api.call('chat_basic')

    assert status == 200, body
    assert body['reply'] is None
    [failed] = [p for p in body['parts'] if p['type'] == 'data-om-actor-failed']
    assert failed['data']['retryable'] is True and failed['data']['error'] == 'model_unavailable'
    _, page = api.messages()
    assert [m['role'] for m in page['messages']] == ['user']


def test_chat_invalid_role_is_422(api: Api) -> None:
    status, body, _ = api.call(
        'chat_basic', body={'resourceId': RESOURCE, 'message': {'role': 'assistant', 'content': 'hi'}}
    )

    assert status == 422
    assert_error(body, 'validation_error')
