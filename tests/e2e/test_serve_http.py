"""`om serve`'s HTTP server as an attacker or a broken client meets it: a foreign Host (DNS rebinding), a malformed
Content-Length, a client too slow to send its headers or its body. Raw sockets, so nothing is tidied up on the way."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from om_cli import local_stack
from om_cli.local_stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope='module')
def stack() -> Iterator[LocalStack]:
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    with LocalStack(port=0, env=env, workers=False, sweep_interval_s=None, allowed_hosts=['devbox.example']) as running:
        yield running


def exchange(stack: LocalStack, raw: bytes, *, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` on a new connection; read the answer until the server closes or the body is complete."""
    host, port = stack.url.removeprefix('http://').rsplit(':', 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(raw)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f'closed before an answer: {data!r}')
        data += chunk
    head, body = data.split(b'\r\n\r\n', 1)
    lines = head.decode('latin-1').split('\r\n')
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(':', 1) for line in lines[1:])}
    length = int(headers.get('content-length', '0'))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def request(stack: LocalStack, *, host: str | None = None, extra: str = '', body: bytes = b'') -> bytes:
    port = stack.url.rsplit(':', 1)[1]
    host_line = f'Host: {host if host is not None else f"127.0.0.1:{port}"}\r\n' if host != '' else ''
    return (f'GET /health HTTP/1.1\r\n{host_line}{extra}Connection: close\r\n\r\n').encode() + body


def assert_error_shape(body: bytes, code: str) -> str:
    error = json.loads(body)['error']
    assert set(error) == {'code', 'message', 'details'} and error['code'] == code, error
    return str(error['message'])


def test_the_host_must_be_a_name_the_server_was_reached_by(stack: LocalStack) -> None:
    port = stack.url.rsplit(':', 1)[1]
    # The bound address and the loopback names, and the configured name, are served
    for host in (
        f'127.0.0.1:{port}',
        f'localhost:{port}',
        f'LOCALHOST:{port}',
        f'[::1]:{port}',
        f'devbox.example:{port}',
    ):
        status, _, _ = exchange(stack, request(stack, host=host))
        assert status == 200, host
    # A page whose own name resolves to this machine (DNS rebinding) is refused, in the error shape
    for host in (f'evil.example:{port}', 'evil.example', f'127.0.0.1:{int(port) + 1}', ''):
        status, headers, body = exchange(stack, request(stack, host=host))
        assert status == 421, host
        assert headers['content-type'] == 'application/json'
        assert '--allowed-host' in assert_error_shape(body, 'host_not_allowed')
    # The stack description (it shows the environment) is behind the same check
    raw = f'GET /_om/local-stack HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n'.encode()
    assert exchange(stack, raw)[0] == 421


def test_a_malformed_content_length_is_a_400_without_a_traceback(
    stack: LocalStack, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    for length in ('abc', '-1', '1e3', ' 12 x', '5, 6'):
        started = time.monotonic()
        status, headers, body = exchange(stack, request(stack, extra=f'Content-Length: {length}\r\n'))
        assert status == 400, length
        assert 'Content-Length' in assert_error_shape(body, 'invalid_content_length')
        assert time.monotonic() - started < 2  # answered at once, not after waiting for a body
    # Two different lengths are refused too (request smuggling); a chunked body is asked to send a length
    status, _, body = exchange(stack, request(stack, extra='Content-Length: 1\r\nContent-Length: 2\r\n', body=b'ab'))
    assert status == 400
    status, _, body = exchange(stack, request(stack, extra='Transfer-Encoding: chunked\r\n', body=b'0\r\n\r\n'))
    assert status == 411 and assert_error_shape(body, 'length_required')
    out, err = capfd.readouterr()
    assert 'Traceback' not in out + err + caplog.text


def test_a_slow_client_cannot_hold_a_worker(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_stack, 'HEADER_TIMEOUT_S', 1.0)
    monkeypatch.setattr(local_stack, 'BODY_TIMEOUT_S', 1.0)
    host, port = stack.url.removeprefix('http://').rsplit(':', 1)
    # Headers a byte every 0.2 s (each read is quick, so a per-read timeout never fires): cut off near the deadline
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        closed_after = None
        for byte in f'GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: {"a" * 100}'.encode():
            try:
                sock.sendall(bytes([byte]))
                sock.settimeout(0.2)
                if sock.recv(1) == b'':
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None and closed_after < 3, closed_after
    # A body that trickles in: 408 in the error shape, once its time is up
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        head = f'POST /threads/t/steps HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n'
        sock.sendall(f'{head}Content-Length: 100\r\n\r\n{{"resourceId'.encode())
        sock.settimeout(5)
        status, _, body = read_answer(sock)
        assert status == 408 and assert_error_shape(body, 'request_timeout')
        assert 0.9 < time.monotonic() - started < 3
    # The server still answers everyone else
    assert exchange(stack, request(stack))[0] == 200
