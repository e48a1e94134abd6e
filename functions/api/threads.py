"""Thread and message-history routes (CONTRACT §2, seed 003): create, get and update a thread, clone it, the
`recall()` query, and deleting messages. Thin: validate → authorize → one om_lib call → JSON.

A thread of another resource reads as missing (404 `thread_not_found`); a taken thread id is 409 `thread_exists`.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from functions import _wiring
from functions._observability import logger
from functions.api.errors import ApiError
from functions.api.models import message_json
from functions.api.routes import (
    _COMMON,
    OptionalResourceIdQuery,
    ResourceIdQuery,
    ThreadId,
    _errors,
    _ok,
    authorize,
    json_response,
    no_content,
    thread_json,
)
from functions.api.thread_models import (
    CloneOut,
    MessagesDeleteIn,
    MessagesQueryIn,
    MessagesQueryOut,
    ThreadCloneIn,
    ThreadCreateIn,
    ThreadEnvelope,
    ThreadPatchIn,
)
from om_lib.service import Include

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated


@router.post(
    '/threads',
    summary='Create a thread',
    description=(
        'An empty thread owned by `resourceId`. `id` is server-assigned when absent; a taken id is 409. With working '
        'memory on, `metadata.workingMemory` is the initial working memory (of the thread, or of the resource in '
        'resource scope); it is validated first (422, nothing written) and not kept in the metadata.'
    ),
    responses={**_ok(ThreadEnvelope, 201, 'Created'), **_errors(*_COMMON, 409)},
    tags=['threads'],
)
def create_thread(body: Annotated[ThreadCreateIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    thread = _wiring.service().create_thread(body.resource_id, body.id, title=body.title, metadata=body.metadata)
    logger.info('thread created', extra={'thread_id': thread.id})
    return json_response({'thread': thread_json(thread)}, 201)


@router.get(
    '/threads/<threadId>',
    summary='A thread',
    responses={**_ok(ThreadEnvelope), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['threads'],
)
def get_thread(threadId: ThreadId, resourceId: ResourceIdQuery) -> Response[Any]:
    authorize(resourceId)
    return json_response({'thread': thread_json(_wiring.service().get_thread(resourceId, threadId))})


@router.patch(
    '/threads/<threadId>',
    summary='Update a thread’s title and metadata',
    description=(
        'Fields left out stay as they are. `metadata` replaces the stored object as a whole (send every key you want '
        'to keep; `null` or `{}` empties it). A title set here is pinned (`titlePinned`): titles the Observer '
        'suggests or `generateTitle` writes never replace it; `title: null` (or an empty title) removes it and '
        'un-pins the thread. With working memory on, '
        '`metadata.workingMemory` updates the working memory (as `PUT .../working-memory` does) and is not kept in '
        'the metadata; an invalid one is refused (422) and nothing is written.'
    ),
    responses={**_ok(ThreadEnvelope), **_errors(*_COMMON, 404)},
    tags=['threads'],
)
def patch_thread(threadId: ThreadId, body: Annotated[ThreadPatchIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    changes: dict[str, Any] = {n: getattr(body, n) for n in ('title', 'metadata') if n in body.model_fields_set}
    updated = _wiring.service().update_thread(body.resource_id, threadId, changes)
    return json_response({'thread': thread_json(updated)})


@router.post(
    '/threads/<threadId>/clone',
    summary='Clone a thread',
    description=(
        'Copies the messages (those in `dateRange`, then only the last `messageLimit`) into a new thread with new '
        'message ids. The clone’s metadata is the source’s plus `clonedFrom` naming the source; it starts with the '
        'source’s observations when every observed message was copied, and with the source’s working memory in '
        'thread scope.'
    ),
    responses={**_ok(CloneOut, 201, 'Created'), **_errors(*_COMMON, 404, 409)},
    tags=['threads'],
)
def clone_thread(threadId: ThreadId, body: Annotated[ThreadCloneIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    thread, cloned = _wiring.service().clone_thread(
        body.resource_id,
        threadId,
        new_thread_id=body.new_thread_id,
        title=body.title,
        message_limit=body.message_limit,
        date_range=body.date_range.as_range() if body.date_range else None,
    )
    logger.info('thread cloned', extra={'thread_id': threadId, 'clone_id': thread.id, 'messages': len(cloned)})
    return json_response({'thread': thread_json(thread), 'clonedMessages': [message_json(m) for m in cloned]}, 201)


@router.post(
    '/threads/<threadId>/messages/query',
    summary='Query a thread’s messages: a page, chosen messages with their neighbours, or by meaning',
    description=(
        'A page of messages (oldest first; `perPage: false` for all, `0` for only the included ones), filtered by '
        '`dateRange` on `createdAt` (inclusive), plus each `include` message with its `withPreviousMessages` / '
        '`withNextMessages` neighbours. `vectorSearchString` (with `semanticRecall` or `retrieval: {vector: true}`, '
        'else 422) adds the `topK` messages closest in meaning, each with `messageRange` neighbours, from this '
        'thread or (scope `resource`) all of the resource’s threads; other threads’ messages come first.'
    ),
    responses={**_ok(MessagesQueryOut), **_errors(*_COMMON, 404)},
    tags=['memory'],
)
def query_messages(threadId: ThreadId, body: Annotated[MessagesQueryIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    include: list[Include] = [i.as_include() for i in body.include or ()]
    messages, has_more = _wiring.service().query_messages(
        body.resource_id,
        threadId,
        page=body.page,
        per_page=body.per_page,
        date_range=body.date_range.as_range() if body.date_range else None,
        include=include,
        vector_search_string=body.vector_search_string,
    )
    return json_response({'messages': [message_json(m) for m in messages], 'hasMore': has_more})


@router.delete(
    '/threads/<threadId>/messages',
    summary='Delete messages by id, or clear the thread',
    description=(
        '`messageIds` left out clears the thread. `resourceId` may come in the body or as a query parameter. '
        'Observations made from deleted messages are dropped (the rest is observed again).'
    ),
    responses={204: {'description': 'Deleted', 'content': {}}, **_errors(*_COMMON, 404)},
    tags=['memory'],
)
def delete_messages(
    threadId: ThreadId,
    resourceId: OptionalResourceIdQuery = None,
    body: Annotated[MessagesDeleteIn | None, Body()] = None,
) -> Response[Any]:
    from_body = body.resource_id if body else None
    if from_body and resourceId and from_body != resourceId:
        raise ApiError(422, 'validation_error', 'resourceId differs between the body and the query string')
    resource_id = from_body or resourceId
    if not resource_id:
        raise ApiError(
            422,
            'validation_error',
            'resourceId is required (in the body or as a query parameter)',
            [{'location': 'body', 'field': 'resourceId', 'type': 'missing', 'message': 'Field required'}],
        )
    authorize(resource_id)
    deleted = _wiring.service().delete_messages(resource_id, threadId, body.message_ids if body else None)
    logger.info('messages deleted', extra={'thread_id': threadId, 'deleted': deleted})
    return no_content()
