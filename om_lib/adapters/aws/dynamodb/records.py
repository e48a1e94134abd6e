"""OM records on the memory table: the head on the key's META item (`om_*` attributes, optimistic lock
`om_version`), retired generations as `OMGEN#` items, the large fields inline or in S3.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.items import (
    BIG_FIELDS,
    MAX_READ_ATTEMPTS,
    META,
    OM_ATTRS,
    OM_OPTIONAL_FIELDS,
    OMGEN,
    BigFields,
    HeadTarget,
    Item,
    dump_json,
    is_conditional_failure,
    item_int,
    item_key,
    item_str,
    num_value,
    str_value,
    target_of,
    targets_of,
    update_expression,
)
from om_lib.adapters.aws.dynamodb.table import DynamoTable
from om_lib.adapters.aws.errors import aws_errors
from om_lib.errors import ErasedError, StorageError, VersionConflictError
from om_lib.records import OMRecord


class RecordItems(DynamoTable):
    """`MemoryStore`'s OM-record methods on the table."""

    # =================================================================================================================
    # OM records
    # =================================================================================================================
    def get_record(self, key: str) -> OMRecord | None:
        """See `MemoryStore.get_record`."""
        for target in targets_of(key):
            for _ in range(MAX_READ_ATTEMPTS):
                item = self._get(target.pk, META)
                if not item or item_str(item, 'om_key') != key:
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
        target = target_of(record)
        new_version = 1 if expected_version is None else expected_version + 1
        stored = record.model_copy(update={'version': new_version})
        reuse = self._big_refs.get((record.key, expected_version)) if expected_version is not None else None
        big = self._offload_big(stored, target, reuse)
        values, set_parts, remove = self._om_update(stored, big)
        if target.thread_id is not None:
            # A record created before its thread claims the thread id for its resource.
            set_parts.append('resource_id = if_not_exists(resource_id, :r)')
        if target.thread_id is not None or expected_version is None:
            values[':r'] = str_value(record.resource_id)
        if expected_version is None:
            condition = (
                'attribute_not_exists(om_version) AND attribute_not_exists(erased_at) '
                'AND (attribute_not_exists(resource_id) OR resource_id = :r)'
            )
        else:
            condition = 'om_version = :ev AND om_id = :id AND om_generation = :g AND om_key = :k'
            values[':ev'] = num_value(expected_version)
        try:
            response = self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(target.pk, META),
                UpdateExpression=update_expression(set_parts, remove),
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValues='UPDATED_OLD',
                ReturnValuesOnConditionCheckFailure='ALL_OLD',
            )
        except ClientError as exc:
            self._head_write_failed(exc, target, record.key, expected_version, big)
        old_ref = item_str(response.get('Attributes', {}), 'om_big_ref')
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
        target = target_of(new)
        head = self._get(target.pk, META)
        if head is not None and 'erased_at' in head:
            raise ErasedError(f'{new.key} was erased; late work is dropped')
        if (
            head is None
            or item_str(head, 'om_key') != new.key
            or item_int(head, 'om_version', -1) != expected_version
            or new.generation != item_int(head, 'om_generation') + 1
        ):
            raise VersionConflictError(new.key, expected_version)
        archive = {name: value for name, value in head.items() if name in OM_ATTRS}
        archive_key = item_key(target.pk, f'{OMGEN}{item_int(head, "om_generation"):010d}')
        archive.update(archive_key)
        archive['inc'] = num_value(item_int(head, 'inc', 0))
        with aws_errors():
            self.ddb.put_item(TableName=self.table_name, Item=archive)
        stored = new.model_copy(update={'version': expected_version + 1})
        big = self._offload_big(stored, target, None)
        values, set_parts, remove = self._om_update(stored, big)
        values[':ev'] = num_value(expected_version)
        values[':og'] = num_value(item_int(head, 'om_generation'))
        try:
            with_condition = 'om_version = :ev AND om_generation = :og AND om_key = :k'
            self.ddb.update_item(
                TableName=self.table_name,
                Key=item_key(target.pk, META),
                UpdateExpression=update_expression(set_parts, remove),
                ConditionExpression=with_condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure='ALL_OLD',
            )
        except ClientError as exc:
            # An erase that won the race takes the archive just written with it.
            self._head_write_failed(exc, target, new.key, expected_version, big, erased_leftovers=[archive_key])
        self._remember_big(stored.key, stored.version, big)
        return stored

    def _head_write_failed(
        self,
        exc: ClientError,
        target: HeadTarget,
        key: str,
        expected_version: int | None,
        big: BigFields,
        *,
        erased_leftovers: Sequence[Item] = (),
    ) -> NoReturn:
        """A conditional write of the head did not happen: drop the S3 document it uploaded, then say why — the key
        was erased (`erased_leftovers` are deleted too), another writer won (`VersionConflictError`), or AWS failed."""
        if big.uploaded:
            self.blobs.delete([big.uploaded])
        if is_conditional_failure(exc):
            current = cast('Mapping[str, Any] | None', exc.response.get('Item')) or self._get(target.pk, META)
            if current and 'erased_at' in current:
                if erased_leftovers:
                    self._delete_items(list(erased_leftovers))
                raise ErasedError(f'{key} was erased; late work is dropped') from exc
            raise VersionConflictError(key, expected_version) from exc
        with aws_errors():
            raise exc

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
                ':pk': str_value(target.pk),
                ':lo': str_value(f'{OMGEN}{0:010d}'),
                ':hi': str_value(f'{OMGEN}{upper - 1:010d}'),
            },
            'ScanIndexForward': False,
            'ConsistentRead': True,
            'Limit': limit + 1,
        }
        for item in self._query_all(kwargs):
            if len(out) >= limit:
                break
            if item_str(item, 'om_key') != key:
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
        archive_key = item_key(target.pk, f'{OMGEN}{record.generation:010d}')
        old = self._get(target.pk, f'{OMGEN}{record.generation:010d}')
        if not old or item_str(old, 'om_key') != record.key:
            return
        stored = record.model_copy(update={'version': item_int(old, 'om_version')})
        big = self._offload_big(stored, target, None)
        values, set_parts, remove = self._om_update(stored, big)
        try:
            self.ddb.update_item(
                TableName=self.table_name,
                Key=archive_key,
                UpdateExpression=update_expression(set_parts, remove),
                ConditionExpression='om_key = :k AND om_generation = :g',
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if big.uploaded:
                self.blobs.delete([big.uploaded])
            if is_conditional_failure(exc):
                return  # deleted meanwhile (the thread was erased, or the generation dropped)
            with aws_errors():
                raise
        old_ref = item_str(old, 'om_big_ref')
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
        items = [item for item in found.values() if item_str(item, 'om_key') == key]
        self._delete_items([item_key(target.pk, item_str(item, schema.SK) or '') for item in items])
        self.blobs.delete([ref for item in items if (ref := item_str(item, 'om_big_ref'))])

    @staticmethod
    def _target_of_head(head: OMRecord) -> HeadTarget:
        return targets_of(head.key)[0] if head.thread_id is None else target_of(head)

    # =================================================================================================================
    # Internals: OM records
    # =================================================================================================================
    def _offload_big(self, record: OMRecord, target: HeadTarget, reuse: tuple[str, str] | None) -> BigFields:
        """The record's large fields, inline or in S3 (uploaded by this call unless `reuse` already holds them)."""
        big = dump_json(record.model_dump(mode='json', include=set(BIG_FIELDS)))
        encoded = big.encode()
        if len(encoded) <= self.inline_head_max_bytes:
            return BigFields(inline=big, key=None, uploaded=None, digest='')
        digest = hashlib.sha256(encoded).hexdigest()
        if reuse is not None and reuse[0] == digest:
            # Only small fields changed (a lease): keep pointing at the same document.
            return BigFields(inline=None, key=reuse[1], uploaded=None, digest=digest)
        # A fresh name per write (not content-addressed): a replaced document is deleted, and no later write can
        # ever point at a deleted name again.
        key = f'{target.prefix}om/{record.id}/{record.version:08d}-{uuid.uuid4().hex}.json'
        self.blobs.put(key, encoded, content_type='application/json')
        return BigFields(inline=None, key=key, uploaded=key, digest=digest)

    def _remember_big(self, key: str, version: int, big: BigFields) -> None:
        if big.key is None:
            return
        with self._lock:
            if len(self._big_refs) > 1024:
                self._big_refs.clear()  # a bound, not an LRU: the entries are only an optimisation
            self._big_refs[(key, version)] = (big.digest, big.key)

    def _om_update(self, record: OMRecord, big: BigFields) -> tuple[dict[str, Any], list[str], list[str]]:
        # Optional fields at an empty default are left out (they read back as their defaults): every byte counts
        # against the write units of each step's record write.
        empty = {name for name in OM_OPTIONAL_FIELDS if getattr(record, name) in (None, ())}
        small = dump_json(record.model_dump(mode='json', exclude={*BIG_FIELDS, 'version', *empty}))
        values: dict[str, Any] = {
            ':k': str_value(record.key),
            ':id': str_value(record.id),
            ':v': num_value(record.version),
            ':g': num_value(record.generation),
            ':small': str_value(small),
        }
        set_parts = ['om_key = :k', 'om_id = :id', 'om_version = :v', 'om_generation = :g', 'om_small = :small']
        if big.key is None:
            values[':big'] = str_value(big.inline or '')
            set_parts.append('om_big = :big')
            remove = ['om_big_ref']
        else:
            values[':big'] = str_value(big.key)
            set_parts.append('om_big_ref = :big')
            remove = ['om_big']
        return values, set_parts, remove

    def _record_from_item(self, item: Item, key: str) -> OMRecord | None:
        """The record in an item, or None when its S3 document is gone (replaced since the item was read)."""
        if 'om_version' not in item or item_str(item, 'om_key') != key:
            return None
        big_text = item_str(item, 'om_big')
        ref = item_str(item, 'om_big_ref')
        if big_text is None and ref:
            data = self.blobs.get(ref)
            if data is None:
                return None
            big_text = data.decode()
        fields = json.loads(item_str(item, 'om_small') or '{}')
        fields.update(json.loads(big_text or '{}'))
        fields['version'] = item_int(item, 'om_version')
        record = OMRecord.model_validate(fields)
        if ref and big_text is not None:
            digest = hashlib.sha256(big_text.encode()).hexdigest()
            self._remember_big(key, record.version, BigFields(inline=None, key=ref, uploaded=None, digest=digest))
        return record
