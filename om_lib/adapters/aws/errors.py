"""AWS SDK errors translated into om_lib's error tree, in one table (STYLE §3).

Conditional-check failures are not in the table: each call site knows what a lost condition means there
(a version conflict, a missing thread, an erased key) and handles it before anything reaches `aws_errors`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError

from om_lib.errors import StorageError


class StorageUnavailableError(StorageError):
    """AWS throttled the request or failed transiently; the request may be retried as is."""

    code = 'storage_unavailable'
    retryable = True


class StorageRequestError(StorageError):
    """AWS refused the request itself (missing table or bucket, bad argument, too large); retrying will not help."""

    code = 'storage_request_error'
    retryable = False


# error code -> om_lib error class. Anything not listed is a StorageError (retryable: the safe default for
# idempotent writes).
_TABLE: dict[str, type[StorageError]] = {
    'ProvisionedThroughputExceededException': StorageUnavailableError,
    'ThrottlingException': StorageUnavailableError,
    'RequestLimitExceeded': StorageUnavailableError,
    'InternalServerError': StorageUnavailableError,
    'ServiceUnavailable': StorageUnavailableError,
    'SlowDown': StorageUnavailableError,
    'InternalError': StorageUnavailableError,
    'ResourceNotFoundException': StorageRequestError,
    'NoSuchBucket': StorageRequestError,
    'ValidationException': StorageRequestError,
    'ItemCollectionSizeLimitExceededException': StorageRequestError,
    'AccessDeniedException': StorageRequestError,
    'AccessDenied': StorageRequestError,
    'EntityTooLarge': StorageRequestError,
}


def error_code(exc: ClientError) -> str:
    """The AWS error code of a ClientError ('' when absent)."""
    return str(exc.response.get('Error', {}).get('Code', ''))


def translate(exc: ClientError | BotoCoreError) -> StorageError:
    """The om_lib error for an SDK error."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        cls = _TABLE.get(code, StorageError)
        return cls(f'AWS {code or "error"}: {exc}')
    return StorageUnavailableError(f'AWS request failed: {exc}')


@contextmanager
def aws_errors() -> Iterator[None]:
    """Re-raise SDK errors as om_lib StorageErrors (`raise ... from exc`)."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc) from exc
