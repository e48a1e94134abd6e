"""`om inspect`: the page on loopback, its read-only API calls forwarded and signed (SigV4 for execute-api, or a
bearer token), checked against a local endpoint that verifies each SigV4 signature with botocore."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from om_cli import inspect
from om_cli.main import main
from tests.fakes.sigv4 import SigV4Identity
from tests.fakes.sigv4 import verify_sigv4 as check_sigv4

ROOT = Path(__file__).resolve().parents[2]
KEY_ID, SECRET, SESSION = 'AKIDINSPECTTEST', 'inspect-secret-key', 'inspect-session-token'
REGION = 'eu-west-1'
IDENTITY = SigV4Identity(KEY_ID, SECRET, SESSION, REGION)


def verify_sigv4(method: str, url: str, headers: dict[str, str], body: bytes) -> str | None:
    """None when the request carries a valid SigV4 signature for execute-api in REGION by KEY_ID, else why not."""
    return check_sigv4(IDENTITY, method, url, headers, body)


class VerifyingApi:
    """A loopback stand-in for API Gateway: refuses (403) anything not signed as the test's identity would be."""

    def __init__(self, *, require: str = 'sigv4') -> None:
        self.require = require
        self.seen: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
                headers = dict(self.headers.items())
                url = f'http://{self.headers["Host"]}{self.path}'
                if api.require == 'sigv4':
                    problem = verify_sigv4(self.command, url, headers, body)
                else:
                    problem = None if headers.get('Authorization') == f'Bearer {api.require}' else 'bad bearer token'
                api.seen.append({'method': self.command, 'path': self.path, 'headers': headers, 'body': body})
                status = 403 if problem else 200
                payload = {'message': problem} if problem else {'path': self.path, 'echo': body.decode() or None}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}/prod'
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def aws_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The user's credential chain: temporary credentials in the environment, no profile or config files."""
    for name in ('AWS_PROFILE', 'AWS_DEFAULT_PROFILE', 'AWS_ENDPOINT_URL'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('AWS_CONFIG_FILE', str(tmp_path / 'none'))
    monkeypatch.setenv('AWS_SHARED_CREDENTIALS_FILE', str(tmp_path / 'none'))
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', KEY_ID)
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', SECRET)
    monkeypatch.setenv('AWS_SESSION_TOKEN', SESSION)


@pytest.fixture
def sigv4_api() -> Iterator[VerifyingApi]:
    api = VerifyingApi()
    yield api
    api.close()


def fetch(url: str, *, method: str = 'GET', body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    sent = {'X-OM-Inspector': '1', **({'Content-Type': 'application/json'} if data else {}), **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, status, kind = response.read(), response.status, response.headers.get('Content-Type', '')
    except urllib.error.HTTPError as exc:
        raw, status, kind = exc.read(), exc.code, exc.headers.get('Content-Type', '')
    return status, json.loads(raw) if 'json' in kind and raw else raw.decode()


def test_the_verifier_refuses_what_is_not_signed_right(aws_identity: None, sigv4_api: VerifyingApi) -> None:
    # The check has teeth: unsigned, and signed for another path, are both refused
    assert fetch(sigv4_api.url + '/health')[0] == 403
    sign = inspect.make_signer('iam', sigv4_api.url, token=None, region=REGION)
    headers = sign('GET', sigv4_api.url + '/threads/a/memory?resourceId=r', {'Accept': 'application/json'}, b'')
    status, body = fetch(sigv4_api.url + '/threads/b/memory?resourceId=r', headers=headers)
    assert (status, body['message']) == (403, 'signature mismatch')


def test_calls_through_the_proxy_are_signed_with_sigv4(aws_identity: None, sigv4_api: VerifyingApi) -> None:
    upstream = inspect.Upstream(sigv4_api.url, inspect.make_signer('iam', sigv4_api.url, token=None, region=REGION))
    inspect.check_reachable(upstream)  # GET /health, signed
    with inspect.InspectServer(upstream) as server:
        base = server.url.removesuffix('/inspector')
        # Ids with characters that are escaped in a path: the signature covers the path as sent
        status, body = fetch(base + '/threads/user%3A1%40x/memory?resourceId=acme%3Aalice')
        assert status == 200, body
        assert body['path'] == '/prod/threads/user%3A1%40x/memory?resourceId=acme%3Aalice'
        recall = {'resourceId': 'acme:alice', 'threadId': 't1', 'mode': 'messages', 'page': 2}
        status, body = fetch(base + '/recall', method='POST', body=recall)
        assert status == 200 and json.loads(body['echo']) == recall  # the body's hash is signed
        # The browser's own headers (cookies, its Authorization) never reach the API
        status, _ = fetch(base + '/threads/t1/messages?resourceId=r', headers={'Cookie': 'session=1'})
        assert status == 200 and 'Cookie' not in sigv4_api.seen[-1]['headers']


def test_the_proxy_forwards_only_the_page_s_read_only_calls(aws_identity: None, sigv4_api: VerifyingApi) -> None:
    upstream = inspect.Upstream(sigv4_api.url, inspect.make_signer('iam', sigv4_api.url, token=None, region=REGION))
    with inspect.InspectServer(upstream) as server:
        base = server.url.removesuffix('/inspector')
        refused = [
            fetch(base + '/threads/t1?resourceId=r', method='DELETE'),
            fetch(base + '/threads/t1/chat', method='POST', body={'resourceId': 'r', 'content': 'hi'}),
            fetch(base + '/resources/r', method='DELETE'),
            # A cross-site request cannot add the page's header without a preflight this server never grants
            fetch(base + '/threads/t1/memory?resourceId=r', headers={'X-OM-Inspector': ''}),
        ]
        assert [(s, b['error']['code']) for s, b in refused] == [(403, 'not_forwarded')] * 4
        # DNS rebinding: a page of another site that resolves to 127.0.0.1 is not this server
        status, body = fetch(base + '/threads/t1/memory?resourceId=r', headers={'Host': f'evil.example:{server.port}'})
        assert (status, body['error']['code']) == (403, 'forbidden_host')
        assert sigv4_api.seen == []
        # The page and its files are served from the package
        status, html = fetch(server.url)
        assert status == 200 and 'src="inspector/inspector.js"' in html


def test_bearer_tokens_pass_through_from_the_environment_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    api = VerifyingApi(require='tok-from-env')
    try:
        monkeypatch.setenv('OM_BEARER_TOKEN', 'tok-from-env')
        upstream = inspect.Upstream(api.url, inspect.make_signer('bearer', api.url, token=None, region=None))
        with inspect.InspectServer(upstream) as server:
            status, body = fetch(server.url.removesuffix('/inspector') + '/resources/r/threads')
            assert status == 200, body
        flag = inspect.make_signer('bearer', api.url, token='tok-from-flag', region=None)
        assert flag('GET', api.url, {}, b'')['Authorization'] == 'Bearer tok-from-flag'
    finally:
        api.close()


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['--api-url', 'ftp://example.com'], "--api-url must be the API's http(s) base URL"),
        (['--api-url', 'https://x.execute-api.eu-west-1.amazonaws.com/prod?x=1'], 'must not carry a query'),
        (['--api-url', 'https://x.execute-api.eu-west-1.amazonaws.com/prod', '--auth', 'bearer'], 'needs a token'),
        (['--api-url', 'http://127.0.0.1:9/prod', '--auth', 'iam'], 'pass --region'),
        (['--api-url', 'http://127.0.0.1:9/prod', '--auth', 'none', '--token', 't'], '--token is only for'),
        (['--api-url', 'http://127.0.0.1:9/prod', '--auth', 'none'], 'cannot reach the API'),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_status_2(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv('OM_BEARER_TOKEN', raising=False)
    for name in ('AWS_REGION', 'AWS_DEFAULT_REGION', 'AWS_PROFILE'):  # no region anywhere
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('AWS_CONFIG_FILE', str(tmp_path / 'none'))
    assert main(['inspect', '--port', '0', *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith('om inspect: ') and message in err and err.count('\n') == 1, err


@pytest.mark.parametrize('source', ['AWS_REGION', 'AWS_DEFAULT_REGION', 'profile'])
def test_the_region_is_read_as_the_aws_cli_reads_it(
    source: str, aws_identity: None, sigv4_api: VerifyingApi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A custom domain (not an execute-api host) and no --region: the region comes from the environment or the profile
    for name in ('AWS_REGION', 'AWS_DEFAULT_REGION'):
        monkeypatch.delenv(name, raising=False)
    if source == 'profile':
        config = tmp_path / 'config'
        config.write_text(f'[profile inspect]\nregion = {REGION}\n')
        monkeypatch.setenv('AWS_CONFIG_FILE', str(config))
        monkeypatch.setenv('AWS_PROFILE', 'inspect')
    else:
        monkeypatch.setenv(source, REGION)
        if source == 'AWS_REGION':
            monkeypatch.setenv('AWS_DEFAULT_REGION', 'us-west-2')  # AWS_REGION wins, as in the AWS CLI
    upstream = inspect.Upstream(sigv4_api.url, inspect.make_signer('iam', sigv4_api.url, token=None, region=None))
    inspect.check_reachable(upstream)  # the verifying API refuses a signature for any other region
    with inspect.InspectServer(upstream) as server:
        status, body = fetch(server.url.removesuffix('/inspector') + '/threads/t1/memory?resourceId=r')
    assert status == 200, body


def test_refused_credentials_are_named_at_start(aws_identity: None, sigv4_api: VerifyingApi, capsys) -> None:
    sigv4_api.require = 'some-other-token'  # the stand-in now wants a bearer token: our SigV4 call is refused
    assert main(['inspect', '--port', '0', '--api-url', sigv4_api.url, '--region', REGION]) == 2
    assert 'refused the credentials (403' in capsys.readouterr().err


def test_om_inspect_runs_until_stopped(aws_identity: None, sigv4_api: VerifyingApi) -> None:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    command = [sys.executable, '-m', 'om_cli.main', 'inspect', '--api-url', sigv4_api.url, '--region', REGION]
    process = subprocess.Popen(
        [*command, '--port', str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f'om inspect: http://127.0.0.1:{port}/inspector'), line + process.stderr.read()  # type: ignore[union-attr]
        status, body = fetch(f'http://127.0.0.1:{port}/threads/t1/memory/generations?resourceId=r&limit=5')
        assert status == 200 and body['path'].startswith('/prod/threads/t1/memory/generations')
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
