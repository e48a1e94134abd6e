"""Concurrent steps on one conversation over real HTTP, with DynamoDB served by dynalite (moto is not atomic).

The local stack runs as in the other e2e modules (embedded moto for S3, SQS and Step Functions; the functions
in-process behind the HTTP adapter), except that the functions' DynamoDB endpoint is dynalite
(`AWS_ENDPOINT_URL_DYNAMODB`), whose single-item conditional writes are atomic like DynamoDB's. The thresholds are
far above what the test writes, so no observation or reflection runs: only the write path is raced.

The memory table is created on dynalite with `ensure_table` before the stack starts: the stack's own resource setup
talks to its general endpoint only (the embedded emulator clears per-service endpoints, and `LocalStack.client()`
passes its endpoint explicitly), so the functions' environment gets the dynalite endpoint through `env=`.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
from botocore.config import Config

from om_cli.local_stack import LocalStack
from om_lib.adapters.aws.dynamodb.schema import ensure_table
from tests.dynalite import ensure_dynalite, running_dynalite

pytestmark = pytest.mark.e2e

# No observation, no reflection: the stack only stores what the writers send.
QUIET_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 1_000_000, 'bufferTokens': False},
    'reflection': {'observationTokens': 1_000_000},
}
WRITERS, STEPS = 8, 10
# A refusal that wrote nothing (CONTRACT §2): the client retries it. Anything else that is not a 200 fails the test.
RETRYABLE = {409, 429}
MAX_ATTEMPTS = 20


@pytest.fixture(scope='module')
def dynalite() -> Iterator[str]:
    with running_dynalite(ensure_dynalite('the dynalite e2e tests')) as endpoint:
        yield endpoint


@pytest.fixture(scope='module')
def ddb(dynalite) -> Any:
    return boto3.client(
        'dynamodb',
        endpoint_url=dynalite,
        region_name='us-east-1',
        aws_access_key_id='testing',
        aws_secret_access_key='testing',
        config=Config(retries={'mode': 'standard', 'max_attempts': 5}),
    )


@pytest.fixture(scope='module')
def stack(dynalite, ddb) -> Iterator[LocalStack]:
    if os.environ.get('AWS_ENDPOINT_URL'):
        pytest.skip('AWS_ENDPOINT_URL is set; this module needs the embedded emulator with DynamoDB on dynalite')
    stack = LocalStack(
        port=0,
        config=QUIET_CONFIG,
        sweep_interval_s=None,
        env={
            'AWS_ENDPOINT_URL_DYNAMODB': dynalite,
            'POWERTOOLS_LOG_LEVEL': 'WARNING',
            'POWERTOOLS_METRICS_DISABLED': 'true',
        },
    )
    ensure_table(ddb, stack.names.table)
    with stack:
        assert os.environ['AWS_ENDPOINT_URL_DYNAMODB'] == dynalite
        yield stack


class Client:
    """A JSON client over real HTTP (urllib: one connection per request, safe to share between threads)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lock = threading.Lock()
        self.answers: dict[int, int] = {}

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={'Content-Type': 'application/json'}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        with self.lock:
            self.answers[status] = self.answers.get(status, 0) + 1
        return status, json.loads(payload) if payload else None

    def step(self, thread: str, resource: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """POST a step until it is accepted; a refusal that wrote nothing is retried, anything else fails."""
        for _ in range(MAX_ATTEMPTS):
            status, body = self.request(
                'POST', f'/threads/{thread}/steps', {'resourceId': resource, 'messages': messages}
            )
            if status == 200:
                return body  # type: ignore[no-any-return]
            assert status in RETRYABLE, (status, body)
        raise AssertionError(f'a step on {thread} was refused {MAX_ATTEMPTS} times')

    def all_messages(self, thread: str, resource: str, per_page: int) -> list[dict[str, Any]]:
        """Every message of the thread, page by page (oldest first)."""
        messages: list[dict[str, Any]] = []
        page = 0
        while True:
            status, body = self.request(
                'GET', f'/threads/{thread}/messages?resourceId={resource}&page={page}&perPage={per_page}'
            )
            assert status == 200, body
            assert len(body['messages']) <= per_page
            messages.extend(body['messages'])
            if not body['hasMore']:
                return messages
            assert body['messages'], 'hasMore with an empty page'
            page += 1


def user(mid: str, text: str | None = None) -> dict[str, Any]:
    return {'id': mid, 'role': 'user', 'content': text or f'message {mid}'}


def run_writers(client: Client, jobs: list[tuple[str, str, int]]) -> list[str]:
    """Each job (thread, resource, writer) sends STEPS steps in order; returns the ids each step carried, flattened."""
    barrier = threading.Barrier(len(jobs))

    def write(job: tuple[str, str, int]) -> list[str]:
        thread, resource, w = job
        sent: list[str] = []
        barrier.wait(timeout=30)  # every writer's first step races the thread's creation
        for i in range(STEPS):
            batch = [user(f'{thread}-w{w}-{i}')]
            if i % 4 == 1:
                batch.append(user(f'{thread}-w{w}-{i}-b'))  # a step of two messages
            if i == 3:
                batch.append(user(f'{thread}-shared', 'the same message from every writer'))
            client.step(thread, resource, batch)
            if i % 3 == 2:
                client.step(thread, resource, batch)  # a retry of an accepted step: nothing new is stored
            sent.extend(m['id'] for m in batch)
        return sent

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return [mid for sent in pool.map(write, jobs) for mid in sent]


def assert_stored_once_in_order(client: Client, thread: str, resource: str, sent: list[str]) -> list[str]:
    expected = set(sent)
    full = client.all_messages(thread, resource, per_page=1000)
    ids = [m['id'] for m in full]
    assert len(ids) == len(set(ids)), f'duplicates: {sorted({i for i in ids if ids.count(i) > 1})}'
    assert set(ids) == expected, f'lost: {sorted(expected - set(ids))}; unexpected: {sorted(set(ids) - expected)}'
    # Small pages walk the same order with no gap and no repeat at page boundaries.
    assert [m['id'] for m in client.all_messages(thread, resource, per_page=7)] == ids
    # Arrival order: each writer's steps are sequential, so its messages appear in the order it sent them.
    position = {mid: n for n, mid in enumerate(ids)}
    writers = {mid.rsplit('-', 1)[0] for mid in sent if not mid.endswith(('-b', '-shared'))}
    for writer in writers:
        own = [position[f'{writer}-{i}'] for i in range(STEPS)]
        assert own == sorted(own), f'{writer} out of order: {own}'
        for i in range(1, STEPS, 4):  # a two-message step is stored in its order, before the writer's next step
            assert position[f'{writer}-{i}'] < position[f'{writer}-{i}-b'] < position.get(f'{writer}-{i + 1}', 10**9)
    return ids


def test_concurrent_steps_on_one_thread_store_every_message_once_in_order(stack, ddb):
    client = Client(stack.url)
    thread, resource = 'race-1', 'alice'
    sent = run_writers(client, [(thread, resource, w) for w in range(WRITERS)])
    ids = assert_stored_once_in_order(client, thread, resource, sent)
    assert len(ids) == WRITERS * (STEPS + 3) + 1  # 10 singles and 3 seconds per writer, and one shared message
    assert not any(status >= 500 for status in client.answers), client.answers
    # The writes went to dynalite, not to the embedded emulator.
    assert ddb.scan(TableName=stack.names.table, Select='COUNT')['Count'] > len(ids)
    status, view = client.request('GET', f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, view
    assert view['observationTokens'] == 0 and view['generationCount'] == 0


def test_concurrent_steps_on_two_threads_of_one_resource_keep_them_apart(stack):
    client = Client(stack.url)
    resource = 'bob'
    jobs = [(thread, resource, w) for thread in ('pair-a', 'pair-b') for w in range(WRITERS // 2)]
    sent = run_writers(client, jobs)
    for thread in ('pair-a', 'pair-b'):
        assert_stored_once_in_order(client, thread, resource, [m for m in sent if m.startswith(f'{thread}-')])
    assert not any(status >= 500 for status in client.answers), client.answers
    status, body = client.request('GET', f'/resources/{resource}/threads')
    assert status == 200, body
    assert sorted(t['id'] for t in body['threads']) == ['pair-a', 'pair-b']
