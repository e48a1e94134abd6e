"""What the loopback model fakes (Gemini, Bedrock, OpenAI) share: the server's lifecycle, scripted replies, the
request log, scripted delays, the JSON request handler and the fake embeddings. Each fake keeps only its wire
protocol."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, Self, TypeVar

from om_lib.models.embedders import HashingEmbedder

EmbedHandler = Callable[[str, int], list[float]]


def deterministic_embedding(text: str, dimensions: int) -> list[float]:
    """A unit-free, repeatable vector derived from the text's SHA-256 (same text → same vector)."""
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f'{counter}:{text}'.encode()).digest()
        values += [(word / 0xFFFFFFFF) * 2 - 1 for word in struct.unpack('>8I', digest)]
        counter += 1
    return values[:dimensions]


def keyword_embedding(text: str, dimensions: int) -> list[float]:
    """Word-hashing vectors: texts sharing words are close, so a search finds what it should (no real semantics)."""
    return HashingEmbedder(dimensions).embed([text], kind='document', timeout_s=1)[0]


class LoggedCall(Protocol):
    """What the shared plumbing writes on a fake's request-log entry."""

    answered_at: float | None
    status: int | None


Call = TypeVar('Call', bound=LoggedCall)
Reply = TypeVar('Reply')


class LoopbackServer(Generic[Call, Reply]):
    """A threaded HTTP server on 127.0.0.1 (random port) with per-key reply scripts and a request log.

    A subclass names its thread and gives the request handler class (`_request_handler`); its handler threads call
    `_receive`, `_wait` and `_answered`.
    """

    thread_name = 'fake-model'

    def __init__(self) -> None:
        """Create a stopped server; use it as a context manager or call `start()` / `stop()`."""
        self._scripts: defaultdict[str | None, deque[Reply]] = defaultdict(deque)
        self._calls: list[Call] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Self:
        """Bind to a free loopback port and serve in a background thread."""
        server = ThreadingHTTPServer(('127.0.0.1', 0), self._request_handler())
        server.daemon_threads = True  # a handler still sleeping in a scripted delay must not block shutdown
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, and wake handlers sleeping in a scripted delay."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>` (no trailing slash): the client's base URL."""
        if self._server is None:
            raise RuntimeError(f'{type(self).__name__} is not started')
        host, port = self._server.server_address[:2]
        return f'http://{host!s}:{port}'

    # -- scripting and the log ---------------------------------------------------------------------------------
    def _add_script(self, key: str | None, replies: Iterable[Reply]) -> None:
        with self._lock:
            self._scripts[key].extend(replies)

    def _pending(self, key: str | None) -> int:
        with self._lock:
            return len(self._scripts[key])

    @property
    def calls(self) -> list[Call]:
        """A snapshot (copies) of the request log, in arrival order."""
        with self._lock:
            return [copy.copy(call) for call in self._calls]

    def reset(self) -> None:
        """Forget scripts and the log."""
        with self._lock:
            self._scripts = defaultdict(deque)
            self._calls = []

    # -- serving (called from handler threads) -----------------------------------------------------------------
    def _receive(self, call: Call, *keys: str | None) -> Reply | None:
        """Log `call` and take the next scripted reply of the first of `keys` with one left (None: none left)."""
        with self._lock:
            self._calls.append(call)
            return self._next_scripted(keys)

    def _scripted(self, *keys: str | None) -> Reply | None:
        """The next scripted reply of the first of `keys` with one left (None: none left)."""
        with self._lock:
            return self._next_scripted(keys)

    def _next_scripted(self, keys: Iterable[str | None]) -> Reply | None:
        for key in keys:
            queue = self._scripts.get(key)
            if queue:
                return queue.popleft()
        return None

    def _log(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def _wait(self, delay_s: float) -> None:
        if delay_s > 0:
            self._stopping.wait(delay_s)

    def _answered(self, call: Call, status: int) -> None:
        # Log before writing: once the bytes are out the client (and the test) may read the log at once.
        with self._lock:
            call.answered_at = time.monotonic()
            call.status = status


def parse_json(raw: bytes) -> Any:
    """A request body parsed as JSON (`{}` when empty); raises json.JSONDecodeError when it is not JSON."""
    return json.loads(raw or b'{}')


class JsonRequestHandler(BaseHTTPRequestHandler):
    """Reads JSON requests and writes JSON answers; quiet, and tolerant of clients that hang up early."""

    protocol_version = 'HTTP/1.1'
    # Headers and body go out as two writes on a kept-alive connection: without TCP_NODELAY the body waits for the
    # client's delayed ACK (~40 ms a call).
    disable_nagle_algorithm = True
    content_type = 'application/json'

    def _route(self) -> str:
        """The request path without its query string."""
        return self.path.split('?', 1)[0]

    def _lower_headers(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}

    def _read_body(self) -> bytes:
        """The whole body (read even when the answer will not need it: a kept-alive connection must be drained)."""
        length = int(self.headers.get('Content-Length') or 0)
        return self.rfile.read(length) if length else b''

    def _send_json(self, status: int, body: dict[str, Any], headers: Iterable[tuple[str, str]] = ()) -> bool:
        """Write the answer; False when the client gave up (its timeout fired) before it went out."""
        payload = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header('Content-Type', self.content_type)
            self.send_header('Content-Length', str(len(payload)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by http.server
        return  # keep test output clean
