"""Messages on the memory table: `MSG#` items ordered by `seq` (LSI1), `GAP#` placeholders for sequence numbers
that will never hold a message, large bodies and inline attachment data in S3.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.items import (
    BATCH_WRITE,
    GAP,
    MAX_READ_ATTEMPTS,
    META,
    MSG,
    Item,
    attention_pk,
    current_incarnation,
    dedupe,
    dump_json,
    epoch_ms,
    gap_item,
    gsi_pk,
    has_inline_data,
    is_conditional_failure,
    is_live_thread,
    is_message_of,
    item_int,
    item_key,
    item_str,
    num_value,
    pending_pk,
    str_value,
    thread_pk,
    update_expression,
    utc_iso,
)
from om_lib.adapters.aws.dynamodb.records import RecordItems
from om_lib.adapters.aws.dynamodb.threads import ThreadItems
from om_lib.adapters.aws.errors import aws_errors, error_code
from om_lib.adapters.aws.s3 import thread_prefix
from om_lib.errors import InvalidInputError, MessageConflictError, StorageError, ThreadNotFoundError
from om_lib.messages import FilePart, ImagePart, Message
from om_lib.ports import AppendResult, MessagePage
from om_lib.records import OMRecord

logger = logging.getLogger(__name__)


class MessageItems(ThreadItems, RecordItems):
    """`MemoryStore`'s message methods on the table (an append also creates the thread and reads the head)."""

    # =================================================================================================================
    # Messages
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
        unique = dedupe(messages)
        hashes = {m.id: m.content_hash() for m in unique}
        pk = thread_pk(resource_id, thread_id)
        reusable: dict[str, Item] = {}
        if len(unique) > 1 or any(has_inline_data(m) for m in unique):
            # Check the whole batch before writing any of it, so a conflict anywhere writes nothing.
            meta, known = self._precheck(pk, [m.id for m in unique])
            if meta is not None and item_str(meta, 'resource_id') not in (None, resource_id):
                raise ThreadNotFoundError(thread_id)
            current_inc = item_int(meta or {}, 'inc', 1)
            for message_id, stored in known.items():
                if item_int(stored, 'inc', 1) != current_inc:
                    continue  # left by an erased incarnation: not a stored message of this thread
                if item_str(stored, 'hash') != hashes[message_id]:
                    raise MessageConflictError(message_id)
                reusable[message_id] = stored
        count = len(unique) - len(reusable)
        old = self._allocate(pk, resource_id, thread_id, count, now, mark_pending=mark_pending)
        inc = item_int(old, 'inc', 1) if old else 1
        first_seq = item_int(old, 'next_seq') + 1 if old else 1
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
            if record is None and old and 'om_version' in old and item_str(old, 'om_key') == key:
                record = self.get_record(key)  # its S3 document was replaced since: read the head again
        return AppendResult(
            thread=thread,
            messages=ordered,
            created_ids=tuple(created),
            record=record,
            record_included=include_record,
        )

    def get_messages(self, resource_id: str, thread_id: str, ids: Sequence[str]) -> list[Message]:
        """See `MemoryStore.get_messages`: one BatchGetItem (META + the ids; 100 keys per call)."""
        unique = list(dict.fromkeys(ids))
        if not unique:
            return []
        meta, found = self._precheck(thread_pk(resource_id, thread_id), unique)
        if not is_live_thread(meta, resource_id):
            return []
        assert meta is not None
        inc = item_int(meta, 'inc', 1)
        items = [i for i in found.values() if is_message_of(i, resource_id) and item_int(i, 'inc', 1) == inc]
        items.sort(key=lambda i: item_int(i, schema.SEQ))
        return [self._message_from_item(i, resource_id, thread_id) for i in items]

    def delete_messages(self, resource_id: str, thread_id: str, message_ids: Sequence[str] | None) -> int:
        """See `MemoryStore.delete_messages`.

        GetItem META (ownership), then the messages: BatchGetItem by id, or (clearing) a Query of the `MSG#` items.
        Every deleted seq first gets a `GAP#` placeholder (BatchWriteItem), then the `MSG#` items are deleted
        (BatchWriteItem), so an ordered read never waits on a hole a deletion left. Offloaded bodies are deleted from
        S3 unless another message of the thread still points at the same (content-addressed) object.
        """
        pk = thread_pk(resource_id, thread_id)
        meta = self._get(pk, META)
        if not is_live_thread(meta, resource_id):
            raise ThreadNotFoundError(thread_id)
        assert meta is not None
        inc = item_int(meta, 'inc', 1)
        if message_ids is None:
            items = list(self._query_messages_keys(pk))
        else:
            unique = list(dict.fromkeys(message_ids))
            if not unique:
                return 0
            items = list(self._batch_get([(pk, MSG + i) for i in unique], by='SK').values())
        items = [i for i in items if is_message_of(i, resource_id) and item_int(i, 'inc', 1) == inc]
        if not items:
            return 0
        now_ms = epoch_ms(self.clock.now())
        gaps = {
            item_int(i, schema.SEQ): {
                'PutRequest': {'Item': gap_item(pk, inc, item_int(i, schema.SEQ), resource_id, now_ms)}
            }
            for i in items
        }
        requests = list(gaps.values())
        for start in range(0, len(requests), BATCH_WRITE):
            self._batch_write(requests[start : start + BATCH_WRITE])
        self._delete_items([item_key(pk, item_str(i, schema.SK) or '') for i in items])
        refs = {ref for i in items if (ref := item_str(i, 'body_ref'))}
        if refs and message_ids is not None:
            refs -= {ref for i in self._query_messages_keys(pk) if (ref := item_str(i, 'body_ref'))}
        if refs:
            self.blobs.delete(sorted(refs))
        return len(items)

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
        pk = thread_pk(resource_id, thread_id)
        low = after_seq + 1
        high = before_seq - 1 if before_seq is not None else None
        if high is not None and high < low:
            return MessagePage(messages=(), has_more=False)
        values: dict[str, Any] = {':pk': str_value(pk), ':lo': num_value(low)}
        condition = f'{schema.PK} = :pk AND #seq >= :lo'
        if high is not None:
            condition = f'{schema.PK} = :pk AND #seq BETWEEN :lo AND :hi'
            values[':hi'] = num_value(high)
        raw: list[Item] = []
        start_key: Item | None = None
        exhausted = False
        while True:
            want = limit + 1 - sum(1 for i in raw if is_message_of(i, resource_id))
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
            if sum(1 for i in raw if is_message_of(i, resource_id)) > limit:
                break
        items = current_incarnation([i for i in raw if item_str(i, 'resource_id') == resource_id])
        if not newest_first:
            # A seq can hold both a message and a placeholder (a retracted write); the message must be seen first.
            items.sort(
                key=lambda i: (item_int(i, schema.SEQ), 0 if (item_str(i, schema.SK) or '').startswith(MSG) else 1)
            )
        if not items:
            return MessagePage(messages=(), has_more=False)
        visible: list[Item] = []
        stopped = False
        if newest_first:
            visible = [i for i in items if (item_str(i, schema.SK) or '').startswith(MSG)]
        else:
            expected = low
            grace_ms = int(self.gap_grace.total_seconds() * 1000)
            now_ms = epoch_ms(self.clock.now())
            for item in items:
                seq = item_int(item, schema.SEQ)
                if seq < expected:
                    continue
                if seq > expected and now_ms - item_int(item, 'written_at') < grace_ms:
                    stopped = True  # a message may still be on its way into the hole: read nothing past it
                    break
                expected = seq + 1
                if item_str(item, schema.SK).startswith(MSG):  # type: ignore[union-attr]
                    visible.append(item)
        has_more = len(visible) > limit or (not exhausted and not stopped)
        page = tuple(self._message_from_item(i, resource_id, thread_id) for i in visible[:limit])
        return MessagePage(messages=page, has_more=has_more)

    # =================================================================================================================
    # Internals: messages
    # =================================================================================================================
    def _query_messages_keys(self, pk: str) -> Iterator[Item]:
        """Every `MSG#` item of a thread partition, projected to what deletion needs."""
        return self._query_all(
            {
                'TableName': self.table_name,
                'KeyConditionExpression': '#pk = :pk AND begins_with(#sk, :m)',
                'ProjectionExpression': '#pk, #sk, #seq, inc, resource_id, body_ref',
                'ExpressionAttributeNames': {'#pk': schema.PK, '#sk': schema.SK, '#seq': schema.SEQ},
                'ExpressionAttributeValues': {':pk': str_value(pk), ':m': str_value(MSG)},
                'ConsistentRead': True,
            }
        )

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
        now_iso = utc_iso(now)
        names = {'#gpk': schema.GSI1_PK, '#gsk': schema.GSI1_SK, '#ttl': schema.TTL_ATTRIBUTE}
        values = {
            ':r': str_value(resource_id),
            ':now': str_value(now_iso),
            ':one': num_value(1),
            ':n': num_value(count),
            ':gpk': str_value(gsi_pk(resource_id)),
            ':gsk': str_value(f'{now_iso}#{thread_id}'),
        }
        activity = 'updated_at = if_not_exists(updated_at, :now)'
        if count > 0:
            names |= {'#apk': schema.ATTN_PK, '#ask': schema.ATTN_SK}
            values |= {':apk': str_value(attention_pk(pk)), ':ask': str_value(now_iso)}
            activity = 'updated_at = :now, #apk = :apk, #ask = :ask'
            if mark_pending:
                # Resource scope: list the thread among the resource's pending ones, keeping when it first became so.
                names |= {'#ppk': schema.PEND_PK, '#psk': schema.PEND_SK}
                values |= {':ppk': str_value(pending_pk(resource_id)), ':psk': str_value(f'{now_iso}#{thread_id}')}
                activity += ', #ppk = :ppk, #psk = if_not_exists(#psk, :psk)'
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(pk, META),
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
            if is_conditional_failure(exc):
                raise ThreadNotFoundError(thread_id) from exc
            with aws_errors():
                raise
        return response.get('Attributes', {})

    def _message_item(
        self, pk: str, prefix: str, message: Message, digest: str, resource_id: str, seq: int, inc: int
    ) -> Item:
        parts = [self._upload_inline_data(p, prefix) for p in message.parts]
        body = dump_json(
            {
                'parts': parts,
                'tokenCounts': message.token_counts.model_dump(mode='json', by_alias=True)
                if message.token_counts
                else None,
            }
        )
        item: Item = {
            **item_key(pk, MSG + message.id),
            schema.SEQ: num_value(seq),
            'inc': num_value(inc),
            'id': str_value(message.id),
            'role': str_value(message.role),
            'created_at': str_value(utc_iso(message.created_at)),
            'hash': str_value(digest),
            'resource_id': str_value(resource_id),
            'written_at': num_value(epoch_ms(self.clock.now())),
        }
        encoded = body.encode()
        if len(encoded) > self.offload_threshold_bytes:
            # Content-addressed: a retry of the same message writes the same object.
            key = f'{prefix}msg/{hashlib.sha256(encoded).hexdigest()}.json'
            self.blobs.put(key, encoded, content_type='application/json')
            item['body_ref'] = str_value(key)
        else:
            item['body'] = str_value(body)
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
        for _ in range(MAX_READ_ATTEMPTS):
            try:
                with_condition = 'attribute_not_exists(SK)'
                self.ddb.put_item(TableName=self.table_name, Item=item, ConditionExpression=with_condition)
                return None
            except ClientError as exc:
                if not is_conditional_failure(exc):
                    with aws_errors():
                        raise
            existing = self._get(pk, MSG + message_id)
            if existing is None:
                continue  # retracted or swept in between: try again
            if item_int(existing, 'inc', 1) < inc:
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
                    if not is_conditional_failure(exc):
                        with aws_errors():
                            raise
                    continue
            if item_str(existing, 'hash') != digest:
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
        values: dict[str, Any] = {':ours': num_value(item_int(old, 'next_seq') + count), ':inc': num_value(inc)}
        try:
            if not old:
                # This call created the item: remove it, unless something else was stored on it since.
                self.ddb.delete_item(
                    TableName=self.table_name,
                    Key=item_key(pk, META),
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
                Key=item_key(pk, META),
                UpdateExpression=update_expression(set_parts, remove),
                ConditionExpression='next_seq = :ours AND inc = :inc',
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
            return True
        except ClientError as exc:
            if not is_conditional_failure(exc):
                logger.warning('could not undo a sequence allocation', extra={'pk': pk, 'error': error_code(exc)})
            return False

    def _put_gap(self, pk: str, inc: int, seq: int, resource_id: str) -> None:
        with aws_errors():
            self.ddb.put_item(
                TableName=self.table_name,
                Item={
                    **item_key(pk, f'{GAP}{inc:06d}#{seq:012d}'),
                    schema.SEQ: num_value(seq),
                    'inc': num_value(inc),
                    'gap': {'BOOL': True},
                    'written_at': num_value(epoch_ms(self.clock.now())),
                    'resource_id': str_value(resource_id),
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
                Key=item_key(pk, MSG + message_id),
                ConditionExpression='#seq = :s AND inc = :i',
                ExpressionAttributeNames={'#seq': schema.SEQ},
                ExpressionAttributeValues={':s': num_value(seq), ':i': num_value(inc)},
            )
        except ClientError as exc:
            if not is_conditional_failure(exc):
                with aws_errors():
                    raise
        self._put_gap(pk, inc, seq, resource_id)

    def _message_from_item(self, item: Item, resource_id: str, thread_id: str) -> Message:
        body_text = item_str(item, 'body')
        if body_text is None:
            ref = item_str(item, 'body_ref') or ''
            data = self.blobs.get(ref)
            if data is None:
                raise StorageError(f'message {item_str(item, "id")!r}: its stored content is missing')
            body_text = data.decode()
        body = json.loads(body_text)
        parts = [{k: v for k, v in p.items() if v is not None} for p in body['parts']]
        payload: dict[str, Any] = {
            'id': item_str(item, 'id'),
            'role': item_str(item, 'role'),
            'createdAt': item_str(item, 'created_at'),
            'parts': parts,
            'threadId': thread_id,
            'resourceId': resource_id,
            'seq': item_int(item, schema.SEQ),
        }
        if body.get('tokenCounts') is not None:
            payload['tokenCounts'] = body['tokenCounts']
        return Message.model_validate(payload)
