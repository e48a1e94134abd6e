"""`DynamoMemoryStore`: the production `MemoryStore`, one DynamoDB table plus one S3 bucket.

Items (docs/storage.md has the whole design and the reasons):

    PK = THREAD#<resource_id>#<thread_id>   (thread ids are scoped to their resource)
      SK = META                 thread (owner, times, title/metadata/hints), `next_seq`, incarnation `inc`, and the
                                thread-scope OM head (`om_*`, optimistic lock `om_version`); GSI1 keys
      SK = MSG#<message_id>     one immutable message; `seq` (LSI1 sort key), content hash, write time
      SK = GAP#<inc>#<seq>      placeholder for a sequence number that was allocated but will never hold a message
      SK = OMGEN#<generation>   a retired generation of the thread-scope record (history)
    PK = RESOURCE#<resource_id>
      SK = META                 the resource-scope OM head (`om_*`), or the resource's tombstone
      SK = OMGEN#<generation>   retired generations of the resource-scope record

Hot path (a steady-state step, thread scope): one UpdateItem on META allocates sequence numbers, checks ownership and
returns the thread and the OM head (ReturnValues=ALL_OLD); one conditional PutItem per new message; one strongly
consistent Query on LSI1 for the messages after the record's cursor. Everything is a single-item conditional write,
which is what DynamoDB (and dynalite, the race-test backend) make atomic.

Large values (a message's parts, the OM head's observations/chunks, thread metadata) move to S3 behind a pointer
above a size threshold; inline base64 attachment data is uploaded on append and replaced by an `s3://` URL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, unquote

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.batch import batch_get, batch_write
from om_lib.adapters.aws.errors import aws_errors, error_code
from om_lib.adapters.aws.s3 import S3Blobs, resource_prefix, thread_prefix
from om_lib.clock import SystemClock
from om_lib.errors import (
    ErasedError,
    InvalidInputError,
    MessageConflictError,
    StorageError,
    ThreadExistsError,
    ThreadNotFoundError,
    VersionConflictError,
)
from om_lib.messages import FilePart, ImagePart, Message
from om_lib.ports import AppendResult, AttentionItem, Clock, MessagePage, PendingThread, ThreadPage
from om_lib.records import FailureNote, OMRecord, Thread, WorkingMemoryRecord

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client

logger = logging.getLogger(__name__)

Item = dict[str, Any]

THREAD = 'THREAD#'
META = 'META'
MSG = 'MSG#'
GAP = 'GAP#'
OMGEN = 'OMGEN#'
FAIL = 'FAIL#'  # a kept failure (recentFailures), in the thread's or the resource's partition
FAILURE_TTL = timedelta(days=30)
WM = 'WM'  # working memory: in the thread partition (thread scope) or the resource partition (resource scope)
TURN = 'TURN#'  # a claim on answering a user message (chat), in the thread's partition, with a TTL
TURN_CLAIM_TTL = timedelta(days=1)  # past its lease a claim is dead; TTL removes what a crash left behind

# OM record fields that can grow without bound. They travel together as one JSON document (`om_big`), inline while
# small and in S3 above `inline_head_max_bytes`; everything else (`om_small`) is a few hundred bytes. Lease changes
# touch only `om_small`, so taking or releasing a lease never rewrites the S3 document. The parts background work
# keeps for the next step (a worker's observation text among them) grow too; a record written before they moved here
# has them in `om_small`, which still reads back (the big document wins only for the fields it holds).
_BIG_FIELDS = (
    'active_observations',
    'groups',
    'archived',
    'buffered_chunks',
    'buffered_reflection',
    'cursors',
    'background_parts',
)
_OM_OPTIONAL_FIELDS = frozenset(
    name for name, field in OMRecord.model_fields.items() if not field.is_required() and field.default in (None, ())
)
_OM_ATTRS = ('om_key', 'om_id', 'om_version', 'om_generation', 'om_small', 'om_big', 'om_big_ref')
_THREAD_ATTRS = ('thread_doc', 'thread_doc_ref')
_MAX_READ_ATTEMPTS = 3
_LIVE_THREAD_OF_R = 'resource_id = :r AND attribute_exists(created_at) AND attribute_not_exists(erased_at)'
_BATCH_WRITE = 25
_BATCH_GET = 100
# Printable ASCII but `#` and `%` stays as it is in keys (readable in the console); the rest is percent-encoded.
_KEY_SAFE = ''.join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '#%')


# ---------------------------------------------------------------------------------------------------------------------
# Attribute values (low-level client: numbers travel as strings, so no Decimal anywhere)
# ---------------------------------------------------------------------------------------------------------------------
def _attention_pk(thread_pk: str) -> str:
    shard = zlib.crc32(thread_pk.encode()) % schema.ATTENTION_SHARDS
    return f'ATTN#{shard}'


def _s(value: str) -> dict[str, str]:
    return {'S': value}


def _n(value: int) -> dict[str, str]:
    return {'N': str(value)}


def _str(item: Item, name: str) -> str | None:
    value = item.get(name)
    return value['S'] if value is not None and 'S' in value else None


def _int(item: Item, name: str, default: int = 0) -> int:
    value = item.get(name)
    return int(value['N']) if value is not None and 'N' in value else default


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(',', ':'), ensure_ascii=False, sort_keys=True)


def _is_conditional_failure(exc: ClientError) -> bool:
    return error_code(exc) == 'ConditionalCheckFailedException'


@dataclass(frozen=True)
class _Big:
    """The OM head's large fields as stored: inline JSON, or the S3 key of that JSON."""

    inline: str | None
    key: str | None
    uploaded: str | None  # the key this write uploaded (deleted again when the write loses)
    digest: str


@dataclass(frozen=True)
class _Target:
    """Where a record key's head lives."""

    pk: str
    resource_id: str
    thread_id: str | None
    prefix: str  # S3 prefix of the key's offloaded documents


class DynamoMemoryStore:
    """The `MemoryStore` on DynamoDB (one table) and S3 (one bucket).

    Args:
        table_name: The memory table (schema in `dynamodb_schema`).
        bucket_name: The bucket for offloaded values and attachments.
        dynamodb_client: A low-level DynamoDB client; created on first use when omitted (honours `AWS_ENDPOINT_URL`).
        s3_client: A low-level S3 client; created on first use when omitted.
        offload_threshold_bytes: Messages whose stored form (parts JSON) is larger move to S3. DynamoDB items stop at
            400 KB including attribute names and keys; 300 KB leaves room for those.
        inline_head_max_bytes: The OM head's large fields and the thread's metadata document move to S3 above this.
            Lower than `offload_threshold_bytes` on purpose: the META item is rewritten by every append, and a write
            costs one unit per KB of the larger of the old and new item.
        gap_grace: How long a list waits for an allocated-but-unwritten sequence number before reading past it
            (a crashed writer must not stop a thread forever).
        clock: Wall clock for write times, the gap grace and tombstone expiry (inject a ManualClock in tests).
        sse: Server-side encryption for S3 objects (`AES256` or `aws:kms`).
        kms_key_id: KMS key for `aws:kms`.
        tombstone_ttl: How long an erased thread's or resource's tombstone is kept (late background work is minutes).
    """

    def __init__(
        self,
        table_name: str,
        bucket_name: str,
        *,
        dynamodb_client: DynamoDBClient | None = None,
        s3_client: S3Client | None = None,
        offload_threshold_bytes: int = 300 * 1024,
        inline_head_max_bytes: int = 8 * 1024,
        gap_grace: timedelta = timedelta(seconds=60),
        clock: Clock | None = None,
        sse: str = 'AES256',
        kms_key_id: str | None = None,
        tombstone_ttl: timedelta = timedelta(days=30),
    ) -> None:
        self.table_name = table_name
        self.blobs = S3Blobs(bucket_name, s3_client=s3_client, sse=sse, kms_key_id=kms_key_id)
        self._ddb = dynamodb_client
        self._lock = threading.Lock()
        self.offload_threshold_bytes = offload_threshold_bytes
        self.inline_head_max_bytes = inline_head_max_bytes
        self.gap_grace = gap_grace
        self.clock: Clock = clock or SystemClock()
        self.tombstone_ttl = tombstone_ttl
        # (record key, version) -> (sha256 of om_big, its S3 key): lets a lease-only write reuse the stored document.
        self._big_refs: dict[tuple[str, int], tuple[str, str]] = {}

    @property
    def ddb(self) -> DynamoDBClient:
        """The DynamoDB client (created lazily, then kept for warm invocations)."""
        if self._ddb is None:
            with self._lock:
                if self._ddb is None:
                    import boto3

                    self._ddb = boto3.client('dynamodb')
        return self._ddb

    # =================================================================================================================
    # Threads and messages
    # =================================================================================================================
    def append_messages(
        self,
        resource_id: str,
        thread_id: str,
        messages: Sequence[Message],
        *,
        now: datetime,
        include_record: bool = False,
        mark_pending: bool = False,
    ) -> AppendResult:
        """See `MemoryStore.append_messages`.

        One UpdateItem on the thread item allocates `seq` numbers (and checks ownership); then one conditional
        PutItem per new message. A batch of several messages (or one with inline attachment data) is checked against
        the stored ids first, so a conflict in it writes nothing.
        """
        unique = _dedupe(messages)
        hashes = {m.id: m.content_hash() for m in unique}
        pk = _thread_pk(resource_id, thread_id)
        reusable: dict[str, Item] = {}
        if len(unique) > 1 or any(_has_inline_data(m) for m in unique):
            # Check the whole batch before writing any of it, so a conflict anywhere writes nothing.
            meta, known = self._precheck(pk, [m.id for m in unique])
            if meta is not None and _str(meta, 'resource_id') not in (None, resource_id):
                raise ThreadNotFoundError(thread_id)
            current_inc = _int(meta or {}, 'inc', 1)
            for message_id, stored in known.items():
                if _int(stored, 'inc', 1) != current_inc:
                    continue  # left by an erased incarnation: not a stored message of this thread
                if _str(stored, 'hash') != hashes[message_id]:
                    raise MessageConflictError(message_id)
                reusable[message_id] = stored
        count = len(unique) - len(reusable)
        old = self._allocate(pk, resource_id, thread_id, count, now, mark_pending=mark_pending)
        inc = _int(old, 'inc', 1) if old else 1
        first_seq = _int(old, 'next_seq') + 1 if old else 1
        created_thread = not old or 'created_at' not in old or 'erased_at' in old
        if old and 'erased_at' in old:
            # A new incarnation of an erased thread: clear anything late work of the old one left behind.
            self._sweep_thread(pk, below_inc=inc)
        if created_thread:
            self._clear_resource_tombstone(resource_id)
        prefix = thread_prefix(resource_id, thread_id)
        stored_messages: list[Message] = []
        created: list[str] = []
        written: list[tuple[str, int]] = []
        unfilled: list[int] = []  # allocated seqs that will never hold a message
        seq = first_seq
        try:
            for message in unique:
                existing = reusable.get(message.id)
                if existing is not None:
                    stored_messages.append(self._message_from_item(existing, resource_id, thread_id))
                    continue
                item = self._message_item(pk, prefix, message, hashes[message.id], resource_id, seq, inc)
                result = self._put_message(pk, item, message.id, hashes[message.id], inc)
                if result is None:
                    stored_messages.append(self._message_from_item(item, resource_id, thread_id))
                    created.append(message.id)
                    written.append((message.id, seq))
                else:
                    stored_messages.append(self._message_from_item(result, resource_id, thread_id))
                    unfilled.append(seq)  # the same message was stored already
                seq += 1
        except Exception as exc:
            if isinstance(exc, MessageConflictError):
                # Lost a race with a writer that stored one of these ids with other content after our check: take
                # back what this call wrote, so a refused request leaves no message (their seqs become placeholders).
                for message_id, written_seq in written:
                    self._retract(pk, message_id, written_seq, inc, resource_id)
            self._release(pk, old, count, inc, resource_id, [*unfilled, *range(seq, first_seq + count)], written)
            raise
        if unfilled:
            self._release(pk, old, count, inc, resource_id, unfilled, written)
        # The thread as it is now: `updated_at` moved only if this call stored something (or created the thread).
        thread = self._thread_from_meta(
            old, resource_id, thread_id, now if created or created_thread else None, created=created_thread
        )
        by_id = {m.id: m for m in stored_messages}
        ordered = tuple(by_id[m.id] for m in messages)
        record: OMRecord | None = None
        if include_record:
            key = f'thread:{resource_id}/{thread_id}'
            record = self._record_from_item(old, key) if old else None
            if record is None and old and 'om_version' in old and _str(old, 'om_key') == key:
                record = self.get_record(key)  # its S3 document was replaced since: read the head again
        return AppendResult(
            thread=thread,
            messages=ordered,
            created_ids=tuple(created),
            record=record,
            record_included=include_record,
        )

    def create_thread(
        self,
        resource_id: str,
        thread_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        now: datetime,
    ) -> Thread:
        """See `MemoryStore.create_thread`: one conditional UpdateItem on META (the id must not hold a live thread).

        A META that holds only a tombstone (an erased id) or an OM record of the same resource created before its
        thread may be claimed; anything else is ThreadExistsError.
        """
        pk = _thread_pk(resource_id, thread_id)
        thread = Thread(
            id=thread_id,
            resource_id=resource_id,
            title=title,
            metadata=dict(metadata or {}),
            created_at=now,
            updated_at=now,
        )
        doc_value, doc_key = self._offload_doc(_thread_doc(thread), thread_prefix(resource_id, thread_id) + 'meta/')
        now_iso = _iso(now)
        set_parts = [
            'resource_id = :r',
            'created_at = :now',
            'updated_at = :now',
            'inc = if_not_exists(inc, :one)',
            '#gpk = :gpk',
            '#gsk = :gsk',
            '#ref = :d' if doc_key else '#doc = :d',
        ]
        remove = ['erased_at', '#ttl', '#doc' if doc_key else '#ref']
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression=_update_expression(set_parts, remove),
                ConditionExpression=(
                    'attribute_not_exists(created_at) AND (attribute_not_exists(resource_id) OR resource_id = :r)'
                ),
                ExpressionAttributeNames={
                    '#gpk': schema.GSI1_PK,
                    '#gsk': schema.GSI1_SK,
                    '#ttl': schema.TTL_ATTRIBUTE,
                    '#doc': 'thread_doc',
                    '#ref': 'thread_doc_ref',
                },
                ExpressionAttributeValues={
                    ':r': _s(resource_id),
                    ':now': _s(now_iso),
                    ':one': _n(1),
                    ':gpk': _s(_gsi_pk(resource_id)),
                    ':gsk': _s(f'{now_iso}#{thread_id}'),
                    ':d': _s(doc_key or doc_value),
                },
                ReturnValues='ALL_OLD',
            )
        except ClientError as exc:
            if doc_key is not None:
                self.blobs.delete([doc_key])
            if _is_conditional_failure(exc):
                raise ThreadExistsError(thread_id) from exc
            with aws_errors():
                raise
        old = response.get('Attributes', {})
        if 'erased_at' in old:
            # A new incarnation of an erased thread: clear anything late work of the old one left behind.
            self._sweep_thread(pk, below_inc=_int(old, 'inc', 1))
        self._clear_resource_tombstone(resource_id)
        return thread

    def get_messages(self, resource_id: str, thread_id: str, ids: Sequence[str]) -> list[Message]:
        """See `MemoryStore.get_messages`: one BatchGetItem (META + the ids; 100 keys per call)."""
        unique = list(dict.fromkeys(ids))
        if not unique:
            return []
        meta, found = self._precheck(_thread_pk(resource_id, thread_id), unique)
        if not _is_live_thread(meta, resource_id):
            return []
        assert meta is not None
        inc = _int(meta, 'inc', 1)
        items = [i for i in found.values() if _is_message_of(i, resource_id) and _int(i, 'inc', 1) == inc]
        items.sort(key=lambda i: _int(i, schema.SEQ))
        return [self._message_from_item(i, resource_id, thread_id) for i in items]

    def delete_messages(self, resource_id: str, thread_id: str, message_ids: Sequence[str] | None) -> int:
        """See `MemoryStore.delete_messages`.

        GetItem META (ownership), then the messages: BatchGetItem by id, or (clearing) a Query of the `MSG#` items.
        Every deleted seq first gets a `GAP#` placeholder (BatchWriteItem), then the `MSG#` items are deleted
        (BatchWriteItem), so an ordered read never waits on a hole a deletion left. Offloaded bodies are deleted from
        S3 unless another message of the thread still points at the same (content-addressed) object.
        """
        pk = _thread_pk(resource_id, thread_id)
        meta = self._get(pk, META)
        if not _is_live_thread(meta, resource_id):
            raise ThreadNotFoundError(thread_id)
        assert meta is not None
        inc = _int(meta, 'inc', 1)
        if message_ids is None:
            items = list(self._query_messages_keys(pk))
        else:
            unique = list(dict.fromkeys(message_ids))
            if not unique:
                return 0
            items = list(self._batch_get([(pk, MSG + i) for i in unique], by='SK').values())
        items = [i for i in items if _is_message_of(i, resource_id) and _int(i, 'inc', 1) == inc]
        if not items:
            return 0
        now_ms = _ms(self.clock.now())
        gaps = {
            _int(i, schema.SEQ): {'PutRequest': {'Item': _gap_item(pk, inc, _int(i, schema.SEQ), resource_id, now_ms)}}
            for i in items
        }
        requests = list(gaps.values())
        for start in range(0, len(requests), _BATCH_WRITE):
            self._batch_write(requests[start : start + _BATCH_WRITE])
        self._delete_items([_key(pk, _str(i, schema.SK) or '') for i in items])
        refs = {ref for i in items if (ref := _str(i, 'body_ref'))}
        if refs and message_ids is not None:
            refs -= {ref for i in self._query_messages_keys(pk) if (ref := _str(i, 'body_ref'))}
        if refs:
            self.blobs.delete(sorted(refs))
        return len(items)

    def _query_messages_keys(self, pk: str) -> Iterator[Item]:
        """Every `MSG#` item of a thread partition, projected to what deletion needs."""
        return self._query_all(
            {
                'TableName': self.table_name,
                'KeyConditionExpression': '#pk = :pk AND begins_with(#sk, :m)',
                'ProjectionExpression': '#pk, #sk, #seq, inc, resource_id, body_ref',
                'ExpressionAttributeNames': {'#pk': schema.PK, '#sk': schema.SK, '#seq': schema.SEQ},
                'ExpressionAttributeValues': {':pk': _s(pk), ':m': _s(MSG)},
                'ConsistentRead': True,
            }
        )

    def get_thread(self, resource_id: str, thread_id: str) -> Thread | None:
        """See `MemoryStore.get_thread`."""
        item = self._get(_thread_pk(resource_id, thread_id), META)
        if not _is_live_thread(item, resource_id):
            return None
        assert item is not None
        return self._thread_from_meta(item, resource_id, thread_id, None, created=False)

    def update_thread(self, thread: Thread) -> Thread:
        """See `MemoryStore.update_thread`."""
        pk = _thread_pk(thread.resource_id, thread.id)
        doc_value, doc_key = self._offload_doc(
            _thread_doc(thread), thread_prefix(thread.resource_id, thread.id) + 'meta/'
        )
        names = {'#doc': 'thread_doc', '#ref': 'thread_doc_ref'}
        values: dict[str, Any] = {':r': _s(thread.resource_id), ':u': _s(_iso(thread.updated_at))}
        if doc_key is None:
            expr = 'SET #doc = :d, updated_at = :u REMOVE #ref'
            values[':d'] = _s(doc_value)
        else:
            expr = 'SET #ref = :d, updated_at = :u REMOVE #doc'
            values[':d'] = _s(doc_key)
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression=expr,
                ConditionExpression=_LIVE_THREAD_OF_R,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues='ALL_OLD',
            )
        except ClientError as exc:
            if doc_key is not None:
                self.blobs.delete([doc_key])
            if _is_conditional_failure(exc):
                raise ThreadNotFoundError(thread.id) from exc
            with aws_errors():
                raise
        old = response.get('Attributes', {})
        old_ref = _str(old, 'thread_doc_ref')
        if old_ref and old_ref != doc_key:
            self.blobs.delete([old_ref])  # last write wins: the replaced document is nobody's any more
        created_at = _str(old, 'created_at')
        return thread.model_copy(update={'created_at': datetime.fromisoformat(created_at)} if created_at else {})

    def list_messages(
        self,
        resource_id: str,
        thread_id: str,
        *,
        after_seq: int = 0,
        before_seq: int | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> MessagePage:
        """See `MemoryStore.list_messages`.

        One strongly consistent Query on LSI1 for `after_seq < seq < before_seq` (more only when a page is cut by
        the 1 MB limit or by placeholders). Oldest-first lists stop at a sequence number that was allocated but not
        written yet, unless the message after it was written more than `gap_grace` ago: a cursor that moves past a
        message still being written would never observe it.
        """
        if limit <= 0:
            return MessagePage(messages=(), has_more=False)
        pk = _thread_pk(resource_id, thread_id)
        low = after_seq + 1
        high = before_seq - 1 if before_seq is not None else None
        if high is not None and high < low:
            return MessagePage(messages=(), has_more=False)
        values: dict[str, Any] = {':pk': _s(pk), ':lo': _n(low)}
        condition = f'{schema.PK} = :pk AND #seq >= :lo'
        if high is not None:
            condition = f'{schema.PK} = :pk AND #seq BETWEEN :lo AND :hi'
            values[':hi'] = _n(high)
        raw: list[Item] = []
        start_key: Item | None = None
        exhausted = False
        while True:
            want = limit + 1 - sum(1 for i in raw if _is_message_of(i, resource_id))
            kwargs: dict[str, Any] = {
                'TableName': self.table_name,
                'IndexName': schema.SEQ_INDEX,
                'KeyConditionExpression': condition,
                'ExpressionAttributeNames': {'#seq': schema.SEQ},
                'ExpressionAttributeValues': values,
                'ScanIndexForward': not newest_first,
                'ConsistentRead': True,
                'Limit': want + 4,
            }
            if start_key:
                kwargs['ExclusiveStartKey'] = start_key
            with aws_errors():
                response = self.ddb.query(**kwargs)
            raw.extend(response.get('Items', []))
            start_key = response.get('LastEvaluatedKey')
            if not start_key:
                exhausted = True
                break
            if sum(1 for i in raw if _is_message_of(i, resource_id)) > limit:
                break
        items = _current_incarnation([i for i in raw if _str(i, 'resource_id') == resource_id])
        if not newest_first:
            # A seq can hold both a message and a placeholder (a retracted write); the message must be seen first.
            items.sort(key=lambda i: (_int(i, schema.SEQ), 0 if (_str(i, schema.SK) or '').startswith(MSG) else 1))
        if not items:
            return MessagePage(messages=(), has_more=False)
        visible: list[Item] = []
        stopped = False
        if newest_first:
            visible = [i for i in items if (_str(i, schema.SK) or '').startswith(MSG)]
        else:
            expected = low
            grace_ms = int(self.gap_grace.total_seconds() * 1000)
            now_ms = _ms(self.clock.now())
            for item in items:
                seq = _int(item, schema.SEQ)
                if seq < expected:
                    continue
                if seq > expected and now_ms - _int(item, 'written_at') < grace_ms:
                    stopped = True  # a message may still be on its way into the hole: read nothing past it
                    break
                expected = seq + 1
                if _str(item, schema.SK).startswith(MSG):  # type: ignore[union-attr]
                    visible.append(item)
        has_more = len(visible) > limit or (not exhausted and not stopped)
        page = tuple(self._message_from_item(i, resource_id, thread_id) for i in visible[:limit])
        return MessagePage(messages=page, has_more=has_more)

    def list_threads(
        self, resource_id: str, *, limit: int = 100, cursor: str | None = None, newest_first: bool = False
    ) -> ThreadPage:
        """See `MemoryStore.list_threads`: a Query of GSI1 (keys only, eventually consistent), then BatchGetItem."""
        kwargs: dict[str, Any] = {
            'TableName': self.table_name,
            'IndexName': schema.THREADS_INDEX,
            'KeyConditionExpression': f'{schema.GSI1_PK} = :g',
            'ExpressionAttributeValues': {':g': _s(_gsi_pk(resource_id))},
            'Limit': limit,
            'ScanIndexForward': not newest_first,
        }
        if cursor:
            thread_id = cursor.split('#', 1)[1] if '#' in cursor else cursor
            kwargs['ExclusiveStartKey'] = {
                schema.GSI1_PK: _s(_gsi_pk(resource_id)),
                schema.GSI1_SK: _s(cursor),
                schema.PK: _s(_thread_pk(resource_id, thread_id)),
                schema.SK: _s(META),
            }
        with aws_errors():
            response = self.ddb.query(**kwargs)
        keys = response.get('Items', [])
        metas = self._batch_get([(k[schema.PK]['S'], META) for k in keys])
        threads: list[Thread] = []
        for key in keys:
            item = metas.get(key[schema.PK]['S'])
            ids = _ids_of_thread_pk(key[schema.PK]['S'])
            if ids is not None and ids[0] == resource_id and _is_live_thread(item, resource_id):
                thread_id = ids[1]
                assert item is not None
                threads.append(self._thread_from_meta(item, resource_id, thread_id, None, created=False))
        next_cursor = None
        if response.get('LastEvaluatedKey'):
            next_cursor = response['LastEvaluatedKey'][schema.GSI1_SK]['S']
        return ThreadPage(threads=tuple(threads), next_cursor=next_cursor)

    # =================================================================================================================
    # OM records
    # =================================================================================================================
    def get_record(self, key: str) -> OMRecord | None:
        """See `MemoryStore.get_record`."""
        for target in _targets(key):
            for _ in range(_MAX_READ_ATTEMPTS):
                item = self._get(target.pk, META)
                if not item or _str(item, 'om_key') != key:
                    break
                record = self._record_from_item(item, key)
                if record is not None:
                    return record
                # The S3 document was replaced (and deleted) between our two reads: read the head again.
            else:
                raise StorageError(f'record {key!r}: its stored observations could not be read')
        return None

    def put_record(self, record: OMRecord, *, expected_version: int | None) -> OMRecord:
        """See `MemoryStore.put_record`: one conditional UpdateItem on the head's version, id and generation."""
        target = _target_of(record)
        new_version = 1 if expected_version is None else expected_version + 1
        stored = record.model_copy(update={'version': new_version})
        reuse = self._big_refs.get((record.key, expected_version)) if expected_version is not None else None
        big = self._offload_big(stored, target, reuse)
        values, set_parts, remove = self._om_update(stored, big)
        if target.thread_id is not None:
            # A record created before its thread claims the thread id for its resource.
            set_parts.append('resource_id = if_not_exists(resource_id, :r)')
        if target.thread_id is not None or expected_version is None:
            values[':r'] = _s(record.resource_id)
        if expected_version is None:
            condition = (
                'attribute_not_exists(om_version) AND attribute_not_exists(erased_at) '
                'AND (attribute_not_exists(resource_id) OR resource_id = :r)'
            )
        else:
            condition = 'om_version = :ev AND om_id = :id AND om_generation = :g AND om_key = :k'
            values[':ev'] = _n(expected_version)
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(target.pk, META),
                UpdateExpression=_update_expression(set_parts, remove),
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValues='UPDATED_OLD',
                ReturnValuesOnConditionCheckFailure='ALL_OLD',
            )
        except ClientError as exc:
            if big.uploaded:
                self.blobs.delete([big.uploaded])
            if _is_conditional_failure(exc):
                current = cast('Mapping[str, Any] | None', exc.response.get('Item')) or self._get(target.pk, META)
                if current and 'erased_at' in current:
                    raise ErasedError(f'{record.key} was erased; late work is dropped') from exc
                raise VersionConflictError(record.key, expected_version) from exc
            with aws_errors():
                raise
        old_ref = _str(response.get('Attributes', {}), 'om_big_ref')
        if old_ref and old_ref != big.key:
            # Same generation, older version: no archive refers to it (put_generation never deletes).
            self.blobs.delete([old_ref])
        self._remember_big(stored.key, stored.version, big)
        return stored

    def put_generation(self, new: OMRecord, *, expected_version: int) -> OMRecord:
        """See `MemoryStore.put_generation`.

        Archives the current head as `OMGEN#<generation>` (a PutItem), then replaces the head with one conditional
        UpdateItem. If the update loses, the archive is harmless (a generation that is still the head is never listed
        as history, and the next reflection overwrites it) unless the key was erased, in which case it is removed.
        """
        target = _target_of(new)
        head = self._get(target.pk, META)
        if head is not None and 'erased_at' in head:
            raise ErasedError(f'{new.key} was erased; late work is dropped')
        if (
            head is None
            or _str(head, 'om_key') != new.key
            or _int(head, 'om_version', -1) != expected_version
            or new.generation != _int(head, 'om_generation') + 1
        ):
            raise VersionConflictError(new.key, expected_version)
        archive = {name: value for name, value in head.items() if name in _OM_ATTRS}
        archive_key = _key(target.pk, f'{OMGEN}{_int(head, "om_generation"):010d}')
        archive.update(archive_key)
        archive['inc'] = _n(_int(head, 'inc', 0))
        with aws_errors():
            self.ddb.put_item(TableName=self.table_name, Item=archive)
        stored = new.model_copy(update={'version': expected_version + 1})
        big = self._offload_big(stored, target, None)
        values, set_parts, remove = self._om_update(stored, big)
        values[':ev'] = _n(expected_version)
        values[':og'] = _n(_int(head, 'om_generation'))
        try:
            with_condition = 'om_version = :ev AND om_generation = :og AND om_key = :k'
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(target.pk, META),
                UpdateExpression=_update_expression(set_parts, remove),
                ConditionExpression=with_condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure='ALL_OLD',
            )
        except ClientError as exc:
            if big.uploaded:
                self.blobs.delete([big.uploaded])
            if _is_conditional_failure(exc):
                current = cast('Mapping[str, Any] | None', exc.response.get('Item')) or self._get(target.pk, META)
                if current and 'erased_at' in current:
                    self._delete_items([archive_key])
                    raise ErasedError(f'{new.key} was erased; late work is dropped') from exc
                raise VersionConflictError(new.key, expected_version) from exc
            with aws_errors():
                raise
        self._remember_big(stored.key, stored.version, big)
        return stored

    def list_generations(self, key: str, *, limit: int = 10, before: int | None = None) -> list[OMRecord]:
        """See `MemoryStore.list_generations`: the head, then a Query of the archives newest first."""
        head = self.get_record(key)
        if head is None or limit <= 0:
            return []
        target = self._target_of_head(head)
        out = [head] if before is None else []
        # Archives of later generations are left by a reflection that lost its race: that generation is the head.
        upper = head.generation if before is None else min(before, head.generation)
        if upper <= 0 or len(out) >= limit:
            return out
        kwargs: dict[str, Any] = {
            'TableName': self.table_name,
            'KeyConditionExpression': f'{schema.PK} = :pk AND {schema.SK} BETWEEN :lo AND :hi',
            'ExpressionAttributeValues': {
                ':pk': _s(target.pk),
                ':lo': _s(f'{OMGEN}{0:010d}'),
                ':hi': _s(f'{OMGEN}{upper - 1:010d}'),
            },
            'ScanIndexForward': False,
            'ConsistentRead': True,
            'Limit': limit + 1,
        }
        for item in self._query_all(kwargs):
            if len(out) >= limit:
                break
            if _str(item, 'om_key') != key:
                continue
            record = self._record_from_item(item, key)
            if record is not None:
                out.append(record)
        return out

    def rewrite_generation(self, record: OMRecord) -> None:
        """See `MemoryStore.rewrite_generation`: one conditional UpdateItem of the archive (its large fields in a new
        S3 document when they are large; the old document is deleted once nothing refers to it)."""
        head = self.get_record(record.key)
        if head is None or record.generation >= head.generation:
            return
        target = self._target_of_head(head)
        archive_key = _key(target.pk, f'{OMGEN}{record.generation:010d}')
        old = self._get(target.pk, f'{OMGEN}{record.generation:010d}')
        if not old or _str(old, 'om_key') != record.key:
            return
        stored = record.model_copy(update={'version': _int(old, 'om_version')})
        big = self._offload_big(stored, target, None)
        values, set_parts, remove = self._om_update(stored, big)
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=archive_key,
                UpdateExpression=_update_expression(set_parts, remove),
                ConditionExpression='om_key = :k AND om_generation = :g',
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if big.uploaded:
                self.blobs.delete([big.uploaded])
            if _is_conditional_failure(exc):
                return  # deleted meanwhile (the thread was erased, or the generation dropped)
            with aws_errors():
                raise
        old_ref = _str(old, 'om_big_ref')
        if old_ref and old_ref != big.key:
            self.blobs.delete([old_ref])

    def delete_generations(self, key: str, generations: Sequence[int]) -> None:
        """See `MemoryStore.delete_generations`: the archive items, then the S3 documents they referred to."""
        head = self.get_record(key)
        if head is None:
            return
        target = self._target_of_head(head)
        wanted = [(target.pk, f'{OMGEN}{g:010d}') for g in sorted(set(generations)) if 0 <= g < head.generation]
        found = self._batch_get(wanted, by='SK')
        items = [item for item in found.values() if _str(item, 'om_key') == key]
        self._delete_items([_key(target.pk, _str(item, schema.SK) or '') for item in items])
        self.blobs.delete([ref for item in items if (ref := _str(item, 'om_big_ref'))])

    @staticmethod
    def _target_of_head(head: OMRecord) -> _Target:
        return _targets(head.key)[0] if head.thread_id is None else _target_of(head)

    # =================================================================================================================
    # Erase
    # =================================================================================================================
    def list_attention(self, *, quiet_since: datetime, limit: int = 100) -> list[AttentionItem]:
        """See `MemoryStore.list_attention`: one Query per shard of the sparse attention index, oldest first."""
        items: list[AttentionItem] = []
        for shard in range(schema.ATTENTION_SHARDS):
            kwargs: dict[str, Any] = {
                'TableName': self.table_name,
                'IndexName': schema.ATTENTION_INDEX,
                'KeyConditionExpression': '#apk = :apk AND #ask < :quiet',
                'ExpressionAttributeNames': {'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK},
                'ExpressionAttributeValues': {':apk': _s(f'ATTN#{shard}'), ':quiet': _s(_iso(quiet_since))},
                'Limit': limit,
            }
            for item in self._query_all(kwargs):
                pk, mark = _str(item, 'PK'), _str(item, schema.ATTN_SK)
                ids = _ids_of_thread_pk(pk or '')
                if not mark or ids is None or _str(item, 'resource_id') != ids[0]:
                    continue
                items.append(
                    AttentionItem(
                        resource_id=ids[0],
                        thread_id=ids[1],
                        active_at=datetime.fromisoformat(mark),
                        mark=mark,
                    )
                )
                if len(items) >= limit * schema.ATTENTION_SHARDS:
                    break
        return sorted(items, key=lambda i: i.active_at)[:limit]

    def list_pending_threads(self, resource_id: str, *, limit: int = 100) -> list[PendingThread]:
        """See `MemoryStore.list_pending_threads`: one Query of the sparse pending index (eventually consistent)."""
        with aws_errors():
            response = self.ddb.query(
                TableName=self.table_name,
                IndexName=schema.PENDING_INDEX,
                KeyConditionExpression='#ppk = :ppk',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK},
                ExpressionAttributeValues={':ppk': _s(_pending_pk(resource_id))},
                Limit=limit,
            )
        out: list[PendingThread] = []
        for item in response.get('Items', []):
            since, _, thread_id = (_str(item, schema.PEND_SK) or '').partition('#')
            if since and thread_id:
                out.append(PendingThread(thread_id=thread_id, pending_since=datetime.fromisoformat(since)))
        return out

    def mark_pending(self, resource_id: str, thread_id: str, *, now: datetime) -> None:
        """See `MemoryStore.mark_pending` (conditional on the thread being the resource's live thread)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(_thread_pk(resource_id, thread_id), META),
                UpdateExpression='SET #ppk = :ppk, #psk = if_not_exists(#psk, :psk)',
                ConditionExpression='resource_id = :r AND attribute_exists(created_at)',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK},
                ExpressionAttributeValues={
                    ':r': _s(resource_id),
                    ':ppk': _s(_pending_pk(resource_id)),
                    ':psk': _s(f'{_iso(now)}#{thread_id}'),
                },
            )
        except ClientError as exc:
            if _is_conditional_failure(exc):
                return  # gone, or another resource's
            with aws_errors():
                raise

    def clear_pending(self, resource_id: str, thread_id: str, *, observed_through: int) -> bool:
        """See `MemoryStore.clear_pending` (conditional: no sequence number allocated past `observed_through`)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(_thread_pk(resource_id, thread_id), META),
                UpdateExpression='REMOVE #ppk, #psk',
                # Never creates an item: a thread that is gone (or another resource's) fails the condition.
                ConditionExpression='resource_id = :r AND (attribute_not_exists(#ppk) OR next_seq <= :upto)',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK},
                ExpressionAttributeValues={':r': _s(resource_id), ':upto': _n(observed_through)},
            )
        except ClientError as exc:
            if _is_conditional_failure(exc):
                return False  # a later message (it stays pending), or the thread is gone
            with aws_errors():
                raise
        return True

    def clear_attention(self, item: AttentionItem) -> None:
        """See `MemoryStore.clear_attention` (conditional on the mark being unchanged)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(_thread_pk(item.resource_id, item.thread_id), META),
                UpdateExpression='REMOVE #apk, #ask',
                ConditionExpression='#ask = :mark',
                ExpressionAttributeNames={'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK},
                ExpressionAttributeValues={':mark': _s(item.mark)},
            )
        except ClientError as exc:
            if _is_conditional_failure(exc):
                return  # new activity since it was listed: it stays marked
            with aws_errors():
                raise

    # =================================================================================================================
    # Failures
    # =================================================================================================================
    def add_failure(self, resource_id: str, thread_id: str | None, failure: FailureNote) -> None:
        """See `MemoryStore.add_failure`: one small item in the memory's partition, expiring after 30 days."""
        pk = _resource_pk(resource_id) if thread_id is None else _thread_pk(resource_id, thread_id)
        sk = f'{FAIL}{_iso(failure.at)}#{uuid.uuid4().hex[:8]}'
        expires = int((failure.at + FAILURE_TTL).timestamp())
        item = {
            **_key(pk, sk),
            'doc': _s(failure.model_dump_json(exclude_none=True)),
            schema.TTL_ATTRIBUTE: _n(expires),
        }
        with aws_errors():
            self.ddb.put_item(TableName=self.table_name, Item=item)
        # A thread's failure lives only as long as the thread: one written during (or after) an erase goes again.
        # (Its META says whether it lives; `get_thread` would also read and parse the thread's document.)
        if thread_id is not None and not _is_live_thread(self._get(pk, META), resource_id):
            self._delete_items([_key(pk, sk)])

    def recent_failures(self, resource_id: str, thread_id: str | None, *, limit: int = 20) -> list[FailureNote]:
        """See `MemoryStore.recent_failures`: one Query, newest first."""
        pk = _resource_pk(resource_id) if thread_id is None else _thread_pk(resource_id, thread_id)
        with aws_errors():
            response = self.ddb.query(
                TableName=self.table_name,
                KeyConditionExpression=f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
                ExpressionAttributeValues={':pk': _s(pk), ':p': _s(FAIL)},
                ScanIndexForward=False,
                Limit=limit,
            )
        return [FailureNote.model_validate_json(_str(item, 'doc') or '{}') for item in response.get('Items', [])]

    # =================================================================================================================
    # Working memory
    # =================================================================================================================
    def get_working_memory(self, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord | None:
        """See `MemoryStore.get_working_memory`: one GetItem (resource scope) or one BatchGetItem (META + WM)."""
        if thread_id is None:
            item = self._get(_resource_pk(resource_id), WM)
            if item is None or _str(item, 'resource_id') != resource_id:
                return None
            return _working_memory_from_item(item, resource_id, None)
        pk = _thread_pk(resource_id, thread_id)
        found = self._batch_get([(pk, META), (pk, WM)], by='SK')
        meta, item = found.get(META), found.get(WM)
        if not _is_live_thread(meta, resource_id) or item is None:
            return None
        assert meta is not None
        if _str(item, 'resource_id') != resource_id or _int(item, 'inc', 1) != _int(meta, 'inc', 1):
            return None  # left behind by an erased incarnation of the thread
        return _working_memory_from_item(item, resource_id, thread_id)

    def put_working_memory(self, memory: WorkingMemoryRecord, *, expected_version: int | None) -> WorkingMemoryRecord:
        """See `MemoryStore.put_working_memory`: one conditional PutItem on `wm_version` (plus a GetItem of the
        thread's META in thread scope, for ownership and the incarnation the item belongs to)."""
        new_version = 1 if expected_version is None else expected_version + 1
        stored = memory.model_copy(update={'version': new_version})
        values: dict[str, Any] = {}
        if memory.thread_id is None:
            pk = _resource_pk(memory.resource_id)
            inc = 1
            condition = 'attribute_not_exists(wm_version)' if expected_version is None else 'wm_version = :ev'
        else:
            pk = _thread_pk(memory.resource_id, memory.thread_id)
            meta = self._get(pk, META)
            if not _is_live_thread(meta, memory.resource_id):
                raise ThreadNotFoundError(memory.thread_id)
            assert meta is not None
            inc = _int(meta, 'inc', 1)
            values[':inc'] = _n(inc)
            values[':r'] = _s(memory.resource_id)
            # An item of an erased incarnation counts as absent.
            condition = (
                'attribute_not_exists(wm_version) OR inc <> :inc'
                if expected_version is None
                else 'wm_version = :ev AND inc = :inc AND resource_id = :r'
            )
        if expected_version is not None:
            values[':ev'] = _n(expected_version)
        item: Item = {
            **_key(pk, WM),
            'resource_id': _s(memory.resource_id),
            'inc': _n(inc),
            'wm_version': _n(new_version),
            'wm_scope': _s(memory.scope),
            'wm_format': _s(memory.format),
            'wm_doc': _s(_dumps(memory.content)),
            'updated_at': _s(_iso(memory.updated_at)),
        }
        try:
            if values:
                self.ddb.put_item(
                    TableName=self.table_name,
                    Item=item,
                    ConditionExpression=condition,
                    ExpressionAttributeValues=values,
                )
            else:
                self.ddb.put_item(TableName=self.table_name, Item=item, ConditionExpression=condition)
        except ClientError as exc:
            if _is_conditional_failure(exc):
                raise VersionConflictError(
                    f'working-memory:{memory.resource_id}/{memory.thread_id}', expected_version
                ) from exc
            with aws_errors():
                raise
        return stored

    def claim_turn(
        self, resource_id: str, thread_id: str, message_id: str, *, owner: str, now: datetime, lease: timedelta
    ) -> datetime | None:
        """See `MemoryStore.claim_turn`: one conditional PutItem (free, expired, or ours), else a read of the holder."""
        key = _key(_thread_pk(resource_id, thread_id), TURN + message_id)
        until = now + lease
        try:
            self.ddb.put_item(
                TableName=self.table_name,
                Item={
                    **key,
                    'owner': _s(owner),
                    'lease_until': _n(int(until.timestamp() * 1000)),
                    schema.TTL_ATTRIBUTE: _n(int((until + TURN_CLAIM_TTL).timestamp())),
                },
                ConditionExpression='attribute_not_exists(#pk) OR lease_until < :now OR #owner = :owner',
                ExpressionAttributeNames={'#pk': schema.PK, '#owner': 'owner'},
                ExpressionAttributeValues={':now': _n(int(now.timestamp() * 1000)), ':owner': _s(owner)},
            )
        except ClientError as exc:
            if not _is_conditional_failure(exc):
                with aws_errors():
                    raise
            held = self._get(key[schema.PK]['S'], key[schema.SK]['S'])
            if held is None:  # released between the write and the read: free now, but let the caller ask again
                return now
            return datetime.fromtimestamp(_int(held, 'lease_until') / 1000, tz=UTC)
        return None

    def release_turn(self, resource_id: str, thread_id: str, message_id: str, *, owner: str) -> None:
        """See `MemoryStore.release_turn`."""
        try:
            self.ddb.delete_item(
                TableName=self.table_name,
                Key=_key(_thread_pk(resource_id, thread_id), TURN + message_id),
                ConditionExpression='#owner = :owner',
                ExpressionAttributeNames={'#owner': 'owner'},
                ExpressionAttributeValues={':owner': _s(owner)},
            )
        except ClientError as exc:
            if not _is_conditional_failure(exc):
                with aws_errors():
                    raise

    def delete_thread(self, resource_id: str, thread_id: str) -> None:
        """See `MemoryStore.delete_thread`.

        The thread item becomes a tombstone first (one conditional UpdateItem that drops the thread, its OM head and
        its index keys and bumps the incarnation), so every later conditional write of the old incarnation fails;
        then every other item of the partition and every object under the thread's S3 prefix is deleted, and the
        partition is swept once more for a message whose write was in flight during the erase.
        """
        pk = _thread_pk(resource_id, thread_id)
        now = self.clock.now()
        remove = ['resource_id', 'created_at', 'updated_at', 'next_seq', schema.GSI1_PK, schema.GSI1_SK]
        remove += [schema.ATTN_PK, schema.ATTN_SK, schema.PEND_PK, schema.PEND_SK]
        remove += [*_THREAD_ATTRS, *_OM_ATTRS]
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression='SET erased_at = :e, #ttl = :ttl ADD inc :one REMOVE ' + ', '.join(remove),
                ConditionExpression=_LIVE_THREAD_OF_R,
                ExpressionAttributeNames={'#ttl': schema.TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ':e': _s(_iso(now)),
                    ':ttl': _n(int((now + self.tombstone_ttl).timestamp())),
                    ':one': _n(1),
                    ':r': _s(resource_id),
                },
                ReturnValues='ALL_NEW',
            )
        except ClientError as exc:
            if _is_conditional_failure(exc):
                raise ThreadNotFoundError(thread_id) from exc
            with aws_errors():
                raise
        new_inc = _int(response.get('Attributes', {}), 'inc', 1)
        self._sweep_thread(pk, below_inc=new_inc)
        self.blobs.delete_prefix(thread_prefix(resource_id, thread_id))
        self._sweep_thread(pk, below_inc=new_inc)

    def delete_resource(self, resource_id: str) -> None:
        """See `MemoryStore.delete_resource`: tombstone the resource, erase each of its threads, delete its prefix."""
        now = self.clock.now()
        pk = _resource_pk(resource_id)
        with aws_errors():
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression='SET erased_at = :e, #ttl = :ttl REMOVE ' + ', '.join(_OM_ATTRS),
                ExpressionAttributeNames={'#ttl': schema.TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ':e': _s(_iso(now)),
                    ':ttl': _n(int((now + self.tombstone_ttl).timestamp())),
                },
            )
        # GSI1 is eventually consistent: pass over it until a whole pass finds none of the resource's threads.
        for _ in range(5):
            found = False
            cursor: str | None = None
            while True:
                page = self.list_threads(resource_id, limit=100, cursor=cursor)
                for thread in page.threads:
                    found = True
                    try:
                        self.delete_thread(resource_id, thread.id)
                    except ThreadNotFoundError:
                        pass  # erased concurrently
                cursor = page.next_cursor
                if cursor is None:
                    break
            if not found:
                break
        self._delete_items(
            [
                _key(pk, _str(i, schema.SK) or '')
                for prefix in (OMGEN, FAIL)  # the resource record's generations and its kept failures
                for i in self._query_all(
                    {
                        'TableName': self.table_name,
                        'KeyConditionExpression': f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
                        'ExpressionAttributeValues': {':pk': _s(pk), ':p': _s(prefix)},
                        'ProjectionExpression': f'{schema.PK}, {schema.SK}',
                        'ConsistentRead': True,
                    }
                )
            ]
        )
        self._delete_items([_key(pk, WM)])
        self.blobs.delete_prefix(resource_prefix(resource_id))

    # =================================================================================================================
    # Internals: messages
    # =================================================================================================================
    def _precheck(self, pk: str, ids: list[str]) -> tuple[Item | None, dict[str, Item]]:
        found = self._batch_get([(pk, META), *[(pk, MSG + i) for i in ids]], by='SK')
        meta = found.pop(META, None)
        return meta, {sk[len(MSG) :]: item for sk, item in found.items()}

    def _allocate(
        self, pk: str, resource_id: str, thread_id: str, count: int, now: datetime, *, mark_pending: bool = False
    ) -> Item:
        """Reserve `count` sequence numbers; returns the thread item as it was before (empty when new).

        Only an allocation (`count > 0`) moves `updated_at` and marks the thread for the sweeper (and, with
        `mark_pending`, as pending): an append of nothing new changes nothing but creating the thread when missing.
        """
        now_iso = _iso(now)
        names = {'#gpk': schema.GSI1_PK, '#gsk': schema.GSI1_SK, '#ttl': schema.TTL_ATTRIBUTE}
        values = {
            ':r': _s(resource_id),
            ':now': _s(now_iso),
            ':one': _n(1),
            ':n': _n(count),
            ':gpk': _s(_gsi_pk(resource_id)),
            ':gsk': _s(f'{now_iso}#{thread_id}'),
        }
        activity = 'updated_at = if_not_exists(updated_at, :now)'
        if count > 0:
            names |= {'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK}
            values |= {':apk': _s(_attention_pk(pk)), ':ask': _s(now_iso)}
            activity = 'updated_at = :now, #apk = :apk, #ask = :ask'
            if mark_pending:
                # Resource scope: list the thread among the resource's pending ones, keeping when it first became so.
                names |= {'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK}
                values |= {':ppk': _s(_pending_pk(resource_id)), ':psk': _s(f'{now_iso}#{thread_id}')}
                activity += ', #ppk = :ppk, #psk = if_not_exists(#psk, :psk)'
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression=(
                    f'SET resource_id = :r, created_at = if_not_exists(created_at, :now), {activity}, '
                    'inc = if_not_exists(inc, :one), #gpk = if_not_exists(#gpk, :gpk), '
                    '#gsk = if_not_exists(#gsk, :gsk) ADD next_seq :n REMOVE erased_at, #ttl'
                ),
                ConditionExpression='attribute_not_exists(resource_id) OR resource_id = :r',
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues='ALL_OLD',
            )
        except ClientError as exc:
            if _is_conditional_failure(exc):
                raise ThreadNotFoundError(thread_id) from exc
            with aws_errors():
                raise
        return response.get('Attributes', {})

    def _message_item(
        self, pk: str, prefix: str, message: Message, digest: str, resource_id: str, seq: int, inc: int
    ) -> Item:
        parts = [self._upload_inline_data(p, prefix) for p in message.parts]
        body = _dumps(
            {
                'parts': parts,
                'tokenCounts': message.token_counts.model_dump(mode='json', by_alias=True)
                if message.token_counts
                else None,
            }
        )
        item: Item = {
            **_key(pk, MSG + message.id),
            schema.SEQ: _n(seq),
            'inc': _n(inc),
            'id': _s(message.id),
            'role': _s(message.role),
            'created_at': _s(_iso(message.created_at)),
            'hash': _s(digest),
            'resource_id': _s(resource_id),
            'written_at': _n(_ms(self.clock.now())),
        }
        encoded = body.encode()
        if len(encoded) > self.offload_threshold_bytes:
            # Content-addressed: a retry of the same message writes the same object.
            key = f'{prefix}msg/{hashlib.sha256(encoded).hexdigest()}.json'
            self.blobs.put(key, encoded, content_type='application/json')
            item['body_ref'] = _s(key)
        else:
            item['body'] = _s(body)
        return item

    def _upload_inline_data(self, part: Any, prefix: str) -> dict[str, Any]:
        dumped: dict[str, Any] = part.model_dump(mode='json', by_alias=True)
        if not isinstance(part, ImagePart | FilePart) or not part.data:
            return dumped
        data = part.data
        if data.startswith('data:') and ',' in data:
            data = data.split(',', 1)[1]  # a data URL: keep the base64 payload
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidInputError(f'{part.type} part `data` is not valid base64') from exc
        key = f'{prefix}att/{hashlib.sha256(raw).hexdigest()}'
        self.blobs.put(key, raw, content_type=part.media_type or 'application/octet-stream')
        dumped['url'] = self.blobs.url(key)
        dumped['data'] = None
        dumped['size'] = len(raw)
        return dumped

    def _put_message(self, pk: str, item: Item, message_id: str, digest: str, inc: int) -> Item | None:
        """Write a new message; returns None when written, or the stored item when the same message was there.

        MessageConflictError when the id holds other content. Either way the caller's seq stays empty (see
        `_release`).
        """
        for _ in range(_MAX_READ_ATTEMPTS):
            try:
                with_condition = 'attribute_not_exists(SK)'
                self.ddb.put_item(TableName=self.table_name, Item=item, ConditionExpression=with_condition)
                return None
            except ClientError as exc:
                if not _is_conditional_failure(exc):
                    with aws_errors():
                        raise
            existing = self._get(pk, MSG + message_id)
            if existing is None:
                continue  # retracted or swept in between: try again
            if _int(existing, 'inc', 1) < inc:
                # A message of an erased incarnation that an in-flight write put back: replace it.
                try:
                    self.ddb.put_item(
                        TableName=self.table_name,
                        Item=item,
                        ConditionExpression='inc = :old',
                        ExpressionAttributeValues={':old': existing['inc']},
                    )
                    return None
                except ClientError as exc:
                    if not _is_conditional_failure(exc):
                        with aws_errors():
                            raise
                    continue
            if _str(existing, 'hash') != digest:
                raise MessageConflictError(message_id)
            return existing
        raise StorageError(f'message {message_id!r} could not be written (it keeps changing)')

    def _release(
        self,
        pk: str,
        old: Item,
        count: int,
        inc: int,
        resource_id: str,
        unfilled: Sequence[int],
        written: Sequence[tuple[str, int]],
    ) -> None:
        """Give back the seqs this append allocated but did not fill.

        When the call wrote no message (refused, or it only repeated stored messages), the thread item is put back as
        it was, so the request changed nothing: not `updated_at`, not the attention or pending marks, not the
        sequence counter. That is only safe while nobody else allocated since (no reader can have seen a later seq),
        which the undo's condition checks. Otherwise every unfilled seq gets a placeholder, so ordered reads never
        wait on it.
        """
        if not written and count and self._undo_allocation(pk, old, count, inc):
            return
        for seq in unfilled:
            self._put_gap_quietly(pk, inc, seq, resource_id)

    def _undo_allocation(self, pk: str, old: Item, count: int, inc: int) -> bool:
        """Restore the thread item to `old` (its state before this call's allocation); False when it cannot be."""
        values: dict[str, Any] = {':ours': _n(_int(old, 'next_seq') + count), ':inc': _n(inc)}
        try:
            if not old:
                # This call created the item: remove it, unless something else was stored on it since.
                self.ddb.delete_item(
                    TableName=self.table_name,
                    Key=_key(pk, META),
                    ConditionExpression=(
                        'next_seq = :ours AND inc = :inc AND attribute_not_exists(om_version) '
                        'AND attribute_not_exists(thread_doc) AND attribute_not_exists(thread_doc_ref)'
                    ),
                    ExpressionAttributeValues=values,
                )
                return True
            if 'created_at' not in old or 'erased_at' in old:
                return False  # a re-created or claimed item: rare, and the placeholders are always correct
            names: dict[str, str] = {}
            set_parts, remove = ['updated_at = :u'], []
            values[':u'] = old['updated_at']
            if 'next_seq' in old:
                set_parts.append('next_seq = :prev')
                values[':prev'] = old['next_seq']
            else:
                remove.append('next_seq')
            for attribute, alias in (
                (schema.ATTN_PK, '#apk'),
                (schema.ATTN_SK, '#ask'),
                (schema.PEND_PK, '#ppk'),
                (schema.PEND_SK, '#psk'),
            ):
                names[alias] = attribute
                if attribute in old:
                    set_parts.append(f'{alias} = :{alias[1:]}')
                    values[f':{alias[1:]}'] = old[attribute]
                else:
                    remove.append(alias)
            self.ddb.update_item(
                TableName=self.table_name,
                Key=_key(pk, META),
                UpdateExpression=_update_expression(set_parts, remove),
                ConditionExpression='next_seq = :ours AND inc = :inc',
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
            return True
        except ClientError as exc:
            if not _is_conditional_failure(exc):
                logger.warning('could not undo a sequence allocation', extra={'pk': pk, 'error': error_code(exc)})
            return False

    def _put_gap(self, pk: str, inc: int, seq: int, resource_id: str) -> None:
        with aws_errors():
            self.ddb.put_item(
                TableName=self.table_name,
                Item={
                    **_key(pk, f'{GAP}{inc:06d}#{seq:012d}'),
                    schema.SEQ: _n(seq),
                    'inc': _n(inc),
                    'gap': {'BOOL': True},
                    'written_at': _n(_ms(self.clock.now())),
                    'resource_id': _s(resource_id),
                },
            )

    def _put_gap_quietly(self, pk: str, inc: int, seq: int, resource_id: str) -> None:
        try:
            self._put_gap(pk, inc, seq, resource_id)
        except StorageError:  # the grace period covers a placeholder we could not write
            logger.warning('could not write a sequence placeholder', extra={'pk': pk, 'seq': seq})

    def _retract(self, pk: str, message_id: str, seq: int, inc: int, resource_id: str) -> None:
        try:
            self.ddb.delete_item(
                TableName=self.table_name,
                Key=_key(pk, MSG + message_id),
                ConditionExpression='#seq = :s AND inc = :i',
                ExpressionAttributeNames={'#seq': schema.SEQ},
                ExpressionAttributeValues={':s': _n(seq), ':i': _n(inc)},
            )
        except ClientError as exc:
            if not _is_conditional_failure(exc):
                with aws_errors():
                    raise
        self._put_gap(pk, inc, seq, resource_id)

    def _message_from_item(self, item: Item, resource_id: str, thread_id: str) -> Message:
        body_text = _str(item, 'body')
        if body_text is None:
            ref = _str(item, 'body_ref') or ''
            data = self.blobs.get(ref)
            if data is None:
                raise StorageError(f'message {_str(item, "id")!r}: its stored content is missing')
            body_text = data.decode()
        body = json.loads(body_text)
        parts = [{k: v for k, v in p.items() if v is not None} for p in body['parts']]
        payload: dict[str, Any] = {
            'id': _str(item, 'id'),
            'role': _str(item, 'role'),
            'createdAt': _str(item, 'created_at'),
            'parts': parts,
            'threadId': thread_id,
            'resourceId': resource_id,
            'seq': _int(item, schema.SEQ),
        }
        if body.get('tokenCounts') is not None:
            payload['tokenCounts'] = body['tokenCounts']
        return Message.model_validate(payload)

    def _sweep_thread(self, pk: str, *, below_inc: int) -> None:
        """Delete the items of a thread partition (not its META) that belong to an incarnation before `below_inc`."""
        stale = [
            _key(pk, _str(i, schema.SK) or '')
            for i in self._query_all(
                {
                    'TableName': self.table_name,
                    'KeyConditionExpression': f'{schema.PK} = :pk',
                    'ExpressionAttributeValues': {':pk': _s(pk)},
                    'ProjectionExpression': f'{schema.PK}, {schema.SK}, inc',
                    'ConsistentRead': True,
                }
            )
            if _str(i, schema.SK) != META and _int(i, 'inc', 0) < below_inc
        ]
        self._delete_items(stale)

    def _clear_resource_tombstone(self, resource_id: str) -> None:
        # A new thread of an erased resource starts a new incarnation of the resource (as InMemoryStore does).
        # The tombstone holds nothing else (its OM attributes were removed by the erase), so it simply goes.
        try:
            self.ddb.delete_item(
                TableName=self.table_name,
                Key=_key(_resource_pk(resource_id), META),
                ConditionExpression='attribute_exists(erased_at) AND attribute_not_exists(om_version)',
            )
        except ClientError as exc:
            if not _is_conditional_failure(exc):
                with aws_errors():
                    raise

    def _thread_from_meta(
        self, item: Item | None, resource_id: str, thread_id: str, now: datetime | None, *, created: bool
    ) -> Thread:
        item = item or {}
        doc: dict[str, Any] = {}
        if not created:
            doc_text = _str(item, 'thread_doc')
            ref = _str(item, 'thread_doc_ref')
            if doc_text is None and ref:
                data = self.blobs.get(ref)
                if data is None:  # replaced between our reads: the item moved on, read it again
                    fresh = self._get(_thread_pk(resource_id, thread_id), META)
                    return self._thread_from_meta(fresh, resource_id, thread_id, now, created=False)
                doc_text = data.decode()
            doc = json.loads(doc_text) if doc_text else {}
        created_at = _str(item, 'created_at') if not created else None
        updated = now or datetime.fromisoformat(_str(item, 'updated_at') or _str(item, 'created_at') or '')
        return Thread(
            id=thread_id,
            resource_id=resource_id,
            created_at=datetime.fromisoformat(created_at) if created_at else (now or updated),
            updated_at=updated,
            title=doc.get('title'),
            title_pinned=bool(doc.get('title_pinned')),
            metadata=doc.get('metadata') or {},
            current_task=doc.get('current_task'),
            suggested_response=doc.get('suggested_response'),
        )

    # =================================================================================================================
    # Internals: OM records
    # =================================================================================================================
    def _offload_big(self, record: OMRecord, target: _Target, reuse: tuple[str, str] | None) -> _Big:
        """The record's large fields, inline or in S3 (uploaded by this call unless `reuse` already holds them)."""
        big = _dumps(record.model_dump(mode='json', include=set(_BIG_FIELDS)))
        encoded = big.encode()
        if len(encoded) <= self.inline_head_max_bytes:
            return _Big(inline=big, key=None, uploaded=None, digest='')
        digest = hashlib.sha256(encoded).hexdigest()
        if reuse is not None and reuse[0] == digest:
            # Only small fields changed (a lease): keep pointing at the same document.
            return _Big(inline=None, key=reuse[1], uploaded=None, digest=digest)
        # A fresh name per write (not content-addressed): a replaced document is deleted, and no later write can
        # ever point at a deleted name again.
        key = f'{target.prefix}om/{record.id}/{record.version:08d}-{uuid.uuid4().hex}.json'
        self.blobs.put(key, encoded, content_type='application/json')
        return _Big(inline=None, key=key, uploaded=key, digest=digest)

    def _remember_big(self, key: str, version: int, big: _Big) -> None:
        if big.key is None:
            return
        with self._lock:
            if len(self._big_refs) > 1024:
                self._big_refs.clear()  # a bound, not an LRU: the entries are only an optimisation
            self._big_refs[(key, version)] = (big.digest, big.key)

    def _om_update(self, record: OMRecord, big: _Big) -> tuple[dict[str, Any], list[str], list[str]]:
        # Optional fields at an empty default are left out (they read back as their defaults): every byte counts
        # against the write units of each step's record write.
        empty = {name for name in _OM_OPTIONAL_FIELDS if getattr(record, name) in (None, ())}
        small = _dumps(record.model_dump(mode='json', exclude={*_BIG_FIELDS, 'version', *empty}))
        values: dict[str, Any] = {
            ':k': _s(record.key),
            ':id': _s(record.id),
            ':v': _n(record.version),
            ':g': _n(record.generation),
            ':small': _s(small),
        }
        set_parts = ['om_key = :k', 'om_id = :id', 'om_version = :v', 'om_generation = :g', 'om_small = :small']
        if big.key is None:
            values[':big'] = _s(big.inline or '')
            set_parts.append('om_big = :big')
            remove = ['om_big_ref']
        else:
            values[':big'] = _s(big.key)
            set_parts.append('om_big_ref = :big')
            remove = ['om_big']
        return values, set_parts, remove

    def _record_from_item(self, item: Item, key: str) -> OMRecord | None:
        """The record in an item, or None when its S3 document is gone (replaced since the item was read)."""
        if 'om_version' not in item or _str(item, 'om_key') != key:
            return None
        big_text = _str(item, 'om_big')
        ref = _str(item, 'om_big_ref')
        if big_text is None and ref:
            data = self.blobs.get(ref)
            if data is None:
                return None
            big_text = data.decode()
        fields = json.loads(_str(item, 'om_small') or '{}')
        fields.update(json.loads(big_text or '{}'))
        fields['version'] = _int(item, 'om_version')
        record = OMRecord.model_validate(fields)
        if ref and big_text is not None:
            digest = hashlib.sha256(big_text.encode()).hexdigest()
            self._remember_big(key, record.version, _Big(inline=None, key=ref, uploaded=None, digest=digest))
        return record

    def _offload_doc(self, doc: dict[str, Any], prefix: str) -> tuple[str, str | None]:
        text = _dumps(doc)
        encoded = text.encode()
        if len(encoded) <= self.inline_head_max_bytes:
            return text, None
        key = f'{prefix}{uuid.uuid4().hex}.json'
        self.blobs.put(key, encoded, content_type='application/json')
        return text, key

    # =================================================================================================================
    # Internals: low-level item access
    # =================================================================================================================
    def _get(self, pk: str, sk: str) -> Item | None:
        with aws_errors():
            response = self.ddb.get_item(TableName=self.table_name, Key=_key(pk, sk), ConsistentRead=True)
        return response.get('Item')

    def _batch_get(self, keys: list[tuple[str, str]], *, by: str = 'PK') -> dict[str, Item]:
        out: dict[str, Item] = {}
        pending = [_key(pk, sk) for pk, sk in dict.fromkeys(keys)]
        for start in range(0, len(pending), _BATCH_GET):
            for item in batch_get(self.ddb, self.table_name, pending[start : start + _BATCH_GET], what='items'):
                out[item[by]['S']] = item
        return out

    def _query_all(self, kwargs: dict[str, Any]) -> Iterator[Item]:
        start: Item | None = None
        while True:
            if start:
                kwargs = {**kwargs, 'ExclusiveStartKey': start}
            with aws_errors():
                response = self.ddb.query(**kwargs)
            yield from response.get('Items', [])
            start = response.get('LastEvaluatedKey')
            if not start:
                return

    def _delete_items(self, keys: Iterable[Item]) -> None:
        batch: list[Item] = []
        for key in keys:
            batch.append({'DeleteRequest': {'Key': key}})
            if len(batch) == _BATCH_WRITE:
                self._batch_write(batch)
                batch = []
        if batch:
            self._batch_write(batch)

    def _batch_write(self, requests: list[Item]) -> None:
        batch_write(self.ddb, self.table_name, requests, what='a batch delete')


# ---------------------------------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------------------------------
def _key(pk: str, sk: str) -> Item:
    return {schema.PK: _s(pk), schema.SK: _s(sk)}


def _key_part(value: str) -> str:
    # `#` separates the parts of a key and `%` escapes: quoting both keeps every (resource, thread) pair its own key,
    # whatever the ids hold (the id grammar already refuses them; the store does not rely on it).
    return quote(value, safe=_KEY_SAFE)


def _thread_pk(resource_id: str, thread_id: str) -> str:
    """A thread's partition: thread ids are scoped to their resource (two resources may each own a `t1`)."""
    return f'{THREAD}{_key_part(resource_id)}#{_key_part(thread_id)}'


def _ids_of_thread_pk(pk: str) -> tuple[str, str] | None:
    """(resource id, thread id) of a thread partition key, or None for any other key."""
    if not pk.startswith(THREAD):
        return None
    resource, sep, thread = pk[len(THREAD) :].partition('#')
    return (unquote(resource), unquote(thread)) if sep and resource and thread else None


def _resource_pk(resource_id: str) -> str:
    return f'RESOURCE#{resource_id}'


def _gsi_pk(resource_id: str) -> str:
    return f'RES#{resource_id}'


def _pending_pk(resource_id: str) -> str:
    return f'PEND#{resource_id}'


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _update_expression(set_parts: list[str], remove: list[str]) -> str:
    expr = 'SET ' + ', '.join(set_parts)
    return expr + (' REMOVE ' + ', '.join(remove) if remove else '')


def _target_of(record: OMRecord) -> _Target:
    if record.scope == 'resource' or record.key.startswith('resource:'):
        return _Target(
            _resource_pk(record.resource_id),
            record.resource_id,
            None,
            resource_prefix(record.resource_id) + 'resource/',
        )
    thread_id = record.thread_id or ''
    return _Target(
        _thread_pk(record.resource_id, thread_id),
        record.resource_id,
        thread_id,
        thread_prefix(record.resource_id, thread_id),
    )


def _targets(key: str) -> list[_Target]:
    """Where the head of a record key can live (`thread:<resource>/<thread>` is ambiguous when ids contain `/`)."""
    if key.startswith('resource:'):
        resource_id = key[len('resource:') :]
        return [_Target(_resource_pk(resource_id), resource_id, None, resource_prefix(resource_id) + 'resource/')]
    if not key.startswith('thread:'):
        return []
    rest = key[len('thread:') :]
    out = []
    for index, char in enumerate(rest):
        if char == '/':
            resource_id, thread_id = rest[:index], rest[index + 1 :]
            pk = _thread_pk(resource_id, thread_id)
            out.append(_Target(pk, resource_id, thread_id, thread_prefix(resource_id, thread_id)))
    return out


def _thread_doc(thread: Thread) -> dict[str, Any]:
    return {
        'title': thread.title,
        'title_pinned': thread.title_pinned,
        'metadata': thread.metadata,
        'current_task': thread.current_task,
        'suggested_response': thread.suggested_response,
    }


def _working_memory_from_item(item: Item, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord:
    return WorkingMemoryRecord(
        scope='thread' if thread_id is not None else 'resource',
        resource_id=resource_id,
        thread_id=thread_id,
        format='json' if _str(item, 'wm_format') == 'json' else 'markdown',
        content=json.loads(_str(item, 'wm_doc') or '""'),
        updated_at=datetime.fromisoformat(_str(item, 'updated_at') or '1970-01-01T00:00:00+00:00'),
        version=_int(item, 'wm_version'),
    )


def _gap_item(pk: str, inc: int, seq: int, resource_id: str, written_ms: int) -> Item:
    """A `GAP#` placeholder: `seq` will never hold a message (a refused append, a retry, a deleted message)."""
    return {
        **_key(pk, f'{GAP}{inc:06d}#{seq:012d}'),
        schema.SEQ: _n(seq),
        'inc': _n(inc),
        'gap': {'BOOL': True},
        'written_at': _n(written_ms),
        'resource_id': _s(resource_id),
    }


def _is_live_thread(item: Item | None, resource_id: str) -> bool:
    return (
        item is not None
        and _str(item, 'resource_id') == resource_id
        and 'created_at' in item
        and 'erased_at' not in item
    )


def _is_message_of(item: Item, resource_id: str) -> bool:
    return (_str(item, schema.SK) or '').startswith(MSG) and _str(item, 'resource_id') == resource_id


def _current_incarnation(items: list[Item]) -> list[Item]:
    """Drop items of an erased incarnation that a late write put back (seq numbers restart with each incarnation)."""
    if not items:
        return items
    newest = max(_int(i, 'inc', 1) for i in items)
    return [i for i in items if _int(i, 'inc', 1) == newest]


def _has_inline_data(message: Message) -> bool:
    return any(isinstance(p, ImagePart | FilePart) and p.data for p in message.parts)


def _dedupe(messages: Sequence[Message]) -> list[Message]:
    """Messages in order, each id once; the same id twice with other content is a conflict (nothing written)."""
    seen: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        digest = message.content_hash()
        if message.id in seen:
            if seen[message.id] != digest:
                raise MessageConflictError(message.id)
            continue
        seen[message.id] = digest
        out.append(message)
    return out
