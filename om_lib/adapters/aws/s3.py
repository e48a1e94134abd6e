"""S3 I/O for the memory store: offloaded values, attachments, and the `BlobReader` that reads them back.

Keys are per resource (`<resource>/...`) so that erasing a resource is one prefix delete and a reader can refuse a URL
of another resource by its key alone. Every object is written with server-side encryption set explicitly (SSE-S3 by
default, SSE-KMS when a key is given), whatever the bucket's default is.

The decision of *what* to offload lives in the store; this module only moves bytes.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, unquote_plus

from botocore.exceptions import ClientError

from om_lib.adapters.aws.errors import aws_errors, error_code
from om_lib.uploads import Upload

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_MISSING = {'NoSuchKey', '404', 'NotFound'}


def _segment(value: str) -> str:
    # Ids are free text; quoting keeps `/` inside an id from opening a new "folder" (and a prefix collision).
    return quote(value, safe='')


def resource_prefix(resource_id: str) -> str:
    """The key prefix of everything stored for a resource (ends with `/`)."""
    return f'{_segment(resource_id)}/'


def thread_prefix(resource_id: str, thread_id: str) -> str:
    """The key prefix of everything stored for one thread of a resource (ends with `/`)."""
    return f'{resource_prefix(resource_id)}threads/{_segment(thread_id)}/'


# `<resource>/threads/<thread>/attachments/<incarnation>-<unique>/<filename>`: the segments are quoted (no `/`), the
# incarnation (om_lib.uploads) says which thread of that id the URL was issued for. Keys written before it was
# recorded have `<unique>` alone.
ATTACHMENTS = 'attachments'
ATTACHMENT_KEY_PATTERN = f'*/threads/*/{ATTACHMENTS}/*'
_UPLOAD_DIR = re.compile(r'(?:(?P<incarnation>\d{8}T\d{12}Z)-)?[0-9a-f]{32}')


def attachment_key(upload: Upload, filename: str, unique: str) -> str:
    """The object key of a new attachment (the filename is kept, quoted, for downloads and the model's benefit)."""
    folder = f'{upload.incarnation}-{unique}' if upload.incarnation else unique
    return f'{thread_prefix(upload.resource_id, upload.thread_id)}{ATTACHMENTS}/{folder}/{quote(filename, safe="._-")}'


def notified_key(key: str) -> str:
    """An object key as an S3 notification carried it: URL-encoded in some (every key of ours has a `/`, an encoded
    one has none), as is in others."""
    return unquote_plus(key) if '/' not in key and '%2F' in key.upper() else key


def parse_attachment_key(key: str) -> Upload | None:
    """Whose attachment an object key is, or None for any other key."""
    parts = key.split('/')
    if len(parts) < 6 or parts[1] != 'threads' or parts[3] != ATTACHMENTS:
        return None
    folder = _UPLOAD_DIR.fullmatch(parts[4])
    if folder is None or not parts[0] or not parts[2]:
        return None
    return Upload(unquote(parts[0]), unquote(parts[2]), folder['incarnation'])


class S3Blobs:
    """Bytes in one bucket, with SSE on every write, prefix deletes and a small cache of immutable objects.

    Args:
        bucket: The bucket name.
        s3_client: A low-level S3 client; created on first use when omitted (honours `AWS_ENDPOINT_URL`).
        sse: `AES256` (SSE-S3) or `aws:kms`.
        kms_key_id: The KMS key for `aws:kms` (the bucket's default KMS key when omitted).
        cache_bytes: Budget of the in-process cache. Only immutable objects are cached (the store never rewrites a
            key with other content), so a warm Lambda reads an unchanged observation log from memory.
    """

    def __init__(
        self,
        bucket: str,
        *,
        s3_client: S3Client | None = None,
        sse: str = 'AES256',
        kms_key_id: str | None = None,
        cache_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.bucket = bucket
        self._client = s3_client
        self._sse = sse
        self._kms_key_id = kms_key_id
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_size = 0
        self._cache_budget = cache_bytes
        self._lock = threading.Lock()

    @property
    def client(self) -> S3Client:
        """The S3 client (created lazily, then kept for warm invocations)."""
        if self._client is None:
            import boto3

            self._client = boto3.client('s3')
        return self._client

    def url(self, key: str) -> str:
        """The `s3://bucket/key` URL of a key."""
        return f's3://{self.bucket}/{key}'

    def key_of(self, url: str) -> str | None:
        """The key of an `s3://` URL in this bucket, or None for anything else."""
        prefix = f's3://{self.bucket}/'
        if not url.startswith(prefix) or len(url) == len(prefix):
            return None
        return url[len(prefix) :]

    def put(self, key: str, data: bytes, *, content_type: str = 'application/octet-stream') -> None:
        """Write an object (encrypted). Idempotent for content-addressed keys."""
        extra: dict[str, Any] = {'ServerSideEncryption': self._sse}
        if self._kms_key_id:
            extra['SSEKMSKeyId'] = self._kms_key_id
        with aws_errors():
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type, **extra)
        self._remember(key, data)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes; None when it is missing or larger than `max_bytes`."""
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
        if cached is not None:
            return None if max_bytes is not None and len(cached) > max_bytes else cached
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                return None
            with aws_errors():
                raise
        body = response['Body']
        try:
            if max_bytes is not None and int(response.get('ContentLength', 0)) > max_bytes:
                return None  # refuse before reading: the size is known from the headers
            with aws_errors():
                data = body.read()
        finally:
            body.close()
        self._remember(key, data)
        return data

    def delete(self, keys: list[str]) -> None:
        """Delete objects (missing ones are fine)."""
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            with self._lock:
                for key in chunk:
                    self._forget(key)
            if chunk:
                with aws_errors():
                    self.client.delete_objects(
                        Bucket=self.bucket, Delete={'Objects': [{'Key': k} for k in chunk], 'Quiet': True}
                    )

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many were deleted."""
        deleted = 0
        with aws_errors():
            paginator = self.client.get_paginator('list_objects_v2')
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                keys = [obj['Key'] for obj in page.get('Contents', [])]
                self.delete(keys)
                deleted += len(keys)
        return deleted

    def _remember(self, key: str, data: bytes) -> None:
        if len(data) > self._cache_budget // 4:
            return
        with self._lock:
            self._forget(key)
            self._cache[key] = data
            self._cache_size += len(data)
            while self._cache_size > self._cache_budget:
                _, old = self._cache.popitem(last=False)
                self._cache_size -= len(old)

    def _forget(self, key: str) -> None:
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_size -= len(old)


class S3BlobReader:
    """`BlobReader` over the store's bucket: reads `s3://` attachment URLs back for inline model input.

    It refuses (answers None) URLs of another bucket and, when a resource is given, keys outside that resource's
    prefix, so one resource's request can never pull another resource's attachment into a prompt.

    Args:
        bucket: The bucket the store writes attachments to.
        s3_client: A low-level S3 client; created on first use when omitted.
        resource_id: When set, only this resource's objects are readable (see also `scoped`).
    """

    def __init__(self, bucket: str, *, s3_client: S3Client | None = None, resource_id: str | None = None) -> None:
        self._blobs = S3Blobs(bucket, s3_client=s3_client, cache_bytes=0)
        self._resource_id = resource_id

    def scoped(self, resource_id: str) -> S3BlobReader:
        """A reader limited to one resource's objects (sharing this reader's client)."""
        reader = S3BlobReader(self._blobs.bucket, resource_id=resource_id)
        reader._blobs = self._blobs
        return reader

    def read(self, url: str, *, max_bytes: int, resource_id: str | None = None) -> bytes | None:
        """See `BlobReader.read`. `resource_id` narrows the readable keys further for this call."""
        key = self._blobs.key_of(url)
        if key is None:
            return None
        for owner in (self._resource_id, resource_id):
            if owner is not None and not key.startswith(resource_prefix(owner)):
                return None
        return self._blobs.get(key, max_bytes=max_bytes)
