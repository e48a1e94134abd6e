"""What the API refuses before the framework parses anything, and what it answers for unknown routes.

Checked first, in this order: the body's size (413: nothing is parsed), then the caller's identity (401: an
anonymous caller learns nothing about validation rules or which threads exist). Ownership of the resourceId is
checked later by each route, once the body has been validated.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from functions import _wiring
from functions._observability import logger
from functions.api import auth
from functions.api.errors import ApiError, error_response, proxy_error

# API Gateway accepts up to 10 MB; a conversation step never needs more than this (attachments go to S3).
MAX_BODY_BYTES = 6 * 1024 * 1024
PUBLIC_PATHS = frozenset({'/health', '/openapi.json'})


def refuse_early(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """A proxy result refusing the request (413, 401), or None to go on."""
    body = event.get('body') or ''
    if len(body) > MAX_BODY_BYTES:
        return proxy_error(
            413, 'payload_too_large', f'the request body is over {MAX_BODY_BYTES} bytes; upload files via /attachments'
        )
    if event.get('isBase64Encoded') and body:
        # API Gateway base64-encodes bodies that are not valid text; JSON must be UTF-8 (RFC 8259).
        try:
            base64.b64decode(body, validate=True).decode('utf-8')
        except (binascii.Error, UnicodeDecodeError):
            return proxy_error(400, 'invalid_json', 'the request body is not UTF-8 encoded JSON')
    if event.get('path') in PUBLIC_PATHS:
        return None
    try:
        s = _wiring.settings()
    except ValueError:  # a broken deployment: say so in the log, not to the caller
        logger.exception('the service settings are invalid')
        return proxy_error(500, 'internal_error', 'the server is misconfigured')
    try:
        auth.identify(event, s.OM_AUTH_MODE, s.OM_AUTH_CLAIM)
    except ApiError as exc:
        return proxy_error(exc.status, exc.code, exc.message)
    return None


def install_not_found(app: APIGatewayRestResolver) -> None:
    """404 `not_found` for unknown paths; 405 `method_not_allowed` (with `Allow`) for a known path's other methods."""

    @app.not_found
    def _not_found(_: NotFoundError) -> Response[Any]:
        event = app.current_event
        allowed = sorted({route.method for route in _routes(app) if route.rule.match(event.path)})
        if allowed:
            return error_response(
                405,
                'method_not_allowed',
                f'{event.http_method} is not supported on {event.path}; use {", ".join(allowed)}',
                headers={'Allow': ', '.join(allowed)},
            )
        return error_response(404, 'not_found', f'no route {event.http_method} {event.path}; see /openapi.json')


def _routes(app: Any) -> list[Any]:
    # Powertools keeps its compiled routes (`rule` regex, `method`) in private lists; reading them keeps one route
    # table instead of a copy that could drift.
    return [*getattr(app, '_static_routes', []), *getattr(app, '_dynamic_routes', [])]
