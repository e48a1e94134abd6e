"""`DynamoVectorIndex`: message vectors in the memory table, one partition per resource, no vector database.

Items (`docs/storage.md`, "Vectors"):

    PK = VEC#<resource>    SK = T#<thread>#S<space tag>#<first seq, 10 digits>

One item per indexed batch of a thread: `space` (the embedder's name), `dims`, `through` (the highest `seq` the batch
covers, so the newest item of a thread is its watermark), `n` and `v` (the batch's int8 vectors packed by
`om_lib.vectors`: ~300 bytes per message at 256 dimensions). Searching a resource is one paginated Query of its
partition (3 MB for 10,000 messages) and an exact scan in memory; searching one thread is a Query of its prefix. A
batch is written with a conditional PutItem on its key, so a repeated job never stores a message twice.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from botocore.exceptions import ClientError

from om_lib import vectors as vec
from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.dynamodb.batch import batch_write
from om_lib.adapters.aws.dynamodb.table import LazyDynamoDB
from om_lib.adapters.aws.errors import aws_errors, error_code
from om_lib.ports import VectorEntry, VectorHit

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

Item = dict[str, Any]
_BATCH_WRITE = 25
# A batch item stays far below DynamoDB's 400 KB item limit (and a rewrite after a message deletion stays cheap).
MAX_ITEM_BYTES = 64 * 1024


def space_tag(space: str) -> str:
    """A short, key-safe tag of an embedding space name."""
    return hashlib.sha256(space.encode()).hexdigest()[:8]


def _pk(resource_id: str) -> str:
    return f'VEC#{quote(resource_id, safe="")}'


def _thread_prefix(thread_id: str) -> str:
    return f'T#{quote(thread_id, safe="")}#'


def _thread_of(sk: str) -> str:
    return unquote(sk.split('#', 2)[1])


class DynamoVectorIndex(LazyDynamoDB):
    """`VectorIndex` on the memory table (see the module docstring)."""

    def __init__(self, table_name: str, *, dynamodb_client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._ddb = dynamodb_client
        self._lock = threading.Lock()

    # -- writing ------------------------------------------------------------------------------------------------
    def indexed_through(self, resource_id: str, thread_id: str, *, space: str) -> int:
        """See `VectorIndex.indexed_through`: the newest batch item's `through` (one Query, one item)."""
        with aws_errors():
            response = self.ddb.query(
                TableName=self.table_name,
                KeyConditionExpression=f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
                ExpressionAttributeValues={
                    ':pk': {'S': _pk(resource_id)},
                    ':p': {'S': f'{_thread_prefix(thread_id)}S{space_tag(space)}#'},
                },
                ProjectionExpression='through',
                ScanIndexForward=False,
                Limit=1,
                ConsistentRead=True,
            )
        items = response.get('Items') or []
        return int(items[0]['through']['N']) if items else 0

    def add(
        self, resource_id: str, thread_id: str, entries: Sequence[VectorEntry], *, through_seq: int, space: str
    ) -> bool:
        """See `VectorIndex.add`: one conditional PutItem per `MAX_ITEM_BYTES` of packed vectors."""
        packed = [vec.quantise(e.message_id, e.seq, e.vector) for e in sorted(entries, key=lambda e: e.seq)]
        chunks = _chunks(packed) or [[]]
        written = False
        for index, chunk in enumerate(chunks):
            first = chunk[0].seq if chunk else through_seq
            last = through_seq if index == len(chunks) - 1 else chunk[-1].seq
            item: Item = {
                schema.PK: {'S': _pk(resource_id)},
                schema.SK: {'S': f'{_thread_prefix(thread_id)}S{space_tag(space)}#{first:010d}'},
                'space': {'S': space},
                'dims': {'N': str(len(chunk[0].values) if chunk else 0)},
                'through': {'N': str(last)},
                'n': {'N': str(len(chunk))},
            }
            if chunk:
                item['v'] = {'B': vec.pack(chunk)}
            try:
                self.ddb.put_item(
                    TableName=self.table_name, Item=item, ConditionExpression=f'attribute_not_exists({schema.SK})'
                )
                written = True
            except ClientError as exc:
                if error_code(exc) != 'ConditionalCheckFailedException':
                    with aws_errors():
                        raise
        return written

    # -- searching ----------------------------------------------------------------------------------------------
    def search(
        self, resource_id: str, query: Sequence[float], *, space: str, top_k: int, thread_id: str | None = None
    ) -> list[VectorHit]:
        """See `VectorIndex.search`: one Query of the resource's partition (or the thread's prefix), exact top-k."""
        best = vec.top_k(query, self._entries(resource_id, space, thread_id), top_k)
        return [VectorHit(thread, entry.message_id, entry.seq, score) for score, thread, entry in best]

    def _entries(self, resource_id: str, space: str, thread_id: str | None) -> Iterator[tuple[str, vec.PackedVector]]:
        prefix = _thread_prefix(thread_id) if thread_id is not None else 'T#'
        for item in self._query(resource_id, prefix, 'SK, #s, dims, v'):
            if item.get('space', {}).get('S') != space or 'v' not in item:
                continue
            thread = _thread_of(item[schema.SK]['S'])
            for entry in vec.unpack(item['v']['B'], int(item['dims']['N'])):
                yield thread, entry

    def _query(self, resource_id: str, prefix: str, projection: str | None = None) -> Iterator[Item]:
        kwargs: dict[str, Any] = {
            'TableName': self.table_name,
            'KeyConditionExpression': f'{schema.PK} = :pk AND begins_with({schema.SK}, :p)',
            'ExpressionAttributeValues': {':pk': {'S': _pk(resource_id)}, ':p': {'S': prefix}},
        }
        if projection:
            kwargs['ProjectionExpression'] = projection
            if '#s' in projection:
                kwargs['ExpressionAttributeNames'] = {'#s': 'space'}
        start: Item | None = None
        while True:
            if start:
                kwargs['ExclusiveStartKey'] = start
            with aws_errors():
                response = self.ddb.query(**kwargs)
            yield from response.get('Items', [])
            start = response.get('LastEvaluatedKey')
            if not start:
                return

    # -- deleting -----------------------------------------------------------------------------------------------
    def delete_messages(
        self,
        resource_id: str,
        thread_id: str,
        message_ids: Sequence[str] | None,
        *,
        seqs: Sequence[int] | None = None,
    ) -> int:
        """See `VectorIndex.delete_messages`: rewrite (or delete) the batch items that held them.

        With `seqs`, the thread's batch items are listed by key and watermark only (`first seq` in the key, `through`),
        and only the items whose range holds one of them are read and rewritten: a long thread costs one keys-only
        Query, not a read of every vector.
        """
        prefix = _thread_prefix(thread_id)
        if message_ids is None:
            keys = list(self._query(resource_id, prefix, f'{schema.PK}, {schema.SK}, n'))
            self._delete([{schema.PK: i[schema.PK], schema.SK: i[schema.SK]} for i in keys])
            return sum(int(i['n']['N']) for i in keys)
        if seqs is None:
            items: Iterable[Item | None] = self._query(resource_id, prefix)
        else:
            wanted = sorted(set(seqs))
            items = (
                self._get(key)
                for key in self._query(resource_id, prefix, f'{schema.PK}, {schema.SK}, through')
                if _holds_any(key, wanted)
            )
        doomed = set(message_ids)
        removed = 0
        for item in items:
            if item is None or 'v' not in item:
                continue
            dims = int(item['dims']['N'])
            entries = list(vec.unpack(item['v']['B'], dims))
            kept = [e for e in entries if e.message_id not in doomed]
            if len(kept) == len(entries):
                continue
            removed += len(entries) - len(kept)
            # The item stays (it carries the thread's watermark), with the remaining vectors.
            updated = {**item, 'n': {'N': str(len(kept))}}
            if kept:
                updated['v'] = {'B': vec.pack(kept)}
            else:
                updated.pop('v')
            with aws_errors():
                self.ddb.put_item(TableName=self.table_name, Item=updated)
        return removed

    def _get(self, key: Item) -> Item | None:
        with aws_errors():
            response = self.ddb.get_item(
                TableName=self.table_name,
                Key={schema.PK: key[schema.PK], schema.SK: key[schema.SK]},
                ConsistentRead=True,
            )
        return response.get('Item')

    def delete_resource(self, resource_id: str) -> None:
        """See `VectorIndex.delete_resource`: Query the partition's keys, BatchWriteItem deletes."""
        self._delete(list(self._query(resource_id, 'T#', f'{schema.PK}, {schema.SK}')))

    def _delete(self, keys: Iterable[Item]) -> None:
        batch: list[Item] = []
        for key in keys:
            batch.append({'DeleteRequest': {'Key': {schema.PK: key[schema.PK], schema.SK: key[schema.SK]}}})
            if len(batch) == _BATCH_WRITE:
                self._batch_write(batch)
                batch = []
        if batch:
            self._batch_write(batch)

    def _batch_write(self, requests: list[Item]) -> None:
        batch_write(self.ddb, self.table_name, requests, what='vectors')

    def stats(self, resource_id: str) -> dict[str, int]:
        """See `VectorIndex.stats`: vectors, bytes of packed vectors, items."""
        vectors = size = items = 0
        for item in self._query(resource_id, 'T#'):
            items += 1
            vectors += int(item['n']['N'])
            size += len(item['v']['B']) if 'v' in item else 0
        return {'vectors': vectors, 'bytes': size, 'items': items}


def _holds_any(key: Item, seqs: Sequence[int]) -> bool:
    """Does the batch item (`first seq` ending its key, `through` its last) cover one of the sorted `seqs`?"""
    first = int(key[schema.SK]['S'].rsplit('#', 1)[1])
    through = int(key['through']['N'])
    index = bisect.bisect_left(seqs, first)
    return index < len(seqs) and seqs[index] <= through


def _chunks(packed: list[vec.PackedVector]) -> list[list[vec.PackedVector]]:
    chunks: list[list[vec.PackedVector]] = []
    current: list[vec.PackedVector] = []
    size = 0
    for entry in packed:
        entry_size = vec.packed_size(entry.message_id, len(entry.values))
        if current and size + entry_size > MAX_ITEM_BYTES:
            chunks.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry_size
    if current:
        chunks.append(current)
    return chunks
