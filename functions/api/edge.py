"""What the API refuses before the framework parses anything, and what it answers for unknown routes.

Checked first, in this order, on the raw request: the body's size (413 `too_large`: nothing is parsed), its media
type (415 `unsupported_media_type`), its encoding (400 `invalid_json` unless UTF-8), then the caller's identity (401:
an anonymous caller learns nothing about validation rules or which threads exist). The admitted event carries the
body as UTF-8 text under the canonical `application/json` type, which is what the framework's body parsing expects;
the JSON itself is parsed, strictly, by `json_body.parse` during validation. Ownership of the resourceId is checked
later by each route, once the body has been validated.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from functions import _wiring
from functions._observability import logger
from functions.api import auth
from functions.api.errors import ApiError, error_response, proxy_error
from functions.api.limits import MAX_BODY_BYTES
from om_lib.errors import InvalidIdError
from om_lib.ids import id_problem

PUBLIC_PATHS = frozenset({'/health', '/openapi.json'})
JSON = 'application/json'
# `application/json`, and the structured-syntax `+json` types (RFC 6839), in any letter case.
_JSON_TYPE = re.compile(r'application/(?:[\w.+-]+\+)?json', re.IGNORECASE)
_UTF8 = frozenset({'utf-8', 'utf8'})


def admit(event: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(a proxy result refusing the request, or None to go on; the event to resolve).

    The event to resolve is a copy whose body is UTF-8 text (no longer base64) and whose Content-Type is
    `application/json` whenever a body was sent.
    """
    admitted = dict(event)
    body, refusal = _body_bytes(event)
    if refusal is not None:
        return refusal, admitted
    if body:
        refusal = _media_type_refusal(_header(event, 'content-type'))
        if refusal is not None:
            return refusal, admitted
        try:
            text = body.decode('utf-8')
        except UnicodeDecodeError:
            return proxy_error(400, 'invalid_json', 'the request body is not UTF-8 encoded JSON'), admitted
        admitted.update(body=text, isBase64Encoded=False, **_with_json_type(event))
    if event.get('path') in PUBLIC_PATHS:
        return None, admitted
    try:
        s = _wiring.settings()
    except ValueError:  # a broken deployment: say so in the log, not to the caller
        logger.exception('the service settings are invalid')
        return proxy_error(500, 'internal_error', 'the server is misconfigured'), admitted
    try:
        auth.identify(event, s.OM_AUTH_MODE, s.OM_AUTH_CLAIM)
    except ApiError as exc:
        return proxy_error(exc.status, exc.code, exc.message), admitted
    return None, admitted


def _body_bytes(event: Mapping[str, Any]) -> tuple[bytes, dict[str, Any] | None]:
    """The body as sent (base64 undone), or a refusal when it is over the limit or not decodable."""
    raw = event.get('body') or ''
    if event.get('isBase64Encoded') and raw:
        # A rough bound first: base64 is 4 characters per 3 bytes, so nothing much larger need be decoded.
        if len(raw) > (MAX_BODY_BYTES + 2) // 3 * 4 + 4:
            return b'', too_large_body()
        try:
            body = base64.b64decode(raw, validate=True)
        except binascii.Error:
            return b'', proxy_error(400, 'invalid_json', 'the request body is not UTF-8 encoded JSON')
    else:
        if len(raw) > MAX_BODY_BYTES:  # characters ≤ bytes: over in characters is over in bytes
            return b'', too_large_body()
        try:
            body = raw.encode('utf-8')
        except UnicodeEncodeError:  # a lone surrogate in the text itself: not UTF-8 either
            return b'', proxy_error(400, 'invalid_json', 'the request body is not UTF-8 encoded JSON')
    if len(body) > MAX_BODY_BYTES:
        return b'', too_large_body()
    return body, None


def too_large_body() -> dict[str, Any]:
    """413 `too_large` for the body as a whole."""
    detail = {'location': 'body', 'field': '', 'type': 'too_large', 'message': f'at most {MAX_BODY_BYTES} bytes'}
    return proxy_error(
        413,
        'too_large',
        f'the request body is over its limit of {MAX_BODY_BYTES} bytes; send fewer messages per request, '
        'and upload files through POST /attachments',
        [detail],
    )


def _media_type_refusal(content_type: str | None) -> dict[str, Any] | None:
    """None when the body is JSON by its Content-Type (a missing one is read as JSON), else 415."""
    if content_type is None or not content_type.strip():
        return None
    media_type, *parameters = (part.strip() for part in content_type.split(';'))
    if _JSON_TYPE.fullmatch(media_type):
        charset = next(
            (
                v.strip().strip('"').lower()
                for k, _, v in (p.partition('=') for p in parameters)
                if k.strip().lower() == 'charset'
            ),
            None,
        )
        if charset is None or charset in _UTF8:
            return None
        message = f'JSON bodies are UTF-8 (RFC 8259), not {charset[:40]}; send `Content-Type: application/json`'
    else:
        message = (
            f'the body must be JSON, not {media_type[:80] or "an unnamed type"}; send `Content-Type: application/json`'
        )
    return proxy_error(415, 'unsupported_media_type', message)


def _header(event: Mapping[str, Any], name: str) -> str | None:
    for key, value in (event.get('headers') or {}).items():
        if key.lower() == name:
            return str(value) if value is not None else None
    for key, values in (event.get('multiValueHeaders') or {}).items():
        if key.lower() == name and values:
            return str(values[-1])
    return None


def _with_json_type(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event's headers with one Content-Type, `application/json` (the framework compares it case-sensitively)."""
    headers = {k: v for k, v in (event.get('headers') or {}).items() if k.lower() != 'content-type'}
    multi = {k: v for k, v in (event.get('multiValueHeaders') or {}).items() if k.lower() != 'content-type'}
    return {'headers': {**headers, 'Content-Type': JSON}, 'multiValueHeaders': {**multi, 'Content-Type': [JSON]}}


def install_not_found(app: APIGatewayRestResolver) -> None:
    """404 `not_found` for unknown paths; 405 `method_not_allowed` (with `Allow`) for a known path's other methods;
    422 `invalid_id` for a known path whose id holds a character no id may hold (the router does not match those)."""

    @app.not_found
    def _not_found(_: NotFoundError) -> Response[Any]:
        event = app.current_event
        invalid = _invalid_path_id(app, event.path)
        if invalid is not None:
            name, problem = invalid
            detail = {'location': 'path', 'field': name, 'type': 'invalid_id', 'message': f'the id {problem}'}
            return error_response(422, 'invalid_id', str(InvalidIdError(name, problem)), [detail])
        allowed = sorted({route.method for route in _routes(app) if route.rule.match(event.path)})
        if allowed:
            return error_response(
                405,
                'method_not_allowed',
                f'{event.http_method} is not supported on {event.path}; use {", ".join(allowed)}',
                headers={'Allow': ', '.join(allowed)},
            )
        return error_response(404, 'not_found', f'no route {event.http_method} {event.path}; see /openapi.json')


def _invalid_path_id(app: Any, path: str) -> tuple[str, str] | None:
    """(parameter, problem) when `path` is a route's path but for an id outside the grammar, else None."""
    for route in _routes(app):
        match = _loose_rule(route.path).match(path)
        if match is None:
            continue
        for name, value in match.groupdict().items():
            problem = id_problem(value)
            if problem is not None:
                return name, problem
    return None


@lru_cache(maxsize=64)
def _loose_rule(path: str) -> re.Pattern[str]:
    # The route's path with each `<param>` matching any one segment, whatever its characters.
    return re.compile('^' + re.sub(r'<(\w+)>', r'(?P<\1>[^/]+)', re.escape(path)) + '/*$')


def _routes(app: Any) -> list[Any]:
    # Powertools keeps its compiled routes (`path`, `rule` regex, `method`) in private lists; reading them keeps one
    # route table instead of a copy that could drift.
    return [*getattr(app, '_static_routes', []), *getattr(app, '_dynamic_routes', [])]
