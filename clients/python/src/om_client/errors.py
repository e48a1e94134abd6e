"""Exceptions: one class per error code of the API (CONTRACT §2 "Errors"), grouped by HTTP status.

Every error answer has the shape `{"error": {"code", "message", "details"}}`; `error_for(status, body)` picks the
class registered for `code`, or the class of the status family when the code is one this client does not know yet
(so `except NotFound` keeps working when the server adds a new 404 code).

    try:
        client.memory('t1', resource_id='me')
    except ThreadNotFound as exc:
        print(exc.code, exc.message, exc.details)
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    'APIError',
    'BadRequest',
    'Conflict',
    'ConnectionFailed',
    'DependencyUnavailable',
    'Erased',
    'Forbidden',
    'GatewayTimeout',
    'InternalError',
    'InvalidId',
    'InvalidInput',
    'InvalidJSON',
    'InvalidRequest',
    'InvalidWorkingMemory',
    'MessageConflict',
    'MethodNotAllowed',
    'ModelError',
    'ModelUnavailable',
    'NotFound',
    'OMClientError',
    'PayloadTooLarge',
    'RateLimited',
    'RetrievalDisabled',
    'ServerError',
    'ServiceUnavailable',
    'StorageUnavailable',
    'ThreadExists',
    'ThreadNotFound',
    'TooLarge',
    'Unauthenticated',
    'UnsupportedMediaType',
    'ValidationFailed',
    'VersionConflict',
    'WorkingMemoryDisabled',
    'WorkingMemoryTooLarge',
    'error_for',
]


class OMClientError(Exception):
    """Root of every error this package raises."""


class ConnectionFailed(OMClientError):
    """The API could not be reached (or the connection broke) and the retries are spent."""


class APIError(OMClientError):
    """The API answered with an error.

    Attributes:
        status: The HTTP status (None for a refusal made by this client before sending anything).
        code: The contract's snake_case error code.
        message: What was wrong and how to fix it (the server's words).
        details: Field-level details (`[{location, field, type, message}]` for validation errors).
        retry_after: Seconds the server asked to wait (`Retry-After`), when it said.
        attempts: How many times the request was sent.
    """

    status_code: ClassVar[int | None] = None
    error_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status if status is not None else self.status_code
        self.code = code or self.error_code or 'error'
        self.details = list(details or [])
        self.retry_after = retry_after
        self.attempts = attempts

    def __str__(self) -> str:
        where = f'{self.status} ' if self.status is not None else ''
        return f'{where}{self.code}: {self.message}'


# -- status families ------------------------------------------------------------------------------------------------
class BadRequest(APIError):
    """400: the request is malformed."""

    status_code = 400
    error_code = 'bad_request'


class Unauthenticated(APIError):
    """401: no identity (sign with SigV4, or send a valid bearer token)."""

    status_code = 401
    error_code = 'unauthenticated'


class Forbidden(APIError):
    """403: the identity may not act for this resourceId."""

    status_code = 403
    error_code = 'forbidden'


class NotFound(APIError):
    """404: no such route or item."""

    status_code = 404
    error_code = 'not_found'


class MethodNotAllowed(APIError):
    """405: the path exists with other methods."""

    status_code = 405
    error_code = 'method_not_allowed'


class Conflict(APIError):
    """409: a conflict that left nothing written."""

    status_code = 409
    error_code = 'conflict'


class TooLarge(APIError):
    """413: a documented size limit was passed."""

    status_code = 413
    error_code = 'too_large'


class UnsupportedMediaType(APIError):
    """415: the body is not JSON."""

    status_code = 415
    error_code = 'unsupported_media_type'


class InvalidRequest(APIError):
    """422: well-formed but invalid."""

    status_code = 422
    error_code = 'invalid_request'


class RateLimited(APIError):
    """429: throttled; retried with backoff until the retries are spent."""

    status_code = 429
    error_code = 'too_many_requests'


class ServerError(APIError):
    """5xx: the server failed."""

    status_code = 500
    error_code = 'server_error'


# -- codes ----------------------------------------------------------------------------------------------------------
class InvalidJSON(BadRequest):
    """400 `invalid_json`: the body is not a JSON object."""

    error_code = 'invalid_json'


class ThreadNotFound(NotFound):
    """404 `thread_not_found`: no such thread for this resource (a thread of another resource reads the same)."""

    error_code = 'thread_not_found'


class MessageConflict(Conflict):
    """409 `message_conflict`: a message id is stored with other content."""

    error_code = 'message_conflict'


class ThreadExists(Conflict):
    """409 `thread_exists`: the thread id is taken."""

    error_code = 'thread_exists'


class VersionConflict(Conflict):
    """409 `version_conflict`: another request changed this memory at the same time; retry."""

    error_code = 'version_conflict'


class Erased(Conflict):
    """409 `erased`: the thread or resource was erased while the request ran."""

    error_code = 'erased'


class PayloadTooLarge(TooLarge):
    """413 `payload_too_large`: the body, a list or an attachment is over its limit."""

    error_code = 'payload_too_large'


class WorkingMemoryTooLarge(TooLarge):
    """413 `working_memory_too_large`."""

    error_code = 'working_memory_too_large'


class ValidationFailed(InvalidRequest):
    """422 `validation_error`: fields are invalid (see `details` for each)."""

    error_code = 'validation_error'


class InvalidId(InvalidRequest):
    """422 `invalid_id`: a resource, thread or message id outside the id grammar."""

    error_code = 'invalid_id'


class InvalidInput(InvalidRequest):
    """422 `invalid_input`: a value the service cannot use (a cursor, a page, a date...)."""

    error_code = 'invalid_input'


class RetrievalDisabled(InvalidRequest):
    """422 `retrieval_disabled`: recall needs `retrieval` in the server's OM configuration."""

    error_code = 'retrieval_disabled'


class WorkingMemoryDisabled(InvalidRequest):
    """422 `working_memory_disabled`: working memory is off in the server's configuration."""

    error_code = 'working_memory_disabled'


class InvalidWorkingMemory(InvalidRequest):
    """422 `invalid_working_memory`: the update does not match the template or schema."""

    error_code = 'invalid_working_memory'


class InternalError(ServerError):
    """500 `internal_error`."""

    error_code = 'internal_error'


class ModelError(ServerError):
    """502 `model_error`: the language model refused or failed the request."""

    status_code = 502
    error_code = 'model_error'


class DependencyUnavailable(ServerError):
    """502 `dependency_unavailable`: API Gateway could not reach the function."""

    status_code = 502
    error_code = 'dependency_unavailable'


class ServiceUnavailable(ServerError):
    """503: a model or dependency is unavailable right now; nothing was written."""

    status_code = 503
    error_code = 'service_unavailable'


class ModelUnavailable(ServiceUnavailable):
    """503 `model_unavailable`."""

    error_code = 'model_unavailable'


class StorageUnavailable(ServiceUnavailable):
    """503 `storage_unavailable`."""

    error_code = 'storage_unavailable'


class GatewayTimeout(ServerError):
    """504 `timeout`: API Gateway stopped waiting for the function."""

    status_code = 504
    error_code = 'timeout'


def _registry() -> dict[str, type[APIError]]:
    found: dict[str, type[APIError]] = {}
    pending: list[type[APIError]] = [APIError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.error_code and cls.__module__ == __name__:
            found.setdefault(cls.error_code, cls)
    return found


BY_CODE: dict[str, type[APIError]] = _registry()
BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    415: UnsupportedMediaType,
    422: InvalidRequest,
    429: RateLimited,
    500: InternalError,
    502: ServerError,
    503: ServiceUnavailable,
    504: GatewayTimeout,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for(
    status: int, body: Any, *, headers: Mapping[str, str] | None = None, text: str = '', attempts: int = 1
) -> APIError:
    """The exception for an error answer: by `error.code` first, else by status (else `APIError`)."""
    error = body.get('error') if isinstance(body, dict) else None
    code = message = None
    details: list[dict[str, Any]] = []
    if isinstance(error, dict):
        code = error.get('code') if isinstance(error.get('code'), str) else None
        message = error.get('message') if isinstance(error.get('message'), str) else None
        raw_details = error.get('details')
        if isinstance(raw_details, list):
            details = [d if isinstance(d, dict) else {'message': str(d)} for d in raw_details]
    cls = BY_CODE.get(code or '') or BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    retry_after = parse_retry_after((headers or {}).get('retry-after'))
    fallback = text.strip()[:500] or f'HTTP {status}'
    return cls(
        message or fallback,
        status=status,
        code=code,
        details=details,
        retry_after=retry_after,
        attempts=attempts,
    )
