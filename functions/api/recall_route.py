"""`POST /recall`: the recall tool over HTTP (CONTRACT §2), for clients that run the Actor themselves.

The body is the tool's parameters plus `resourceId` and `threadId`; the answer is the tool's returns for its mode
(seed 000 "Recall tool"). `threadId` is the thread the agent is in: it must belong to `resourceId` (else 404
`thread_not_found`), it is the thread a cursor is looked up in first, and `mode: "threads"` marks it `← current`.
With retrieval scope `'resource'` (the default) a cursor may name a message of any of the resource's threads.
Retrieval must be on in the configuration (`retrieval: true`), else 422 `retrieval_disabled`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from pydantic import BaseModel, Field

from functions import _wiring
from functions._observability import logger
from functions.api.limits import SearchText
from functions.api.models import API_MODEL_CONFIG
from functions.api.routes import _errors, _ok, authorize, json_response
from om_lib.ids import Id
from om_lib.service import RecallRequest

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated


class _Model(BaseModel):
    model_config = API_MODEL_CONFIG


class RecallIn(_Model):
    """`POST /recall`: the recall tool's parameters for a thread of a resource."""

    resource_id: Id
    thread_id: Id
    mode: Literal['messages', 'threads', 'search', 'observations'] = Field(
        default='messages', description='What to retrieve ("observations": the archived observation groups).'
    )
    query: SearchText | None = Field(
        default=None, description='Search text (mode "search"), or words archived groups must hold ("observations").'
    )
    cursor: str | None = Field(
        default=None, min_length=1, max_length=4096, description='A message id (or a range, which answers a hint).'
    )
    page: int | None = Field(
        default=None,
        ge=-1000,
        le=1000,
        description='Messages: forward (+) or backward (-) from the cursor; threads: from 0.',
    )
    limit: int | None = Field(default=None, ge=1, le=1000, description='Items per page (default 20, at most 50 used).')
    detail: Literal['low', 'high'] = Field(default='low', description='Part detail.')
    part_index: int | None = Field(default=None, ge=0, le=100_000, description='One part of the cursor message.')
    before: str | None = Field(default=None, max_length=64, description='Threads created before this ISO 8601 date.')
    after: str | None = Field(default=None, max_length=64, description='Threads created after this ISO 8601 date.')


class RecallOut(_Model):
    """The tool's returns; which fields are present depends on the call.

    `mode: "messages"`: `{messages, count, cursor, page, limit, detail, hasNextPage, hasPrevPage, truncated,
    tokenOffset}`. With `partIndex`: `{text, messageId, partIndex, role, type, truncated}`. `mode: "threads"`:
    `{threads, count, page, hasMore}`. `mode: "search"`: `{results, count}`.
    """

    results: str | None = None
    observations: str | None = None

    messages: str | None = None
    count: int | None = None
    cursor: str | None = None
    page: int | None = None
    limit: int | None = None
    detail: Literal['low', 'high'] | None = None
    has_next_page: bool | None = None
    has_prev_page: bool | None = None
    truncated: bool | None = None
    token_offset: int | None = None
    text: str | None = None
    message_id: str | None = None
    part_index: int | None = None
    role: str | None = None
    type: str | None = None
    threads: str | None = None
    has_more: bool | None = None


@router.post(
    '/recall',
    summary='Page through raw message history behind observations (the recall tool)',
    description=(
        'The recall tool over HTTP. `mode: "messages"` pages from `cursor` (or from the start of the thread); '
        '`partIndex` returns `{text, messageId, partIndex, role, type, truncated}`; `mode: "threads"` returns '
        '`{threads, count, page, hasMore}`; `mode: "search"` (with `retrieval: {vector: true}`) returns '
        '`{results, count}`: messages similar in meaning to `query`, grouped by thread, each with a cursor; '
        '`mode: "observations"` returns `{observations, count, page, limit, hasNextPage, hasPrevPage, truncated, '
        'tokenOffset}`: the observation groups archived when the log passed its bound, newest first. '
        '422 `retrieval_disabled` unless `retrieval` is on in the configuration, 422 `invalid_input` for a cursor, '
        'thread, part index or date the tool cannot use.'
    ),
    responses={**_ok(RecallOut), **_errors(400, 401, 403, 404, 413, 415, 422, 500, 503)},
    tags=['memory'],
)
def post_recall(body: Annotated[RecallIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    request = RecallRequest(
        mode=body.mode,
        query=body.query,
        cursor=body.cursor,
        # Without a cursor, "messages" reads `threadId` from its start, as documented (the tool's own `threadId`).
        thread_id=body.thread_id if body.mode == 'messages' and body.cursor is None else None,
        page=body.page,
        limit=body.limit,
        detail=body.detail,
        part_index=body.part_index,
        before=body.before,
        after=body.after,
    )
    result = _wiring.service().recall(body.resource_id, body.thread_id, request)
    logger.info('recall', extra={'thread_id': body.thread_id, 'mode': body.mode, 'count': result.get('count')})
    return json_response(result)
