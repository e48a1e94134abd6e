"""`om inspect`: the memory inspector on a loopback port, against any stack.

It serves the same page as `GET /inspector` (`functions/api/inspector/`) and forwards the page's API calls to
`--api-url`, adding the credentials there, so the browser needs none: SigV4 for `execute-api` with the user's AWS
credential chain (`--auth iam`, the deployed default), a bearer token (`--auth bearer`, from `--token` or
`OM_BEARER_TOKEN`), or nothing (`--auth none`).

The proxy holds the user's credentials, so it is careful about who may use them: it listens on loopback only,
answers only requests whose `Host` is its own loopback address (a page on another site cannot reach it through DNS
rebinding), forwards only the read-only calls the page makes (listing, memory, generations, messages, recall) and
only with the `X-OM-Inspector` header the page sends (a cross-site request cannot add it without a CORS preflight,
which this server never grants).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from functions.api import inspector

logger = logging.getLogger(__name__)

AUTH_MODES = ('none', 'iam', 'bearer')
TOKEN_ENV = 'OM_BEARER_TOKEN'
UPSTREAM_TIMEOUT_S = 35.0  # API Gateway stops an integration at ~29 s
MAX_BODY_BYTES = 1_000_000  # the page's recall form sends a few hundred bytes
PAGE_HEADER = 'X-OM-Inspector'
# https://{api-id}.execute-api.{region}.amazonaws.com[.cn] (and the vpce- form {api-id}-{vpce-id}.execute-api...)
_EXECUTE_API_HOST = re.compile(r'\.execute-api\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$')
_ID = r'[^/?#]+'
# The calls the page makes: nothing that writes or erases (recall only reads).
FORWARDED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ('GET', re.compile(r'/health')),
    ('GET', re.compile(rf'/resources/{_ID}/threads')),
    ('GET', re.compile(rf'/threads/{_ID}')),
    ('GET', re.compile(rf'/threads/{_ID}/memory')),
    ('GET', re.compile(rf'/threads/{_ID}/memory/generations')),
    ('GET', re.compile(rf'/threads/{_ID}/messages')),
    ('POST', re.compile(r'/recall')),
)


class InspectError(Exception):
    """A mistake the user can fix (the message says what and how); the CLI prints it and exits with 2."""


def region_from_url(url: str) -> str | None:
    """The AWS region in an `execute-api` URL, or None (custom domains, loopback)."""
    match = _EXECUTE_API_HOST.search(urlsplit(url).hostname or '')
    return match['region'] if match else None


# ---------------------------------------------------------------------------------------------------------------------
# Adding credentials
# ---------------------------------------------------------------------------------------------------------------------
Signer = Callable[[str, str, dict[str, str], bytes], dict[str, str]]


def no_auth(method: str, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    """No credentials (a stack deployed with `authMode=none`, or `om serve`)."""
    return headers


def bearer_auth(token: str) -> Signer:
    """`Authorization: Bearer <token>` on every forwarded call (a JWT/Cognito stack)."""

    def sign(method: str, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        return {**headers, 'Authorization': f'Bearer {token}'}

    return sign


def sigv4_auth(region: str, credentials: Any) -> Signer:
    """SigV4 for `execute-api` in `region`, with botocore credentials (refreshed by botocore when they expire)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    def sign(method: str, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        # Sign only what is sent unchanged: the host (from the URL), the body's hash and the content type.
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        SigV4Auth(credentials.get_frozen_credentials(), 'execute-api', region).add_auth(request)
        return dict(request.headers.items())

    return sign


def configured_region(session: Any) -> str | None:
    """The region the AWS CLI and SDKs would use: `AWS_REGION`, then what botocore reads (`AWS_DEFAULT_REGION`, the
    profile's `region` in the config file)."""
    region = os.environ.get('AWS_REGION', '').strip()
    return region or session.get_config_variable('region') or None


def make_signer(auth: str, api_url: str, *, token: str | None, region: str | None) -> Signer:
    """The signer for `--auth`, checking everything it needs now (InspectError says what is missing)."""
    if auth not in AUTH_MODES:
        raise InspectError(f'--auth must be one of {", ".join(AUTH_MODES)}, got {auth!r}')
    if token is not None and auth != 'bearer':
        raise InspectError(
            f'--token is only for --auth bearer (this is --auth {auth}): drop --token or add --auth bearer'
        )
    if auth == 'none':
        return no_auth
    if auth == 'bearer':
        token = (token or os.environ.get(TOKEN_ENV) or '').strip()
        if not token:
            raise InspectError(f'--auth bearer needs a token: pass --token TOKEN or set {TOKEN_ENV}')
        return bearer_auth(token)
    import botocore.session

    session = botocore.session.get_session()
    region = region or region_from_url(api_url) or configured_region(session)
    if not region:
        raise InspectError(
            f'the AWS region of {api_url} is unknown (it is read from execute-api URLs, AWS_REGION, '
            'AWS_DEFAULT_REGION or the profile): pass --region, e.g. --region eu-west-1'
        )
    credentials = session.get_credentials()
    if credentials is None:
        raise InspectError(
            'no AWS credentials found for --auth iam: configure the credential chain (AWS_PROFILE, '
            'AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, SSO), or use --auth none for a stack without authentication'
        )
    return sigv4_auth(region, credentials)


def check_api_url(url: str) -> str:
    """The API's base URL without a trailing slash; InspectError unless it is an http(s) URL without query."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        raise InspectError(
            "--api-url must be the API's http(s) base URL, e.g. "
            f'https://abc123.execute-api.eu-west-1.amazonaws.com/prod (got {url!r})'
        )
    if parts.query or parts.fragment:
        raise InspectError(f'--api-url must not carry a query or fragment (got {url!r}): pass the base URL only')
    return url.strip().rstrip('/')


# ---------------------------------------------------------------------------------------------------------------------
# The proxy
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Upstream:
    """Where forwarded calls go and how they are signed."""

    api_url: str
    sign: Signer

    def call(self, method: str, path_and_query: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Forward one call; (status, headers, body). Raises OSError when the API cannot be reached."""
        url = self.api_url + path_and_query
        headers = {'Accept': 'application/json'}
        if body:
            headers['Content-Type'] = 'application/json'
        signed = self.sign(method, url, headers, body)
        request = urllib.request.Request(url, data=body or None, method=method, headers=signed)
        try:
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as response:  # noqa: S310 - the user's API
                return response.status, dict(response.headers.items()), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()


def _error(code: str, message: str) -> bytes:
    return json.dumps({'error': {'code': code, 'message': message, 'details': []}}).encode()


def _forwarded(method: str, path: str) -> bool:
    return any(method == m and pattern.fullmatch(path) for m, pattern in FORWARDED)


def handler_class(upstream: Upstream, allowed_hosts: frozenset[str]) -> type[BaseHTTPRequestHandler]:
    """The request handler: the page and its files from the package, the page's API calls to `upstream`."""

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        server_version = 'om-inspect'

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._dispatch()

        # Everything else reaches `_proxy`, which refuses what the page never sends (with a message, not a 501 page).
        do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET  # noqa: N815

        def _dispatch(self) -> None:
            started = time.monotonic()
            if self.headers.get('Host', '') not in allowed_hosts:
                self.close_connection = True
                self._send(403, 'application/json', _error('forbidden_host', 'om inspect answers only its own address'))
                return
            path = urlsplit(self.path).path
            if self.command == 'GET' and path in ('/', '/inspector', '/inspector/'):
                if path == '/':
                    self._send(302, 'text/plain', b'', {'Location': '/inspector'})
                    return
                page = inspector.page(trailing_slash=path.endswith('/'))
                self._send(200, inspector.HTML, page, inspector.SECURITY_HEADERS)
                return
            if self.command == 'GET' and path.startswith('/inspector/'):
                found = inspector.asset(path.removeprefix('/inspector/'))
                if found is None:
                    self._send(404, 'application/json', _error('not_found', f'no inspector file {path}'))
                else:
                    self._send(200, found[1], found[0], inspector.SECURITY_HEADERS)
                return
            self._proxy(path, started)

        def _proxy(self, path: str, started: float) -> None:
            length = int(self.headers.get('Content-Length') or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, 'application/json', _error('too_large', 'om inspect forwards small bodies only'))
                return
            body = self.rfile.read(length) if length else b''
            if not _forwarded(self.command, path) or self.headers.get(PAGE_HEADER) != '1':
                message = (
                    f"om inspect forwards only the inspector page's read-only calls; {self.command} {path} is not one "
                    '(use the API or om-client for anything else)'
                )
                self._send(403, 'application/json', _error('not_forwarded', message))
                return
            try:
                status, headers, payload = upstream.call(self.command, self.path, body)
            except (OSError, ValueError) as exc:
                reason = getattr(exc, 'reason', None) or exc
                message = f'om inspect could not reach {upstream.api_url} ({reason}); check --api-url and your network'
                self._send(502, 'application/json', _error('upstream_unreachable', message))
                return
            content_type = headers.get('Content-Type') or headers.get('content-type') or 'application/json'
            self._send(status, content_type, payload)
            logger.info('%s %s %s %d ms', self.command, self.path, status, (time.monotonic() - started) * 1000)

        def _send(
            self, status: int, content_type: str, payload: bytes, headers: Mapping[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header('Content-Type', content_type)
            self.send_header('Content-Length', str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by http.server
            logger.debug('%s %s', self.address_string(), format % args)

    return _Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class InspectServer:
    """The loopback server of `om inspect` (a context manager; `url` is the inspector's address)."""

    def __init__(self, upstream: Upstream, *, port: int = 0, host: str = '127.0.0.1') -> None:
        self.upstream = upstream
        self._server = _Server((host, port), handler_class(upstream, frozenset()))
        bound = self._server.server_address[1]
        hosts = frozenset({f'{host}:{bound}', f'localhost:{bound}', f'127.0.0.1:{bound}'})
        self._server.RequestHandlerClass = handler_class(upstream, hosts)
        self.port = bound
        self._thread = threading.Thread(target=self._server.serve_forever, name='om-inspect', daemon=True)

    @property
    def url(self) -> str:
        return f'http://127.0.0.1:{self.port}/inspector'

    def start(self) -> InspectServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> InspectServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def check_reachable(upstream: Upstream) -> None:
    """GET /health through the signer: InspectError when the API cannot be reached or refuses the credentials."""
    try:
        status, _, payload = upstream.call('GET', '/health', b'')
    except (OSError, ValueError) as exc:
        reason = getattr(exc, 'reason', None) or exc
        raise InspectError(f'cannot reach the API at {upstream.api_url} ({reason}): check --api-url') from exc
    if status in (401, 403):
        try:
            detail = json.loads(payload).get('error', {}).get('message') or json.loads(payload).get('message')
        except (ValueError, AttributeError):
            detail = payload[:200].decode(errors='replace')
        raise InspectError(
            f"the API at {upstream.api_url} refused the credentials ({status}: {detail}): check --auth (the stack's "
            'authMode), --region, and that your identity may call it'
        )
    if status != 200:
        raise InspectError(
            f'{upstream.api_url}/health answered {status}, not 200: is --api-url the base URL of an Observational '
            'Memory API (stage included, e.g. .../prod)?'
        )
