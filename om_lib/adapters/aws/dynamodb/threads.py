"""Threads on the memory table: the thread's META item (owner, times, document, incarnation), its index marks
(attention for the sweeper, pending for resource scope), and erasing a thread or a whole resource.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.items import (
    FAIL,
    LIVE_THREAD_OF_R,
    META,
    OM_ATTRS,
    OMGEN,
    THREAD_ATTRS,
    WM,
    Item,
    dump_json,
    gsi_pk,
    ids_of_thread_pk,
    is_conditional_failure,
    is_live_thread,
    item_int,
    item_key,
    item_str,
    num_value,
    pending_pk,
    resource_pk,
    str_value,
    thread_doc,
    thread_pk,
    update_expression,
    utc_iso,
)
from om_lib.adapters.aws.dynamodb.table import DynamoTable
from om_lib.adapters.aws.errors import aws_errors
from om_lib.adapters.aws.s3 import resource_prefix, thread_prefix
from om_lib.errors import ThreadExistsError, ThreadNotFoundError
from om_lib.ports import AttentionItem, PendingThread, ThreadPage
from om_lib.records import Thread


class ThreadItems(DynamoTable):
    """`MemoryStore`'s thread methods on the table."""

    # =================================================================================================================
    # Threads
    # =================================================================================================================
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
        pk = thread_pk(resource_id, thread_id)
        thread = Thread(
            id=thread_id,
            resource_id=resource_id,
            title=title,
            metadata=dict(metadata or {}),
            created_at=now,
            updated_at=now,
        )
        doc_value, doc_key = self._offload_doc(thread_doc(thread), thread_prefix(resource_id, thread_id) + 'meta/')
        now_iso = utc_iso(now)
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
                Key=item_key(pk, META),
                UpdateExpression=update_expression(set_parts, remove),
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
                    ':r': str_value(resource_id),
                    ':now': str_value(now_iso),
                    ':one': num_value(1),
                    ':gpk': str_value(gsi_pk(resource_id)),
                    ':gsk': str_value(f'{now_iso}#{thread_id}'),
                    ':d': str_value(doc_key or doc_value),
                },
                ReturnValues='ALL_OLD',
            )
        except ClientError as exc:
            if doc_key is not None:
                self.blobs.delete([doc_key])
            if is_conditional_failure(exc):
                raise ThreadExistsError(thread_id) from exc
            with aws_errors():
                raise
        old = response.get('Attributes', {})
        if 'erased_at' in old:
            # A new incarnation of an erased thread: clear anything late work of the old one left behind.
            self._sweep_thread(pk, below_inc=item_int(old, 'inc', 1))
        self._clear_resource_tombstone(resource_id)
        return thread

    def get_thread(self, resource_id: str, thread_id: str) -> Thread | None:
        """See `MemoryStore.get_thread`."""
        item = self._get(thread_pk(resource_id, thread_id), META)
        if not is_live_thread(item, resource_id):
            return None
        assert item is not None
        return self._thread_from_meta(item, resource_id, thread_id, None, created=False)

    def update_thread(self, thread: Thread) -> Thread:
        """See `MemoryStore.update_thread`."""
        pk = thread_pk(thread.resource_id, thread.id)
        doc_value, doc_key = self._offload_doc(
            thread_doc(thread), thread_prefix(thread.resource_id, thread.id) + 'meta/'
        )
        names = {'#doc': 'thread_doc', '#ref': 'thread_doc_ref'}
        values: dict[str, Any] = {':r': str_value(thread.resource_id), ':u': str_value(utc_iso(thread.updated_at))}
        if doc_key is None:
            expr = 'SET #doc = :d, updated_at = :u REMOVE #ref'
            values[':d'] = str_value(doc_value)
        else:
            expr = 'SET #ref = :d, updated_at = :u REMOVE #doc'
            values[':d'] = str_value(doc_key)
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(pk, META),
                UpdateExpression=expr,
                ConditionExpression=LIVE_THREAD_OF_R,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues='ALL_OLD',
            )
        except ClientError as exc:
            if doc_key is not None:
                self.blobs.delete([doc_key])
            if is_conditional_failure(exc):
                raise ThreadNotFoundError(thread.id) from exc
            with aws_errors():
                raise
        old = response.get('Attributes', {})
        old_ref = item_str(old, 'thread_doc_ref')
        if old_ref and old_ref != doc_key:
            self.blobs.delete([old_ref])  # last write wins: the replaced document is nobody's any more
        created_at = item_str(old, 'created_at')
        return thread.model_copy(update={'created_at': datetime.fromisoformat(created_at)} if created_at else {})

    def list_threads(
        self, resource_id: str, *, limit: int = 100, cursor: str | None = None, newest_first: bool = False
    ) -> ThreadPage:
        """See `MemoryStore.list_threads`: a Query of GSI1 (keys only, eventually consistent), then BatchGetItem."""
        kwargs: dict[str, Any] = {
            'TableName': self.table_name,
            'IndexName': schema.THREADS_INDEX,
            'KeyConditionExpression': f'{schema.GSI1_PK} = :g',
            'ExpressionAttributeValues': {':g': str_value(gsi_pk(resource_id))},
            'Limit': limit,
            'ScanIndexForward': not newest_first,
        }
        if cursor:
            thread_id = cursor.split('#', 1)[1] if '#' in cursor else cursor
            kwargs['ExclusiveStartKey'] = {
                schema.GSI1_PK: str_value(gsi_pk(resource_id)),
                schema.GSI1_SK: str_value(cursor),
                schema.PK: str_value(thread_pk(resource_id, thread_id)),
                schema.SK: str_value(META),
            }
        with aws_errors():
            response = self.ddb.query(**kwargs)
        keys = response.get('Items', [])
        metas = self._batch_get([(k[schema.PK]['S'], META) for k in keys])
        threads: list[Thread] = []
        for key in keys:
            item = metas.get(key[schema.PK]['S'])
            ids = ids_of_thread_pk(key[schema.PK]['S'])
            if ids is not None and ids[0] == resource_id and is_live_thread(item, resource_id):
                thread_id = ids[1]
                assert item is not None
                threads.append(self._thread_from_meta(item, resource_id, thread_id, None, created=False))
        next_cursor = None
        if response.get('LastEvaluatedKey'):
            next_cursor = response['LastEvaluatedKey'][schema.GSI1_SK]['S']
        return ThreadPage(threads=tuple(threads), next_cursor=next_cursor)

    # =================================================================================================================
    # Index marks: pending threads (resource scope) and attention (the sweeper)
    # =================================================================================================================
    def list_pending_threads(self, resource_id: str, *, limit: int = 100) -> list[PendingThread]:
        """See `MemoryStore.list_pending_threads`: one Query of the sparse pending index (eventually consistent)."""
        with aws_errors():
            response = self.ddb.query(
                TableName=self.table_name,
                IndexName=schema.PENDING_INDEX,
                KeyConditionExpression='#ppk = :ppk',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK},
                ExpressionAttributeValues={':ppk': str_value(pending_pk(resource_id))},
                Limit=limit,
            )
        out: list[PendingThread] = []
        for item in response.get('Items', []):
            since, _, thread_id = (item_str(item, schema.PEND_SK) or '').partition('#')
            if since and thread_id:
                out.append(PendingThread(thread_id=thread_id, pending_since=datetime.fromisoformat(since)))
        return out

    def mark_pending(self, resource_id: str, thread_id: str, *, now: datetime) -> None:
        """See `MemoryStore.mark_pending` (conditional on the thread being the resource's live thread)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(thread_pk(resource_id, thread_id), META),
                UpdateExpression='SET #ppk = :ppk, #psk = if_not_exists(#psk, :psk)',
                ConditionExpression='resource_id = :r AND attribute_exists(created_at)',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK},
                ExpressionAttributeValues={
                    ':r': str_value(resource_id),
                    ':ppk': str_value(pending_pk(resource_id)),
                    ':psk': str_value(f'{utc_iso(now)}#{thread_id}'),
                },
            )
        except ClientError as exc:
            if is_conditional_failure(exc):
                return  # gone, or another resource's
            with aws_errors():
                raise

    def clear_pending(self, resource_id: str, thread_id: str, *, observed_through: int) -> bool:
        """See `MemoryStore.clear_pending` (conditional: no sequence number allocated past `observed_through`)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(thread_pk(resource_id, thread_id), META),
                UpdateExpression='REMOVE #ppk, #psk',
                # Never creates an item: a thread that is gone (or another resource's) fails the condition.
                ConditionExpression='resource_id = :r AND (attribute_not_exists(#ppk) OR next_seq <= :upto)',
                ExpressionAttributeNames={'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK},
                ExpressionAttributeValues={':r': str_value(resource_id), ':upto': num_value(observed_through)},
            )
        except ClientError as exc:
            if is_conditional_failure(exc):
                return False  # a later message (it stays pending), or the thread is gone
            with aws_errors():
                raise
        return True

    def list_attention(self, *, quiet_since: datetime, limit: int = 100) -> list[AttentionItem]:
        """See `MemoryStore.list_attention`: one Query per shard of the sparse attention index, oldest first."""
        items: list[AttentionItem] = []
        for shard in range(schema.ATTENTION_SHARDS):
            kwargs: dict[str, Any] = {
                'TableName': self.table_name,
                'IndexName': schema.ATTENTION_INDEX,
                'KeyConditionExpression': '#apk = :apk AND #ask < :quiet',
                'ExpressionAttributeNames': {'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK},
                'ExpressionAttributeValues': {
                    ':apk': str_value(f'ATTN#{shard}'),
                    ':quiet': str_value(utc_iso(quiet_since)),
                },
                'Limit': limit,
            }
            for item in self._query_all(kwargs):
                pk, mark = item_str(item, 'PK'), item_str(item, schema.ATTN_SK)
                ids = ids_of_thread_pk(pk or '')
                if not mark or ids is None or item_str(item, 'resource_id') != ids[0]:
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

    def clear_attention(self, item: AttentionItem) -> None:
        """See `MemoryStore.clear_attention` (conditional on the mark being unchanged)."""
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(thread_pk(item.resource_id, item.thread_id), META),
                UpdateExpression='REMOVE #apk, #ask',
                ConditionExpression='#ask = :mark',
                ExpressionAttributeNames={'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK},
                ExpressionAttributeValues={':mark': str_value(item.mark)},
            )
        except ClientError as exc:
            if is_conditional_failure(exc):
                return  # new activity since it was listed: it stays marked
            with aws_errors():
                raise

    # =================================================================================================================
    # Erase
    # =================================================================================================================
    def delete_thread(self, resource_id: str, thread_id: str) -> None:
        """See `MemoryStore.delete_thread`.

        The thread item becomes a tombstone first (one conditional UpdateItem that drops the thread, its OM head and
        its index keys and bumps the incarnation), so every later conditional write of the old incarnation fails;
        then every other item of the partition and every object under the thread's S3 prefix is deleted, and the
        partition is swept once more for a message whose write was in flight during the erase.
        """
        pk = thread_pk(resource_id, thread_id)
        now = self.clock.now()
        remove = ['resource_id', 'created_at', 'updated_at', 'next_seq', schema.GSI1_PK, schema.GSI1_SK]
        remove += [schema.ATTN_PK, schema.ATTN_SK, schema.PEND_PK, schema.PEND_SK]
        remove += [*THREAD_ATTRS, *OM_ATTRS]
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(pk, META),
                UpdateExpression='SET erased_at = :e, #ttl = :ttl ADD inc :one REMOVE ' + ', '.join(remove),
                ConditionExpression=LIVE_THREAD_OF_R,
                ExpressionAttributeNames={'#ttl': schema.TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ':e': str_value(utc_iso(now)),
                    ':ttl': num_value(int((now + self.tombstone_ttl).timestamp())),
                    ':one': num_value(1),
                    ':r': str_value(resource_id),
                },
                ReturnValues='ALL_NEW',
            )
        except ClientError as exc:
            if is_conditional_failure(exc):
                raise ThreadNotFoundError(thread_id) from exc
            with aws_errors():
                raise
        new_inc = item_int(response.get('Attributes', {}), 'inc', 1)
        self._sweep_thread(pk, below_inc=new_inc)
        self.blobs.delete_prefix(thread_prefix(resource_id, thread_id))
        self._sweep_thread(pk, below_inc=new_inc)

    def delete_resource(self, resource_id: str) -> None:
        """See `MemoryStore.delete_resource`: tombstone the resource, erase each of its threads, delete its prefix."""
        now = self.clock.now()
        pk = resource_pk(resource_id)
        with aws_errors():
            self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(pk, META),
                UpdateExpression='SET erased_at = :e, #ttl = :ttl REMOVE ' + ', '.join(OM_ATTRS),
                ExpressionAttributeNames={'#ttl': schema.TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ':e': str_value(utc_iso(now)),
                    ':ttl': num_value(int((now + self.tombstone_ttl).timestamp())),
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
                item_key(pk, item_str(i, schema.SK) or '')
                for prefix in (OMGEN, FAIL)  # the resource record's generations and its kept failures
                for i in self._query_all(
                    {
                        'TableName': self.table_name,
                        'KeyConditionExpression': f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
                        'ExpressionAttributeValues': {':pk': str_value(pk), ':p': str_value(prefix)},
                        'ProjectionExpression': f'{schema.PK}, {schema.SK}',
                        'ConsistentRead': True,
                    }
                )
            ]
        )
        self._delete_items([item_key(pk, WM)])
        self.blobs.delete_prefix(resource_prefix(resource_id))

    # =================================================================================================================
    # Internals: threads
    # =================================================================================================================
    def _sweep_thread(self, pk: str, *, below_inc: int) -> None:
        """Delete the items of a thread partition (not its META) that belong to an incarnation before `below_inc`."""
        stale = [
            item_key(pk, item_str(i, schema.SK) or '')
            for i in self._query_all(
                {
                    'TableName': self.table_name,
                    'KeyConditionExpression': f'{schema.PK} = :pk',
                    'ExpressionAttributeValues': {':pk': str_value(pk)},
                    'ProjectionExpression': f'{schema.PK}, {schema.SK}, inc',
                    'ConsistentRead': True,
                }
            )
            if item_str(i, schema.SK) != META and item_int(i, 'inc', 0) < below_inc
        ]
        self._delete_items(stale)

    def _clear_resource_tombstone(self, resource_id: str) -> None:
        # A new thread of an erased resource starts a new incarnation of the resource (as InMemoryStore does).
        # The tombstone holds nothing else (its OM attributes were removed by the erase), so it simply goes.
        try:
            self.ddb.delete_item(
                TableName=self.table_name,
                Key=item_key(resource_pk(resource_id), META),
                ConditionExpression='attribute_exists(erased_at) AND attribute_not_exists(om_version)',
            )
        except ClientError as exc:
            if not is_conditional_failure(exc):
                with aws_errors():
                    raise

    def _thread_from_meta(
        self, item: Item | None, resource_id: str, thread_id: str, now: datetime | None, *, created: bool
    ) -> Thread:
        item = item or {}
        doc: dict[str, Any] = {}
        if not created:
            doc_text = item_str(item, 'thread_doc')
            ref = item_str(item, 'thread_doc_ref')
            if doc_text is None and ref:
                data = self.blobs.get(ref)
                if data is None:  # replaced between our reads: the item moved on, read it again
                    fresh = self._get(thread_pk(resource_id, thread_id), META)
                    return self._thread_from_meta(fresh, resource_id, thread_id, now, created=False)
                doc_text = data.decode()
            doc = json.loads(doc_text) if doc_text else {}
        created_at = item_str(item, 'created_at') if not created else None
        updated = now or datetime.fromisoformat(item_str(item, 'updated_at') or item_str(item, 'created_at') or '')
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

    def _offload_doc(self, doc: dict[str, Any], prefix: str) -> tuple[str, str | None]:
        text = dump_json(doc)
        encoded = text.encode()
        if len(encoded) <= self.inline_head_max_bytes:
            return text, None
        key = f'{prefix}{uuid.uuid4().hex}.json'
        self.blobs.put(key, encoded, content_type='application/json')
        return text, key
