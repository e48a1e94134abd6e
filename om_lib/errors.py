"""The one error tree of om_lib. Adapters translate vendor errors into these (`raise ... from exc`)."""

from __future__ import annotations

from typing import Any


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


class InvalidIdError(InvalidInputError):
    """A resource, thread or message id outside the id grammar (`om_lib.ids`); nothing was written."""

    code = 'invalid_id'

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(
            f"{name} {problem}; ids are 1-128 letters, digits and `_-.~()'!*:@,;=+&$<>[]{{}}|^` "
            '(UUIDs, emails and `user:123` are fine; no `/ ? # %`, spaces, control or invisible characters), in NFC'
        )
        self.name = name
        self.problem = problem


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
        super().__init__(
            f'thread {thread_id!r} was not found for this resourceId: check both ids, or create the thread first '
            '(POST /threads, or a step, turn or chat to it)'
        )
        self.thread_id = thread_id


class ThreadExistsError(StorageError):
    """The resource already has a thread with this id; nothing was written."""

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


class TurnInProgressError(StorageError):
    """Another request is answering this user message right now and did not finish while this one waited."""

    code = 'in_progress'
    retryable = True

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f'message {message_id!r} is being answered by another request; retry with the same id in a few seconds '
            'to get its reply'
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
    """Transient: overloaded, rate-limited, 5xx, timeout, network, or the model's circuit breaker is open. Worth a
    retry later or a fallback model. `retry_after_s` is the provider's `Retry-After` (or the breaker's wait)."""

    retryable = True
    code = 'model_unavailable'

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        model: str | None = None,
        retry_after_s: float | None = None,
        circuit_open: bool = False,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.model = model
        self.retry_after_s = retry_after_s
        self.circuit_open = circuit_open


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


# -- refusals of features that are off or updates that do not fit ------------------------------------------------
class WorkingMemoryDisabledError(InvalidInputError):
    """Working memory is off in the configuration (or the route's scope is not the configured one)."""

    code = 'working_memory_disabled'


class InvalidWorkingMemoryError(InvalidInputError):
    """An update that does not fit the format or the schema; nothing was written. `details` names each problem."""

    code = 'invalid_working_memory'

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.details = details or []


class WorkingMemoryTooLargeError(InvalidWorkingMemoryError):
    """The updated working memory would be larger than `MAX_WORKING_MEMORY_BYTES`."""

    code = 'too_large'


class RetrievalDisabledError(InvalidInputError):
    """The recall tool was asked for while retrieval mode is off."""

    code = 'retrieval_disabled'


class BufferingDisabledError(InvalidInputError):
    """Buffering was asked for where nothing is buffered (thread scope with `bufferTokens` and a work queue only)."""

    code = 'buffering_disabled'


class ImportTooLargeError(InvalidInputError):
    """Imported messages that one Observer call cannot hold; nothing was observed. Send them in smaller parts."""

    code = 'too_large'
