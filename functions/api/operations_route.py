"""`POST /threads/{threadId}/memory/observe | reflect | buffer`: memory operations a client runs now.

- **observe**: the thread's unobserved messages now (below the threshold too); with `messages`, history imported from
  another system (each with its `createdAt`), observed into the thread's memory without being added to its messages.
- **reflect**: condense the observations now, below the threshold too.
- **buffer**: observe the unbuffered messages into a buffered chunk now (it activates like any other).

Each is idempotent (a retry finds nothing left to do: `status: "nothing_to_do"`), waits for another worker holding the
memory within the request's budget (`busy` when it runs out), and answers with the `data-om-*` parts it made. Thin:
validate → authorize → one service call → JSON.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from functions import _wiring
from functions._observability import logger, record_parts_metrics
from functions.api.models import MemoryOperationIn, MemoryOperationOut, ObserveIn
from functions.api.part_urls import check_part_urls
from functions.api.routes import _COMMON, ThreadId, _errors, _ok, authorize, idempotent_ids, json_response
from om_lib.service import OperationResult

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated


def _answer(operation: str, thread_id: str, result: OperationResult) -> Response[Any]:
    record_parts_metrics(result.parts.made_here())
    logger.info(operation, extra={'thread_id': thread_id, 'status': result.status})
    record = result.record
    return json_response(
        {
            'status': result.status,
            'generationCount': record.generation if record is not None else 0,
            'observationTokens': record.observation_tokens if record is not None else 0,
            'parts': result.parts.to_json(),
        }
    )


@router.post(
    '/threads/<threadId>/memory/observe',
    summary='Observe now (the thread’s unobserved messages, or imported history)',
    description=(
        'Without `messages`: the thread’s unobserved messages are observed now, below the threshold too. With '
        '`messages`: history imported from another system, each message with its `createdAt`, is observed into this '
        'thread’s memory (dated by those times) and never added to the thread’s messages; at most '
        '`observation.messageTokens` tokens per call (else 413: send it in parts, oldest first). The same import '
        'twice is observed once (`nothing_to_do`), whatever its message ids. The thread must exist.'
    ),
    responses={**_ok(MemoryOperationOut), **_errors(*_COMMON, 404)},
    tags=['memory'],
)
def post_observe(threadId: ThreadId, body: Annotated[ObserveIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    imported = body.messages or []
    check_part_urls(body.resource_id, ((f'messages[{i}]', m) for i, m in enumerate(imported)))
    service = _wiring.service()
    now = service.now()
    ids = idempotent_ids('observe', body.resource_id, threadId)
    messages = [m.to_message(now, ids(i)) for i, m in enumerate(imported)]
    return _answer('observe', threadId, service.observe(body.resource_id, threadId, messages or None))


@router.post(
    '/threads/<threadId>/memory/reflect',
    summary='Reflect now',
    description=(
        'The Reflector condenses the observations now, below `reflection.observationTokens` too. A log a reflection '
        'made that has not grown since is not reflected again (`nothing_to_do`), so a retry costs nothing.'
    ),
    responses={**_ok(MemoryOperationOut), **_errors(*_COMMON, 404)},
    tags=['memory'],
)
def post_reflect(threadId: ThreadId, body: Annotated[MemoryOperationIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    return _answer('reflect', threadId, _wiring.service().reflect(body.resource_id, threadId))


@router.post(
    '/threads/<threadId>/memory/buffer',
    summary='Buffer now',
    description=(
        'The thread’s unbuffered messages are observed now into one buffered chunk, which activates like any other '
        '(at the threshold, or on idle). Only where observations are buffered (thread scope with '
        '`observation.bufferTokens`): else 422 `buffering_disabled`. A buffering job already running for the thread '
        'is not doubled (`busy`).'
    ),
    responses={**_ok(MemoryOperationOut), **_errors(*_COMMON, 404)},
    tags=['memory'],
)
def post_buffer(threadId: ThreadId, body: Annotated[MemoryOperationIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    return _answer('buffer', threadId, _wiring.service().buffer(body.resource_id, threadId))
