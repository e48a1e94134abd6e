"""`MemoryClient` and `AsyncMemoryClient`: every route of the Observational Memory API (docs/api.md).

    from om_client import MemoryClient, Message

    url = 'https://abc123.execute-api.eu-west-1.amazonaws.com/prod'
    with MemoryClient(url, auth='iam', resource_id='user-42') as om:
        step = om.step('t1', [Message.user('I moved to Lisbon.')])   # before every model call
        ...                                                           # call your model with step.system + step.messages
        om.turn('t1', [Message.assistant('Noted!')])                  # after the turn

Messages get their ids here, so a write that is sent again (a retry, or your own) changes nothing on the server.
Calls are retried on 429/502/503 and connection failures with backoff and jitter (see `RetryPolicy`). Errors raise
the class of their code (`ThreadNotFound`, `MessageConflict`, `RateLimited`, ...; see `om_client.errors`).
"""

from __future__ import annotations

import asyncio
import mimetypes
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

import httpx

from om_client._calls import (
    UNSET,
    Call,
    Calls,
    Direction,
    Effect,
    Finished,
    Flow,
    RetryPolicy,
    Sleep,
    exchange,
    open_stream,
    put_upload,
    resume,
)
from om_client._version import __version__
from om_client.auth import AuthLike, resolve_auth
from om_client.errors import ThreadExists
from om_client.models import (
    AttachmentUpload,
    ChatResult,
    CloneResult,
    DateRange,
    FilePart,
    Health,
    ImagePart,
    Include,
    MemoryGenerations,
    MemoryOperation,
    MemoryStatus,
    Message,
    MessageLike,
    MessagesPage,
    MessagesQueryResult,
    RecallResult,
    StepResult,
    Thread,
    ThreadsPage,
    TurnResult,
    WorkingMemory,
)
from om_client.streaming import StreamChunk, achunks_of_lines, chunks_of_lines

__all__ = ['AsyncMemoryClient', 'MemoryClient']

T = TypeVar('T')
DEFAULT_TIMEOUT = httpx.Timeout(35.0, connect=5.0)  # API Gateway gives up on an integration after ~29 s
UPLOAD_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
DateRangeLike = DateRange | Mapping[str, Any] | tuple[Any, Any] | None
IncludeLike = Include | Mapping[str, Any] | str


def _new_thread_id() -> str:
    return str(uuid.uuid4())


def _upload_headers(upload: AttachmentUpload, media_type: str) -> dict[str, str]:
    """The headers the presigned PUT was signed with (Content-Length is set by httpx from the body)."""
    headers = {'Content-Type': media_type}
    signed = parse_qs(urlsplit(upload.upload_url).query).get('X-Amz-SignedHeaders', [''])[0].split(';')
    if 'x-amz-server-side-encryption' in signed:
        headers['x-amz-server-side-encryption'] = 'AES256'
    return headers


def _attachment_part(upload: AttachmentUpload, filename: str, media_type: str, size: int) -> ImagePart | FilePart:
    if media_type.startswith('image/'):
        return ImagePart(url=upload.url, media_type=media_type, filename=filename, size=size)
    return FilePart(url=upload.url, media_type=media_type, filename=filename, size=size)


def _read_upload(data: bytes | Path | str, filename: str | None) -> tuple[bytes, str]:
    if isinstance(data, bytes | bytearray):
        if not filename:
            raise ValueError('filename is required when uploading bytes')
        return bytes(data), filename
    path = Path(data)
    return path.read_bytes(), filename or path.name


def _media_type(filename: str, media_type: str | None) -> str:
    return media_type or mimetypes.guess_type(filename)[0] or 'application/octet-stream'


class _Base:
    def __init__(
        self,
        api_url: str,
        *,
        resource_id: str | None,
        auth: AuthLike,
        region: str | None,
        timeout: float | httpx.Timeout | None,
        retries: RetryPolicy | int | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        if not api_url or not api_url.startswith(('http://', 'https://')):
            raise ValueError(
                f'api_url must be an http(s) URL (the API stage URL, or http://127.0.0.1:8787), not {api_url!r}'
            )
        self.api_url = api_url.rstrip('/')
        self.calls = Calls(resource_id)
        self.auth = resolve_auth(auth, self.api_url, region=region)
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout or 35.0, connect=5.0)
        if isinstance(retries, int):
            retries = RetryPolicy(max_retries=retries)
        self.retries = retries or RetryPolicy()
        self.headers = {'User-Agent': f'om-client/{__version__}', 'Accept': 'application/json', **dict(headers or {})}
        self._rng = random.Random()

    @property
    def resource_id(self) -> str | None:
        """The default resource id of calls that take `resource_id`."""
        return self.calls.default_resource_id

    # What the methods that take more than one call do, as flows both clients run (see `om_client._calls`).
    def _exchange(self, call: Call[T]) -> Flow[T]:
        return exchange(call, self.retries, self._rng)

    def _create_thread(
        self, *, resource_id: str | None, thread_id: str | None, title: str | None, metadata: Mapping[str, Any] | None
    ) -> Flow[Thread]:
        generated = thread_id is None
        thread_id = thread_id or _new_thread_id()
        call = self.calls.create_thread(resource_id=resource_id, thread_id=thread_id, title=title, metadata=metadata)
        try:
            return (yield from self._exchange(call))
        except ThreadExists as exc:
            if generated and exc.attempts > 1:  # an earlier attempt created it and its answer was lost
                return (yield from self._exchange(self.calls.get_thread(thread_id, resource_id=resource_id)))
            raise

    def _clone_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None,
        new_thread_id: str | None,
        title: str | None,
        message_limit: int | None,
        date_range: DateRangeLike,
    ) -> Flow[CloneResult]:
        generated = new_thread_id is None
        new_thread_id = new_thread_id or _new_thread_id()
        call = self.calls.clone_thread(
            thread_id,
            resource_id=resource_id,
            new_thread_id=new_thread_id,
            title=title,
            message_limit=message_limit,
            date_range=date_range,
        )
        try:
            return (yield from self._exchange(call))
        except ThreadExists as exc:
            if generated and exc.attempts > 1:  # an earlier attempt cloned it and its answer was lost
                thread = yield from self._exchange(self.calls.get_thread(new_thread_id, resource_id=resource_id))
                messages = yield from self._all_messages(new_thread_id, resource_id=resource_id)
                return CloneResult(thread=thread, cloned_messages=messages)
            raise

    def _all_messages(self, thread_id: str, *, resource_id: str | None) -> Flow[list[Message]]:
        found: list[Message] = []
        page = 0
        while True:
            call = self.calls.messages(thread_id, resource_id=resource_id, page=page, per_page=1000)
            result = yield from self._exchange(call)
            found.extend(result.messages)
            if not result.has_more:
                return found
            page += 1

    def _upload_attachment(
        self,
        thread_id: str,
        data: bytes | Path | str,
        *,
        filename: str | None,
        media_type: str | None,
        resource_id: str | None,
    ) -> Flow[ImagePart | FilePart]:
        content, name = _read_upload(data, filename)
        kind = _media_type(name, media_type)
        call = self.calls.create_attachment(
            thread_id, resource_id=resource_id, filename=name, media_type=kind, size=len(content)
        )
        upload = yield from self._exchange(call)
        yield from put_upload(upload.upload_url, content, _upload_headers(upload, kind), self.retries, self._rng)
        return _attachment_part(upload, name, kind, len(content))


class MemoryClient(_Base):
    """The API over HTTP, blocking (httpx). Thread-safe; use one per process and close it (or use `with`).

    Args:
        api_url: The API's base URL (the stage URL of API Gateway, or `http://127.0.0.1:8787` for `om serve`).
        resource_id: Default `resource_id` of every call (the user or tenant whose memory this is).
        auth: `'none'`, `'iam'` (SigV4 with the default credential chain), or an `httpx.Auth` (`BearerAuth(...)`,
            `IAMAuth(region=...)`).
        region: The AWS region for `'iam'` when the URL does not name one (custom domains).
        timeout: Seconds per request (default 35), or an `httpx.Timeout`.
        retries: A `RetryPolicy`, or the number of retries (0 turns them off).
        headers: Extra headers on every request.
        transport: An httpx transport (tests, proxies).
        sleep: How to wait between retries (tests).
    """

    def __init__(
        self,
        api_url: str,
        *,
        resource_id: str | None = None,
        auth: AuthLike = 'none',
        region: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        retries: RetryPolicy | int | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            api_url,
            resource_id=resource_id,
            auth=auth,
            region=region,
            timeout=timeout,
            retries=retries,
            headers=headers,
        )
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.api_url, auth=self.auth, timeout=self.timeout, headers=self.headers, transport=transport
        )
        self._uploads: httpx.Client | None = None
        self._transport = transport

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pools."""
        self._http.close()
        if self._uploads is not None:
            self._uploads.close()

    def send(self, call: Call[T]) -> T:
        """Send one call, retrying per the policy; the parsed answer or the error's exception."""
        return self._run(self._exchange(call))

    def _run(self, flow: Flow[T]) -> T:
        reply: Any = None
        while not isinstance(effect := resume(flow, reply), Finished):
            reply = self._carry_out(effect)
        return effect.value

    def _carry_out(self, effect: Effect) -> httpx.Response | httpx.TransportError | None:
        if isinstance(effect, Sleep):
            self._sleep(effect.seconds)
            return None
        pool = self._http
        if effect.upload:  # a plain pool: the presigned URL carries its own signature, our credentials stay here
            pool = self._uploads = self._uploads or httpx.Client(timeout=UPLOAD_TIMEOUT, transport=self._transport)
        try:
            if effect.stream:
                response = pool.send(pool.build_request(effect.method, effect.url, **effect.options()), stream=True)
                if not 200 <= response.status_code < 300:
                    response.read()  # an error answer is read whole (its body says what was wrong)
                    response.close()
                return response
            return pool.request(effect.method, effect.url, **effect.options())
        except httpx.TransportError as exc:
            return exc

    # -- conversation -------------------------------------------------------------------------------------------
    def step(
        self,
        thread_id: str,
        messages: Sequence[MessageLike] = (),
        *,
        resource_id: str | None = None,
        step_number: int | None = None,
        read_only: bool | None = None,
        actor_model: str | None = None,
    ) -> StepResult:
        """Save a step's new input (plain strings are user messages) and get the Actor's context. `actor_model`
        (`provider/model`): the model your Actor calls, which `activateAfterIdle: "auto"` and
        `activateOnProviderChange` use."""
        return self.send(
            self.calls.step(
                thread_id,
                messages,
                resource_id=resource_id,
                step_number=step_number,
                read_only=read_only,
                actor_model=actor_model,
            )
        )

    def turn(self, thread_id: str, messages: Sequence[MessageLike], *, resource_id: str | None = None) -> TurnResult:
        """Save a turn's outputs (plain strings are assistant messages); schedules background work when due."""
        return self.send(self.calls.turn(thread_id, messages, resource_id=resource_id))

    def chat_stream(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None = None, read_only: bool | None = None
    ) -> Iterator[StreamChunk]:
        """Send a user message and read the turn as it happens: typed chunks of the UI message stream (the memory's
        `DataChunk`s, then the reply's `TextDelta`s, ...; see `om_client.streaming`).

        The request goes out when iteration starts. Retried per the policy until the stream begins; a stream cut
        short can be asked for again with the same message, whose stored reply then streams back.
        """
        call = self.calls.chat_stream(thread_id, message, resource_id=resource_id, read_only=read_only)
        response: httpx.Response = self._run(open_stream(call, self.retries, self._rng))
        try:
            yield from chunks_of_lines(response.iter_lines())
        finally:
            response.close()

    def chat(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None = None, read_only: bool | None = None
    ) -> ChatResult:
        """Send a user message and get the server Actor's reply (steps + Actor + turns in one call)."""
        return self.send(self.calls.chat(thread_id, message, resource_id=resource_id, read_only=read_only))

    # -- memory and messages ------------------------------------------------------------------------------------
    def memory(self, thread_id: str, *, resource_id: str | None = None) -> MemoryStatus:
        """The thread's observational memory: observations, token counts, thresholds, current task."""
        return self.send(self.calls.memory(thread_id, resource_id=resource_id))

    def memory_generations(
        self, thread_id: str, *, resource_id: str | None = None, limit: int | None = None
    ) -> MemoryGenerations:
        """The memory's generations, newest first: the current one, then the earlier ones (`limit` at most)."""
        return self.send(self.calls.memory_generations(thread_id, resource_id=resource_id, limit=limit))

    def observe(
        self, thread_id: str, messages: Sequence[MessageLike] | None = None, *, resource_id: str | None = None
    ) -> MemoryOperation:
        """Observe now: the thread's unobserved messages (below the threshold too), or, with `messages`, history
        imported from another system (each with its `created_at`), observed into the thread's memory without being
        added to its messages. The same import twice is observed once."""
        return self.send(self.calls.observe(thread_id, messages, resource_id=resource_id))

    def reflect(self, thread_id: str, *, resource_id: str | None = None) -> MemoryOperation:
        """Reflect the memory now (below the threshold too); a log just reflected is left alone."""
        return self.send(self.calls.reflect(thread_id, resource_id=resource_id))

    def buffer(self, thread_id: str, *, resource_id: str | None = None) -> MemoryOperation:
        """Buffer the thread's unbuffered messages now, as one chunk (thread scope with buffering on; else
        `BufferingDisabled`)."""
        return self.send(self.calls.buffer(thread_id, resource_id=resource_id))

    def messages(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        page: int = 0,
        per_page: int = 100,
        direction: Direction = 'ASC',
    ) -> MessagesPage:
        """A page of the thread's stored messages, oldest first (`direction='DESC'`: newest first)."""
        call = self.calls.messages(
            thread_id, resource_id=resource_id, page=page, per_page=per_page, direction=direction
        )
        return self.send(call)

    def iter_messages(
        self, thread_id: str, *, resource_id: str | None = None, per_page: int = 1000
    ) -> Iterator[Message]:
        """Every stored message of the thread, oldest first (pages fetched as needed)."""
        page = 0
        while True:
            result = self.messages(thread_id, resource_id=resource_id, page=page, per_page=per_page)
            yield from result.messages
            if not result.has_more:
                return
            page += 1

    def query_messages(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        page: int | None = None,
        per_page: int | Literal[False] | None = None,
        date_range: DateRangeLike = None,
        include: Sequence[IncludeLike] | None = None,
        vector_search_string: str | None = None,
    ) -> MessagesQueryResult:
        """The seed's `recall()` query: a page, a date range, messages by id with neighbours, a vector search."""
        return self.send(
            self.calls.query_messages(
                thread_id,
                resource_id=resource_id,
                page=page,
                per_page=per_page,
                date_range=date_range,
                include=include,
                vector_search_string=vector_search_string,
            )
        )

    def delete_messages(
        self, thread_id: str, message_ids: Sequence[str] | None = None, *, resource_id: str | None = None
    ) -> None:
        """Delete messages by id, or every message of the thread when `message_ids` is None."""
        self.send(self.calls.delete_messages(thread_id, message_ids, resource_id=resource_id))

    def recall(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        mode: str | None = None,
        query: str | None = None,
        cursor: str | None = None,
        page: int | None = None,
        limit: int | None = None,
        detail: str | None = None,
        part_index: int | None = None,
        before: str | None = None,
        after: str | None = None,
    ) -> RecallResult:
        """The recall tool: page raw history (`mode='messages'`), list threads (`'threads'`), search (`'search'`)."""
        return self.send(
            self.calls.recall(
                thread_id,
                resource_id=resource_id,
                mode=mode,
                query=query,
                cursor=cursor,
                page=page,
                limit=limit,
                detail=detail,
                part_index=part_index,
                before=before,
                after=after,
            )
        )

    # -- threads ------------------------------------------------------------------------------------------------
    def create_thread(
        self,
        *,
        resource_id: str | None = None,
        thread_id: str | None = None,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Thread:
        """Create an empty thread (its id is generated here when not given, so a retry cannot make two)."""
        return self._run(
            self._create_thread(resource_id=resource_id, thread_id=thread_id, title=title, metadata=metadata)
        )

    def get_thread(self, thread_id: str, *, resource_id: str | None = None) -> Thread:
        """A thread."""
        return self.send(self.calls.get_thread(thread_id, resource_id=resource_id))

    def update_thread(
        self, thread_id: str, *, resource_id: str | None = None, title: Any = UNSET, metadata: Any = UNSET
    ) -> Thread:
        """Change the title (None removes it) and/or replace the metadata; what is left out stays. A title set here
        is pinned: generated titles never replace it; None un-pins."""
        return self.send(self.calls.update_thread(thread_id, resource_id=resource_id, title=title, metadata=metadata))

    def clone_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        new_thread_id: str | None = None,
        title: str | None = None,
        message_limit: int | None = None,
        date_range: DateRangeLike = None,
    ) -> CloneResult:
        """Copy a thread (the newest `message_limit` messages, or a date range) into a new one."""
        return self._run(
            self._clone_thread(
                thread_id,
                resource_id=resource_id,
                new_thread_id=new_thread_id,
                title=title,
                message_limit=message_limit,
                date_range=date_range,
            )
        )

    def delete_thread(self, thread_id: str, *, resource_id: str | None = None) -> None:
        """Erase a thread: messages, observations, vectors and attachments."""
        self.send(self.calls.delete_thread(thread_id, resource_id=resource_id))

    def list_threads(
        self,
        *,
        resource_id: str | None = None,
        page: int = 0,
        per_page: int = 100,
        order_by: Literal['createdAt', 'updatedAt'] = 'createdAt',
        direction: Literal['ASC', 'DESC'] = 'DESC',
        metadata: Mapping[str, str] | None = None,
    ) -> ThreadsPage:
        """A page of the resource's threads (filter with `metadata={key: value}`)."""
        return self.send(
            self.calls.list_threads(
                resource_id=resource_id,
                page=page,
                per_page=per_page,
                order_by=order_by,
                direction=direction,
                metadata=metadata,
            )
        )

    def delete_resource(self, resource_id: str | None = None) -> None:
        """Erase everything stored for the resource."""
        self.send(self.calls.delete_resource(resource_id))

    # -- working memory -----------------------------------------------------------------------------------------
    def get_working_memory(self, *, resource_id: str | None = None, thread_id: str | None = None) -> WorkingMemory:
        """The working memory a thread sees (with `thread_id`), or the resource's (resource scope)."""
        return self.send(self.calls.get_working_memory(resource_id=resource_id, thread_id=thread_id))

    def update_working_memory(
        self, value: str | Mapping[str, Any], *, resource_id: str | None = None, thread_id: str | None = None
    ) -> WorkingMemory:
        """Markdown replaces; a JSON object is merged (null deletes a field)."""
        return self.send(self.calls.update_working_memory(value, resource_id=resource_id, thread_id=thread_id))

    # -- attachments and meta -----------------------------------------------------------------------------------
    def create_attachment(
        self, thread_id: str, *, filename: str, media_type: str, size: int, resource_id: str | None = None
    ) -> AttachmentUpload:
        """A presigned S3 upload URL (use `upload_attachment` to have the upload done too)."""
        return self.send(
            self.calls.create_attachment(
                thread_id, resource_id=resource_id, filename=filename, media_type=media_type, size=size
            )
        )

    def upload_attachment(
        self,
        thread_id: str,
        data: bytes | Path | str,
        *,
        filename: str | None = None,
        media_type: str | None = None,
        resource_id: str | None = None,
    ) -> ImagePart | FilePart:
        """Upload a file (bytes or a path) for the thread and return the part to put in a message (`s3://` URL)."""
        return self._run(
            self._upload_attachment(thread_id, data, filename=filename, media_type=media_type, resource_id=resource_id)
        )

    def health(self) -> Health:
        """`GET /health`."""
        return self.send(self.calls.health())

    def openapi(self) -> dict[str, Any]:
        """The served OpenAPI document."""
        return self.send(self.calls.openapi())


class AsyncMemoryClient(_Base):
    """The same API as `MemoryClient`, with `async` methods (httpx.AsyncClient).

    Safe to share between tasks. It opens its connection pool in the event loop that uses it, and a new one when a
    later call runs in another loop (e.g. a framework that runs each request in a fresh `asyncio.run`).
    """

    def __init__(
        self,
        api_url: str,
        *,
        resource_id: str | None = None,
        auth: AuthLike = 'none',
        region: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        retries: RetryPolicy | int | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        super().__init__(
            api_url,
            resource_id=resource_id,
            auth=auth,
            region=region,
            timeout=timeout,
            retries=retries,
            headers=headers,
        )
        self._sleep = sleep
        self._transport = transport
        self._limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._uploads: httpx.AsyncClient | None = None

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pools."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._uploads is not None:
            await self._uploads.aclose()
            self._uploads = None

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            # A pool belongs to the loop that opened it; one from a finished loop cannot be reused (or closed).
            self._http = httpx.AsyncClient(
                base_url=self.api_url,
                auth=self.auth,
                timeout=self.timeout,
                headers=self.headers,
                transport=self._transport,
                limits=self._limits,
            )
            self._http_loop = loop
        return self._http

    async def send(self, call: Call[T]) -> T:
        """Send one call, retrying per the policy; the parsed answer or the error's exception."""
        return await self._run(self._exchange(call))

    async def _run(self, flow: Flow[T]) -> T:
        reply: Any = None
        while not isinstance(effect := resume(flow, reply), Finished):
            reply = await self._carry_out(effect)
        return effect.value

    async def _carry_out(self, effect: Effect) -> httpx.Response | httpx.TransportError | None:
        if isinstance(effect, Sleep):
            await self._sleep(effect.seconds)
            return None
        if effect.upload:
            pool = self._uploads = self._uploads or httpx.AsyncClient(timeout=UPLOAD_TIMEOUT, transport=self._transport)
        else:
            pool = self._client()
        try:
            if effect.stream:
                request = pool.build_request(effect.method, effect.url, **effect.options())
                response = await pool.send(request, stream=True)
                if not 200 <= response.status_code < 300:
                    await response.aread()
                    await response.aclose()
                return response
            return await pool.request(effect.method, effect.url, **effect.options())
        except httpx.TransportError as exc:
            return exc

    # -- conversation -------------------------------------------------------------------------------------------
    async def step(
        self,
        thread_id: str,
        messages: Sequence[MessageLike] = (),
        *,
        resource_id: str | None = None,
        step_number: int | None = None,
        read_only: bool | None = None,
        actor_model: str | None = None,
    ) -> StepResult:
        """`MemoryClient.step`."""
        return await self.send(
            self.calls.step(
                thread_id,
                messages,
                resource_id=resource_id,
                step_number=step_number,
                read_only=read_only,
                actor_model=actor_model,
            )
        )

    async def turn(
        self, thread_id: str, messages: Sequence[MessageLike], *, resource_id: str | None = None
    ) -> TurnResult:
        """Save a turn's outputs (plain strings are assistant messages); schedules background work when due."""
        return await self.send(self.calls.turn(thread_id, messages, resource_id=resource_id))

    async def chat_stream(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None = None, read_only: bool | None = None
    ) -> AsyncIterator[StreamChunk]:
        """`MemoryClient.chat_stream`, as an async iterator of typed chunks (`async for chunk in ...`)."""
        call = self.calls.chat_stream(thread_id, message, resource_id=resource_id, read_only=read_only)
        response: httpx.Response = await self._run(open_stream(call, self.retries, self._rng))
        try:
            async for chunk in achunks_of_lines(response.aiter_lines()):
                yield chunk
        finally:
            await response.aclose()

    async def chat(
        self, thread_id: str, message: MessageLike, *, resource_id: str | None = None, read_only: bool | None = None
    ) -> ChatResult:
        """Send a user message and get the server Actor's reply (steps + Actor + turns in one call)."""
        return await self.send(self.calls.chat(thread_id, message, resource_id=resource_id, read_only=read_only))

    # -- memory and messages ------------------------------------------------------------------------------------
    async def memory(self, thread_id: str, *, resource_id: str | None = None) -> MemoryStatus:
        """The thread's observational memory: observations, token counts, thresholds, current task."""
        return await self.send(self.calls.memory(thread_id, resource_id=resource_id))

    async def memory_generations(
        self, thread_id: str, *, resource_id: str | None = None, limit: int | None = None
    ) -> MemoryGenerations:
        """The memory's generations, newest first: the current one, then the earlier ones (`limit` at most)."""
        return await self.send(self.calls.memory_generations(thread_id, resource_id=resource_id, limit=limit))

    async def observe(
        self, thread_id: str, messages: Sequence[MessageLike] | None = None, *, resource_id: str | None = None
    ) -> MemoryOperation:
        """`MemoryClient.observe`."""
        return await self.send(self.calls.observe(thread_id, messages, resource_id=resource_id))

    async def reflect(self, thread_id: str, *, resource_id: str | None = None) -> MemoryOperation:
        """`MemoryClient.reflect`."""
        return await self.send(self.calls.reflect(thread_id, resource_id=resource_id))

    async def buffer(self, thread_id: str, *, resource_id: str | None = None) -> MemoryOperation:
        """`MemoryClient.buffer`."""
        return await self.send(self.calls.buffer(thread_id, resource_id=resource_id))

    async def messages(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        page: int = 0,
        per_page: int = 100,
        direction: Direction = 'ASC',
    ) -> MessagesPage:
        """A page of the thread's stored messages, oldest first (`direction='DESC'`: newest first)."""
        call = self.calls.messages(
            thread_id, resource_id=resource_id, page=page, per_page=per_page, direction=direction
        )
        return await self.send(call)

    async def iter_messages(
        self, thread_id: str, *, resource_id: str | None = None, per_page: int = 1000
    ) -> AsyncIterator[Message]:
        """Every stored message of the thread, oldest first (pages fetched as needed)."""
        page = 0
        while True:
            result = await self.messages(thread_id, resource_id=resource_id, page=page, per_page=per_page)
            for message in result.messages:
                yield message
            if not result.has_more:
                return
            page += 1

    async def query_messages(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        page: int | None = None,
        per_page: int | Literal[False] | None = None,
        date_range: DateRangeLike = None,
        include: Sequence[IncludeLike] | None = None,
        vector_search_string: str | None = None,
    ) -> MessagesQueryResult:
        """The seed's `recall()` query: a page, a date range, messages by id with neighbours, a vector search."""
        return await self.send(
            self.calls.query_messages(
                thread_id,
                resource_id=resource_id,
                page=page,
                per_page=per_page,
                date_range=date_range,
                include=include,
                vector_search_string=vector_search_string,
            )
        )

    async def delete_messages(
        self, thread_id: str, message_ids: Sequence[str] | None = None, *, resource_id: str | None = None
    ) -> None:
        """Delete messages by id, or every message of the thread when `message_ids` is None."""
        await self.send(self.calls.delete_messages(thread_id, message_ids, resource_id=resource_id))

    async def recall(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        mode: str | None = None,
        query: str | None = None,
        cursor: str | None = None,
        page: int | None = None,
        limit: int | None = None,
        detail: str | None = None,
        part_index: int | None = None,
        before: str | None = None,
        after: str | None = None,
    ) -> RecallResult:
        """The recall tool: page raw history (`mode='messages'`), list threads (`'threads'`), search (`'search'`)."""
        return await self.send(
            self.calls.recall(
                thread_id,
                resource_id=resource_id,
                mode=mode,
                query=query,
                cursor=cursor,
                page=page,
                limit=limit,
                detail=detail,
                part_index=part_index,
                before=before,
                after=after,
            )
        )

    # -- threads ------------------------------------------------------------------------------------------------
    async def create_thread(
        self,
        *,
        resource_id: str | None = None,
        thread_id: str | None = None,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Thread:
        """Create an empty thread (its id is generated here when not given, so a retry cannot make two)."""
        return await self._run(
            self._create_thread(resource_id=resource_id, thread_id=thread_id, title=title, metadata=metadata)
        )

    async def get_thread(self, thread_id: str, *, resource_id: str | None = None) -> Thread:
        """A thread."""
        return await self.send(self.calls.get_thread(thread_id, resource_id=resource_id))

    async def update_thread(
        self, thread_id: str, *, resource_id: str | None = None, title: Any = UNSET, metadata: Any = UNSET
    ) -> Thread:
        """Change the title (None removes it) and/or replace the metadata; what is left out stays. A title set here
        is pinned: generated titles never replace it; None un-pins."""
        return await self.send(
            self.calls.update_thread(thread_id, resource_id=resource_id, title=title, metadata=metadata)
        )

    async def clone_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        new_thread_id: str | None = None,
        title: str | None = None,
        message_limit: int | None = None,
        date_range: DateRangeLike = None,
    ) -> CloneResult:
        """Copy a thread (the newest `message_limit` messages, or a date range) into a new one."""
        return await self._run(
            self._clone_thread(
                thread_id,
                resource_id=resource_id,
                new_thread_id=new_thread_id,
                title=title,
                message_limit=message_limit,
                date_range=date_range,
            )
        )

    async def delete_thread(self, thread_id: str, *, resource_id: str | None = None) -> None:
        """Erase a thread: messages, observations, vectors and attachments."""
        await self.send(self.calls.delete_thread(thread_id, resource_id=resource_id))

    async def list_threads(
        self,
        *,
        resource_id: str | None = None,
        page: int = 0,
        per_page: int = 100,
        order_by: Literal['createdAt', 'updatedAt'] = 'createdAt',
        direction: Literal['ASC', 'DESC'] = 'DESC',
        metadata: Mapping[str, str] | None = None,
    ) -> ThreadsPage:
        """A page of the resource's threads (filter with `metadata={key: value}`)."""
        return await self.send(
            self.calls.list_threads(
                resource_id=resource_id,
                page=page,
                per_page=per_page,
                order_by=order_by,
                direction=direction,
                metadata=metadata,
            )
        )

    async def delete_resource(self, resource_id: str | None = None) -> None:
        """Erase everything stored for the resource."""
        await self.send(self.calls.delete_resource(resource_id))

    # -- working memory -----------------------------------------------------------------------------------------
    async def get_working_memory(
        self, *, resource_id: str | None = None, thread_id: str | None = None
    ) -> WorkingMemory:
        """The working memory a thread sees (with `thread_id`), or the resource's (resource scope)."""
        return await self.send(self.calls.get_working_memory(resource_id=resource_id, thread_id=thread_id))

    async def update_working_memory(
        self, value: str | Mapping[str, Any], *, resource_id: str | None = None, thread_id: str | None = None
    ) -> WorkingMemory:
        """Markdown replaces; a JSON object is merged (null deletes a field)."""
        return await self.send(self.calls.update_working_memory(value, resource_id=resource_id, thread_id=thread_id))

    # -- attachments and meta -----------------------------------------------------------------------------------
    async def create_attachment(
        self, thread_id: str, *, filename: str, media_type: str, size: int, resource_id: str | None = None
    ) -> AttachmentUpload:
        """A presigned S3 upload URL (use `upload_attachment` to have the upload done too)."""
        return await self.send(
            self.calls.create_attachment(
                thread_id, resource_id=resource_id, filename=filename, media_type=media_type, size=size
            )
        )

    async def upload_attachment(
        self,
        thread_id: str,
        data: bytes | Path | str,
        *,
        filename: str | None = None,
        media_type: str | None = None,
        resource_id: str | None = None,
    ) -> ImagePart | FilePart:
        """Upload a file (bytes or a path) for the thread and return the part to put in a message (`s3://` URL)."""
        return await self._run(
            self._upload_attachment(thread_id, data, filename=filename, media_type=media_type, resource_id=resource_id)
        )

    async def health(self) -> Health:
        """`GET /health`."""
        return await self.send(self.calls.health())

    async def openapi(self) -> dict[str, Any]:
        """The served OpenAPI document."""
        return await self.send(self.calls.openapi())
