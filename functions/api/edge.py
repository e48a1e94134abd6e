"""What the API refuses before the framework parses anything, what it adds to every answer, and what it answers for
unknown routes.

Checked first, in this order, on the raw request: the body's size (413 `too_large`: nothing is parsed), its media
type (415 `unsupported_media_type`: a body must say it is JSON; a browser sends a body without a type, or a
`text/plain` one, to any site without asking it first), its encoding (400 `invalid_json` unless UTF-8), the web page
it comes from (403 `origin_not_allowed` for a request that changes data from a page of another origin than the API's
own or an allowed one; see `functions.origins`), then the caller's identity (401: an anonymous caller learns nothing
about validation rules or which threads exist). A CORS preflight from an allowed origin is answered here too. The
admitted event carries the body as UTF-8 text under the canonical `application/json` type, which is what the
framework's body parsing expects; the JSON itself is parsed, strictly, by `json_body.parse` during validation.
Ownership of the resourceId is checked later by each route, once the body has been validated.

`finish` adds to every answer `X-Content-Type-Options: nosniff` (no browser reads a JSON answer as a page or a script)
and, for an allowed origin, its CORS headers.
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
from functions.origins import canonical_origin, own_origin, parse_origins
from om_lib.errors import InvalidIdError
from om_lib.ids import id_problem

PUBLIC_PATHS = frozenset({'/health', '/openapi.json'})
JSON = 'application/json'
# `application/json`, and the structured-syntax `+json` types (RFC 6839), in any letter case.
_JSON_TYPE = re.compile(r'application/(?:[\w.+-]+\+)?json', re.IGNORECASE)
_UTF8 = frozenset({'utf-8', 'utf8'})
# Methods that change data: from a web page, only of the API's own origin or an allowed one.
STATE_CHANGING = frozenset({'POST', 'PUT', 'PATCH', 'DELETE'})
NOSNIFF = {'X-Content-Type-Options': 'nosniff'}
# What an allowed origin's page may send (CORS): every method of the API, JSON, and the credentials of each auth mode.
CORS_METHODS = 'DELETE, GET, OPTIONS, PATCH, POST, PUT'
CORS_HEADERS = 'Authorization, Content-Type, X-Amz-Content-Sha256, X-Amz-Date, X-Amz-Security-Token, X-Api-Key'
CORS_MAX_AGE_S = 600


def admit(event: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(a proxy result refusing the request, or None to go on; the event to resolve).

    The event to resolve is a copy whose body is UTF-8 text (no longer base64) and whose Content-Type is
    `application/json` whenever a body was sent. A CORS preflight is answered here (the "refusal" is the answer).
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
    method = str(event.get('httpMethod') or '').upper()
    origin = _header(event, 'origin')
    public = event.get('path') in PUBLIC_PATHS
    if public and origin is None:
        return None, admitted  # the settings are not needed: /health answers even on a broken deployment
    try:
        s = _wiring.settings()
    except ValueError:  # a broken deployment: say so in the log, not to the caller
        logger.exception('the service settings are invalid')
        return proxy_error(500, 'internal_error', 'the server is misconfigured'), admitted
    if origin is not None:
        if method == 'OPTIONS' and _header(event, 'access-control-request-method'):
            return _preflight(origin, s.OM_ALLOWED_ORIGINS), admitted
        if method in STATE_CHANGING and not _origin_may_write(event, origin, s.OM_ALLOWED_ORIGINS):
            return _origin_refusal(origin), admitted
    if public:
        return None, admitted
    try:
        auth.identify(event, s.OM_AUTH_MODE, s.OM_AUTH_CLAIM)
    except ApiError as exc:
        return proxy_error(exc.status, exc.code, exc.message), admitted
    return None, admitted


def finish(event: Mapping[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The proxy result with `X-Content-Type-Options: nosniff` and, for an allowed origin, its CORS headers."""
    extra = dict(NOSNIFF)
    origin = _header(event, 'origin')
    if origin is not None and _allowed(origin, _allow_list()):
        extra.update({'Access-Control-Allow-Origin': origin.strip(), 'Vary': 'Origin'})
    if isinstance(result.get('multiValueHeaders'), dict):
        multi = result['multiValueHeaders']
        present = {k.lower() for k in multi}
        multi.update({k: [v] for k, v in extra.items() if k.lower() not in present})
    else:
        headers = result.setdefault('headers', {}) or {}
        present = {k.lower() for k in headers}
        headers.update({k: v for k, v in extra.items() if k.lower() not in present})
        result['headers'] = headers
    return result


def _allow_list() -> str:
    try:
        return _wiring.settings().OM_ALLOWED_ORIGINS
    except ValueError:
        return ''


@lru_cache(maxsize=8)
def _allowed_origins(allow_list: str) -> frozenset[str]:
    return parse_origins(allow_list)


def _allowed(origin: str, allow_list: str) -> bool:
    canonical = canonical_origin(origin)
    return canonical is not None and canonical in _allowed_origins(allow_list)


def _origin_may_write(event: Mapping[str, Any], origin: str, allow_list: str) -> bool:
    """Is the page that sent this request the API's own (same scheme, host and port) or an allowed one?"""
    canonical = canonical_origin(origin)
    if canonical is None:
        return False  # `null` (a sandboxed frame, a file: page) or garbage: no page anyone vouches for
    own = own_origin(_header(event, 'host'), _header(event, 'x-forwarded-proto'))
    return canonical == own or canonical in _allowed_origins(allow_list)


def _origin_refusal(origin: str) -> dict[str, Any]:
    shown = origin.strip()[:100]
    return proxy_error(
        403,
        'origin_not_allowed',
        f'a web page of another origin ({shown}) may not change data here; if that page should, add its origin to '
        'the allowed origins (`om serve --allow-origin ORIGIN`, or `-c allowedOrigins=ORIGIN` for a deployed stack)',
    )


def _preflight(origin: str, allow_list: str) -> dict[str, Any]:
    """A CORS preflight: 204 with what an allowed origin may send; 403 for any other origin (the browser then never
    sends the request)."""
    if not _allowed(origin, allow_list):
        return _origin_refusal(origin)
    return {
        'statusCode': 204,
        'headers': {
            'Access-Control-Allow-Origin': origin.strip(),
            'Access-Control-Allow-Methods': CORS_METHODS,
            'Access-Control-Allow-Headers': CORS_HEADERS,
            'Access-Control-Max-Age': str(CORS_MAX_AGE_S),
            'Vary': 'Origin',
        },
        'body': '',
        'isBase64Encoded': False,
    }


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
    """None when the body is JSON by its Content-Type, else 415 (a body without a Content-Type too)."""
    if content_type is None or not content_type.strip():
        return proxy_error(
            415,
            'unsupported_media_type',
            'the request has a body but no Content-Type; send it as JSON with `Content-Type: application/json`',
        )
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
