"""Conversation, memory, message-listing, thread-listing and erase routes (CONTRACT §2). Thin: validate → authorize →
one service call → JSON.

Every route that names a resourceId checks the caller may act for it before anything is read or written, so a
refused request writes nothing. A thread of another resource reads as missing (404 `thread_not_found`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from aws_lambda_powertools.metrics import MetricUnit

from functions import _wiring
from functions._observability import logger, metrics, record_parts_metrics
from functions.api import auth
from functions.api.models import (
    ChatIn,
    ChatOut,
    ErrorOut,
    MemoryOut,
    MessagesPage,
    StepsIn,
    StepsOut,
    ThreadsPage,
    TurnsIn,
    TurnsOut,
    message_json,
)
from om_lib import history
from om_lib.chat import ChatService
from om_lib.errors import ThreadNotFoundError
from om_lib.ids import Id
from om_lib.messages import Message
from om_lib.recall import declaration_json, step_tools
from om_lib.records import Thread
from om_lib.threads import list_resource_threads
from om_lib.titles import after_turn as title_after_turn
from om_lib.working_memory import working_memory_of

router = APIGatewayRouter()

# Every id in a path or a query string follows the one id grammar (om_lib.ids): else 422 `invalid_id`.
ThreadId = Annotated[Id, Path()]
ResourceIdPath = Annotated[Id, Path()]
ResourceIdQuery = Annotated[Id, Query()]
OptionalResourceIdQuery = Annotated[Id | None, Query()]
Page = Annotated[int, Query(ge=0, le=1_000_000)]
PerPage = Annotated[int, Query(ge=1, le=1000)]
# The store reads at most this many messages per call while skipping to a later page.
_SKIP_CHUNK = 1000


def _errors(*statuses: int) -> dict[int, Any]:
    return {
        s: {'description': HTTPStatus(s).phrase, 'content': {'application/json': {'model': ErrorOut}}} for s in statuses
    }


def _ok(model: type, status: int = 200, description: str = 'OK') -> dict[int, Any]:
    return {status: {'description': description, 'content': {'application/json': {'model': model}}}}


_COMMON = (400, 401, 403, 413, 415, 422, 500, 503)


def json_response(body: Any, status: int = 200) -> Response:
    """A JSON answer (bodies are built by the routes, so optional fields that are None stay out)."""
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


def no_content() -> Response:
    """204 with an empty body."""
    return Response(status_code=204, content_type=None, body='')


def authorize(resource_id: str) -> None:
    """Refuse (401/403) unless the caller may act for `resource_id`."""
    s = _wiring.settings()
    caller = auth.identify(router.current_event.raw_event, s.OM_AUTH_MODE, s.OM_AUTH_CLAIM)
    auth.require_owner(caller, resource_id)


def _messages_json(messages: list[Message] | tuple[Message, ...]) -> list[dict[str, Any]]:
    return [message_json(m) for m in messages]


# -- conversation -------------------------------------------------------------------------------------------------


@router.post(
    '/threads/<threadId>/steps',
    summary='Save a step’s input and get the Actor’s context',
    responses={**_ok(StepsOut), **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_steps(threadId: ThreadId, body: Annotated[StepsIn, Body()]):
    authorize(body.resource_id)
    engine = _wiring.engine()
    now = engine.clock.now()
    messages = [m.to_message(now) for m in body.messages]
    started = time.perf_counter()
    step = engine.prepare_step(body.resource_id, threadId, messages, step_number=body.step_number)
    system, tools = step.system, step_tools(engine.settings.retrieval)
    working = working_memory_of(engine.settings.working_memory, engine.store, engine.clock)
    if working is not None:
        block = working.system_text(body.resource_id, threadId, read_only=body.read_only)
        system = f'{system}\n\n{block}' if system.strip() else block
        tools += [declaration_json(t) for t in working.tools(read_only=body.read_only)]
    metrics.add_metric(name='StepLatencyMs', unit=MetricUnit.Milliseconds, value=(time.perf_counter() - started) * 1e3)
    record_parts_metrics(step.parts)
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
            'system': system,
            'messages': _messages_json(step.messages),
            'tools': tools,
            'parts': step.parts,
        }
    )


@router.post(
    '/threads/<threadId>/turns',
    summary='Save a turn’s outputs (assistant and tool messages)',
    responses={**_ok(TurnsOut), **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_turns(threadId: ThreadId, body: Annotated[TurnsIn, Body()]):
    authorize(body.resource_id)
    engine = _wiring.engine()
    now = engine.clock.now()
    turn = engine.complete_turn(body.resource_id, threadId, [m.to_message(now) for m in body.messages])
    semantic = _wiring.semantic()
    if semantic is not None:
        semantic.schedule(body.resource_id, threadId)  # embed the turn's messages in the background
    parts = list(turn.parts)
    scheduled = list(turn.scheduled)
    if title_after_turn(engine, body.resource_id, threadId, turn.saved):
        scheduled.append('title')
    if scheduled:
        parts.append({'type': 'data-om-scheduled', 'data': {'operations': scheduled}})
    record_parts_metrics(parts)
    logger.info('turn', extra={'thread_id': threadId, 'saved': len(turn.saved), 'scheduled': turn.scheduled})
    return json_response({'saved': [m.id for m in turn.saved], 'parts': parts})


@router.post(
    '/threads/<threadId>/chat',
    summary='Send a user message and get the Actor’s reply (steps + Actor + turns in one call)',
    description=(
        'When the Actor model fails after the user message was saved, the answer is still 200: `reply` is null and '
        '`parts` holds a `data-om-actor-failed` part. Retry with the same message id.'
    ),
    responses={**_ok(ChatOut), **_errors(*_COMMON, 404, 409)},
    tags=['conversation'],
)
def post_chat(threadId: ThreadId, body: Annotated[ChatIn, Body()]):
    authorize(body.resource_id)
    engine = _wiring.engine()
    result = ChatService(engine, semantic=_wiring.semantic()).chat(
        body.resource_id, threadId, body.user_message(engine.clock.now()), read_only=body.read_only
    )
    record_parts_metrics(result.parts)
    metrics.add_metric(name='ModelCalls', unit=MetricUnit.Count, value=result.actor_calls)
    logger.info('chat', extra={'thread_id': threadId, 'replied': result.reply is not None})
    return json_response(
        {'reply': message_json(result.reply) if result.reply is not None else None, 'parts': result.parts}
    )


# -- memory and messages ------------------------------------------------------------------------------------------


@router.get(
    '/threads/<threadId>/memory',
    summary='The thread’s observational memory',
    responses={**_ok(MemoryOut), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_memory(threadId: ThreadId, resourceId: ResourceIdQuery):
    authorize(resourceId)
    return json_response(_wiring.engine().memory_view(resourceId, threadId))


@router.get(
    '/threads/<threadId>/messages',
    summary='A page of the thread’s messages, oldest first',
    responses={**_ok(MessagesPage), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_messages(
    threadId: ThreadId,
    resourceId: ResourceIdQuery,
    page: Page = 0,
    perPage: PerPage = 100,
):
    authorize(resourceId)
    store = _wiring.store()
    if store.get_thread(resourceId, threadId) is None:
        raise ThreadNotFoundError(threadId)
    messages, has_more = page_of_messages(store, resourceId, threadId, page, perPage)
    return json_response({'messages': _messages_json(messages), 'page': page, 'perPage': perPage, 'hasMore': has_more})


def page_of_messages(
    store: Any, resource_id: str, thread_id: str, page: int, per_page: int
) -> tuple[tuple[Message, ...], bool]:
    """Messages `page * per_page ...` in arrival order.

    Sequence numbers may have holes (deleted messages, abandoned writes), so the offset is counted by reading
    forward through the store's seq index in chunks; the first pages read only what they show.
    """
    after, skip = 0, page * per_page
    while skip > 0:
        chunk = store.list_messages(resource_id, thread_id, after_seq=after, limit=min(skip, _SKIP_CHUNK))
        if not chunk.messages:
            return (), False
        after = chunk.messages[-1].seq or after
        skip -= len(chunk.messages)
        if skip > 0 and not chunk.has_more:
            return (), False
    result = store.list_messages(resource_id, thread_id, after_seq=after, limit=per_page)
    return result.messages, result.has_more


# -- threads of a resource, and erasing ---------------------------------------------------------------------------


def thread_json(thread: Thread) -> dict[str, Any]:
    """A thread as listed (CONTRACT §2)."""
    return {
        'id': thread.id,
        'resourceId': thread.resource_id,
        'title': thread.title,
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
):
    authorize(resourceId)
    threads, has_more = list_resource_threads(
        _wiring.store(),
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
    responses={204: {'description': 'Erased'}, **_errors(401, 403, 404, 422, 500, 503)},
    tags=['threads'],
)
def delete_thread(threadId: ThreadId, resourceId: ResourceIdQuery):
    authorize(resourceId)
    semantic = _wiring.semantic()
    try:
        _wiring.store().delete_thread(resourceId, threadId)
    finally:  # also when it was erased before: a retry after a failed vector erase must still remove them
        if semantic is not None:
            semantic.erase_thread(resourceId, threadId)
        # Resource scope: the thread's sections leave the shared memory too (a no-op without a resource record).
        history.erase_thread_from_resource_memory(
            _wiring.store(),
            resourceId,
            threadId,
            now=datetime.now(UTC),
            count=_wiring.engine().counter.count_observations,
        )
    logger.info('thread erased', extra={'thread_id': threadId})
    return no_content()


@router.delete(
    '/resources/<resourceId>',
    summary='Erase everything stored for a resource',
    responses={204: {'description': 'Erased'}, **_errors(401, 403, 422, 500, 503)},
    tags=['threads'],
)
def delete_resource(resourceId: ResourceIdPath):
    authorize(resourceId)
    _wiring.store().delete_resource(resourceId)
    semantic = _wiring.semantic()
    if semantic is not None:
        semantic.erase_resource(resourceId)
    logger.info('resource erased')
    return no_content()
