"""`DynamoMemoryStore`: the production `MemoryStore`, one DynamoDB table plus one S3 bucket.

Its methods live with what they touch: `threads` (threads, index marks, erase), `messages`, `records` (OM heads and
generations) and, here, the small items beside them (kept failures, working memory, turn claims); `items` is the
item layout and `table` the low-level access they share. docs/storage.md has the whole design and the reasons.

Hot path (a steady-state step, thread scope): one UpdateItem on META allocates sequence numbers, checks ownership and
returns the thread and the OM head (ReturnValues=ALL_OLD); one conditional PutItem per new message; one strongly
consistent Query on LSI1 for the messages after the record's cursor. Everything is a single-item conditional write,
which is what DynamoDB (and dynalite, the race-test backend) make atomic.

Large values (a message's parts, the OM head's observations/chunks, thread metadata) move to S3 behind a pointer
above a size threshold; inline base64 attachment data is uploaded on append and replaced by an `s3://` URL.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.items import (
    FAIL,
    FAILURE_TTL,
    META,
    TURN,
    TURN_CLAIM_TTL,
    WM,
    Item,
    dump_json,
    is_conditional_failure,
    is_live_thread,
    item_int,
    item_key,
    item_str,
    num_value,
    resource_pk,
    str_value,
    thread_pk,
    utc_iso,
    working_memory_from_item,
)
from om_lib.adapters.aws.dynamodb.messages import MessageItems
from om_lib.adapters.aws.errors import aws_errors
from om_lib.errors import ThreadNotFoundError, VersionConflictError
from om_lib.records import FailureNote, WorkingMemoryRecord


class DynamoMemoryStore(MessageItems):
    """The `MemoryStore` on DynamoDB (one table) and S3 (one bucket).

    Args:
        table_name: The memory table (its keys and indexes: `schema`).
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

    # =================================================================================================================
    # Failures
    # =================================================================================================================
    def add_failure(self, resource_id: str, thread_id: str | None, failure: FailureNote) -> None:
        """See `MemoryStore.add_failure`: one small item in the memory's partition, expiring after 30 days."""
        pk = resource_pk(resource_id) if thread_id is None else thread_pk(resource_id, thread_id)
        sk = f'{FAIL}{utc_iso(failure.at)}#{uuid.uuid4().hex[:8]}'
        expires = int((failure.at + FAILURE_TTL).timestamp())
        item = {
            **item_key(pk, sk),
            'doc': str_value(failure.model_dump_json(exclude_none=True)),
            schema.TTL_ATTRIBUTE: num_value(expires),
        }
        with aws_errors():
            self.ddb.put_item(TableName=self.table_name, Item=item)
        # A thread's failure lives only as long as the thread: one written during (or after) an erase goes again.
        # (Its META says whether it lives; `get_thread` would also read and parse the thread's document.)
        if thread_id is not None and not is_live_thread(self._get(pk, META), resource_id):
            self._delete_items([item_key(pk, sk)])

    def recent_failures(self, resource_id: str, thread_id: str | None, *, limit: int = 20) -> list[FailureNote]:
        """See `MemoryStore.recent_failures`: one Query, newest first."""
        pk = resource_pk(resource_id) if thread_id is None else thread_pk(resource_id, thread_id)
        with aws_errors():
            response = self.ddb.query(
                TableName=self.table_name,
                KeyConditionExpression=f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
                ExpressionAttributeValues={':pk': str_value(pk), ':p': str_value(FAIL)},
                ScanIndexForward=False,
                Limit=limit,
            )
        return [FailureNote.model_validate_json(item_str(item, 'doc') or '{}') for item in response.get('Items', [])]

    # =================================================================================================================
    # Working memory
    # =================================================================================================================
    def get_working_memory(self, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord | None:
        """See `MemoryStore.get_working_memory`: one GetItem (resource scope) or one BatchGetItem (META + WM)."""
        if thread_id is None:
            item = self._get(resource_pk(resource_id), WM)
            if item is None or item_str(item, 'resource_id') != resource_id:
                return None
            return working_memory_from_item(item, resource_id, None)
        pk = thread_pk(resource_id, thread_id)
        found = self._batch_get([(pk, META), (pk, WM)], by='SK')
        meta, item = found.get(META), found.get(WM)
        if not is_live_thread(meta, resource_id) or item is None:
            return None
        assert meta is not None
        if item_str(item, 'resource_id') != resource_id or item_int(item, 'inc', 1) != item_int(meta, 'inc', 1):
            return None  # left behind by an erased incarnation of the thread
        return working_memory_from_item(item, resource_id, thread_id)

    def put_working_memory(self, memory: WorkingMemoryRecord, *, expected_version: int | None) -> WorkingMemoryRecord:
        """See `MemoryStore.put_working_memory`: one conditional PutItem on `wm_version` (plus a GetItem of the
        thread's META in thread scope, for ownership and the incarnation the item belongs to)."""
        new_version = 1 if expected_version is None else expected_version + 1
        stored = memory.model_copy(update={'version': new_version})
        values: dict[str, Any] = {}
        if memory.thread_id is None:
            pk = resource_pk(memory.resource_id)
            inc = 1
            condition = 'attribute_not_exists(wm_version)' if expected_version is None else 'wm_version = :ev'
        else:
            pk = thread_pk(memory.resource_id, memory.thread_id)
            meta = self._get(pk, META)
            if not is_live_thread(meta, memory.resource_id):
                raise ThreadNotFoundError(memory.thread_id)
            assert meta is not None
            inc = item_int(meta, 'inc', 1)
            values[':inc'] = num_value(inc)
            values[':r'] = str_value(memory.resource_id)
            # An item of an erased incarnation counts as absent.
            condition = (
                'attribute_not_exists(wm_version) OR inc <> :inc'
                if expected_version is None
                else 'wm_version = :ev AND inc = :inc AND resource_id = :r'
            )
        if expected_version is not None:
            values[':ev'] = num_value(expected_version)
        item: Item = {
            **item_key(pk, WM),
            'resource_id': str_value(memory.resource_id),
            'inc': num_value(inc),
            'wm_version': num_value(new_version),
            'wm_scope': str_value(memory.scope),
            'wm_format': str_value(memory.format),
            'wm_doc': str_value(dump_json(memory.content)),
            'updated_at': str_value(utc_iso(memory.updated_at)),
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
            if is_conditional_failure(exc):
                raise VersionConflictError(
                    f'working-memory:{memory.resource_id}/{memory.thread_id}', expected_version
                ) from exc
            with aws_errors():
                raise
        return stored

    # =================================================================================================================
    # Turn claims
    # =================================================================================================================
    def claim_turn(
        self, resource_id: str, thread_id: str, message_id: str, *, owner: str, now: datetime, lease: timedelta
    ) -> datetime | None:
        """See `MemoryStore.claim_turn`: one conditional PutItem (free, expired, or ours), else a read of the holder."""
        key = item_key(thread_pk(resource_id, thread_id), TURN + message_id)
        until = now + lease
        try:
            self.ddb.put_item(
                TableName=self.table_name,
                Item={
                    **key,
                    'owner': str_value(owner),
                    'lease_until': num_value(int(until.timestamp() * 1000)),
                    schema.TTL_ATTRIBUTE: num_value(int((until + TURN_CLAIM_TTL).timestamp())),
                },
                ConditionExpression='attribute_not_exists(#pk) OR lease_until < :now OR #owner = :owner',
                ExpressionAttributeNames={'#pk': schema.PK, '#owner': 'owner'},
                ExpressionAttributeValues={':now': num_value(int(now.timestamp() * 1000)), ':owner': str_value(owner)},
            )
        except ClientError as exc:
            if not is_conditional_failure(exc):
                with aws_errors():
                    raise
            held = self._get(key[schema.PK]['S'], key[schema.SK]['S'])
            if held is None:  # released between the write and the read: free now, but let the caller ask again
                return now
            return datetime.fromtimestamp(item_int(held, 'lease_until') / 1000, tz=UTC)
        return None

    def release_turn(self, resource_id: str, thread_id: str, message_id: str, *, owner: str) -> None:
        """See `MemoryStore.release_turn`."""
        try:
            self.ddb.delete_item(
                TableName=self.table_name,
                Key=item_key(thread_pk(resource_id, thread_id), TURN + message_id),
                ConditionExpression='#owner = :owner',
                ExpressionAttributeNames={'#owner': 'owner'},
                ExpressionAttributeValues={':owner': str_value(owner)},
            )
        except ClientError as exc:
            if not is_conditional_failure(exc):
                with aws_errors():
                    raise
