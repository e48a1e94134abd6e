"""SigV4 checked the way API Gateway checks it, with botocore: a verifier, and a loopback proxy that lets only correctly
signed requests through to an API (the local stack), as an IAM-authorized stage would.

    identity = SigV4Identity('AKIDTEST', 'secret', 'session-token', 'eu-west-1')
    with SigV4Proxy(stack.url, identity) as proxy:   # proxy.url ends in /prod, like a stage URL
        ...  # sign requests to proxy.url as identity; anything else is answered 403
"""

from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

_AUTH = re.compile(r'AWS4-HMAC-SHA256 Credential=([^,]+), SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$')


@dataclass(frozen=True)
class SigV4Identity:
    """The credentials a caller must sign with, and the API's region."""

    key_id: str
    secret: str
    session_token: str | None
    region: str
    service: str = 'execute-api'


def verify_sigv4(identity: SigV4Identity, method: str, url: str, headers: dict[str, str], body: bytes) -> str | None:
    """None when the request carries a valid SigV4 signature by `identity`, else why not.

    Recomputes the signature with botocore from exactly the headers the request says it signed (the path and query
    as sent, the body's hash); a session token must be among them."""
    lower = {k.lower(): v for k, v in headers.items()}
    match = _AUTH.match(lower.get('authorization', ''))
    if match is None:
        return 'no SigV4 Authorization header'
    credential, signed, signature = match.groups()
    key_id, date, region, service, terminal = credential.split('/')
    if (key_id, region, service, terminal) != (identity.key_id, identity.region, identity.service, 'aws4_request'):
        return f'wrong credential scope {credential}'
    amz_date = lower.get('x-amz-date', '')
    if not amz_date.startswith(date):
        return 'X-Amz-Date does not match the scope'
    request = AWSRequest(method=method, url=url, data=body, headers={n: lower[n] for n in signed.split(';')})
    request.context['timestamp'] = amz_date
    auth = SigV4Auth(Credentials(identity.key_id, identity.secret, identity.session_token), service, region)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if expected != signature:
        return 'signature mismatch'
    if identity.session_token is not None and (
        'x-amz-security-token' not in signed.split(';') or lower['x-amz-security-token'] != identity.session_token
    ):
        return 'the session token is not signed'
    return None


# Headers of the caller that are not passed on (hop-by-hop, and the signature: the API behind trusts the proxy).
_NOT_FORWARDED = {'host', 'connection', 'keep-alive', 'transfer-encoding', 'authorization', 'x-amz-date'}


class SigV4Proxy:
    """A loopback stand-in for an IAM-authorized API Gateway stage in front of `target`.

    Requests to `url` (`http://127.0.0.1:<port>/prod/...`) are verified with botocore; a bad or missing signature is
    answered 403 `{"error": {"code": "forbidden", ...}}` and not forwarded. Good ones go to `target` without the stage
    prefix. `seen` lists `(method, path, problem)` per request.
    """

    def __init__(self, target: str, identity: SigV4Identity, *, stage: str = 'prod') -> None:
        self.target = urlsplit(target)
        self.identity = identity
        self.stage = f'/{stage}'
        self.seen: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(('127.0.0.1', 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The stage URL callers use."""
        return f'http://127.0.0.1:{self._server.server_address[1]}{self.stage}'

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list[Any], bytes]:
        connection = http.client.HTTPConnection(self.target.hostname or '127.0.0.1', self.target.port, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
            connection.request(method, path, body=body or None, headers=sent)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
                headers = dict(self.headers.items())
                problem = verify_sigv4(
                    proxy.identity, self.command, f'http://{self.headers["Host"]}{self.path}', headers, body
                )
                if problem is None and not self.path.startswith(f'{proxy.stage}/'):
                    problem = f'no such stage (paths start with {proxy.stage}/)'
                proxy.seen.append((self.command, self.path, problem))
                if problem is not None:
                    payload = f'{{"error": {{"code": "forbidden", "message": "{problem}", "details": []}}}}'.encode()
                    status, answer_headers = 403, [('Content-Type', 'application/json')]
                else:
                    status, answer_headers, payload = proxy._forward(
                        self.command, self.path[len(proxy.stage) :], headers, body
                    )
                self.send_response(status)
                for name, value in answer_headers:
                    if name.lower() not in ('content-length', 'transfer-encoding', 'connection', 'date', 'server'):
                        self.send_header(name, value)
                self.send_header('Content-Length', str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler
