"""Conversation, memory, message-listing, thread-listing and erase routes (CONTRACT §2). Thin: validate → authorize →
one service call → JSON.

Every route that names a resourceId checks the caller may act for it before anything is read or written, so a
refused request writes nothing. A thread of another resource reads as missing (404 `thread_not_found`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponseContentModel, OpenAPIResponseContentSchema
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from aws_lambda_powertools.metrics import MetricUnit

from functions import _wiring
from functions._observability import logger, metrics, record_parts_metrics
from functions.api import auth, streaming
from functions.api.errors import ApiError
from functions.api.models import (
    ChatIn,
    ChatOut,
    ErrorOut,
    GenerationsOut,
    MemoryOut,
    MessagesPage,
    StepsIn,
    StepsOut,
    ThreadsPage,
    TurnsIn,
    TurnsOut,
    message_json,
)
from functions.api.part_urls import check_part_urls
from om_lib.ids import Id
from om_lib.llm import FunctionDeclaration
from om_lib.messages import Message
from om_lib.records import Thread
from om_lib.service import ChatListener, ChatResult

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated

# Every id in a path or a query string follows the one id grammar (om_lib.ids): else 422 `invalid_id`.
ThreadId = Annotated[Id, Path(description='The conversation; thread ids are scoped to their resource.')]
ResourceIdPath = Annotated[Id, Path(description='Whose memory: a user or tenant.')]
ResourceIdQuery = Annotated[Id, Query(description='Whose memory: a user or tenant; the thread must belong to it.')]
OptionalResourceIdQuery = Annotated[Id | None, Query()]
Page = Annotated[int, Query(ge=0, le=1_000_000)]
PerPage = Annotated[int, Query(ge=1, le=1000)]
GenerationLimit = Annotated[int, Query(ge=1, le=100)]


def _errors(*statuses: int) -> dict[int, Any]:
    return {
        s: {'description': HTTPStatus(s).phrase, 'content': {'application/json': {'model': ErrorOut}}} for s in statuses
    }


def _ok(model: type, status: int = 200, description: str = 'OK') -> dict[int, Any]:
    return {status: {'description': description, 'content': {'application/json': {'model': model}}}}


_COMMON = (400, 401, 403, 413, 415, 422, 500, 503)


def json_response(body: Any, status: int = 200) -> Response[Any]:
    """A JSON answer (bodies are built by the routes, so optional fields that are None stay out)."""
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


def no_content() -> Response[Any]:
    """204 with an empty body."""
    return Response(status_code=204, content_type=None, body='')


def authorize(resource_id: str) -> None:
    """Refuse (401/403) unless the caller may act for `resource_id`."""
    s = _wiring.settings()
    caller = auth.identify(router.current_event.raw_event, s.OM_AUTH_MODE, s.OM_AUTH_CLAIM)
    auth.require_owner(caller, resource_id)


# `Idempotency-Key` (the IETF draft's header): printable ASCII, as the draft's examples; its hash names what it names.
IDEMPOTENCY_KEY = 'Idempotency-Key'
_MAX_IDEMPOTENCY_KEY = 255


def idempotent_ids(route: str, resource_id: str, thread_id: str) -> Callable[[int], str | None]:
    """Server ids for the request's messages that came without one: derived from the `Idempotency-Key` header when
    the request has one (a retry with the same key stores nothing twice), else None (new ids)."""
    key = router.current_event.headers.get(IDEMPOTENCY_KEY)
    if key is None:
        return lambda index: None
    if not key or len(key) > _MAX_IDEMPOTENCY_KEY or not key.isascii() or not key.isprintable():
        detail = {'location': 'header', 'field': IDEMPOTENCY_KEY, 'type': 'invalid_header', 'message': 'invalid'}
        raise ApiError(
            422,
            'invalid_input',
            f'the {IDEMPOTENCY_KEY} header must be 1-{_MAX_IDEMPOTENCY_KEY} printable ASCII characters '
            '(a UUID is a good choice)',
            [detail],
        )

    def derived(index: int) -> str:
        digest = hashlib.sha256(f'{route}\x00{resource_id}\x00{thread_id}\x00{key}\x00{index}'.encode()).hexdigest()
        return f'msg_{digest[:32]}'

    return derived


def _messages_json(messages: list[Message] | tuple[Message, ...]) -> list[dict[str, Any]]:
    return [message_json(m) for m in messages]


def declaration_json(declaration: FunctionDeclaration) -> dict[str, Any]:
    """A tool declaration as a step lists it: `{name, description, parameters}` (JSON Schema)."""
    return {'name': declaration.name, 'description': declaration.description, 'parameters': declaration.parameters}


# -- conversation -------------------------------------------------------------------------------------------------


@router.post(
    '/threads/<threadId>/steps',
    summary='Save a step’s input and get the Actor’s context',
    responses={**_ok(StepsOut), **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_steps(threadId: ThreadId, body: Annotated[StepsIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    check_part_urls(body.resource_id, ((f'messages[{i}]', m) for i, m in enumerate(body.messages)))
    service = _wiring.service()
    now = service.now()
    started = time.perf_counter()
    ids = idempotent_ids('steps', body.resource_id, threadId)
    step = service.step(
        body.resource_id,
        threadId,
        [m.to_message(now, ids(i)) for i, m in enumerate(body.messages)],
        step_number=body.step_number,
        read_only=body.read_only,
        actor_model=body.actor_model,
    )
    metrics.add_metric(name='StepLatencyMs', unit=MetricUnit.Milliseconds, value=(time.perf_counter() - started) * 1e3)
    parts = step.parts.to_json()
    record_parts_metrics(step.parts.made_here())
    logger.info(
        'step',
        extra={
            'thread_id': threadId,
            'saved': len(step.saved_ids),
            'visible_messages': len(step.messages),
            'observation_tokens': step.record.observation_tokens if step.record else 0,
        },
    )
    return json_response(
        {
            'threadId': step.thread_id,
            'resourceId': step.resource_id,
            'system': step.system,
            'messages': _messages_json(step.messages),
            'tools': [declaration_json(t) for t in step.tools],
            'parts': parts,
        }
    )


@router.post(
    '/threads/<threadId>/turns',
    summary='Save a turn’s outputs (assistant and tool messages)',
    responses={**_ok(TurnsOut), **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_turns(threadId: ThreadId, body: Annotated[TurnsIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    check_part_urls(body.resource_id, ((f'messages[{i}]', m) for i, m in enumerate(body.messages)))
    service = _wiring.service()
    now = service.now()
    ids = idempotent_ids('turns', body.resource_id, threadId)
    turn = service.turn(body.resource_id, threadId, [m.to_message(now, ids(i)) for i, m in enumerate(body.messages)])
    parts = turn.parts.to_json()
    record_parts_metrics(turn.parts.made_here())
    logger.info('turn', extra={'thread_id': threadId, 'saved': len(turn.saved), 'scheduled': turn.scheduled})
    return json_response({'saved': [m.id for m in turn.saved], 'parts': parts})


_STREAM_DESCRIPTION = (
    'The AI SDK UI message stream (protocol v1, header `x-vercel-ai-ui-message-stream: v1`): server-sent events '
    '`data: <chunk JSON>`, in order `start` (the reply id), the `data-om-*` parts as they happen (`data-om-status` '
    'first, observation-start before the Observer call and -end/-failed after it), `start-step`, `text-start`/'
    '`text-delta`/'
    '`text-end`, tool chunks for tools the server ran, `finish-step`, the parts the turn queued, an `error` chunk '
    '(`errorText`, `code`) when the Actor failed, `finish`, then `data: [DONE]`.'
)
# Each server-sent event: its `data` is one chunk's JSON (or `[DONE]`, the last).
_SSE_EVENT = {
    'type': 'object',
    'description': _STREAM_DESCRIPTION,
    'properties': {'data': {'type': 'string', 'description': 'One chunk as JSON, or `[DONE]` (the last event).'}},
    'required': ['data'],
}
_SSE: dict[str, OpenAPIResponseContentSchema | OpenAPIResponseContentModel] = {
    'text/event-stream': {'schema': _SSE_EVENT}
}
_CHAT_DESCRIPTION = (
    'When the Actor model fails after the user message was saved, the answer is still 200: `reply` is null and '
    '`parts` holds a `data-om-actor-failed` part. Retry with the same message id: a message is answered once, so a '
    'retry of an answered message returns its stored reply (no model call, nothing stored twice), and one sent while '
    'another request is answering it waits for that reply or gets 409 `in_progress`. The body may also be what the '
    "AI SDK's `DefaultChatTransport` sends (`{id, messages, trigger, messageId}` plus `resourceId`): the newest user "
    'message is taken.'
)


@router.post(
    '/threads/<threadId>/chat',
    summary='Send a user message and get the Actor’s reply (steps + Actor + turns in one call)',
    description=_CHAT_DESCRIPTION
    + ' With `Accept: text/event-stream`, or a body of the AI SDK’s shape (`messages`), the answer is streamed as at '
    '`/chat/stream`.',
    responses={
        200: {'description': 'OK', 'content': {'application/json': {'model': ChatOut}, **_SSE}},
        **_errors(*_COMMON, 404, 409),
    },
    tags=['conversation'],
)
def post_chat(threadId: ThreadId, body: Annotated[ChatIn, Body()]) -> Response[Any]:
    # The AI SDK's transport sends `messages` and reads a stream (without asking for one in Accept).
    accept = router.current_event.headers.get('accept') or ''
    return _chat(threadId, body, stream=streaming.EVENT_STREAM in accept.lower() or body.messages is not None)


@router.post(
    '/threads/<threadId>/chat/stream',
    summary='Send a user message and stream the turn (the AI SDK UI message stream)',
    description=_CHAT_DESCRIPTION,
    responses={200: {'description': 'The turn, as it happens', 'content': _SSE}, **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_chat_stream(threadId: ThreadId, body: Annotated[ChatIn, Body()]) -> Response[Any]:
    return _chat(threadId, body, stream=True)


def _chat(thread_id: str, body: ChatIn, *, stream: bool) -> Response[Any]:
    authorize(body.resource_id)
    check_part_urls(body.resource_id, [('message', body.message)] if body.message is not None else [])
    service = _wiring.service()
    message = body.user_message(service.now(), idempotent_ids('chat', body.resource_id, thread_id)(0))

    def run(listener: ChatListener | None) -> ChatResult:
        return service.chat(body.resource_id, thread_id, message, read_only=body.read_only, listener=listener)

    if not stream:
        result = run(None)
        _chat_done(thread_id, result)
        return json_response(
            {'reply': message_json(result.reply) if result.reply is not None else None, 'parts': result.parts.to_json()}
        )
    # Errors before the turn began (nothing written) are raised here and answered with their status, like any route.
    chat = streaming.ChatStream(run, on_done=lambda result: _chat_done(thread_id, result)).start()
    streaming.hand_over(chat)
    headers = {k: v for k, v in streaming.STREAM_HEADERS.items() if k != 'Content-Type'}
    return Response(status_code=200, content_type=streaming.EVENT_STREAM, body='', headers=headers)


def _chat_done(thread_id: str, result: ChatResult) -> None:
    record_parts_metrics(result.parts.made_here())
    metrics.add_metric(name='ModelCalls', unit=MetricUnit.Count, value=result.actor_calls)
    logger.info(
        'chat',
        extra={'thread_id': thread_id, 'replied': result.reply is not None, 'replayed': result.replayed},
    )


# -- memory and messages ------------------------------------------------------------------------------------------


@router.get(
    '/threads/<threadId>/memory',
    summary='The thread’s observational memory',
    responses={**_ok(MemoryOut), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_memory(threadId: ThreadId, resourceId: ResourceIdQuery) -> Response[Any]:
    authorize(resourceId)
    return json_response(_wiring.service().memory(resourceId, threadId))


@router.get(
    '/threads/<threadId>/memory/generations',
    summary='The memory’s generations, newest first',
    description=(
        'Every reflection (and every reset after observed messages are deleted) starts a new generation; earlier ones '
        'are listed here, newest first, the current one first. Deleting messages (or erasing a thread) also removes '
        'what was derived from them from earlier generations: one that observed them is rewritten without them, or '
        'dropped when a reflection condensed them with the rest. Resource scope lists the resource’s memory.'
    ),
    responses={**_ok(GenerationsOut), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_memory_generations(
    threadId: ThreadId, resourceId: ResourceIdQuery, limit: GenerationLimit = 10
) -> Response[Any]:
    authorize(resourceId)
    return json_response(_wiring.service().generations(resourceId, threadId, limit=limit))


@router.get(
    '/threads/<threadId>/messages',
    summary='A page of the thread’s messages, oldest first (or newest first)',
    responses={**_ok(MessagesPage), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_messages(
    threadId: ThreadId,
    resourceId: ResourceIdQuery,
    page: Page = 0,
    perPage: PerPage = 100,
    direction: Annotated[
        Literal['ASC', 'DESC'],
        Query(description='`ASC` (default): oldest first; `DESC`: newest first, so page 0 holds the newest messages.'),
    ] = 'ASC',
) -> Response[Any]:
    authorize(resourceId)
    listed, has_more = _wiring.service().messages(
        resourceId, threadId, page=page, per_page=perPage, newest_first=direction == 'DESC'
    )
    messages = [{**message_json(m), 'omStatus': status} for m, status in listed]
    return json_response({'messages': messages, 'page': page, 'perPage': perPage, 'hasMore': has_more})


# -- threads of a resource, and erasing ---------------------------------------------------------------------------


def thread_json(thread: Thread) -> dict[str, Any]:
    """A thread as listed (CONTRACT §2)."""
    return {
        'id': thread.id,
        'resourceId': thread.resource_id,
        'title': thread.title,
        'titlePinned': thread.title_pinned,
        'createdAt': thread.created_at.isoformat().replace('+00:00', 'Z'),
        'updatedAt': thread.updated_at.isoformat().replace('+00:00', 'Z'),
        'metadata': thread.metadata,
    }


def metadata_filter(query: Mapping[str, str] | None) -> dict[str, str]:
    """`metadata.<key>=<value>` query parameters as `{key: value}`."""
    return {k[len('metadata.') :]: v for k, v in (query or {}).items() if k.startswith('metadata.') and len(k) > 9}


@router.get(
    '/resources/<resourceId>/threads',
    summary='A page of the resource’s threads',
    description='Filter by metadata with `metadata.<key>=<value>` query parameters (all must match).',
    responses={**_ok(ThreadsPage), **_errors(401, 403, 422, 500, 503)},
    tags=['threads'],
)
def list_threads(
    resourceId: ResourceIdPath,
    page: Page = 0,
    perPage: PerPage = 100,
    orderBy: Annotated[Literal['createdAt', 'updatedAt'], Query()] = 'createdAt',
    direction: Annotated[Literal['ASC', 'DESC'], Query()] = 'DESC',
) -> Response[Any]:
    authorize(resourceId)
    threads, has_more = _wiring.service().list_threads(
        resourceId,
        page=page,
        per_page=perPage,
        order_by=orderBy,
        direction=direction,
        metadata=metadata_filter(router.current_event.query_string_parameters),
    )
    return json_response({'threads': [thread_json(t) for t in threads], 'hasMore': has_more})


@router.delete(
    '/threads/<threadId>',
    summary='Erase a thread: its messages, observations and attachments',
    responses={204: {'description': 'Erased', 'content': {}}, **_errors(401, 403, 404, 422, 500, 503)},
    tags=['threads'],
)
def delete_thread(threadId: ThreadId, resourceId: ResourceIdQuery) -> Response[Any]:
    authorize(resourceId)
    _wiring.service().erase_thread(resourceId, threadId)
    logger.info('thread erased', extra={'thread_id': threadId})
    return no_content()


@router.delete(
    '/resources/<resourceId>',
    summary='Erase everything stored for a resource',
    responses={204: {'description': 'Erased', 'content': {}}, **_errors(401, 403, 422, 500, 503)},
    tags=['threads'],
)
def delete_resource(resourceId: ResourceIdPath) -> Response[Any]:
    authorize(resourceId)
    _wiring.service().erase_resource(resourceId)
    logger.info('resource erased')
    return no_content()
