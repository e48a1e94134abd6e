"""Least privilege that still works: every AWS call each function makes is one its deployed role allows.

A conversation runs on the local stack (moto, the fake Gemini, the real handlers) with `om_cli.metering.AwsMeter`
recording which function made which call. Each call's IAM action must be allowed to that function's role in the
synthesised template, on that resource (table, named index, bucket objects, queue, state machine, secret), and the
role must be allowed to use the stack's key through that service. A grant trimmed too far fails here, not in
production. The Gemini key's cache is off for the run, so every model call reads the secret and shows who reads it.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from infra.constants import ALL_FUNCTIONS, FunctionSpec
from om_cli.metering import AwsMeter
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest
from tests.infra.conftest import Resources, of_type, role_of, role_statements

# Small thresholds, buffering on: steps buffer in the worker, observations activate, reflections run the workflow.
CONFIG = {
    'model': 'default',
    'observation': {'messageTokens': 300, 'bufferTokens': 0.25},
    'reflection': {'observationTokens': 400},
}
OBSERVATIONS = '<observations>\nDate: Mar 3, 2025\n{lines}\n</observations>'
# The ESM polls and deletes with the worker's role; the local stack's poller stands in for it.
ACTING_FOR = {'stack:om-queue-poller': 'buffer_worker', 'stack:om-uploads-poller': 'orphan_uploads'}
FUNCTION_OF_SPEC = {
    'ApiFunction': 'api',
    # The chat stream function runs the API's handler for the chat routes (the local stack serves them in `api`).
    'ChatStreamFunction': 'api',
    'BufferWorkerFunction': 'buffer_worker',
    'ReflectionFunction': 'reflection',
    'SweeperFunction': 'sweeper',
    'OrphanUploadsFunction': 'orphan_uploads',
}


def _gemini(request: FakeRequest) -> FakeReply:
    system = request.system_text
    if 'observation reflector' in system:
        return FakeReply.text(OBSERVATIONS.format(lines='* 🔴 (09:00) User shared facts about Maya (condensed)'))
    if 'You are the memory of an AI assistant' in system:
        lines = '\n'.join(f'* 🔴 (09:0{i}) User said Maya moves to Lisbon, fact {i} of many' for i in range(8))
        return FakeReply.text(OBSERVATIONS.format(lines=lines))
    return FakeReply.text('Noted.')


def _json_call(base: str, method: str, path: str, body: Any) -> Any:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method=method, headers={'Content-Type': 'application/json'}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _call(base: str, method: str, path: str, body: Any = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={'Content-Type': 'application/json'}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture(scope='module')
def observed() -> Iterator[dict[str, set[tuple[str, str]]]]:
    """`{function: {(IAM action, resource)}}` from one conversation on the local stack."""
    for name in ('AWS_ENDPOINT_URL', 'GOOGLE_API_KEY', 'GEMINI_API_KEY'):
        if os.environ.get(name):
            pytest.skip(f'{name} is set; this test needs the embedded emulator and the fake Gemini only')
    import om_cli.local_stack as local_stack
    from functions import _wiring

    meter = AwsMeter()
    original_secret = _wiring.SecretKey

    class UncachedSecret(original_secret):  # type: ignore[misc,valid-type]
        def __init__(self, secret_arn: str, *, ttl_s: float = 0.0) -> None:
            super().__init__(secret_arn, ttl_s=-1.0)

    _wiring.SecretKey = UncachedSecret
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    try:
        with meter.metering_local_stack(), FakeGemini(_gemini) as gemini:
            env['GOOGLE_GEMINI_BASE_URL'] = gemini.url
            stack = local_stack.LocalStack(
                port=0, config=CONFIG, env=env, sweep_interval_s=None, visibility_timeout_s=2
            ).start()
            try:
                arn = stack.client('secretsmanager').create_secret(Name='om-gemini', SecretString='key')['ARN']
                os.environ['OM_GEMINI_SECRET_ARN'] = arn
                _wiring.reset()
                _converse(stack)
            finally:
                os.environ.pop('OM_GEMINI_SECRET_ARN', None)
                stack.stop()
    finally:
        _wiring.SecretKey = original_secret
    found: dict[str, set[tuple[str, str]]] = {}
    for function, calls in meter.actions_by_function().items():
        found.setdefault(ACTING_FOR.get(function, function), set()).update(calls)
    yield found


def _converse(stack: Any) -> None:
    base, resource, thread = stack.url, 'user-1', 't1'
    for i in range(10):
        text = f'Fact {i}: my sister Maya moves to Lisbon in May with her cat Olive. ' * 6
        body = {'resourceId': resource, 'messages': [{'role': 'user', 'content': text}]}
        assert _call(base, 'POST', f'/threads/{thread}/steps', body) == 200
        stack.drain(60)
    # A message over the offload threshold goes to S3 (written by the API, read back by whoever observes it).
    large = {'resourceId': resource, 'messages': [{'role': 'user', 'content': 'A long note about Lisbon. ' * 13_000}]}
    assert _call(base, 'POST', f'/threads/{thread}/steps', large) == 200
    stack.drain(60)
    assert (
        _call(base, 'POST', f'/threads/{thread}/chat', {'resourceId': resource, 'content': 'What about Maya?'}) == 200
    )
    streamed = {'resourceId': resource, 'content': 'And Olive?'}
    assert _call(base, 'POST', f'/threads/{thread}/chat/stream', streamed) == 200
    attachment = {'resourceId': resource, 'threadId': thread, 'filename': 'a.txt', 'mediaType': 'text/plain', 'size': 9}
    assert _call(base, 'POST', '/attachments', attachment) == 201
    assert _call(base, 'POST', f'/threads/{thread}/clone', {'resourceId': resource, 'newThreadId': 't2'}) == 201
    assert _call(base, 'GET', f'/threads/{thread}/memory?resourceId={resource}') == 200
    # A thread left with unobserved messages, an hour later: the sweeper finds it and submits its job.
    quiet = {'resourceId': resource, 'messages': [{'role': 'user', 'content': 'One more thing about Olive.'}]}
    assert _call(base, 'POST', '/threads/t3/steps', quiet) == 200
    stack.drain(60)
    _sweep_an_hour_later(stack)
    stack.drain(60)
    # An upload URL of t2 used after t2 is erased: the bucket reports the upload and the orphan-upload function
    # deletes it (reading the thread, deleting the object).
    late = {'resourceId': resource, 'threadId': 't2', 'filename': 'late.txt', 'mediaType': 'text/plain', 'size': 4}
    upload = _json_call(base, 'POST', '/attachments', late)
    assert _call(base, 'DELETE', f'/threads/t2?resourceId={resource}') == 204
    put = urllib.request.Request(
        upload['uploadUrl'],
        data=b'late',
        method='PUT',
        headers={'Content-Type': 'text/plain', 'x-amz-server-side-encryption': 'AES256'},
    )
    with urllib.request.urlopen(put, timeout=30) as response:
        assert response.status == 200
    stack.drain(60)
    assert _call(base, 'DELETE', f'/resources/{resource}') == 204


def _sweep_an_hour_later(stack: Any) -> None:
    from datetime import timedelta

    from functions import _wiring

    runtime = _wiring.engine().rt  # the sweep reads the runtime's clock
    clock = runtime.clock

    class Later:
        def now(self) -> Any:
            return clock.now() + timedelta(hours=1)

        def __getattr__(self, name: str) -> Any:
            return getattr(clock, name)

    runtime.clock = Later()
    try:
        assert stack.sweep_once()['submitted'] >= 1
    finally:
        runtime.clock = clock


def _grants(statements: list[dict[str, Any]], action: str) -> list[str]:
    """The resources (as JSON text) of the statements allowing `action`."""
    return [
        json.dumps(s['Resource'])
        for s in statements
        if action in (s['Action'] if isinstance(s['Action'], list) else [s['Action']])
    ]


def _key_services(resources: Resources, role: str) -> set[str]:
    """The services through which `role` may use the stack's key (its key policy statements' kms:ViaService)."""
    (key,) = of_type(resources, 'AWS::KMS::Key').values()
    services: set[str] = set()
    for statement in key['KeyPolicy']['Statement']:
        if statement['Principal'].get('AWS') == {'Fn::GetAtt': [role, 'Arn']}:
            for value in statement['Condition']['StringEquals']['kms:ViaService']:
                services.add(value['Fn::Join'][1][0].rstrip('.'))
    return services


def test_the_conversation_exercised_every_function(observed: dict[str, set[tuple[str, str]]]) -> None:
    assert {'api', 'buffer_worker', 'reflection', 'sweeper', 'orphan_uploads'} <= set(observed)
    # Every function that calls a model read the key itself (the cache is off), and the sweeper never did.
    readers = {f for f, calls in observed.items() if any(a == 'secretsmanager:GetSecretValue' for a, _ in calls)}
    assert {'api', 'buffer_worker', 'reflection'} <= readers and 'sweeper' not in readers
    # Each function that makes memory outcomes published them itself.
    publishers = {f for f, calls in observed.items() if any(a == 'events:PutEvents' for a, _ in calls)}
    assert {'api', 'buffer_worker', 'reflection'} <= publishers and 'sweeper' not in publishers


@pytest.mark.parametrize('spec', ALL_FUNCTIONS, ids=lambda spec: spec.construct_id)
def test_every_call_a_function_makes_is_allowed_to_its_role(
    observed: dict[str, set[tuple[str, str]]], resources: Resources, spec: FunctionSpec
) -> None:
    role = role_of(resources, spec)
    statements = role_statements(resources, role)
    key_services = _key_services(resources, role)
    calls = observed.get(FUNCTION_OF_SPEC[spec.construct_id])
    assert calls, f'the conversation made no AWS call from {spec.construct_id}: nothing was checked'
    for action, resource in sorted(calls):
        grants = _grants(statements, action)
        assert grants, f'{spec.construct_id} calls {action} on {resource} but its role does not allow it'
        service = action.split(':')[0]
        kind = resource.split('/')[0]
        if kind == 'table' and '/index/' in resource:
            index = resource.rsplit('/', 1)[1]
            assert any(f'/index/{index}"' in g for g in grants), f'{spec.construct_id}: {action} on index {index}'
        elif kind == 'bucket':
            wants_objects = resource.endswith('/object')
            assert any(('/*' in g) == wants_objects for g in grants), f'{spec.construct_id}: {action} on {resource}'
        elif kind == 'queue':  # the local stack's queue names: `<prefix>-work.fifo`, `<prefix>-uploads`
            construct = 'OrphanUploadCleanupQueue' if resource.endswith('-uploads') else 'WorkQueue'
            assert any(construct in g and 'DeadLetter' not in g for g in grants), (spec.construct_id, action)
        elif kind == 'state-machine':
            assert any(':stateMachine:' in g and '-reflection' in g for g in grants), (spec.construct_id, action)
        elif kind == 'event-bus':  # the local stack's bus: `<prefix>-lifecycle`, the deployed `<stack>-lifecycle`
            assert any('event-bus/' in g and '-lifecycle' in g for g in grants), (spec.construct_id, action)
        if service in {'dynamodb', 's3', 'sqs', 'secretsmanager'}:
            assert service in key_services, f'{spec.construct_id} calls {service} but may not use the key through it'
