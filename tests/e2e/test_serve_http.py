"""`om serve`'s HTTP server as an attacker or a broken client meets it: a foreign Host (DNS rebinding), a malformed
Content-Length, a body over the API's limit, a client too slow to send its headers or its body. Raw sockets, so nothing
is tidied up on the way. Every answer the server makes itself carries the headers the API function's answers do."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from functions.api.edge import too_large_body
from functions.api.limits import MAX_BODY_BYTES
from om_cli import local_stack
from om_cli.local_stack import EVENTS_PATH, LocalStack, host_to_allow, served_hosts

pytestmark = pytest.mark.e2e


@pytest.fixture(scope='module')
def stack() -> Iterator[LocalStack]:
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    hosts = ['devbox.example', 'proxy.example:80', 'tls.example:443', 'tunnel.example:9000']
    with LocalStack(port=0, env=env, workers=False, sweep_interval_s=None, allowed_hosts=hosts) as running:
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


def assert_api_headers(headers: dict[str, str]) -> None:
    """The headers every answer of the API function carries (edge.finish)."""
    assert headers['content-type'] == 'application/json', headers
    assert headers.get('x-content-type-options') == 'nosniff', headers


def test_the_host_must_be_a_name_the_server_was_reached_by(stack: LocalStack) -> None:
    port = stack.url.rsplit(':', 1)[1]
    # The bound address and the loopback names, and the configured names, are served; a name given without a port
    # also bare (a reverse proxy's Host), and one given with port 80 or 443 bare too (the scheme's default port)
    for host in (
        f'127.0.0.1:{port}',
        f'localhost:{port}',
        f'LOCALHOST:{port}',
        f'[::1]:{port}',
        f'devbox.example:{port}',
        'devbox.example',
        'proxy.example:80',
        'proxy.example',
        'tls.example',
        'tunnel.example:9000',
    ):
        status, _, _ = exchange(stack, request(stack, host=host))
        assert status == 200, host
    # A page whose own name resolves to this machine (DNS rebinding) is refused, in the error shape, with advice that
    # serves exactly that Host (never the option already given)
    for host, advice in (
        (f'evil.example:{port}', '`om serve --allowed-host evil.example`'),
        ('evil.example', '`om serve --allowed-host evil.example`'),
        (f'127.0.0.1:{int(port) + 1}', f'`om serve --allowed-host 127.0.0.1:{int(port) + 1}`'),
        (f'devbox.example:{int(port) + 1}', f'`om serve --allowed-host devbox.example:{int(port) + 1}`'),
        (f'proxy.example:{port}', '`om serve --allowed-host proxy.example`'),
        ('tunnel.example', '`om serve --allowed-host tunnel.example`'),
        ('', 'the request names no Host'),
    ):
        status, headers, body = exchange(stack, request(stack, host=host))
        assert status == 421, host
        assert_api_headers(headers)
        message = assert_error_shape(body, 'host_not_allowed')
        assert advice in message, (host, message)
        assert stack.url in message, message
    # The stack description (it shows the environment) is behind the same check
    raw = f'GET /_om/local-stack HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n'.encode()
    assert exchange(stack, raw)[0] == 421


def test_the_host_advice_always_serves_the_host_it_was_given_for() -> None:
    # For any Host refused, the `--allowed-host` the 421 suggests makes the server answer for exactly that Host
    for bound in ('127.0.0.1', '0.0.0.0', '::', '192.0.2.5'):
        for port in (80, 8803):
            for host in (
                'devbox.local',
                f'devbox.local:{port}',
                'devbox.local:80',
                'devbox.local:443',
                'devbox.local:9999',
                '[fe80::1]',
                f'[fe80::1]:{port}',
                '[fe80::1]:9999',
                '10.0.0.7:9999',
                f'127.0.0.1:{port + 1}',
            ):
                assert host not in served_hosts(bound, port, ()), (bound, port, host)
                assert host in served_hosts(bound, port, (host_to_allow(host, port),)), (bound, port, host)


def test_a_body_over_the_api_limit_is_refused_before_it_is_read(stack: LocalStack) -> None:
    # Declared over the API's own limit: the function's own 413 (same status, headers and body), at once; the body
    # is never waited for (it would otherwise take the 30 s body timeout and end in a 408)
    expected = json.loads(too_large_body()['body'])
    assert str(MAX_BODY_BYTES) in expected['error']['message']
    port = stack.url.rsplit(':', 1)[1]
    for length in (MAX_BODY_BYTES + 1, 6_000_000, 11 * 1024 * 1024):
        started = time.monotonic()
        head = f'POST /threads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n'
        status, headers, body = exchange(stack, f'{head}Content-Length: {length}\r\n\r\n{{'.encode())
        assert time.monotonic() - started < 2, length
        assert status == 413, (length, body)
        assert_api_headers(headers)
        assert json.loads(body) == expected
    # A client that sends the whole body before reading (most do) still reads the 413: the server drops the body
    # instead of closing on it (which resets the connection); one that asks first (`Expect: 100-continue`, as curl
    # does) gets the 413 instead of `100 Continue` and never sends it
    head = f'POST /threads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n'
    big = b'x' * (MAX_BODY_BYTES + 1)
    status, headers, body = exchange(stack, f'{head}Content-Length: {len(big)}\r\n\r\n'.encode() + big, timeout=30)
    assert status == 413 and json.loads(body) == expected
    status, headers, body = exchange(
        stack, f'{head}Content-Length: {len(big)}\r\nExpect: 100-continue\r\n\r\n'.encode()
    )
    assert status == 413 and json.loads(body) == expected
    # At the limit, the body is read and handed to the function, which decides (here: not JSON)
    raw = f'POST /threads HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n'
    raw += f'Content-Length: {MAX_BODY_BYTES}\r\nConnection: close\r\n\r\n'
    status, _, body = exchange(stack, raw.encode() + b'x' * MAX_BODY_BYTES, timeout=30)
    assert status == 400 and assert_error_shape(body, 'invalid_json')


def test_every_answer_the_server_makes_itself_says_nosniff(stack: LocalStack) -> None:
    port = stack.url.rsplit(':', 1)[1]
    host = f'Host: 127.0.0.1:{port}\r\n'
    for raw, status in (
        (request(stack, host='evil.example'), 421),
        (request(stack, extra='Transfer-Encoding: chunked\r\n', body=b'0\r\n\r\n'), 411),
        (request(stack, extra='Content-Length: abc\r\n'), 400),
        (f'TRACE / HTTP/1.1\r\n{host}Connection: close\r\n\r\n'.encode(), 405),
        (request(stack, extra=f'X-Big: {"a" * 70_000}\r\n'), 431),  # http.server's own refusal
    ):
        answer = exchange(stack, raw)
        assert answer[0] == status, (raw, answer)
        assert_api_headers(answer[1])
        json.loads(answer[2])


def test_events_after_must_be_a_count_of_events(stack: LocalStack) -> None:
    port = stack.url.rsplit(':', 1)[1]

    def events(query: str) -> tuple[int, dict[str, str], bytes]:
        raw = f'GET {EVENTS_PATH}{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n'
        return exchange(stack, raw.encode())

    status, _, body = events('')
    assert status == 200
    read = json.loads(body)['next']
    for query in ('?after=0', f'?after={read}', '?after=999999'):
        status, _, body = events(query)
        assert status == 200, query
    assert json.loads(body) == {'events': [], 'next': read}
    # Not a count: refused in the API's error shape, naming the parameter and what it must be, not every event
    for bad in ('abc', '-1', '1.5', '', '%C2%B2'):
        status, headers, body = events(f'?after={bad}')
        assert status == 422, bad
        assert_api_headers(headers)
        message = assert_error_shape(body, 'validation_error')
        assert 'after' in message and 'whole number >= 0' in message and '`next`' in message, message
        assert json.loads(body)['error']['details'][0]['location'] == 'query'


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
        status, headers, body = read_answer(sock)
        assert status == 408 and assert_error_shape(body, 'request_timeout')
        assert_api_headers(headers)
        assert 0.9 < time.monotonic() - started < 3
    # The server still answers everyone else
    assert exchange(stack, request(stack))[0] == 200
