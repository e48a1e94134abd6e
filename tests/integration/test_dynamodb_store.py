"""DynamoMemoryStore under moto (in-process, single-threaded): the store conformance suite plus what only a real
table and bucket can show — item-size limits, S3 offload, pagination, erase leaving nothing behind, lease takeover.

Races are not tested here: moto is not atomic per item under threads (see tests/integration/test_dynamodb_races.py,
which runs them against dynalite).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from om_lib.adapters.aws.dynamodb.items import thread_pk as _thread_pk
from om_lib.adapters.aws.dynamodb.schema import create_table, ensure_table
from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore
from om_lib.adapters.aws.s3 import S3BlobReader
from om_lib.clock import ManualClock
from om_lib.errors import ErasedError, InvalidInputError, MessageConflictError, VersionConflictError
from om_lib.messages import Message
from om_lib.records import BufferedChunk, Lease, OMRecord
from tests.store_conformance import (
    AttentionConformance,
    ScopedThreadIdsConformance,
    StoreConformance,
    WorkingMemoryConformance,
)

TABLE = 'om-memory'
BUCKET = 'om-memory-blobs'


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_SESSION_TOKEN': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
    }.items():
        monkeypatch.setenv(name, value)
    for name in ('AWS_ENDPOINT_URL', 'AWS_ENDPOINT_URL_DYNAMODB', 'AWS_ENDPOINT_URL_S3', 'AWS_PROFILE'):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def aws(aws_env):
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        ddb = boto3.client('dynamodb', region_name='us-east-1')
        s3 = boto3.client('s3', region_name='us-east-1')
        create_table(ddb, TABLE)
        s3.create_bucket(Bucket=BUCKET)
        yield ddb, s3


@pytest.fixture
def clock():
    return ManualClock(datetime(2025, 3, 1, 12, 0, tzinfo=UTC))


@pytest.fixture
def store(aws, clock):
    ddb, s3 = aws
    return DynamoMemoryStore(TABLE, BUCKET, dynamodb_client=ddb, s3_client=s3, clock=clock)


class TestDynamoStoreConformance(
    StoreConformance, ScopedThreadIdsConformance, AttentionConformance, WorkingMemoryConformance
):
    """The shared suite, unchanged, against DynamoDB + S3 (moto)."""


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------
KB = 1024
SIZES = {'399KB': 399 * KB, '401KB': 401 * KB, '5MB': 5 * KB * KB}
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def scan(ddb) -> list[dict]:
    items, start = [], None
    while True:
        kwargs = {'TableName': TABLE, **({'ExclusiveStartKey': start} if start else {})}
        page = ddb.scan(**kwargs)
        items += page['Items']
        start = page.get('LastEvaluatedKey')
        if not start:
            return items


def bucket_keys(s3) -> list[str]:
    return [
        o['Key']
        for page in s3.get_paginator('list_objects_v2').paginate(Bucket=BUCKET)
        for o in page.get('Contents', [])
    ]


def item_bytes(item: dict) -> int:
    """Approximate DynamoDB item size (names + values), enough to check the 400 KB limit."""
    total = 0
    for name, value in item.items():
        total += len(name.encode())
        kind, raw = next(iter(value.items()))
        total += len(raw.encode()) if isinstance(raw, str) else 1
    return total


def message(mid: str, text: str = 'hello', **extra) -> Message:
    return Message.model_validate({'id': mid, 'role': 'user', 'createdAt': T0.isoformat(), 'content': text, **extra})


def thread_record(**update) -> OMRecord:
    base = OMRecord(
        id='rec-1', key='thread:r1/t1', scope='thread', resource_id='r1', thread_id='t1', created_at=T0, updated_at=T0
    )
    return base.model_copy(update=update)


def chunk(text: str) -> BufferedChunk:
    return BufferedChunk(
        id='c1',
        cycle_id='cy1',
        thread_id='t1',
        observations=text,
        token_count=10,
        message_ids=('a', 'b'),
        message_tokens=20,
        start_seq=1,
        end_seq=2,
        last_observed_at=T0,
        created_at=T0,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Size limits: every kind of stored value round-trips at 399 KB, 401 KB and 5 MB
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('size', SIZES.values(), ids=SIZES.keys())
def test_large_message_round_trips_through_s3(store, aws, size):
    ddb, s3 = aws
    text = 'é' * (size // 2)  # multi-byte on purpose: limits are bytes, not characters
    stored = store.append_messages('r1', 't1', [message('big', text), message('small')], now=T0)
    assert stored.created_ids == ('big', 'small')
    got = store.list_messages('r1', 't1').messages
    assert [m.id for m in got] == ['big', 'small'] and got[0].text() == text
    assert all(item_bytes(i) < 300 * KB for i in scan(ddb))
    assert any('/threads/t1/msg/' in k for k in bucket_keys(s3))
    # A retry of the same large message is one message (content-addressed object, same hash).
    again = store.append_messages('r1', 't1', [message('big', text)], now=T0)
    assert again.created_ids == () and len(store.list_messages('r1', 't1').messages) == 2


@pytest.mark.parametrize('size', SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize('field', ['active_observations', 'buffered_chunks', 'buffered_reflection'])
def test_large_record_values_round_trip_through_s3(store, aws, size, field):
    ddb, s3 = aws
    text = 'observation line 🔴\n' * (size // 22 + 1)
    value = (chunk(text),) if field == 'buffered_chunks' else text
    created = store.put_record(thread_record(**{field: value}), expected_version=None)
    assert store.get_record('thread:r1/t1') == created
    updated = store.put_record(created.model_copy(update={'observation_tokens': 5}), expected_version=created.version)
    assert store.get_record('thread:r1/t1') == updated
    new_gen = updated.model_copy(update={'id': 'rec-2', 'generation': 1, 'origin': 'reflection'})
    store.put_generation(new_gen, expected_version=updated.version)
    history = store.list_generations('thread:r1/t1')
    assert [r.generation for r in history] == [1, 0] and getattr(history[1], field) == value
    assert all(item_bytes(i) < 20 * KB for i in scan(ddb))  # the hot META item stays small


@pytest.mark.parametrize('size', SIZES.values(), ids=SIZES.keys())
def test_large_thread_metadata_round_trips_through_s3(store, aws, size):
    ddb, _ = aws
    thread = store.append_messages('r1', 't1', [message('a')], now=T0).thread
    meta = {'workingMemory': 'x' * size}
    store.update_thread(thread.model_copy(update={'metadata': meta, 'current_task': 'task'}))
    got = store.get_thread('r1', 't1')
    assert got.metadata == meta and got.current_task == 'task'
    # The next append returns the thread with its metadata too.
    assert store.append_messages('r1', 't1', [message('b')], now=T0).thread.metadata == meta
    assert all(item_bytes(i) < 20 * KB for i in scan(ddb))


def test_lease_changes_do_not_rewrite_the_offloaded_document(store, aws):
    _, s3 = aws
    head = store.put_record(thread_record(active_observations='x' * (50 * KB)), expected_version=None)
    keys = bucket_keys(s3)
    assert len(keys) == 1
    lease = Lease(owner='w1', expires_at=T0 + timedelta(minutes=2))
    leased = store.put_record(head.model_copy(update={'observing': lease}), expected_version=head.version)
    assert bucket_keys(s3) == keys  # same large fields: same object, no upload
    committed = store.put_record(
        leased.model_copy(update={'active_observations': 'y' * (50 * KB), 'observing': None}),
        expected_version=leased.version,
    )
    assert len(bucket_keys(s3)) == 1 and bucket_keys(s3) != keys  # the replaced document is deleted
    assert store.get_record('thread:r1/t1') == committed


def test_rewritten_and_dropped_generations_leave_no_document_behind(store, aws):
    _, s3 = aws
    head = store.put_record(thread_record(active_observations='x' * (50 * KB)), expected_version=None)
    for n in (1, 2):
        new = head.model_copy(update={'id': f'rec-{n}', 'generation': n, 'active_observations': f'{n}' * (50 * KB)})
        head = store.put_generation(new, expected_version=head.version)
    assert len(bucket_keys(s3)) == 3  # one document per generation
    first = store.list_generations('thread:r1/t1', before=1)[0]
    store.rewrite_generation(first.model_copy(update={'active_observations': 'c' * (50 * KB)}))
    assert len(bucket_keys(s3)) == 3  # the rewritten generation's old document is gone
    assert store.list_generations('thread:r1/t1', before=1)[0].active_observations == 'c' * (50 * KB)
    store.delete_generations('thread:r1/t1', [0, 1])
    assert len(bucket_keys(s3)) == 1  # only the head's
    assert [r.generation for r in store.list_generations('thread:r1/t1')] == [2]


def test_losing_writer_leaves_no_object(store, aws):
    _, s3 = aws
    head = store.put_record(thread_record(active_observations='x' * (50 * KB)), expected_version=None)
    store.put_record(head.model_copy(update={'observation_tokens': 1}), expected_version=head.version)
    before = bucket_keys(s3)
    with pytest.raises(VersionConflictError):
        store.put_record(
            head.model_copy(update={'active_observations': 'z' * (60 * KB)}), expected_version=head.version
        )
    assert bucket_keys(s3) == before


# ---------------------------------------------------------------------------------------------------------------------
# Messages: pagination, sequence holes, attachments
# ---------------------------------------------------------------------------------------------------------------------
def test_cursor_pagination_reads_only_after_the_cursor(store):
    ids = [f'm{i:03d}' for i in range(250)]
    for start in range(0, 250, 50):
        store.append_messages('r1', 't1', [message(i, f'text {i}') for i in ids[start : start + 50]], now=T0)
    seen, cursor = [], 120
    while True:
        page = store.list_messages('r1', 't1', after_seq=cursor, limit=40)
        seen += [m.id for m in page.messages]
        if not page.has_more:
            break
        cursor = page.messages[-1].seq
    assert seen == ids[120:]
    newest = store.list_messages('r1', 't1', limit=3, newest_first=True)
    assert [m.id for m in newest.messages] == ['m249', 'm248', 'm247'] and newest.has_more


def test_pages_cut_by_the_1mb_query_limit_are_followed(store):
    # 15 × 100 KB stay inline (under the 300 KB offload threshold): one Query page holds at most ~9 of them.
    store.append_messages('r1', 't1', [message(f'm{i:02d}', 'x' * (100 * KB)) for i in range(15)], now=T0)
    page = store.list_messages('r1', 't1', limit=100)
    assert len(page.messages) == 15 and not page.has_more
    first = store.list_messages('r1', 't1', limit=12)
    assert len(first.messages) == 12 and first.has_more


def test_a_retried_message_leaves_no_hole(store, clock):
    store.append_messages('r1', 't1', [message('a')], now=T0)
    assert store.append_messages('r1', 't1', [message('a')], now=T0).created_ids == ()  # burns a seq
    store.append_messages('r1', 't1', [message('b')], now=T0)
    # Read at once (no grace period passed): the burned seq holds a placeholder, so nothing waits.
    assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a', 'b']


def test_a_seq_allocated_but_not_written_holds_readers_back_until_the_grace_period(store, clock):
    store.append_messages('r1', 't1', [message('a')], now=T0)
    # A writer reserves seq 2, then crashes (or is still uploading) before writing its message.
    store._allocate(_thread_pk('r1', 't1'), 'r1', 't1', 1, T0)
    store.append_messages('r1', 't1', [message('c')], now=T0)
    page = store.list_messages('r1', 't1', after_seq=1)
    assert page.messages == () and not page.has_more  # a cursor must not move past seq 2
    assert [m.id for m in store.list_messages('r1', 't1').messages] == ['a']
    assert [m.id for m in store.list_messages('r1', 't1', newest_first=True).messages] == ['c', 'a']
    clock.advance(store.gap_grace + timedelta(seconds=1))
    assert [m.id for m in store.list_messages('r1', 't1', after_seq=1).messages] == ['c']


def test_a_conflict_in_a_batch_writes_nothing(store, aws):
    ddb, _ = aws
    store.append_messages('r1', 't1', [message('a', 'x')], now=T0)
    before = scan(ddb)
    with pytest.raises(MessageConflictError):
        store.append_messages('r1', 't1', [message('n1'), message('a', 'changed'), message('n2')], now=T0)
    assert scan(ddb) == before


def test_inline_attachment_data_moves_to_s3(store, aws):
    _, s3 = aws
    png = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 40
    part = {'type': 'image', 'mediaType': 'image/png', 'data': base64.b64encode(png).decode(), 'filename': 'a.png'}
    sent = Message.model_validate({'id': 'img', 'role': 'user', 'createdAt': T0.isoformat(), 'parts': [part]})
    stored = store.append_messages('r1', 't1', [sent], now=T0).messages[0]
    image = stored.parts[0]
    assert image.data is None and image.size == len(png)
    assert image.url.startswith(f's3://{BUCKET}/r1/threads/t1/att/')
    assert store.list_messages('r1', 't1').messages[0].parts == stored.parts
    # A retry of the same request (same base64) is the same message.
    assert store.append_messages('r1', 't1', [sent], now=T0).created_ids == ()
    reader = S3BlobReader(BUCKET, s3_client=s3)
    assert reader.read(image.url, max_bytes=10**6) == png
    assert reader.read(image.url, max_bytes=10**6, resource_id='r1') == png
    assert reader.read(image.url, max_bytes=10**6, resource_id='r2') is None  # another resource's object
    assert reader.scoped('r2').read(image.url, max_bytes=10**6) is None
    assert reader.read(image.url, max_bytes=100) is None  # too large
    assert reader.read(image.url.replace(BUCKET, 'other-bucket'), max_bytes=10**6) is None
    assert reader.read(f's3://{BUCKET}/r1/threads/t1/att/missing', max_bytes=10**6) is None
    head = s3.head_object(Bucket=BUCKET, Key=image.url.split(f'{BUCKET}/', 1)[1])
    assert head['ServerSideEncryption'] == 'AES256' and head['ContentType'] == 'image/png'


def test_invalid_base64_is_refused_before_anything_is_written(store, aws):
    ddb, s3 = aws
    part = {'type': 'file', 'mediaType': 'application/pdf', 'data': 'not base64!!'}
    # The message model refuses it first (so the API answers 422 before the store is touched) ...
    with pytest.raises(ValueError, match='base64'):
        Message.model_validate({'id': 'f', 'role': 'user', 'createdAt': T0.isoformat(), 'parts': [part]})
    # ... and the store refuses it too, should an unvalidated message ever reach it.
    from om_lib.messages import FilePart

    bad_part = FilePart.model_construct(type='file', media_type='application/pdf', data='not base64!!')
    bad = Message.model_construct(id='f', role='user', created_at=T0, parts=(bad_part,))
    with pytest.raises(InvalidInputError):
        store.append_messages('r1', 't1', [bad], now=T0)
    assert bucket_keys(s3) == []
    assert store.list_messages('r1', 't1').messages == ()


# ---------------------------------------------------------------------------------------------------------------------
# Erase leaves nothing behind — also when a worker finishes after the erase
# ---------------------------------------------------------------------------------------------------------------------
def _fill(store) -> OMRecord:
    png = base64.b64encode(b'img' * 1000).decode()
    store.append_messages('r1', 't1', [message('a'), message('big', 'b' * (400 * KB))], now=T0)
    store.append_messages(
        'r1',
        't1',
        [
            Message.model_validate(
                {
                    'id': 'img',
                    'role': 'user',
                    'createdAt': T0.isoformat(),
                    'parts': [{'type': 'image', 'mediaType': 'image/png', 'data': png}],
                }
            )
        ],
        now=T0,
    )
    store.append_messages('r1', 't1', [message('a')], now=T0)  # a placeholder item
    thread = store.get_thread('r1', 't1')
    store.update_thread(thread.model_copy(update={'metadata': {'wm': 'w' * (20 * KB)}, 'title': 'T'}))
    head = store.put_record(thread_record(active_observations='o' * (30 * KB)), expected_version=None)
    head = store.put_generation(
        head.model_copy(update={'id': 'rec-2', 'generation': 1, 'active_observations': 'p' * (30 * KB)}),
        expected_version=head.version,
    )
    res = OMRecord(
        id='res',
        key='resource:r1',
        scope='resource',
        resource_id='r1',
        thread_id=None,
        created_at=T0,
        updated_at=T0,
        active_observations='r' * (30 * KB),
    )
    res_head = store.put_record(res, expected_version=None)
    store.put_generation(
        res_head.model_copy(update={'id': 'res-2', 'generation': 1}), expected_version=res_head.version
    )
    store.append_messages('r1', 't2', [message('other thread')], now=T0)
    return head


def _only_tombstones(ddb) -> None:
    for item in scan(ddb):
        assert 'erased_at' in item, item
        assert set(item) <= {'PK', 'SK', 'erased_at', 'expires_at', 'inc'}, item


def test_delete_resource_leaves_only_tombstones_even_after_late_work(store, aws):
    ddb, s3 = aws
    store.append_messages('r2', 'keep', [message('k')], now=T0)
    head = _fill(store)
    assert len(bucket_keys(s3)) >= 5
    store.delete_resource('r1')
    # A worker that started before the erase finishes now: every write is refused and leaves nothing.
    late = head.model_copy(update={'active_observations': 'late ' * (20 * KB)})
    with pytest.raises(ErasedError):
        store.put_record(late, expected_version=head.version)
    with pytest.raises(ErasedError):
        store.put_generation(late.model_copy(update={'id': 'rec-3', 'generation': 2}), expected_version=head.version)
    res = store_res = OMRecord(
        id='x',
        key='resource:r1',
        scope='resource',
        resource_id='r1',
        thread_id=None,
        created_at=T0,
        updated_at=T0,
        active_observations='q' * (30 * KB),
    )
    with pytest.raises(ErasedError):
        store.put_record(store_res, expected_version=None)
    with pytest.raises(ErasedError):
        store.put_record(res, expected_version=2)
    assert [k for k in bucket_keys(s3) if not k.startswith('r2/')] == []
    items = scan(ddb)
    kept = [i for i in items if i['PK']['S'] == 'THREAD#r2#keep' or i['PK']['S'] == 'RESOURCE#r2']
    assert kept
    for item in items:
        if item not in kept:
            assert 'erased_at' in item and set(item) <= {'PK', 'SK', 'erased_at', 'expires_at', 'inc'}, item
    assert store.list_messages('r2', 'keep').messages[0].id == 'k'


def test_delete_thread_leaves_only_a_tombstone_even_after_late_work(store, aws):
    ddb, s3 = aws
    head = _fill(store)
    store.delete_resource('r1')  # start from a clean slate for the scan, then erase one thread
    store.append_messages('r1', 't1', [message('a'), message('big', 'b' * (400 * KB))], now=T0)
    head = store.put_record(thread_record(id='again', active_observations='o' * (30 * KB)), expected_version=None)
    store.delete_thread('r1', 't1')
    with pytest.raises(ErasedError):
        store.put_record(
            head.model_copy(update={'active_observations': 'z' * (40 * KB)}), expected_version=head.version
        )
    with pytest.raises(ErasedError):
        store.put_generation(head.model_copy(update={'id': 'g', 'generation': 1}), expected_version=head.version)
    _only_tombstones(ddb)
    assert bucket_keys(s3) == []


def test_a_message_write_in_flight_during_an_erase_is_not_resurrected(store, aws):
    """A writer that reserved its seq before the erase and writes after it: the next incarnation never shows it."""
    ddb, _ = aws
    store.append_messages('r1', 't1', [message('a')], now=T0)
    old = store._allocate(_thread_pk('r1', 't1'), 'r1', 't1', 1, T0)
    stale_item = store._message_item(
        _thread_pk('r1', 't1'), 'r1/threads/t1/', message('ghost'), 'h', 'r1', int(old['next_seq']['N']) + 1, 1
    )
    store.delete_thread('r1', 't1')
    ddb.put_item(TableName=TABLE, Item=stale_item)  # the in-flight write lands after the erase
    store.append_messages('r1', 't1', [message('new')], now=T0)
    assert [m.id for m in store.list_messages('r1', 't1').messages] == ['new']
    assert not [i for i in scan(ddb) if i['SK']['S'] == 'MSG#ghost']  # swept when the thread started over


# ---------------------------------------------------------------------------------------------------------------------
# Leases: an expired lease is taken over, and the stale holder's late write is refused
# ---------------------------------------------------------------------------------------------------------------------
def test_expired_lease_is_taken_over_and_the_stale_holder_cannot_write(store, clock):
    head = store.put_record(thread_record(), expected_version=None)
    ttl = timedelta(minutes=2)
    # Worker A takes the observing lease, then stalls (a crashed or frozen Lambda).
    a = store.put_record(
        head.model_copy(update={'observing': Lease(owner='A', expires_at=clock.now() + ttl)}),
        expected_version=head.version,
    )
    current = store.get_record('thread:r1/t1')
    assert current.observing.active(clock.now())  # B must wait while A's lease runs
    clock.advance(ttl + timedelta(seconds=1))
    current = store.get_record('thread:r1/t1')
    assert not current.observing.active(clock.now())
    b = store.put_record(
        current.model_copy(update={'observing': Lease(owner='B', expires_at=clock.now() + ttl)}),
        expected_version=current.version,
    )
    # A wakes up and commits its observation against the version it leased: refused.
    with pytest.raises(VersionConflictError):
        store.put_record(
            a.model_copy(update={'active_observations': 'stale', 'observing': None}), expected_version=a.version
        )
    # Re-reading shows the lease is no longer A's, so A drops its work (the engine's `apply` returns None).
    assert store.get_record('thread:r1/t1').observing.owner == 'B'
    done = store.put_record(
        b.model_copy(update={'active_observations': 'fresh', 'observing': None}), expected_version=b.version
    )
    assert store.get_record('thread:r1/t1') == done and done.active_observations == 'fresh'


def test_append_returns_the_head_in_the_same_call(store, aws):
    ddb, _ = aws
    created = store.put_record(thread_record(active_observations='o' * (20 * KB)), expected_version=None)
    store.append_messages('r1', 't1', [message('a')], now=T0)
    calls: list[str] = []
    ddb.meta.events.register('before-call.dynamodb.*', lambda model, **_: calls.append(model.name))
    result = store.append_messages('r1', 't1', [message('b')], now=T0, include_record=True)
    assert result.record == created
    assert calls == ['UpdateItem', 'PutItem']


def test_ensure_table_creates_the_table_once(aws):
    ddb, _ = aws
    assert ensure_table(ddb, 'another-table') is True
    assert ensure_table(ddb, 'another-table') is False
    described = ddb.describe_table(TableName='another-table')['Table']
    assert {i['IndexName'] for i in described['LocalSecondaryIndexes']} == {'LSI1'}
    assert {i['IndexName'] for i in described['GlobalSecondaryIndexes']} == {'GSI1', 'GSI2', 'GSI3'}
