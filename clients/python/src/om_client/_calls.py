"""What each API call sends and how its answer is read, shared by the sync and the async client.

`Calls` turns method arguments into a `Call` (method, path, query, JSON body, parser, retry rules). What a call or a
longer operation does on the wire (the retry loop, the presigned upload) is written once as a generator (`Flow`) that
yields `Request`s and `Sleep`s; the blocking and the async client differ only in how they carry those out. One place
knows the routes, so the two clients cannot drift apart and the OpenAPI conformance test can read every route the
client uses from here (`ROUTES`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, urlencode

import httpx

from om_client.errors import APIError, ConnectionFailed, InvalidId, error_for
from om_client.models import (
    AttachmentUpload,
    ChatResult,
    CloneResult,
    DateRange,
    Health,
    Include,
    MemoryGenerations,
    MemoryOperation,
    MemoryStatus,
    MessageLike,
    MessagesPage,
    MessagesQueryResult,
    RecallResult,
    StepResult,
    Thread,
    ThreadsPage,
    TurnResult,
    WorkingMemory,
    as_message,
)

T = TypeVar('T')

# Characters the id grammar forbids (docs/api.md, ids): they would change the URL's meaning or are not printable.
_BAD_ID_CHARS = re.compile(r'[/?#%\s\x00-\x1f\x7f]')


class _Unset:
    def __repr__(self) -> str:
        return 'UNSET'


UNSET: Any = _Unset()


# The order of a message listing: `ASC` oldest first (the default), `DESC` newest first.
Direction = Literal['ASC', 'DESC']


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before sending a request again.

    Retried: 429, 502 and 503 (such answers left nothing written), connection failures before the request was sent,
    and — for calls that are safe to repeat (every call: a message carries its client-side id, and `chat` answers a
    message once) — timeouts, broken connections and 504. Waits grow exponentially with jitter (half fixed, half
    random) up to `backoff_max_s`; a `Retry-After` header is honoured up to `max_retry_after_s`.
    """

    max_retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 60.0
    statuses: frozenset[int] = frozenset({429, 502, 503})

    def delay(self, retry: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first retry)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * (2.0**retry))
        uniform = rng.uniform if rng is not None else random.uniform
        return ceiling / 2 + uniform(0, ceiling / 2)

    def retries_status(self, status: int, idempotent: bool) -> bool:
        """Whether an answer with `status` is worth sending again."""
        return status in self.statuses or (idempotent and status == 504)

    def retries_exception(self, exc: Exception, idempotent: bool) -> bool:
        """Whether a transport failure is worth sending again."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return True  # the request never reached the server
        return idempotent and isinstance(exc, httpx.TransportError)


NO_RETRIES = RetryPolicy(max_retries=0)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    Attributes:
        idempotent: Sending it twice has the effect of sending it once (client-side ids make writes so).
        done_if_missing_on_retry: A 404 on a repeated attempt means an earlier attempt already did it (deletes).
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    body: Any = None
    idempotent: bool = True
    done_if_missing_on_retry: bool = False

    @property
    def target(self) -> str:
        """The path and query. The query is encoded here, RFC 3986 style (a space is %20, never +), because SigV4
        signs the query as sent and API Gateway checks it re-encoded that way."""
        if not self.params:
            return self.path
        return f'{self.path}?{urlencode(self.params, quote_via=quote, safe="-_.~")}'


def check_id(name: str, value: str) -> str:
    """`value` when it is a usable id; else InvalidId (nothing is sent)."""
    if not isinstance(value, str) or not value or _BAD_ID_CHARS.search(value):
        raise InvalidId(
            f'{name} {value!r} is not a valid id: ids are 1-128 characters without "/", "?", "#", "%", whitespace or '
            'control characters',
            status=None,
            details=[{'location': 'client', 'field': name, 'type': 'invalid_id', 'message': 'invalid id'}],
        )
    return value


def _seg(name: str, value: str) -> str:
    return quote(check_id(name, value), safe='')


def _none(_: Any) -> None:
    return None


def _model(cls: type[T]) -> Callable[[Any], T]:
    return cls.model_validate  # type: ignore[attr-defined, no-any-return]


def _thread(body: Any) -> Thread:
    return Thread.model_validate(body['thread'])


def _date_range(value: DateRange | Mapping[str, Any] | tuple[datetime | None, datetime | None] | None) -> Any:
    if value is None:
        return None
    if isinstance(value, tuple):
        value = DateRange(start=value[0], end=value[1])
    if isinstance(value, Mapping):
        value = DateRange.model_validate(value)
    return value.to_wire()


def _clean(body: Mapping[str, Any]) -> dict[str, Any]:
    """Drop arguments left out (None / UNSET), so the server applies its defaults."""
    return {k: v for k, v in body.items() if v is not None and v is not UNSET}


def messages_wire(messages: Iterable[MessageLike], *, role: Literal['user', 'assistant', 'tool'] = 'user') -> list[Any]:
    """Messages as the API takes them (each with its client-side id)."""
    return [as_message(m, role=role).to_wire() for m in messages]


class Calls:
    """Builds every call of the API (docs/api.md). `resource_id` defaults to the client's."""

    def __init__(self, resource_id: str | None = None) -> None:
        self.default_resource_id = resource_id

    def resource(self, resource_id: str | None) -> str:
        """The resource id to use, checked."""
        value = resource_id or self.default_resource_id
        if not value:
            raise ValueError('resource_id is required: pass resource_id=... or MemoryClient(..., resource_id=...)')
        return check_id('resourceId', value)

    # -- conversation -------------------------------------------------------------------------------------------
    def step(
        self,
        thread_id: str,
        messages: Sequence[MessageLike],
        *,
        resource_id: str | None,
        step_number: int | None,
        read_only: bool | None,
        actor_model: str | None = None,
    ) -> Call[StepResult]:
        body = {
            'resourceId': self.resource(resource_id),
            'messages': messages_wire(messages),
            'stepNumber': step_number,
            'readOnly': read_only,
            'actorModel': actor_model,
        }
        return Call('POST', f'/threads/{_seg("threadId", thread_id)}/steps', _model(StepResult), body=_clean(body))

    def turn(self, thread_id: str, messages: Sequence[MessageLike], *, resource_id: str | None) -> Call[TurnResult]:
        body = {'resourceId': self.resource(resource_id), 'messages': messages_wire(messages, role='assistant')}
        return Call('POST', f'/threads/{_seg("threadId", thread_id)}/turns', _model(TurnResult), body=body)

    def chat(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None, read_only: bool | None
    ) -> Call[ChatResult]:
        body = {
            'resourceId': self.resource(resource_id),
            'message': as_message(message).to_wire(),
            'readOnly': read_only,
        }
        # Idempotent: the message carries its client-side id, and the server answers a message once (a repeat gets
        # the stored reply, with no second Actor call).
        path = f'/threads/{_seg("threadId", thread_id)}/chat'
        return Call('POST', path, _model(ChatResult), body=_clean(body))

    def chat_stream(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None, read_only: bool | None
    ) -> Call[None]:
        body = {
            'resourceId': self.resource(resource_id),
            'message': as_message(message).to_wire(),
            'readOnly': read_only,
        }
        return Call('POST', f'/threads/{_seg("threadId", thread_id)}/chat/stream', _none, body=_clean(body))

    # -- memory and messages ------------------------------------------------------------------------------------
    def memory(self, thread_id: str, *, resource_id: str | None) -> Call[MemoryStatus]:
        params = {'resourceId': self.resource(resource_id)}
        return Call('GET', f'/threads/{_seg("threadId", thread_id)}/memory', _model(MemoryStatus), params=params)

    def memory_generations(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> Call[MemoryGenerations]:
        params = _clean({'resourceId': self.resource(resource_id), 'limit': limit})
        path = f'/threads/{_seg("threadId", thread_id)}/memory/generations'
        return Call('GET', path, _model(MemoryGenerations), params=params)

    def observe(
        self, thread_id: str, messages: Sequence[MessageLike] | None, *, resource_id: str | None
    ) -> Call[MemoryOperation]:
        imported = None
        if messages:
            imported = messages_wire(messages)
            missing = [m['id'] for m in imported if not m.get('createdAt')]
            if missing:
                raise ValueError(
                    f'imported messages need created_at (when they were said): {", ".join(missing[:5])} have none'
                )
        body = _clean({'resourceId': self.resource(resource_id), 'messages': imported})
        path = f'/threads/{_seg("threadId", thread_id)}/memory/observe'
        # Idempotent: the same import is observed once (the server keys it by content and dates), and observing the
        # thread's own messages twice finds nothing left the second time.
        return Call('POST', path, _model(MemoryOperation), body=body)

    def reflect(self, thread_id: str, *, resource_id: str | None) -> Call[MemoryOperation]:
        body = {'resourceId': self.resource(resource_id)}
        path = f'/threads/{_seg("threadId", thread_id)}/memory/reflect'
        return Call('POST', path, _model(MemoryOperation), body=body)

    def buffer(self, thread_id: str, *, resource_id: str | None) -> Call[MemoryOperation]:
        body = {'resourceId': self.resource(resource_id)}
        path = f'/threads/{_seg("threadId", thread_id)}/memory/buffer'
        return Call('POST', path, _model(MemoryOperation), body=body)

    def messages(
        self, thread_id: str, *, resource_id: str | None, page: int, per_page: int, direction: Direction = 'ASC'
    ) -> Call[MessagesPage]:
        params: dict[str, Any] = {'resourceId': self.resource(resource_id), 'page': page, 'perPage': per_page}
        if direction != 'ASC':
            params['direction'] = direction
        return Call('GET', f'/threads/{_seg("threadId", thread_id)}/messages', _model(MessagesPage), params=params)

    def query_messages(
        self,
        thread_id: str,
        *,
        resource_id: str | None,
        page: int | None,
        per_page: int | Literal[False] | None,
        date_range: Any,
        include: Sequence[Include | Mapping[str, Any] | str] | None,
        vector_search_string: str | None,
    ) -> Call[MessagesQueryResult]:
        includes = None
        if include is not None:
            includes = [
                (Include(id=i) if isinstance(i, str) else Include.model_validate(i)).to_wire()
                if not isinstance(i, Include)
                else i.to_wire()
                for i in include
            ]
        body = _clean(
            {
                'resourceId': self.resource(resource_id),
                'page': page,
                'dateRange': _date_range(date_range),
                'include': includes,
                'vectorSearchString': vector_search_string,
            }
        )
        if per_page is not None:
            body['perPage'] = per_page  # `False` means every message
        path = f'/threads/{_seg("threadId", thread_id)}/messages/query'
        return Call('POST', path, _model(MessagesQueryResult), body=body)

    def delete_messages(
        self, thread_id: str, message_ids: Sequence[str] | None, *, resource_id: str | None
    ) -> Call[None]:
        body = _clean({'resourceId': self.resource(resource_id), 'messageIds': list(message_ids or []) or None})
        return Call('DELETE', f'/threads/{_seg("threadId", thread_id)}/messages', _none, body=body)

    def recall(
        self,
        thread_id: str,
        *,
        resource_id: str | None,
        mode: str | None,
        query: str | None,
        cursor: str | None,
        page: int | None,
        limit: int | None,
        detail: str | None,
        part_index: int | None,
        before: str | None,
        after: str | None,
    ) -> Call[RecallResult]:
        body = _clean(
            {
                'resourceId': self.resource(resource_id),
                'threadId': check_id('threadId', thread_id),
                'mode': mode,
                'query': query,
                'cursor': cursor,
                'page': page,
                'limit': limit,
                'detail': detail,
                'partIndex': part_index,
                'before': before,
                'after': after,
            }
        )
        return Call('POST', '/recall', _model(RecallResult), body=body)

    # -- threads ------------------------------------------------------------------------------------------------
    def create_thread(
        self,
        *,
        resource_id: str | None,
        thread_id: str,
        title: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> Call[Thread]:
        body = _clean(
            {
                'resourceId': self.resource(resource_id),
                'id': check_id('threadId', thread_id),
                'title': title,
                'metadata': dict(metadata) if metadata is not None else None,
            }
        )
        return Call('POST', '/threads', _thread, body=body)

    def get_thread(self, thread_id: str, *, resource_id: str | None) -> Call[Thread]:
        params = {'resourceId': self.resource(resource_id)}
        return Call('GET', f'/threads/{_seg("threadId", thread_id)}', _thread, params=params)

    def update_thread(self, thread_id: str, *, resource_id: str | None, title: Any, metadata: Any) -> Call[Thread]:
        body: dict[str, Any] = {'resourceId': self.resource(resource_id)}
        if title is not UNSET:
            body['title'] = title  # None removes the title
        if metadata is not UNSET:
            body['metadata'] = dict(metadata) if metadata is not None else None
        return Call('PATCH', f'/threads/{_seg("threadId", thread_id)}', _thread, body=body)

    def clone_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None,
        new_thread_id: str,
        title: str | None,
        message_limit: int | None,
        date_range: Any,
    ) -> Call[CloneResult]:
        body = _clean(
            {
                'resourceId': self.resource(resource_id),
                'newThreadId': check_id('newThreadId', new_thread_id),
                'title': title,
                'messageLimit': message_limit,
                'dateRange': _date_range(date_range),
            }
        )
        return Call('POST', f'/threads/{_seg("threadId", thread_id)}/clone', _model(CloneResult), body=body)

    def delete_thread(self, thread_id: str, *, resource_id: str | None) -> Call[None]:
        params = {'resourceId': self.resource(resource_id)}
        path = f'/threads/{_seg("threadId", thread_id)}'
        return Call('DELETE', path, _none, params=params, done_if_missing_on_retry=True)

    def list_threads(
        self,
        *,
        resource_id: str | None,
        page: int,
        per_page: int,
        order_by: str,
        direction: str,
        metadata: Mapping[str, str] | None,
    ) -> Call[ThreadsPage]:
        resource = self.resource(resource_id)
        params: dict[str, Any] = {'page': page, 'perPage': per_page, 'orderBy': order_by, 'direction': direction}
        for key, value in (metadata or {}).items():
            params[f'metadata.{key}'] = value
        return Call('GET', f'/resources/{_seg("resourceId", resource)}/threads', _model(ThreadsPage), params=params)

    def delete_resource(self, resource_id: str | None) -> Call[None]:
        resource = self.resource(resource_id)
        return Call('DELETE', f'/resources/{_seg("resourceId", resource)}', _none)

    # -- working memory -----------------------------------------------------------------------------------------
    def get_working_memory(self, *, resource_id: str | None, thread_id: str | None) -> Call[WorkingMemory]:
        resource = self.resource(resource_id)
        if thread_id is None:
            path = f'/resources/{_seg("resourceId", resource)}/working-memory'
            return Call('GET', path, _model(WorkingMemory))
        path = f'/threads/{_seg("threadId", thread_id)}/working-memory'
        return Call('GET', path, _model(WorkingMemory), params={'resourceId': resource})

    def update_working_memory(
        self, value: str | Mapping[str, Any], *, resource_id: str | None, thread_id: str | None
    ) -> Call[WorkingMemory]:
        resource = self.resource(resource_id)
        body = {'workingMemory': value if isinstance(value, str) else dict(value), 'resourceId': resource}
        if thread_id is None:
            path = f'/resources/{_seg("resourceId", resource)}/working-memory'
        else:
            path = f'/threads/{_seg("threadId", thread_id)}/working-memory'
        return Call('PUT', path, _model(WorkingMemory), body=body)

    # -- attachments and meta -----------------------------------------------------------------------------------
    def create_attachment(
        self, thread_id: str, *, resource_id: str | None, filename: str, media_type: str, size: int
    ) -> Call[AttachmentUpload]:
        body = {
            'resourceId': self.resource(resource_id),
            'threadId': check_id('threadId', thread_id),
            'filename': filename,
            'mediaType': media_type,
            'size': size,
        }
        return Call('POST', '/attachments', _model(AttachmentUpload), body=body)

    def health(self) -> Call[Health]:
        return Call('GET', '/health', _model(Health))

    def openapi(self) -> Call[dict[str, Any]]:
        return Call('GET', '/openapi.json', dict)


# Every route the client calls (method, path template), for the conformance test against `GET /openapi.json`.
ROUTES: tuple[tuple[str, str], ...] = (
    ('POST', '/threads/{threadId}/steps'),
    ('POST', '/threads/{threadId}/turns'),
    ('POST', '/threads/{threadId}/chat'),
    ('POST', '/threads/{threadId}/chat/stream'),
    ('GET', '/threads/{threadId}/memory'),
    ('GET', '/threads/{threadId}/memory/generations'),
    ('POST', '/threads/{threadId}/memory/observe'),
    ('POST', '/threads/{threadId}/memory/reflect'),
    ('POST', '/threads/{threadId}/memory/buffer'),
    ('GET', '/threads/{threadId}/messages'),
    ('POST', '/threads/{threadId}/messages/query'),
    ('DELETE', '/threads/{threadId}/messages'),
    ('POST', '/threads'),
    ('GET', '/threads/{threadId}'),
    ('PATCH', '/threads/{threadId}'),
    ('POST', '/threads/{threadId}/clone'),
    ('DELETE', '/threads/{threadId}'),
    ('GET', '/resources/{resourceId}/threads'),
    ('DELETE', '/resources/{resourceId}'),
    ('GET', '/resources/{resourceId}/working-memory'),
    ('PUT', '/resources/{resourceId}/working-memory'),
    ('GET', '/threads/{threadId}/working-memory'),
    ('PUT', '/threads/{threadId}/working-memory'),
    ('POST', '/recall'),
    ('POST', '/attachments'),
    ('GET', '/health'),
    ('GET', '/openapi.json'),
)
# Routes the contract lists that a server may not serve yet; the client's methods for them work once it does.
NOT_YET_SERVED_OK: frozenset[tuple[str, str]] = frozenset()


def read_answer(call: Call[T], response: httpx.Response, attempt: int) -> T:
    """The parsed answer, or the exception for an error answer."""
    status = response.status_code
    if call.done_if_missing_on_retry and status == 404 and attempt > 1:
        return call.parse(None)
    if 200 <= status < 300:
        if status == 204 or not response.content:
            return call.parse(None)
        return call.parse(response.json())
    try:
        body = response.json()
    except ValueError:
        body = None
    raise error_for(status, body, headers=response.headers, text=response.text, attempts=attempt)


def connection_failed(call: Call[Any], exc: Exception, attempts: int) -> ConnectionFailed:
    """The error raised when the transport keeps failing."""
    error = ConnectionFailed(f'{call.method} {call.path} failed after {attempts} attempt(s): {exc}')
    error.__cause__ = exc
    return error


# -- sending: the retry loops, once for both clients ----------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """An HTTP request for the client to make. It answers with the `httpx.Response`, or throws the transport error
    into the flow. `upload` requests go through a plain pool: a presigned URL carries its own signature, and the API's
    credentials must not be sent to S3."""

    method: str
    url: str
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    upload: bool = False
    stream: bool = False  # answered with the response as soon as its headers are in (its body is read by the caller)

    def options(self) -> dict[str, Any]:
        """The keyword arguments of `httpx.Client.request` / `httpx.AsyncClient.request`."""
        if self.upload:
            return {'content': self.content, 'headers': dict(self.headers or {})}
        if self.json is None:
            return {'headers': dict(self.headers)} if self.headers else {}
        # The API refuses a body without `Content-Type: application/json` (415): always say so, whatever httpx does.
        return {'json': self.json, 'headers': {'Content-Type': 'application/json', **(self.headers or {})}}


@dataclass(frozen=True)
class Sleep:
    """Wait before the next attempt."""

    seconds: float


@dataclass(frozen=True)
class Finished(Generic[T]):
    """A flow's result."""

    value: T


Effect = Request | Sleep
Flow = Generator[Effect, Any, T]


def resume(flow: Flow[T], reply: Any) -> Effect | Finished[T]:
    """Hand the flow the answer to its last effect (a transport error is raised in it); its next effect, or its
    result. The first call passes None."""
    try:
        return flow.throw(reply) if isinstance(reply, BaseException) else flow.send(reply)
    except StopIteration as done:
        return Finished(done.value)


def exchange(call: Call[T], retries: RetryPolicy, rng: random.Random) -> Flow[T]:
    """Send one call, retrying per the policy; the parsed answer or the error's exception."""
    attempt = 0
    while True:
        attempt += 1
        try:
            response = yield Request(call.method, call.target, json=call.body)
        except httpx.TransportError as exc:
            if attempt > retries.max_retries or not retries.retries_exception(exc, call.idempotent):
                raise connection_failed(call, exc, attempt) from exc
            yield Sleep(retries.delay(attempt - 1, rng=rng))
            continue
        try:
            return read_answer(call, response, attempt)
        except APIError as exc:
            if attempt > retries.max_retries or not retries.retries_status(exc.status or 0, call.idempotent):
                raise
            wait = retries.delay(attempt - 1, exc.retry_after, rng=rng)
        yield Sleep(wait)


EVENT_STREAM_HEADERS = {'Accept': 'text/event-stream'}


def open_stream(call: Call[Any], retries: RetryPolicy, rng: random.Random) -> Flow[httpx.Response]:
    """Send a call whose answer streams: the open response once a 2xx arrived (retried per the policy until then:
    once the stream began, nothing is sent again), or the error's exception."""
    attempt = 0
    while True:
        attempt += 1
        try:
            response = yield Request(
                call.method, call.target, json=call.body, headers=EVENT_STREAM_HEADERS, stream=True
            )
        except httpx.TransportError as exc:
            if attempt > retries.max_retries or not retries.retries_exception(exc, call.idempotent):
                raise connection_failed(call, exc, attempt) from exc
            yield Sleep(retries.delay(attempt - 1, rng=rng))
            continue
        if 200 <= response.status_code < 300:
            opened: httpx.Response = response
            return opened
        try:
            read_answer(call, response, attempt)  # raises the error answer's exception
        except APIError as exc:
            if attempt > retries.max_retries or not retries.retries_status(exc.status or 0, call.idempotent):
                raise
            wait = retries.delay(attempt - 1, exc.retry_after, rng=rng)
        yield Sleep(wait)


def put_upload(
    url: str, content: bytes, headers: Mapping[str, str], retries: RetryPolicy, rng: random.Random
) -> Flow[None]:
    """PUT a file to a presigned URL, retrying transport failures and 5xx answers."""
    call: Call[None] = Call('PUT', url, _none)
    attempt = 0
    while True:
        attempt += 1
        try:
            response = yield Request('PUT', url, content=content, headers=headers, upload=True)
        except httpx.TransportError as exc:
            if attempt > retries.max_retries:
                raise connection_failed(call, exc, attempt) from exc
            yield Sleep(retries.delay(attempt - 1, rng=rng))
            continue
        if response.status_code < 300:
            return
        if attempt > retries.max_retries or response.status_code < 500:
            raise APIError(
                f'the attachment upload was refused ({response.status_code}): {response.text[:300]}',
                status=response.status_code,
                code='upload_failed',
                attempts=attempt,
            )
        yield Sleep(retries.delay(attempt - 1, rng=rng))
