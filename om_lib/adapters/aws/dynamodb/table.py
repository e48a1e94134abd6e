"""The table and the bucket every part of `DynamoMemoryStore` works on, and the low-level item access they share:
consistent reads, paginated queries, batched gets and deletes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from om_lib.adapters.aws.dynamodb.batch import batch_get, batch_write
from om_lib.adapters.aws.dynamodb.items import BATCH_GET, BATCH_WRITE, Item, item_key
from om_lib.adapters.aws.errors import aws_errors
from om_lib.adapters.aws.s3 import S3Blobs
from om_lib.clock import SystemClock
from om_lib.ports import Clock

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client


class LazyDynamoDB:
    """A DynamoDB client given, or made on first use (boto3 is imported then, not at a cold start's import) and kept
    for warm invocations. Subclasses set `_ddb` (the given client or None) and `_lock`."""

    _ddb: DynamoDBClient | None
    _lock: threading.Lock

    @property
    def ddb(self) -> DynamoDBClient:
        """The DynamoDB client."""
        if self._ddb is None:
            with self._lock:
                if self._ddb is None:
                    import boto3

                    self._ddb = boto3.client('dynamodb')
        return self._ddb


class DynamoTable(LazyDynamoDB):
    """One memory table and its bucket; the arguments are `DynamoMemoryStore`'s (see there)."""

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

    def _get(self, pk: str, sk: str) -> Item | None:
        with aws_errors():
            response = self.ddb.get_item(TableName=self.table_name, Key=item_key(pk, sk), ConsistentRead=True)
        return response.get('Item')

    def _batch_get(self, keys: list[tuple[str, str]], *, by: str = 'PK') -> dict[str, Item]:
        out: dict[str, Item] = {}
        pending = [item_key(pk, sk) for pk, sk in dict.fromkeys(keys)]
        for start in range(0, len(pending), BATCH_GET):
            for item in batch_get(self.ddb, self.table_name, pending[start : start + BATCH_GET], what='items'):
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
            if len(batch) == BATCH_WRITE:
                self._batch_write(batch)
                batch = []
        if batch:
            self._batch_write(batch)

    def _batch_write(self, requests: list[Item]) -> None:
        batch_write(self.ddb, self.table_name, requests, what='a batch delete')
