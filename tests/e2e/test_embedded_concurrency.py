"""The one-command local stack is as safe as DynamoDB: 24 concurrent steps on the embedded emulator lose nothing.

moto applies conditional writes without a lock; before `SerialDynamoDB` serialised its DynamoDB requests, 24 concurrent
steps on one thread made duplicate sequence numbers and the listing then hid messages.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from om_cli.local_stack import LocalStack
from tests.e2e.test_concurrency_dynalite import QUIET_CONFIG, Client, user

pytestmark = pytest.mark.e2e

CONCURRENT_STEPS = 24
STEPS_EACH = 4


@pytest.fixture(scope='module')
def embedded() -> Iterator[LocalStack]:
    for name in ('AWS_ENDPOINT_URL', 'AWS_ENDPOINT_URL_DYNAMODB'):
        if os.environ.get(name):
            pytest.skip(f'{name} is set; this module tests the embedded emulator')
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    with LocalStack(port=0, config=QUIET_CONFIG, sweep_interval_s=None, env=env) as stack:
        assert stack.embedded
        yield stack


def test_24_concurrent_steps_on_one_thread_store_every_message_once(embedded: LocalStack) -> None:
    # (Without the serialisation this loses most messages: 4 of 96 were listed in one run.)
    client = Client(embedded.url)
    thread, resource = 'embedded-race', 'alice'
    barrier = threading.Barrier(CONCURRENT_STEPS)

    def writer(n: int) -> list[str]:
        barrier.wait(timeout=30)  # all of them race the thread's creation and its sequence counter
        sent = []
        for i in range(STEPS_EACH):
            mid = f'{thread}-{n}-{i}'
            client.step(thread, resource, [user(mid)])
            sent.append(mid)
        return sent

    with ThreadPoolExecutor(max_workers=CONCURRENT_STEPS) as pool:
        sent = [mid for ids in pool.map(writer, range(CONCURRENT_STEPS)) for mid in ids]
    stored = client.all_messages(thread, resource, per_page=1000)
    ids = [m['id'] for m in stored]
    assert len(ids) == len(set(ids)), f'duplicates: {sorted({i for i in ids if ids.count(i) > 1})}'
    assert set(ids) == set(sent), f'lost: {sorted(set(sent) - set(ids))}'
    # Small pages walk the same listing: nothing hidden between pages (holes or repeated sequence numbers would)
    assert [m['id'] for m in client.all_messages(thread, resource, per_page=5)] == ids
    assert not any(status >= 500 for status in client.answers), client.answers


def test_concurrent_requests_each_get_their_own_answer(embedded: LocalStack) -> None:
    # Powertools keeps the request being resolved in class attributes and a shared dict, which a Lambda environment
    # never shares between requests; the local stack serves them on concurrent threads. Before the resolver's state
    # was made per thread, a request for t3 could be answered about t0 (404) or lose its route (500): with very
    # frequent thread switches, ~7% of these requests did.
    client = Client(embedded.url)
    threads = 6
    for i in range(threads):
        client.step(f'own-{i}', f'owner-{i}', [user(f'own-{i}-m')])
    wrong: list[tuple[str, Any]] = []

    def reader(n: int) -> None:
        for k in range(12):
            i = (n + k) % threads
            path = [
                f'/threads/own-{i}/messages?resourceId=owner-{i}',
                f'/threads/own-{i}/memory?resourceId=owner-{i}',
                f'/resources/owner-{i}/threads',
            ][k % 3]
            status, body = client.request('GET', path)
            listed = [m['id'] for m in body.get('messages', [])] if status == 200 else None
            threads_listed = [t['id'] for t in body.get('threads', [])] if status == 200 else None
            if status != 200 or listed not in ([], [f'own-{i}-m']) or threads_listed not in ([], [f'own-{i}']):
                wrong.append((path, body))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so a shared-state race shows within seconds
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(reader, range(16)))
    finally:
        sys.setswitchinterval(switch)
    assert not wrong, f'{len(wrong)} of {16 * 12} answers were about another request: {wrong[:3]}'
