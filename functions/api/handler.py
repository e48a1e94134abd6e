"""The API Lambda: API Gateway REST proxy events → Powertools' resolver → the routes in this package."""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import _wiring
from functions._observability import logger, metrics, traced
from functions.api import (
    attachments,
    edge,
    errors,
    inspector_route,
    json_body,
    meta,
    operations_route,
    recall_route,
    routes,
    streaming,
    threads,
    working_memory_route,
)

# Bodies are parsed by json_body.parse: strict JSON (no NaN, overflow, lone surrogates or runaway nesting).
app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=json_body.parse)
app.include_router(routes.router)
app.include_router(threads.router)
app.include_router(attachments.router)
app.include_router(meta.router)
app.include_router(recall_route.router)
app.include_router(operations_route.router)
app.include_router(working_memory_route.router)
app.include_router(inspector_route.router)
errors.register(app)
edge.install_not_found(app)

# Heavy setup during Lambda init, so SnapStart snapshots it and warm invocations reuse it. Only inside Lambda:
# importing this module in a test (or a tool) must work without the service's environment.
if os.environ.get('AWS_LAMBDA_FUNCTION_NAME'):
    try:
        _wiring.init()
        if _wiring.snapshotting():
            # Only /openapi.json needs it; build it now only when the init is snapshotted (free for requests).
            meta.openapi_document()
    except Exception:  # the first request retries the setup and answers with the error then
        logger.exception('init failed')


@logger.inject_lambda_context
@metrics.log_metrics
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One request. A streamed answer (the chat stream) is left for a transport that streams it
    (`streaming.accepting_streams`: the Lambda streaming runtime, `om serve`); any other caller gets it whole."""
    refusal, admitted = edge.admit(event)
    result = edge.finish(event, refusal or app.resolve(admitted, context))
    return result if streaming.transport_streams() else streaming.buffered(result)


# The chat stream function's handler: the same one, run by its streaming runtime (functions/api/stream_runtime.py
# reads it from _HANDLER), which sends the streamed answers as they are made. A name of its own tells the two
# functions apart in the template and in logs.
chat_stream_handler = lambda_handler
