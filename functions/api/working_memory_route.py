"""Working-memory routes (CONTRACT §2, seed 003): read and update the working memory of a resource or a thread.

`/threads/{threadId}/working-memory` is the working memory that thread's Actor sees: the thread's own in thread scope,
the resource's in resource scope (the answer's `scope` says which). `/resources/{resourceId}/working-memory` is the
resource's, and exists only in resource scope. `PUT` applies the same update as the Actor's `updateWorkingMemory`
tool: Markdown replaces, JSON merges (objects deep-merged, `null` deletes a field, arrays replaced) and must match
`workingMemory.schema`. An invalid update is 422 `invalid_working_memory` with the problems in `details`; nothing is
written. With working memory off, every route is 422 `working_memory_disabled`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from pydantic import BaseModel, Field

from functions import _wiring
from functions._observability import logger
from functions.api.errors import ApiError
from functions.api.models import API_MODEL_CONFIG
from functions.api.routes import (
    _COMMON,
    OptionalResourceIdQuery,
    ResourceIdPath,
    ResourceIdQuery,
    ThreadId,
    _errors,
    _ok,
    authorize,
    json_response,
)
from om_lib.ids import Id

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated


class _Model(BaseModel):
    model_config = API_MODEL_CONFIG


class WorkingMemoryIn(_Model):
    """`PUT .../working-memory`: Markdown text (replaces) or a JSON object (merged), per the configuration."""

    working_memory: str | dict[str, Any] = Field(
        description='Markdown (template mode: replaces the stored text) or an object (schema mode: merged).'
    )
    resource_id: Id | None = Field(
        default=None, description='The owner; may also be sent as the `resourceId` query parameter (thread route).'
    )


class WorkingMemoryOut(_Model):
    """The working memory (null when nothing is stored yet), its scope and its format."""

    working_memory: str | dict[str, Any] | None
    scope: Literal['thread', 'resource']
    format: Literal['markdown', 'json']


def _resource_of(path_or_query: str | None, body: WorkingMemoryIn) -> str:
    from_body = body.resource_id
    if from_body and path_or_query and from_body != path_or_query:
        raise ApiError(422, 'validation_error', 'resourceId differs between the body and the URL')
    resource_id = from_body or path_or_query
    if not resource_id:
        raise ApiError(
            422,
            'validation_error',
            'resourceId is required (in the body or as a query parameter)',
            [{'location': 'body', 'field': 'resourceId', 'type': 'missing', 'message': 'Field required'}],
        )
    return resource_id


_DISABLED_OR_INVALID = 'Working memory off (`working_memory_disabled`) or an invalid update (`invalid_working_memory`).'


@router.get(
    '/resources/<resourceId>/working-memory',
    summary='The resource’s working memory',
    description='Resource scope only (thread scope: use the thread route, else 422 `working_memory_disabled`).',
    responses={**_ok(WorkingMemoryOut), **_errors(401, 403, 422, 500, 503)},
    tags=['memory'],
)
def get_resource_working_memory(resourceId: ResourceIdPath) -> Response[Any]:
    authorize(resourceId)
    return json_response(_wiring.service().working_memory(resourceId, None).to_json())


@router.put(
    '/resources/<resourceId>/working-memory',
    summary='Update the resource’s working memory',
    description='Markdown replaces, JSON merges (null deletes a field, arrays replaced). ' + _DISABLED_OR_INVALID,
    responses={**_ok(WorkingMemoryOut), **_errors(*_COMMON, 409)},
    tags=['memory'],
)
def put_resource_working_memory(resourceId: ResourceIdPath, body: Annotated[WorkingMemoryIn, Body()]) -> Response[Any]:
    resource_id = _resource_of(resourceId, body)
    authorize(resource_id)
    view = _wiring.service().update_working_memory(resource_id, None, body.working_memory)
    logger.info('working memory updated', extra={'scope': view.scope})
    return json_response(view.to_json())


@router.get(
    '/threads/<threadId>/working-memory',
    summary='The working memory the thread sees',
    description='The thread’s own (thread scope) or its resource’s (resource scope); `scope` says which.',
    responses={**_ok(WorkingMemoryOut), **_errors(401, 403, 404, 422, 500, 503)},
    tags=['memory'],
)
def get_thread_working_memory(threadId: ThreadId, resourceId: ResourceIdQuery) -> Response[Any]:
    authorize(resourceId)
    return json_response(_wiring.service().working_memory(resourceId, threadId).to_json())


@router.put(
    '/threads/<threadId>/working-memory',
    summary='Update the working memory the thread sees',
    description=(
        'The thread’s own (thread scope) or its resource’s (resource scope). `resourceId` as a query parameter or '
        'in the body. Markdown replaces, JSON merges (null deletes a field, arrays replaced). ' + _DISABLED_OR_INVALID
    ),
    responses={**_ok(WorkingMemoryOut), **_errors(*_COMMON, 404, 409)},
    tags=['memory'],
)
def put_thread_working_memory(
    threadId: ThreadId, body: Annotated[WorkingMemoryIn, Body()], resourceId: OptionalResourceIdQuery = None
) -> Response[Any]:
    resource_id = _resource_of(resourceId, body)
    authorize(resource_id)
    view = _wiring.service().update_working_memory(resource_id, threadId, body.working_memory)
    logger.info('working memory updated', extra={'thread_id': threadId, 'scope': view.scope})
    return json_response(view.to_json())
