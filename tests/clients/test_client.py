"""om_client without a server: what each call sends, retries and backoff, errors by code, auth (httpx MockTransport)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from botocore.credentials import Credentials
from om_client import AsyncMemoryClient, BearerAuth, IAMAuth, MemoryClient, Message, RetryPolicy
from om_client.auth import region_from_url
from om_client.errors import (
    BY_CODE,
    APIError,
    ConnectionFailed,
    InvalidId,
    InvalidJSON,
    MessageConflict,
    ModelUnavailable,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    ThreadExists,
    ThreadNotFound,
    TooLarge,
    ValidationFailed,
    error_for,
)
from om_client.models import ImagePart, StepResult, ToolCallPart

URL = 'https://abc123.execute-api.eu-west-1.amazonaws.com/prod'
STEP = {'threadId': 't1', 'resourceId': 'me', 'system': '', 'messages': [], 'tools': [], 'parts': []}
AT = '2026-01-01T00:00:00Z'
THREAD = {'id': 't1', 'resourceId': 'me', 'title': None, 'createdAt': AT, 'updatedAt': AT, 'metadata': {}}


def error(status: int, code: str, message: str = 'scripted', **headers: str) -> httpx.Response:
    body = {'error': {'code': code, 'message': message, 'details': [{'field': 'x', 'message': 'bad'}]}}
    return httpx.Response(status, json=body, headers=headers)


class Scripted:
    """A transport answering from a list (responses or exceptions), recording every request."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer) and not isinstance(answer, httpx.Response):
            return answer(request)
        return answer

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) if r.content else None for r in self.requests]


def client(transport: Scripted, **kwargs: Any) -> tuple[MemoryClient, list[float]]:
    sleeps: list[float] = []
    made = MemoryClient(URL, resource_id='me', transport=httpx.MockTransport(transport), sleep=sleeps.append, **kwargs)
    return made, sleeps


# -- what is sent ---------------------------------------------------------------------------------------------------
def test_step_sends_client_side_ids_and_camel_case() -> None:
    # Given a client with a default resource
    transport = Scripted(httpx.Response(200, json=STEP))
    om, _ = client(transport)

    # When a step is sent with a string, a Message and a dict
    om.step('t1', ['hi', Message.user('there'), {'role': 'user', 'content': 'x', 'createdAt': '2026-01-01T00:00:00Z'}])

    # Then every message has an id, JSON is camelCase, and left-out fields are not sent
    (request,) = transport.requests
    body = json.loads(request.content)
    assert request.method == 'POST' and request.url.path == '/prod/threads/t1/steps'
    assert body['resourceId'] == 'me' and set(body) == {'resourceId', 'messages'}
    assert [m['role'] for m in body['messages']] == ['user', 'user', 'user']
    assert all(m['id'].startswith('msg_') for m in body['messages'])
    assert len({m['id'] for m in body['messages']}) == 3
    assert body['messages'][0]['parts'] == [{'type': 'text', 'text': 'hi'}]
    assert body['messages'][2]['createdAt'].startswith('2026-01-01T00:00:00')


def test_every_request_with_a_body_says_it_is_json() -> None:
    # The API refuses a body without a Content-Type (415): every call that sends one must name it
    transport = Scripted(lambda r: httpx.Response(204) if r.method == 'DELETE' else httpx.Response(200, json={}))
    om, _ = client(transport)
    calls = [
        lambda: om.step('t1', ['hi']),
        lambda: om.turn('t1', ['done']),
        lambda: om.chat('t1', 'hello'),
        lambda: om.delete_messages('t1', ['m1']),
        lambda: om.query_messages('t1', per_page=5),
        lambda: om.update_working_memory('# Me', thread_id='t1'),
    ]
    for call in calls:
        try:
            call()
        except Exception:  # noqa: BLE001 - the scripted answers do not parse: only the requests matter here
            pass
    with_body = [r for r in transport.requests if r.content]
    assert len(with_body) == len(calls)
    assert all(r.headers['Content-Type'] == 'application/json' for r in with_body), [
        (r.method, r.url.path, r.headers.get('Content-Type')) for r in with_body
    ]


def test_a_retried_write_sends_the_same_message_ids() -> None:
    transport = Scripted(error(503, 'model_unavailable'), httpx.Response(200, json={'saved': ['a'], 'parts': []}))
    om, sleeps = client(transport)

    om.turn('t1', ['done'])

    first, second = transport.bodies()
    assert first == second and len(sleeps) == 1  # safe: the server treats the same id and content as a no-op


def test_ids_outside_the_grammar_are_refused_before_sending() -> None:
    transport = Scripted(httpx.Response(200, json=STEP))
    om, _ = client(transport)

    for bad in ('a/b', 'a b', '', 'x?y', '50%'):
        with pytest.raises(InvalidId, match='not a valid id'):
            om.step(bad, ['hi'])

    assert transport.requests == []


def test_queries_threads_and_working_memory_requests() -> None:
    transport = Scripted(
        lambda r: httpx.Response(
            200,
            json={'threads': [], 'hasMore': False}
            if r.url.path.endswith('/threads')
            else {'workingMemory': '# Me', 'scope': 'thread', 'format': 'markdown'},
        )
    )
    om, _ = client(transport)

    om.list_threads(order_by='updatedAt', metadata={'topic': 'trips'}, per_page=5)
    om.update_working_memory('# Me', thread_id='t1')

    listing, update = transport.requests
    assert listing.url.path == '/prod/resources/me/threads'
    assert dict(listing.url.params) == {
        'page': '0',
        'perPage': '5',
        'orderBy': 'updatedAt',
        'direction': 'DESC',
        'metadata.topic': 'trips',
    }
    assert update.method == 'PUT' and update.url.path == '/prod/threads/t1/working-memory'
    assert json.loads(update.content) == {'workingMemory': '# Me', 'resourceId': 'me'}


# -- retries --------------------------------------------------------------------------------------------------------
def test_429_502_503_and_connection_failures_are_retried_with_backoff() -> None:
    transport = Scripted(
        error(429, 'too_many_requests'),
        error(502, 'dependency_unavailable'),
        httpx.ConnectError('refused'),
        httpx.Response(200, json=STEP),
    )
    om, sleeps = client(transport, retries=RetryPolicy(max_retries=3, backoff_base_s=1.0, backoff_max_s=3.0))

    result = om.step('t1', ['hi'])

    assert isinstance(result, StepResult) and len(transport.requests) == 4
    # Exponential with jitter: half of each ceiling is fixed (1, 2, then capped at 3), half random.
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0 and 1.5 <= sleeps[2] <= 3.0


def test_retry_after_is_honoured() -> None:
    transport = Scripted(error(429, 'too_many_requests', **{'Retry-After': '7'}), httpx.Response(200, json=STEP))
    om, sleeps = client(transport)

    om.step('t1', ['hi'])

    assert sleeps == [7.0]


def test_retries_run_out_into_the_codes_exception() -> None:
    transport = Scripted(error(429, 'too_many_requests', 'slow down'))
    om, sleeps = client(transport, retries=2)

    with pytest.raises(RateLimited) as caught:
        om.step('t1', ['hi'])

    assert caught.value.attempts == 3 and len(sleeps) == 2 and caught.value.message == 'slow down'


def test_other_errors_are_not_retried() -> None:
    transport = Scripted(error(409, 'message_conflict', 'message m1 is stored with other content'))
    om, sleeps = client(transport)

    with pytest.raises(MessageConflict) as caught:
        om.turn('t1', ['x'])

    assert len(transport.requests) == 1 and sleeps == []
    assert caught.value.status == 409 and caught.value.details == [{'field': 'x', 'message': 'bad'}]


def test_chat_is_resent_after_a_read_timeout_like_steps() -> None:
    # A chat whose answer was lost is sent again with the same message id: the server answers a message once, so
    # the retry gets the reply the first attempt stored (no second Actor call).
    chat_transport = Scripted(httpx.ReadTimeout('slow'), httpx.Response(200, json={'reply': None, 'parts': []}))
    om, _ = client(chat_transport)
    om.chat('t1', 'hello')
    assert len(chat_transport.requests) == 2
    first, again = (json.loads(r.content)['message'] for r in chat_transport.requests)
    assert first['id'] == again['id']

    step_transport = Scripted(httpx.ReadTimeout('slow'), httpx.Response(200, json=STEP))
    om, _ = client(step_transport)
    om.step('t1', ['hello'])
    assert len(step_transport.requests) == 2


def test_a_thread_created_by_a_lost_attempt_is_returned_not_refused() -> None:
    # The first attempt created the thread but its answer was lost; the retry finds the (client-chosen) id taken.
    transport = Scripted(
        httpx.ReadError('connection reset'),
        error(409, 'thread_exists'),
        lambda r: httpx.Response(200, json={'thread': {**THREAD, 'id': r.url.path.rsplit('/', 1)[-1]}}),
    )
    om, _ = client(transport)

    thread = om.create_thread(title='Trip')

    create, retry, get = transport.requests
    assert json.loads(create.content)['id'] == json.loads(retry.content)['id'] == thread.id
    assert get.method == 'GET' and get.url.path == f'/prod/threads/{thread.id}'


def test_a_delete_whose_first_attempt_succeeded_is_done() -> None:
    transport = Scripted(httpx.ReadError('connection reset'), error(404, 'thread_not_found'))
    om, _ = client(transport)

    om.delete_thread('t1')  # no exception

    assert len(transport.requests) == 2


# -- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ('status', 'code', 'expected'),
    [
        (404, 'thread_not_found', ThreadNotFound),
        (409, 'message_conflict', MessageConflict),
        (409, 'thread_exists', ThreadExists),
        (400, 'invalid_json', InvalidJSON),
        (413, 'payload_too_large', PayloadTooLarge),
        (413, 'too_large', TooLarge),
        (422, 'validation_error', ValidationFailed),
        (422, 'invalid_id', InvalidId),
        (429, 'too_many_requests', RateLimited),
        (503, 'model_unavailable', ModelUnavailable),
        (503, 'some_new_503_code', ServiceUnavailable),
        (404, 'some_new_404_code', NotFound),  # a code this client does not know falls back to its status family
        (418, 'teapot', APIError),
    ],
)
def test_each_error_code_raises_its_class(status: int, code: str, expected: type[APIError]) -> None:
    exc = error_for(status, {'error': {'code': code, 'message': 'what to fix', 'details': []}})

    assert type(exc) is expected and exc.code == code and exc.status == status and exc.message == 'what to fix'


def test_every_code_the_server_answers_has_its_own_class() -> None:
    server_codes = {
        'invalid_json', 'validation_error', 'payload_too_large', 'unauthenticated', 'forbidden', 'not_found',
        'thread_not_found', 'method_not_allowed', 'message_conflict', 'thread_exists', 'version_conflict', 'erased',
        'invalid_input', 'retrieval_disabled', 'working_memory_disabled', 'invalid_working_memory',
        'working_memory_too_large', 'model_unavailable', 'model_error', 'storage_unavailable', 'internal_error',
        'too_many_requests', 'dependency_unavailable', 'timeout', 'bad_request', 'invalid_id', 'too_large',
        'unsupported_media_type', 'origin_not_allowed', 'buffering_disabled',
    }  # fmt: skip
    assert server_codes <= set(BY_CODE)
    assert len({BY_CODE[c] for c in server_codes}) == len(server_codes)


def test_a_gateway_error_without_our_body_is_still_typed() -> None:
    transport = Scripted(httpx.Response(502, text='<html>Bad Gateway</html>'))
    om, _ = client(transport, retries=0)

    with pytest.raises(ServerError, match='Bad Gateway'):
        om.memory('t1')


# -- auth -----------------------------------------------------------------------------------------------------------
def test_iam_signs_with_sigv4_for_execute_api_in_the_urls_region() -> None:
    transport = Scripted(httpx.Response(200, json=STEP))
    auth = IAMAuth(credentials=Credentials('AKIDEXAMPLE', 'secret', 'session-token'))
    om, _ = client(transport, auth=auth)

    om.step('t1', ['hi'])

    headers = transport.requests[0].headers
    assert headers['Authorization'].startswith('AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/')
    assert '/eu-west-1/execute-api/aws4_request' in headers['Authorization']
    assert 'SignedHeaders=content-type;host;x-amz-date;x-amz-security-token' in headers['Authorization']
    assert headers['X-Amz-Security-Token'] == 'session-token' and headers['X-Amz-Date']


def test_query_values_are_encoded_as_sigv4_expects() -> None:
    transport = Scripted(httpx.Response(200, json={'threads': [], 'hasMore': False}))
    auth = IAMAuth(credentials=Credentials('AKIDEXAMPLE', 'secret'))
    om, _ = client(transport, auth=auth)

    om.list_threads(metadata={'topic': 'day trips+más'})

    query = transport.requests[0].url.query.decode()
    assert 'metadata.topic=day%20trips%2Bm%C3%A1s' in query and '+' not in query
    assert dict(transport.requests[0].url.params)['metadata.topic'] == 'day trips+más'


def test_iam_signature_covers_the_body() -> None:
    transport = Scripted(httpx.Response(200, json=STEP))
    auth = IAMAuth('us-east-1', credentials=Credentials('AKIDEXAMPLE', 'secret'))
    om, _ = client(transport, auth=auth)

    om.step('t1', [Message.user('one', id='m1')])
    om.step('t1', [Message.user('two', id='m1')])

    first, second = (r.headers['Authorization'].rsplit('Signature=', 1)[1] for r in transport.requests)
    assert first != second


def test_region_comes_from_execute_api_urls_only() -> None:
    assert region_from_url(URL) == 'eu-west-1'
    assert region_from_url('https://abc-vpce-1.execute-api.ap-south-2.amazonaws.com/x') == 'ap-south-2'
    assert region_from_url('https://memory.example.com/prod') is None


def test_bearer_token_callable_is_asked_again_after_a_401() -> None:
    tokens = iter(['expired', 'fresh'])
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers['Authorization'])
        return httpx.Response(200, json=STEP) if sent[-1] == 'Bearer fresh' else error(401, 'unauthenticated')

    om, _ = client(Scripted(answer), auth=BearerAuth(lambda: next(tokens)))

    om.step('t1', ['hi'])

    assert sent == ['Bearer expired', 'Bearer fresh']


# -- models, attachments, async, packaging --------------------------------------------------------------------------
def test_answers_keep_unknown_fields_and_parse_parts() -> None:
    body = {
        **STEP,
        'newField': 1,
        'messages': [
            {'id': 'a', 'role': 'assistant', 'createdAt': '2026-01-01T00:00:00Z', 'omStatus': 'observed',
             'parts': [{'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'f', 'args': {'x': 1}},
                       {'type': 'future-part', 'stuff': True}]},
        ],
        'parts': [{'type': 'data-om-status', 'data': {'windows': {}}}],
    }  # fmt: skip

    step = StepResult.model_validate(body)

    assert step.model_extra == {'newField': 1} and step.status == {'windows': {}}
    message = step.messages[0]
    assert message.om_status == 'observed' and isinstance(message.parts[0], ToolCallPart)
    assert message.parts[1].type == 'future-part'


def test_upload_attachment_presigns_then_puts_with_the_signed_headers() -> None:
    upload_url = 'https://bucket.s3.amazonaws.com/k?X-Amz-SignedHeaders=content-length%3Bcontent-type%3Bhost%3Bx-amz-server-side-encryption&X-Amz-Signature=abc'  # noqa: E501
    transport = Scripted(
        lambda r: (
            httpx.Response(201, json={'url': 's3://bucket/k', 'uploadUrl': upload_url, 'expiresAt': 'later'})
            if r.url.path.endswith('/attachments')
            else httpx.Response(200)
        )
    )
    om, _ = client(transport, auth=IAMAuth(credentials=Credentials('AKIDEXAMPLE', 'secret')))

    part = om.upload_attachment('t1', b'\x89PNG...', filename='shot.png')

    presign, put = transport.requests
    assert json.loads(presign.content) == {
        'resourceId': 'me',
        'threadId': 't1',
        'filename': 'shot.png',
        'mediaType': 'image/png',
        'size': 7,
    }
    assert put.method == 'PUT' and put.content == b'\x89PNG...'
    assert put.headers['Content-Type'] == 'image/png' and put.headers['x-amz-server-side-encryption'] == 'AES256'
    assert 'Authorization' not in put.headers  # our credentials never go to S3
    assert part == ImagePart(url='s3://bucket/k', media_type='image/png', filename='shot.png', size=7)


def test_async_client_retries_and_survives_a_new_event_loop() -> None:
    transport = Scripted(error(503, 'model_unavailable'), httpx.Response(200, json=STEP))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    om = AsyncMemoryClient(URL, resource_id='me', transport=httpx.MockTransport(transport), sleep=sleep)

    asyncio.run(om.step('t1', ['hi']))
    asyncio.run(om.step('t1', ['again']))  # a second loop, as frameworks that asyncio.run per request do

    assert len(transport.requests) == 3 and len(sleeps) == 1


def test_the_client_never_imports_the_server() -> None:
    code = (
        'import sys, om_client, om_client.tools, om_client.integrations.openai_agents, '
        'om_client.integrations.strands, om_client.integrations.mcp_server\n'
        "server = sorted(m for m in sys.modules if m.split('.')[0] in ('om_lib', 'functions', 'om_cli'))\n"
        'assert not server, server'
    )
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr


# -- the memory tools the integrations offer ------------------------------------------------------------------------
def test_update_working_memory_tool_resends_an_object_sent_as_text() -> None:
    from om_client.integrations._shared import run_update_working_memory

    def answer(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)['workingMemory']
        if isinstance(sent, str):
            return error(422, 'invalid_working_memory', 'working memory is JSON here: send an object')
        return httpx.Response(200, json={'workingMemory': sent, 'scope': 'thread', 'format': 'json'})

    transport = Scripted(answer)
    om, _ = client(transport)

    ok = asyncio.run(run_update_working_memory(om, 't1', 'me', '{"memory": "{\\"city\\": \\"Lisbon\\"}"}'))
    missing = asyncio.run(run_update_working_memory(om, 't1', 'me', {}))
    refused = asyncio.run(run_update_working_memory(om, 't1', 'me', {'memory': 'plain markdown'}))

    assert ok == ('{"success": true}', False)
    assert [b['workingMemory'] for b in transport.bodies()] == [
        '{"city": "Lisbon"}',
        {'city': 'Lisbon'},
        'plain markdown',
    ]
    assert missing[1] and 'needs one argument, `memory`' in json.loads(missing[0])['error']
    assert refused == (json.dumps({'success': False, 'error': 'working memory is JSON here: send an object'}), True)


def test_recall_tool_reads_the_models_arguments_and_reports_errors() -> None:
    from om_client.integrations._shared import run_recall

    transport = Scripted(
        lambda r: (
            httpx.Response(200, json={'threads': '- t2', 'count': 1})
            if json.loads(r.content)['threadId'] == 't2'
            else error(422, 'invalid_input', 'Could not resolve cursor message x')
        )
    )
    om, _ = client(transport)

    listed = asyncio.run(run_recall(om, 't1', 'me', '{"mode": "threads", "threadId": "t2", "partIndex": null}'))
    failed = asyncio.run(run_recall(om, 't1', 'me', {'cursor': 'x', 'partIndex': 2}))

    assert json.loads(listed) == {'threads': '- t2', 'count': 1}
    assert transport.bodies()[0] == {'resourceId': 'me', 'threadId': 't2', 'mode': 'threads'}
    assert transport.bodies()[1] == {'resourceId': 'me', 'threadId': 't1', 'cursor': 'x', 'partIndex': 2}
    assert json.loads(failed) == {'error': 'Could not resolve cursor message x'}


# -- operations of several requests (one flow, run by both clients) -------------------------------------------------
def _lost_clone_answers(request: httpx.Request) -> httpx.Response:
    """The clone's answer is lost, its retry finds the new id taken; then the clone is read back, two pages."""
    path = request.url.path
    if path.endswith('/clone'):
        return httpx.Response(409, json={'error': {'code': 'thread_exists', 'message': 'taken'}})
    if path.endswith('/messages'):
        page = int(request.url.params['page'])
        message = {'id': f'm{page}', 'role': 'user', 'parts': [{'type': 'text', 'text': f'hi {page}'}]}
        return httpx.Response(200, json={'messages': [message], 'page': page, 'perPage': 1000, 'hasMore': page == 0})
    return httpx.Response(200, json={'thread': {**THREAD, 'id': path.rsplit('/', 1)[-1]}})


def test_a_clone_made_by_a_lost_attempt_is_read_back() -> None:
    transport = Scripted(httpx.ReadError('connection reset'), _lost_clone_answers)
    om, _ = client(transport)

    result = om.clone_thread('t1', title='Copy')

    clone_id = result.thread.id
    assert [m.id for m in result.cloned_messages] == ['m0', 'm1']
    assert [(r.method, r.url.path) for r in transport.requests] == [
        ('POST', '/prod/threads/t1/clone'),
        ('POST', '/prod/threads/t1/clone'),
        ('GET', f'/prod/threads/{clone_id}'),
        ('GET', f'/prod/threads/{clone_id}/messages'),
        ('GET', f'/prod/threads/{clone_id}/messages'),
    ]
    assert json.loads(transport.requests[0].content)['newThreadId'] == clone_id


PRESIGNED = {
    'url': 's3://bucket/k',
    'uploadUrl': 'https://bucket.s3.amazonaws.com/k?X-Amz-Signature=a',
    'expiresAt': 'x',
}


def test_an_upload_is_retried_on_5xx_and_connection_failures_and_refused_on_4xx() -> None:
    def s3(*answers: httpx.Response | Exception) -> Scripted:
        puts = Scripted(*answers)
        return Scripted(
            lambda r: httpx.Response(201, json=PRESIGNED) if r.url.path.endswith('/attachments') else puts(r)
        )

    retried = s3(httpx.ConnectError('refused'), httpx.Response(500), httpx.Response(200))
    om, sleeps = client(retried)
    part = om.upload_attachment('t1', b'%PDF', filename='a.pdf')
    assert [r.method for r in retried.requests] == ['POST', 'PUT', 'PUT', 'PUT'] and len(sleeps) == 2
    assert part.url == 's3://bucket/k' and part.media_type == 'application/pdf'

    refused = s3(httpx.Response(403, text='<Error>SignatureDoesNotMatch</Error>'))
    om, sleeps = client(refused)
    with pytest.raises(APIError) as caught:
        om.upload_attachment('t1', b'%PDF', filename='a.pdf')
    assert (
        caught.value.code == 'upload_failed'
        and caught.value.status == 403
        and 'SignatureDoesNotMatch' in str(caught.value)
    )
    assert len(refused.requests) == 2 and sleeps == []

    unreachable = s3(httpx.ConnectError('refused'))
    om, _ = client(unreachable, retries=1)
    with pytest.raises(ConnectionFailed, match='PUT https://bucket.s3.amazonaws.com/k.* after 2 attempt'):
        om.upload_attachment('t1', b'%PDF', filename='a.pdf')


def test_the_async_client_recovers_lost_creates_and_uploads_like_the_blocking_one() -> None:
    created = Scripted(
        httpx.ReadError('connection reset'),
        error(409, 'thread_exists'),
        lambda r: httpx.Response(200, json={'thread': {**THREAD, 'id': r.url.path.rsplit('/', 1)[-1]}}),
    )
    uploaded = Scripted(httpx.Response(201, json=PRESIGNED), httpx.Response(503), httpx.Response(200))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def run() -> tuple[Any, Any]:
        async with AsyncMemoryClient(URL, resource_id='me', transport=httpx.MockTransport(created), sleep=sleep) as om:
            thread = await om.create_thread()
        async with AsyncMemoryClient(
            URL, resource_id='me', transport=httpx.MockTransport(uploaded), sleep=sleep, auth=BearerAuth('tok')
        ) as om:
            part = await om.upload_attachment('t1', b'\x89PNG', filename='x.png')
        return thread, part

    thread, part = asyncio.run(run())

    assert created.requests[-1].url.path == f'/prod/threads/{thread.id}'
    assert json.loads(created.requests[0].content)['id'] == thread.id
    assert isinstance(part, ImagePart) and part.url == 's3://bucket/k'
    assert [r.method for r in uploaded.requests] == ['POST', 'PUT', 'PUT'] and len(sleeps) == 2
    assert uploaded.requests[0].headers['Authorization'] == 'Bearer tok'
    assert 'Authorization' not in uploaded.requests[2].headers  # our credentials never go to S3
