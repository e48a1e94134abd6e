"""Every error the API answers, in the CONTRACT's one shape: `{"error": {"code", "message", "details"}}`.

Three sources, one shape: our own refusals (`ApiError`), om_lib's errors (mapped by class, never by message text), and
the framework's request validation (mapped to 400/413/422 with camelCase field paths: 413 `too_large` for a
documented limit, 422 `invalid_id` for an id outside the grammar, 422 `validation_error` for the rest).
`GATEWAY_RESPONSES` holds the same shape for the errors API Gateway answers itself (the CDK app installs them as
gateway responses).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from functions._observability import logger
from om_lib import errors as om

# Errors of the body as a whole that mean "absent or not a JSON object" (a model validator's error is a 422).
_NOT_AN_OBJECT = frozenset({'missing', 'model_attributes_type', 'model_type', 'dict_type'})


class ApiError(Exception):
    """A refusal decided at the edge (auth, limits, unknown route)."""

    def __init__(
        self, status: int, code: str, message: str, details: Sequence[dict[str, Any]] = (), **headers: str
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = list(details)
        self.headers = headers


def error_response(
    status: int, code: str, message: str, details: Iterable[dict[str, Any]] = (), headers: dict[str, str] | None = None
) -> Response[Any]:
    """A Powertools response in the error shape."""
    body = {'error': {'code': code, 'message': message, 'details': list(details)}}
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers)


def proxy_error(status: int, code: str, message: str, details: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The same shape as a raw API Gateway proxy result (for refusals made before the resolver runs)."""
    body = {'error': {'code': code, 'message': message, 'details': list(details)}}
    return {
        'statusCode': status,
        'headers': {'Content-Type': content_types.APPLICATION_JSON},
        'body': json.dumps(body),
        'isBase64Encoded': False,
    }


# om_lib error class → (HTTP status, code). The first class an error is an instance of wins, so subclasses come first.
_OM_ERRORS: tuple[tuple[type[om.OMError], int, str], ...] = (
    (om.ThreadNotFoundError, 404, 'thread_not_found'),
    (om.NotFoundError, 404, 'not_found'),
    (om.MessageConflictError, 409, 'message_conflict'),
    (om.TurnInProgressError, 409, 'in_progress'),
    (om.ThreadExistsError, 409, 'thread_exists'),
    (om.WorkingMemoryTooLargeError, 413, 'too_large'),
    (om.ImportTooLargeError, 413, 'too_large'),
    (om.BufferingDisabledError, 422, 'buffering_disabled'),
    (om.InvalidWorkingMemoryError, 422, 'invalid_working_memory'),
    (om.WorkingMemoryDisabledError, 422, 'working_memory_disabled'),
    (om.RetrievalDisabledError, 422, 'retrieval_disabled'),
    (om.VersionConflictError, 409, 'version_conflict'),
    (om.ErasedError, 409, 'erased'),
    (om.InvalidIdError, 422, 'invalid_id'),
    (om.InvalidInputError, 422, 'invalid_input'),
    (om.ModelUnavailableError, 503, 'model_unavailable'),
    (om.DeadlineExceededError, 503, 'model_unavailable'),
    (om.ModelError, 502, 'model_error'),
    (om.ConfigError, 500, 'internal_error'),
)

_OM_MESSAGES = {
    'version_conflict': 'another request changed this memory at the same time; retry the request',
    'erased': 'the thread or resource was erased while the request ran',
    'model_unavailable': 'the language model is unavailable right now; retry later',
    'model_error': 'the language model refused or failed the request',
    'storage_unavailable': 'storage is unavailable or throttled right now; retry later',
    'internal_error': 'the server failed to handle the request',
}


def map_om_error(exc: om.OMError) -> tuple[int, str, str]:
    """(status, code, message) for an om_lib error."""
    for cls, status, code in _OM_ERRORS:
        if isinstance(exc, cls):
            # Not-found, conflict and input messages are written for clients; model and config ones are not.
            message = str(exc) if status in (404, 409, 413, 422) and code not in _OM_MESSAGES else _OM_MESSAGES[code]
            return status, code, message
    if isinstance(exc, om.StorageError) and exc.retryable:
        return 503, 'storage_unavailable', _OM_MESSAGES['storage_unavailable']
    return 500, 'internal_error', _OM_MESSAGES['internal_error']


def _field_path(loc: Sequence[Any]) -> str:
    path = ''
    for item in loc:
        path += f'[{item}]' if isinstance(item, int) else (f'.{item}' if path else str(item))
    return path


def validation_details(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/Powertools error entries as `{location, field, type, message}` (no echo of the input), plus `limit`
    for a value over a documented limit."""
    details = []
    for entry in errors:
        loc = tuple(entry.get('loc') or ())
        location, rest = (loc[0], loc[1:]) if loc and loc[0] in ('body', 'query', 'path', 'header') else ('body', loc)
        detail = {
            'location': location,
            'field': _field_path(rest),
            'type': entry.get('type', 'invalid'),
            'message': str(entry.get('msg') or 'invalid value'),
        }
        if entry.get('type') == 'too_large' and 'limit' in (entry.get('ctx') or {}):
            detail['limit'] = entry['ctx']['limit']
        details.append(detail)
    return details


def validation_response(exc: RequestValidationError) -> Response[Any]:
    """400 when the body is not a JSON object, 413 when a value is over its limit, 422 `invalid_id` for an id outside
    the grammar, else 422 `validation_error`; every field to fix is in `details`."""
    errors = list(exc.errors())
    details = validation_details(errors)
    if any(
        e.get('type') == 'json_invalid' or (tuple(e.get('loc') or ()) == ('body',) and e.get('type') in _NOT_AN_OBJECT)
        for e in errors
    ):
        # The body as a whole is wrong: absent, not JSON, or JSON but not an object.
        return error_response(HTTPStatus.BAD_REQUEST, 'invalid_json', 'the request body must be a JSON object', details)
    too_large = [d for d in details if d['type'] == 'too_large']
    if too_large:
        first = too_large[0]
        return error_response(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            'too_large',
            f'{first["field"] or "the body"} is over its limit: {first["message"]}; split the request or shorten it',
            too_large,
        )
    invalid_ids = [(e, d) for e, d in zip(errors, details, strict=True) if d['type'] == 'invalid_id']
    if invalid_ids:
        entry, first = invalid_ids[0]
        problem = str((entry.get('ctx') or {}).get('problem') or 'is not a valid id')
        return error_response(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            'invalid_id',
            str(om.InvalidIdError(first['field'] or 'the id', problem)),
            [d for _, d in invalid_ids],
        )
    first = details[0] if details else {'field': '', 'message': 'invalid request'}
    where = f'{first["field"]}: ' if first['field'] else ''
    return error_response(
        HTTPStatus.UNPROCESSABLE_ENTITY,
        'validation_error',
        f'the request is invalid ({where}{first["message"]}); see details for every field to fix',
        details,
    )


def register(app: APIGatewayRestResolver) -> None:
    """Install the error handlers on a resolver. `not_found` is installed by the routes (it needs the route table)."""

    @app.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]  # Powertools: unannotated
    def _validation(exc: RequestValidationError) -> Response[Any]:
        return validation_response(exc)

    @app.exception_handler(ApiError)  # type: ignore[untyped-decorator]
    def _api_error(exc: ApiError) -> Response[Any]:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers or None)

    @app.exception_handler(om.OMError)  # type: ignore[untyped-decorator]
    def _om_error(exc: om.OMError) -> Response[Any]:
        status, code, message = map_om_error(exc)
        if status >= 500:
            logger.warning('request failed', extra={'error': exc.code, 'status': status}, exc_info=exc)
        headers = {'Retry-After': '5'} if status == 503 else None
        return error_response(status, code, message, getattr(exc, 'details', ()), headers=headers)

    @app.exception_handler(Exception)  # type: ignore[untyped-decorator]
    def _unexpected(exc: Exception) -> Response[Any]:
        # No stack trace or exception text in the answer: it may carry internals. The log has everything.
        logger.exception('unhandled error')
        return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, 'internal_error', _OM_MESSAGES['internal_error'])


# API Gateway's own errors (gateway responses), in the same shape. `$context.error.messageString` is already a quoted
# JSON string. The CDK app installs each as `responseTemplates={'application/json': template}`.
def _gateway_template(code: str) -> str:
    return '{"error": {"code": "' + code + '", "message": $context.error.messageString, "details": []}}'


GATEWAY_RESPONSES: dict[str, tuple[int | None, str]] = {
    # type → (status to force, or None to keep API Gateway's own; error code)
    'BAD_REQUEST_BODY': (400, 'invalid_json'),
    'BAD_REQUEST_PARAMETERS': (422, 'validation_error'),
    'UNAUTHORIZED': (401, 'unauthenticated'),
    'MISSING_AUTHENTICATION_TOKEN': (404, 'not_found'),
    'ACCESS_DENIED': (403, 'forbidden'),
    'INVALID_SIGNATURE': (403, 'forbidden'),
    'EXPIRED_TOKEN': (403, 'forbidden'),
    'INVALID_API_KEY': (403, 'forbidden'),
    'AUTHORIZER_FAILURE': (500, 'internal_error'),
    'AUTHORIZER_CONFIGURATION_ERROR': (500, 'internal_error'),
    'REQUEST_TOO_LARGE': (413, 'too_large'),
    'UNSUPPORTED_MEDIA_TYPE': (415, 'unsupported_media_type'),
    'THROTTLED': (429, 'too_many_requests'),
    'QUOTA_EXCEEDED': (429, 'too_many_requests'),
    'INTEGRATION_FAILURE': (502, 'dependency_unavailable'),
    'INTEGRATION_TIMEOUT': (504, 'timeout'),
    'DEFAULT_4XX': (None, 'bad_request'),
    'DEFAULT_5XX': (None, 'internal_error'),
}


def gateway_response_templates() -> dict[str, dict[str, Any]]:
    """`{type: {'statusCode': str | None, 'template': str}}` for the CDK app's `add_gateway_response` calls."""
    return {
        kind: {'statusCode': str(status) if status else None, 'template': _gateway_template(code)}
        for kind, (status, code) in GATEWAY_RESPONSES.items()
    }
