"""Exceptions: one class per error code of the API (docs/api.md, "Errors"), grouped by HTTP status.

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
    'BufferingDisabled',
    'Conflict',
    'ConnectionFailed',
    'DependencyUnavailable',
    'Erased',
    'Forbidden',
    'GatewayTimeout',
    'HostNotAllowed',
    'InProgress',
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
    'OriginNotAllowed',
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


# The class of each error code, filled in as the classes below are declared.
BY_CODE: dict[str, type[APIError]] = {}


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

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        """`class ThreadNotFound(NotFound, code='thread_not_found')`: the class raised for that code (and status)."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status_code = status
        if code is not None:
            cls.error_code = code
            if cls.__module__ == __name__:  # the API's own codes; a subclass made elsewhere does not take one over
                BY_CODE.setdefault(code, cls)

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
class BadRequest(APIError, status=400, code='bad_request'):
    """400: the request is malformed."""


class Unauthenticated(APIError, status=401, code='unauthenticated'):
    """401: no identity (sign with SigV4, or send a valid bearer token)."""


class Forbidden(APIError, status=403, code='forbidden'):
    """403: the identity may not act for this resourceId."""


class NotFound(APIError, status=404, code='not_found'):
    """404: no such route or item."""


class MethodNotAllowed(APIError, status=405, code='method_not_allowed'):
    """405: the path exists with other methods."""


class HostNotAllowed(APIError, status=421, code='host_not_allowed'):
    """421 `host_not_allowed`: `om serve` does not answer for the Host the request named (start it with
    `--allowed-host NAME` to serve that name too)."""


class Conflict(APIError, status=409, code='conflict'):
    """409: a conflict that left nothing written."""


class TooLarge(APIError, status=413, code='too_large'):
    """413: a documented size limit was passed."""


class UnsupportedMediaType(APIError, status=415, code='unsupported_media_type'):
    """415: the body is not JSON."""


class InvalidRequest(APIError, status=422, code='invalid_request'):
    """422: well-formed but invalid."""


class RateLimited(APIError, status=429, code='too_many_requests'):
    """429: throttled; retried with backoff until the retries are spent."""


class ServerError(APIError, status=500, code='server_error'):
    """5xx: the server failed."""


# -- codes ----------------------------------------------------------------------------------------------------------
class InvalidJSON(BadRequest, code='invalid_json'):
    """400 `invalid_json`: the body is not a JSON object."""


class OriginNotAllowed(Forbidden, code='origin_not_allowed'):
    """403 `origin_not_allowed`: a web page of an origin the API does not allow tried to change data (browsers only)."""


class ThreadNotFound(NotFound, code='thread_not_found'):
    """404 `thread_not_found`: no such thread for this resource (a thread of another resource reads the same)."""


class MessageConflict(Conflict, code='message_conflict'):
    """409 `message_conflict`: a message id is stored with other content."""


class InProgress(Conflict, code='in_progress'):
    """409 `in_progress`: another request is answering this message; send it again (same id) to get its reply."""


class ThreadExists(Conflict, code='thread_exists'):
    """409 `thread_exists`: the thread id is taken."""


class VersionConflict(Conflict, code='version_conflict'):
    """409 `version_conflict`: another request changed this memory at the same time; retry."""


class Erased(Conflict, code='erased'):
    """409 `erased`: the thread or resource was erased while the request ran."""


class PayloadTooLarge(TooLarge, code='payload_too_large'):
    """413 `payload_too_large`: the body, a list or an attachment is over its limit."""


class WorkingMemoryTooLarge(TooLarge, code='working_memory_too_large'):
    """413 `working_memory_too_large`."""


class ValidationFailed(InvalidRequest, code='validation_error'):
    """422 `validation_error`: fields are invalid (see `details` for each)."""


class InvalidId(InvalidRequest, code='invalid_id'):
    """422 `invalid_id`: a resource, thread or message id outside the id grammar."""


class InvalidInput(InvalidRequest, code='invalid_input'):
    """422 `invalid_input`: a value the service cannot use (a cursor, a page, a date...)."""


class RetrievalDisabled(InvalidRequest, code='retrieval_disabled'):
    """422 `retrieval_disabled`: recall needs `retrieval` in the server's OM configuration."""


class BufferingDisabled(InvalidRequest, code='buffering_disabled'):
    """422 `buffering_disabled`: `buffer` needs observations buffered (thread scope with `observation.bufferTokens`);
    observe instead."""


class WorkingMemoryDisabled(InvalidRequest, code='working_memory_disabled'):
    """422 `working_memory_disabled`: working memory is off in the server's configuration."""


class InvalidWorkingMemory(InvalidRequest, code='invalid_working_memory'):
    """422 `invalid_working_memory`: the update does not match the template or schema."""


class InternalError(ServerError, code='internal_error'):
    """500 `internal_error`."""


class ModelError(ServerError, status=502, code='model_error'):
    """502 `model_error`: the language model refused or failed the request."""


class DependencyUnavailable(ServerError, status=502, code='dependency_unavailable'):
    """502 `dependency_unavailable`: API Gateway could not reach the function."""


class ServiceUnavailable(ServerError, status=503, code='service_unavailable'):
    """503: a model or dependency is unavailable right now; nothing was written."""


class ModelUnavailable(ServiceUnavailable, code='model_unavailable'):
    """503 `model_unavailable`."""


class StorageUnavailable(ServiceUnavailable, code='storage_unavailable'):
    """503 `storage_unavailable`."""


class GatewayTimeout(ServerError, status=504, code='timeout'):
    """504 `timeout`: API Gateway stopped waiting for the function."""


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
