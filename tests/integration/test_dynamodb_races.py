"""Races on one thread and one record, with real threads, against dynalite (an offline DynamoDB whose single-item
conditional writes are atomic; moto's are not, see shared/reference/aws-notes.md §1.4).

Every path raced here is a single-item conditional write, which is all the hot path uses. Paths that dynalite cannot
run (transactions, TTL) are not used by the store at all. S3 is never touched: every value here is small.

dynalite comes from `tests/tools` (`npm ci --prefix tests/tools`); the fixture installs it when it is missing and
skips only when node/npm are unavailable or the install fails (no registry).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import boto3
import pytest
from botocore.config import Config

from om_lib.adapters.aws.dynamodb.schema import create_table
from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore
from om_lib.errors import VersionConflictError
from om_lib.messages import Message
from om_lib.records import Lease, OMRecord
from tests.dynalite import ensure_dynalite, running_dynalite

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope='module')
def dynalite_endpoint() -> Iterator[str]:
    with running_dynalite(ensure_dynalite()) as endpoint:
        yield endpoint


@pytest.fixture
def store(dynalite_endpoint, monkeypatch) -> DynamoMemoryStore:
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', 'testing')
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'testing')
    monkeypatch.setenv('AWS_DEFAULT_REGION', 'us-east-1')
    # Nothing here may reach S3; if something tried, it would fail fast on a closed loopback port.
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', 'http://127.0.0.1:9')
    ddb = boto3.client(
        'dynamodb',
        endpoint_url=dynalite_endpoint,
        region_name='us-east-1',
        config=Config(max_pool_connections=32, retries={'mode': 'standard', 'max_attempts': 5}),
    )
    table = f'race-{uuid.uuid4().hex[:8]}'
    create_table(ddb, table)
    # The race tests keep every record inline: how big the log grows depends on how the racing steps interleave (more
    # batches, more headers), and crossing the 8 KB default would send it to S3, which these tests do not run.
    return DynamoMemoryStore(table, 'unused-bucket', dynamodb_client=ddb, inline_head_max_bytes=256 * 1024)


def msg(mid: str, text: str | None = None) -> Message:
    return Message.model_validate({'id': mid, 'role': 'user', 'createdAt': T0.isoformat(), 'content': text or mid})


def run_all(workers: int, fn, args: list) -> list:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, args))


def test_concurrent_appends_lose_nothing_duplicate_nothing_and_a_cursor_never_skips(store):
    """8 writers append to one new thread while a reader walks a cursor through it, as the Observer does."""
    writers, per_writer = 8, 20
    done = threading.Event()
    seen: list[Message] = []

    def reader() -> None:
        cursor = 0
        while True:
            finished = done.is_set()  # read the flag first: the page after it sees every finished write
            page = store.list_messages('r1', 't1', after_seq=cursor, limit=7)
            for message in page.messages:
                assert (message.seq or 0) > cursor
                seen.append(message)
                cursor = message.seq or cursor
            if finished and not page.messages and not page.has_more:
                return

    def write(w: int) -> None:
        for i in range(per_writer):
            ids = [f'w{w}-{i}']
            if i % 5 == 0:
                ids.append(f'w{w}-{i}-b')  # a batch of two
            if i % 4 == 0:
                ids.append('shared')  # the same message from every writer: stored once
            store.append_messages('r1', 't1', [msg(x) for x in ids], now=T0)

    reading = threading.Thread(target=reader)
    reading.start()
    run_all(writers, write, list(range(writers)))
    done.set()
    reading.join(timeout=60)
    assert not reading.is_alive()

    expected = {f'w{w}-{i}' for w in range(writers) for i in range(per_writer)}
    expected |= {f'w{w}-{i}-b' for w in range(writers) for i in range(0, per_writer, 5)} | {'shared'}
    stored = store.list_messages('r1', 't1', limit=10_000).messages
    assert sorted(m.id for m in stored) == sorted(expected)  # nothing lost, nothing twice
    seqs = [m.seq for m in stored]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # The cursor walk saw every message exactly once, in seq order: it never moved past one still being written.
    assert [m.id for m in seen] == [m.id for m in stored]


def test_concurrent_first_appends_create_one_thread(store):
    results = run_all(8, lambda i: store.append_messages('r1', 'fresh', [msg(f'm{i}')], now=T0), list(range(8)))
    assert {r.thread.created_at for r in results} == {T0}
    assert len(store.list_messages('r1', 'fresh').messages) == 8


def test_concurrent_first_appends_of_many_resources_to_one_thread_id_create_one_thread_each(store):
    """Thread ids are scoped to their resource: no resource can take (or block) another's `shared` id."""
    resources = [f'r{i}' for i in range(8)]

    def first_steps(resource: str) -> list:
        return [store.append_messages(resource, 'shared', [msg(f'{resource}-{n}')], now=T0) for n in range(3)]

    run_all(8, first_steps, resources)
    created = run_all(8, lambda r: store.create_thread(r, 'made', now=T0).resource_id, resources)
    assert created == resources
    for resource in resources:
        page = store.list_messages(resource, 'shared')
        assert [m.id for m in page.messages] == [f'{resource}-{n}' for n in range(3)]
        assert [m.seq for m in page.messages] == [1, 2, 3]
        assert sorted(t.id for t in store.list_threads(resource).threads) == ['made', 'shared']


def test_concurrent_optimistic_updates_lose_no_update(store):
    """8 workers × 12 read-modify-write cycles on one head, while messages are appended to the same thread item."""
    store.append_messages('r1', 't1', [msg('first')], now=T0)
    base = OMRecord(
        id='rec', key='thread:r1/t1', scope='thread', resource_id='r1', thread_id='t1', created_at=T0, updated_at=T0
    )
    store.put_record(base, expected_version=None)
    conflicts = []

    def bump(worker: int) -> None:
        for _ in range(12):
            while True:
                current = store.get_record('thread:r1/t1')
                assert current is not None
                updated = current.model_copy(
                    update={
                        'total_tokens_observed': current.total_tokens_observed + 1,
                        'cursors': {**current.cursors, f'w{worker}': current.cursors.get(f'w{worker}', 0) + 1},
                    }
                )
                try:
                    store.put_record(updated, expected_version=current.version)
                    break
                except VersionConflictError:
                    conflicts.append(worker)

    def append(i: int) -> None:
        store.append_messages('r1', 't1', [msg(f'a{i}')], now=T0)

    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(bump, w) for w in range(8)] + [pool.submit(append, i) for i in range(40)]
        for future in futures:
            future.result()
    head = store.get_record('thread:r1/t1')
    assert head is not None
    assert head.total_tokens_observed == 8 * 12
    assert head.cursors == {f'w{w}': 12 for w in range(8)}
    assert head.version == 1 + 8 * 12
    assert len(store.list_messages('r1', 't1', limit=1000).messages) == 41
    assert conflicts, 'the workers never collided: the test did not race'


def test_only_one_worker_takes_a_lease(store):
    base = OMRecord(
        id='rec', key='resource:r1', scope='resource', resource_id='r1', thread_id=None, created_at=T0, updated_at=T0
    )
    head = store.put_record(base, expected_version=None)
    barrier = threading.Barrier(8)

    def take(worker: int) -> bool:
        lease = Lease(owner=f'w{worker}', expires_at=datetime(2099, 1, 1, tzinfo=UTC))
        barrier.wait()
        try:
            store.put_record(head.model_copy(update={'observing': lease}), expected_version=head.version)
            return True
        except VersionConflictError:
            return False

    assert sum(run_all(8, take, list(range(8)))) == 1
    final = store.get_record('resource:r1')
    assert final is not None and final.observing is not None and final.version == 2


def test_two_threads_of_one_resource_stepping_at_once_neither_double_observe_nor_lose_work(store):
    """Resource scope: two conversations of one user step concurrently; every message is observed exactly once."""
    from om_lib.clock import SystemClock
    from om_lib.config import OMConfig
    from om_lib.context.tokens import TokenCounter
    from om_lib.engine.engine import MemoryEngine
    from om_lib.models.model_router import ModelRouter
    from tests.fakes.scripted_model import ScriptedModel
    from tests.unit.test_engine import WordTokenizer, words
    from tests.unit.test_resource_engine import echo_observer, resource_config

    model = ScriptedModel(fallback=echo_observer)
    clock = SystemClock()
    engine = MemoryEngine(
        OMConfig.model_validate(resource_config(message_tokens=120)),
        store=store,
        router=ModelRouter({'google': model}, clock=clock),
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
    )
    steps = 12
    barrier = threading.Barrier(2)

    def converse(thread_id: str) -> list[str]:
        sent = []
        barrier.wait()
        for n in range(steps):
            message = Message.model_validate(
                {
                    'id': f'{thread_id}-{n}',
                    'role': 'user',
                    'createdAt': clock.now().isoformat(),
                    'content': f'{thread_id} says {n} ' + words(30),
                }
            )
            engine.prepare_step('r1', thread_id, [message])
            sent.append(message.id)
        return sent

    sent = [mid for ids in run_all(2, converse, ['left', 'right']) for mid in ids]
    engine.observe_now('r1', 'left')
    engine.observe_now('r1', 'right')
    observed = [m.id for call in model.calls_for('observer') for m in call.request.source_messages]
    assert len(model.calls_for('observer')) >= 2
    assert sorted(observed) == sorted(sent), 'every message observed exactly once (no loss, no double observation)'
    head = store.get_record('resource:r1')
    assert head is not None and head.cursors == {'left': steps, 'right': steps}
    assert store.list_pending_threads('r1') == []


def test_dynalite_is_not_aws(store):
    """Guard: the fixture really talks to dynalite on loopback, never to an AWS endpoint."""
    endpoint = store.ddb.meta.endpoint_url
    assert endpoint.startswith('http://127.0.0.1:')
    assert os.environ['AWS_ENDPOINT_URL_S3'].startswith('http://127.0.0.1')


def test_concurrent_retries_of_one_chat_message_call_the_actor_once_and_store_one_reply(store):
    """20 requests for one user message (a client retrying, several tabs): one Actor call, one reply, every request
    gets that reply."""
    from om_lib.clock import SystemClock
    from om_lib.config import OMConfig
    from om_lib.context.tokens import TokenCounter
    from om_lib.engine.engine import MemoryEngine
    from om_lib.models.model_router import ModelRouter
    from om_lib.service import MemoryService
    from tests.fakes.scripted_model import ScriptedModel
    from tests.unit.test_api_chat import WordTokenizer

    model = ScriptedModel()
    calls = threading.Semaphore(0)

    def slow_actor(_: object) -> str:
        calls.release()
        threading.Event().wait(0.5)  # long enough for every duplicate to arrive while the first one answers
        return 'The only reply.'

    model.script('actor', slow_actor, 'A second reply (must never be asked for).')
    clock = SystemClock()
    engine = MemoryEngine(
        OMConfig.model_validate({'model': 'default', 'observation': {'messageTokens': 10_000, 'bufferTokens': False}}),
        store=store,
        router=ModelRouter({'google': model}, clock=clock),
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
    )
    service = MemoryService(engine)
    results = run_all(20, lambda _: service.chat('r1', 't1', msg('u1', 'Hello there')), list(range(20)))
    replies = {r.reply.id for r in results if r.reply is not None}
    assert len(replies) == 1 and all(r.reply is not None and r.reply.text() == 'The only reply.' for r in results)
    assert len(model.calls_for('actor')) == 1
    assert sum(not r.replayed for r in results) == 1
    stored = store.list_messages('r1', 't1').messages
    assert [(m.id, m.role) for m in stored] == [('u1', 'user'), (replies.pop(), 'assistant')]
