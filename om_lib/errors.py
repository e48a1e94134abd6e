"""The one error tree of om_lib. Adapters translate vendor errors into these (`raise ... from exc`)."""

from __future__ import annotations


class OMError(Exception):
    """Root of every error om_lib raises on purpose."""

    retryable: bool = False
    code: str = 'om_error'


class ConfigError(OMError, ValueError):
    """The configuration document is invalid."""

    code = 'invalid_config'


class InvalidInputError(OMError, ValueError):
    """A request was well-formed but invalid; nothing was written."""

    code = 'invalid_input'


class StorageError(OMError):
    """The store failed."""

    code = 'storage_error'
    retryable = True


class NotFoundError(StorageError):
    """A thing does not exist (or belongs to another resource, which reads the same)."""

    code = 'not_found'
    retryable = False


class ThreadNotFoundError(NotFoundError):
    """The thread does not exist for this resource."""

    code = 'thread_not_found'

    def __init__(self, thread_id: str) -> None:
        super().__init__(f'thread {thread_id!r} was not found for this resourceId')
        self.thread_id = thread_id


class ThreadExistsError(StorageError):
    """A thread with this id already exists (for this or another resource); nothing was written."""

    code = 'thread_exists'
    retryable = False

    def __init__(self, thread_id: str) -> None:
        super().__init__(f'thread {thread_id!r} already exists; choose another id or omit it to get a new one')
        self.thread_id = thread_id


class MessageConflictError(StorageError):
    """A message id is already stored with different content; nothing was written."""

    code = 'message_conflict'
    retryable = False

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f'message {message_id!r} is already stored with different content; stored messages are immutable, '
            'send new content under a new id'
        )
        self.message_id = message_id


class VersionConflictError(StorageError):
    """A conditional write lost to a concurrent writer."""

    code = 'version_conflict'

    def __init__(self, key: str, expected_version: int | None) -> None:
        super().__init__(f'record {key!r} changed concurrently (expected version {expected_version})')
        self.key = key
        self.expected_version = expected_version


class ErasedError(StorageError):
    """The thread or resource was erased; late background work must not write it back."""

    code = 'erased'
    retryable = False


class ModelError(OMError):
    """A language-model call failed."""

    code = 'model_error'


class ModelUnavailableError(ModelError):
    """Transient: overloaded, rate-limited, 5xx, timeout, network. Worth a retry or a fallback model."""

    retryable = True
    code = 'model_unavailable'

    def __init__(self, message: str, *, status_code: int | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.model = model


class ModelThrottledError(ModelUnavailableError):
    """Transient: the provider's rate limit or quota (HTTP 429). The workflow waits longer before retrying these."""

    code = 'model_throttled'


class ModelOutputError(ModelError):
    """The model answered, but the answer is unusable (empty, blocked, degenerate, malformed)."""

    code = 'model_output_error'

    def __init__(self, message: str, *, model: str | None = None, finish_reason: str | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.finish_reason = finish_reason


class ModelRequestError(ModelError):
    """Permanent: the request itself was refused (bad key, bad argument, unknown model)."""

    code = 'model_request_error'

    def __init__(self, message: str, *, status_code: int | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.model = model


class DeadlineExceededError(ModelError):
    """The path's single deadline passed before a usable answer arrived."""

    retryable = True
    code = 'deadline_exceeded'
