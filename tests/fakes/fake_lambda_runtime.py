"""A loopback fake of the Lambda Runtime API (`/2018-06-01/runtime/...`), for running a custom runtime loop in tests.

Queue events with `invoke(event)`; the runtime under test takes them from `GET invocation/next` and answers on
`POST invocation/{id}/response` (buffered, or streamed: chunked, read chunk by chunk with the time each arrived, and
the trailers) or `POST invocation/{id}/error`. `answers[request_id]` holds what came back.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class RuntimeAnswer:
    """What the runtime sent back for one invocation."""

    kind: str  # 'response' | 'error'
    headers: dict[str, str]
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    trailers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return b''.join(data for _, data in self.chunks)


class FakeRuntimeApi:
    """The Runtime API on a free loopback port; `address` is what AWS_LAMBDA_RUNTIME_API holds."""

    def __init__(self) -> None:
        self._events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.answers: dict[str, RuntimeAnswer] = {}
        self._done: dict[str, threading.Event] = {}
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> Self:
        self._server = ThreadingHTTPServer(('127.0.0.1', 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f'{host!s}:{port}'

    def invoke(self, event: dict[str, Any]) -> str:
        """Queue an invocation; returns its request id."""
        request_id = str(uuid.uuid4())
        self._done[request_id] = threading.Event()
        self._events.put((request_id, event))
        return request_id

    def answer(self, request_id: str, timeout: float = 60) -> RuntimeAnswer:
        """The answer to an invocation, once it is complete."""
        assert self._done[request_id].wait(timeout), 'the runtime did not answer'
        return self.answers[request_id]


def _handler(fake: FakeRuntimeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            assert self.path == '/2018-06-01/runtime/invocation/next', self.path
            request_id, event = fake._events.get()
            payload = json.dumps(event).encode()
            self.send_response(200)
            self.send_header('Lambda-Runtime-Aws-Request-Id', request_id)
            self.send_header('Lambda-Runtime-Deadline-Ms', str(int(time.time() * 1000) + 120_000))
            self.send_header('Lambda-Runtime-Invoked-Function-Arn', 'arn:aws:lambda:us-east-1:123456789012:function:x')
            self.send_header('Lambda-Runtime-Trace-Id', 'Root=1-00000000-000000000000000000000000;Sampled=0')
            self.send_header('Content-Length', str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            match = re.fullmatch(r'/2018-06-01/runtime/invocation/([^/]+)/(response|error)', self.path)
            assert match is not None, self.path
            request_id, kind = match[1], match[2]
            answer = RuntimeAnswer(kind, {k.lower(): v for k, v in self.headers.items()})
            if answer.headers.get('transfer-encoding') == 'chunked':
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        break
                    answer.chunks.append((time.monotonic(), self.rfile.read(size)))
                    assert self.rfile.read(2) == b'\r\n'
                while (line := self.rfile.readline()) not in (b'\r\n', b''):
                    name, _, value = line.decode().partition(':')
                    answer.trailers[name.strip().lower()] = value.strip()
            else:
                length = int(self.headers.get('Content-Length') or 0)
                answer.chunks.append((time.monotonic(), self.rfile.read(length)))
            self.send_response(202)
            self.send_header('Content-Length', '0')
            self.end_headers()
            fake.answers[request_id] = answer
            fake._done[request_id].set()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            return

    return Handler
