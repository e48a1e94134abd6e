"""The local stack behind `om serve`, `om invoke`, `om chat`, `om demo` and the e2e tests.

It runs the deployed architecture in one process, with the same handler code:

- AWS: the endpoint in `AWS_ENDPOINT_URL` (created resources if missing), or an embedded moto server on a free
  loopback port. The memory table, the bucket, the FIFO work queue with its FIFO dead-letter queue (redrive after 3
  receives), a Lambda function for the reflection tasks and the reflection state machine built from
  `functions/reflection/state_machine.asl.json` — the very document the CDK app deploys.
- Step Functions: moto's ASL interpreter runs the workflow (`execute_state_machine`). Its Lambda tasks call moto's
  Lambda, which would need Docker; a patch of moto's docker-less Lambda backend runs
  `functions.reflection.handler.lambda_handler` in-process instead and reports an exception the way Lambda does
  (`FunctionError` + `errorType` = the class name), so the ASL's Retry/Catch behave as in AWS.
- SQS → Lambda: a poller thread long-polls the work queue, hands batches to `functions.buffer_worker.handler` as an
  SQS event and deletes only the records that did not fail, so redelivery and redrive work as in AWS.
- The schedule: a timer thread calls `functions.sweeper.handler` with a scheduled event.
- S3 → EventBridge → SQS → Lambda: the bucket reports new objects to EventBridge, the rule the CDK app deploys
  (`functions/orphan_uploads/events.py`) puts attachment uploads on the uploads queue, and a second poller hands them
  to `functions.orphan_uploads.handler`, which deletes an upload whose thread was erased.
- API Gateway: a `ThreadingHTTPServer` turns each request into a REST API proxy event for `functions.api.handler`.
- Lifecycle events: the functions publish to an EventBridge bus on the emulator (OM_EVENT_BUS_NAME), as deployed; a
  rule with the CDK app's pattern (`om_lib.events.lifecycle_event_pattern`) puts them on a queue, and
  `GET /_om/events` (loopback callers the API would take, like `GET /_om/local-stack`) reads them back in order.

With an external endpoint (`AWS_ENDPOINT_URL`) the Lambda patch cannot reach the emulator's process, so the state
machine is not used there: reflection jobs travel through the work queue and the buffer worker runs them (run_job
handles both kinds).
"""

from __future__ import annotations

import base64
import copy
import importlib
import io
import json
import logging
import os
import re
import shlex
import socket
import threading
import time
import traceback
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from om_cli import local_logs

if TYPE_CHECKING:
    from functions.api.streaming import ChatStream

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
ASL_PATH = ROOT / 'functions' / 'reflection' / 'state_machine.asl.json'
FAKE_CREDENTIALS = {
    'AWS_ACCESS_KEY_ID': 'testing',
    'AWS_SECRET_ACCESS_KEY': 'testing',
    'AWS_SESSION_TOKEN': 'testing',
}

ApiHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


# The deployed buffer worker's timeout (infra/constants.py; a test keeps the two equal). A job's deadline is what is
# left of it, so the local worker must not be given less than the deployed one.
BUFFER_WORKER_TIMEOUT_S: float = 600.0


@dataclass(frozen=True)
class StackNames:
    """Names of the AWS resources the local stack uses (and creates when missing)."""

    table: str = 'om-memory'
    bucket: str = 'om-memory-blobs'
    queue: str = 'om-work.fifo'
    dead_letter_queue: str = 'om-work-dlq.fifo'
    uploads_queue: str = 'om-uploads'
    uploads_dead_letter_queue: str = 'om-uploads-dlq'
    uploads_rule: str = 'om-orphan-uploads'
    event_bus: str = 'om-lifecycle'
    events_queue: str = 'om-lifecycle-events'
    events_rule: str = 'om-lifecycle-events'
    reflection_function: str = 'om-reflection'
    state_machine: str = 'om-reflection'

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StackNames:
        """Names from `OM_TABLE_NAME`, `OM_BUCKET_NAME` and `OM_STACK_PREFIX` (queues, function, state machine), so
        two stacks on one shared emulator stay apart; unset, the defaults above. Raises ValueError for a bad prefix."""
        env = os.environ if env is None else env
        prefix = env.get('OM_STACK_PREFIX') or 'om'
        if not STACK_PREFIX.fullmatch(prefix):
            raise ValueError(
                f'OM_STACK_PREFIX {prefix!r} cannot name queues and a state machine: use 1-40 letters, digits, '
                "'-' or '_', starting with a letter or digit (e.g. OM_STACK_PREFIX=alice)"
            )
        return cls(
            table=env.get('OM_TABLE_NAME') or cls.table,
            bucket=env.get('OM_BUCKET_NAME') or cls.bucket,
            queue=f'{prefix}-work.fifo',
            dead_letter_queue=f'{prefix}-work-dlq.fifo',
            uploads_queue=f'{prefix}-uploads',
            uploads_dead_letter_queue=f'{prefix}-uploads-dlq',
            uploads_rule=f'{prefix}-orphan-uploads',
            event_bus=f'{prefix}-lifecycle',
            events_queue=f'{prefix}-lifecycle-events',
            events_rule=f'{prefix}-lifecycle-events',
            reflection_function=f'{prefix}-reflection',
            state_machine=f'{prefix}-reflection',
        )


STACK_PREFIX = re.compile(r'[A-Za-z0-9][A-Za-z0-9_-]{0,39}')
# Where `om serve` describes itself to `om invoke --stack` (a local-stack path; API Gateway has no such route).
DESCRIBE_PATH = '/_om/local-stack'
# Where the local stack reads back the lifecycle events its functions published (a local-stack path too).
EVENTS_PATH = '/_om/events'


# ---------------------------------------------------------------------------------------------------------------------
# Running handlers locally
# ---------------------------------------------------------------------------------------------------------------------
class LocalLambdaContext:
    """The parts of the Lambda context object that Powertools and our handlers read."""

    def __init__(self, function: str, *, timeout_s: float = 900.0, region: str = 'us-east-1') -> None:
        self.function_name = f'om-{function.replace("_", "-")}'
        self.function_version = '$LATEST'
        self.invoked_function_arn = f'arn:aws:lambda:{region}:123456789012:function:{self.function_name}'
        self.memory_limit_in_mb = 1024
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f'/aws/lambda/{self.function_name}'
        self.log_stream_name = 'local'
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before this invocation's timeout."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def handler_for(function: str) -> Callable[[dict[str, Any], Any], Any]:
    """`functions.<function>.handler.lambda_handler` (imported on first use)."""
    module = importlib.import_module(f'functions.{function}.handler')
    return module.lambda_handler  # type: ignore[no-any-return]


def invoke_handler(function: str, event: dict[str, Any], *, timeout_s: float = 900.0) -> Any:
    """Call one function's handler in-process with a Lambda-like context (its log lines name that function)."""
    region = os.environ.get('AWS_DEFAULT_REGION', 'us-east-1')
    context = LocalLambdaContext(function, timeout_s=timeout_s, region=region)
    with local_logs.invocation(context):
        return handler_for(function)(event, context)


# ---------------------------------------------------------------------------------------------------------------------
# moto's Lambda: run our reflection handler in-process (moto would need Docker to run code)
# ---------------------------------------------------------------------------------------------------------------------
_IN_PROCESS: dict[str, Callable[[dict[str, Any]], Any]] = {}
_PATCH_LOCK = threading.Lock()
_ORIGINAL_INVOKE: Any = None


def _function_name(name_or_arn: str) -> str:
    # arn:aws:lambda:<region>:<account>:function:<name>[:<qualifier>]
    return name_or_arn.split(':')[6] if name_or_arn.startswith('arn:') else name_or_arn


def _patched_invoke(
    self: Any, function_name: str, qualifier: str | None, body: Any, headers: Any, response_headers: Any
) -> bytes | str | None:
    target = _IN_PROCESS.get(_function_name(function_name))
    if target is None:
        return _ORIGINAL_INVOKE(self, function_name, qualifier, body, headers, response_headers)  # type: ignore[no-any-return]
    event = json.loads(body or b'{}')
    try:
        result = target(event)
    except Exception as exc:  # noqa: BLE001 - reported exactly as Lambda reports an unhandled exception
        # Lambda answers 200 with X-Amz-Function-Error and the class name as errorType; Step Functions matches on it.
        response_headers['x-amz-function-error'] = 'Unhandled'
        payload = {
            'errorType': type(exc).__name__,
            'errorMessage': str(exc),
            'stackTrace': traceback.format_tb(exc.__traceback__),
        }
        return json.dumps(payload).encode()
    return json.dumps(result).encode()


class SerialDynamoDB:
    """WSGI middleware: one DynamoDB request at a time through the embedded moto server.

    moto applies a request's conditions and writes without a lock, so two concurrent conditional writes to one item
    can both succeed (duplicate sequence numbers; a listing that hides messages). Serialising DynamoDB's requests
    makes each one atomic, which is all the store relies on (DynamoDB is linearizable per item). Only DynamoDB: the
    reflection workflow's Lambda tasks run inside moto's Step Functions requests and call DynamoDB themselves, so a
    lock over every request would deadlock.
    """

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if not str(environ.get('HTTP_X_AMZ_TARGET', '')).startswith('DynamoDB_'):
            return self.app(environ, start_response)
        with self.lock:
            # Read the whole answer inside the lock: the write it reports is then complete for everyone.
            return [b''.join(self.app(environ, start_response))]


def linearizable_moto_server() -> Any:
    """The embedded moto server, with DynamoDB's requests serialised (`SerialDynamoDB`)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = SerialDynamoDB(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return Server(ip_address='127.0.0.1', port=0, verbose=False)


def register_in_process_function(name: str, target: Callable[[dict[str, Any]], Any]) -> None:
    """Make moto's docker-less Lambda run `target(event)` for function `name` (installs the patch once)."""
    global _ORIGINAL_INVOKE
    from moto.awslambda_simple.models import LambdaSimpleBackend

    with _PATCH_LOCK:
        if _ORIGINAL_INVOKE is None:
            _ORIGINAL_INVOKE = LambdaSimpleBackend.invoke
            LambdaSimpleBackend.invoke = _patched_invoke  # type: ignore[method-assign]
        _IN_PROCESS[name] = target


def unregister_in_process_function(name: str) -> None:
    """Undo `register_in_process_function`; the patch is removed with the last registration."""
    global _ORIGINAL_INVOKE
    from moto.awslambda_simple.models import LambdaSimpleBackend

    with _PATCH_LOCK:
        _IN_PROCESS.pop(name, None)
        if not _IN_PROCESS and _ORIGINAL_INVOKE is not None:
            LambdaSimpleBackend.invoke = _ORIGINAL_INVOKE  # type: ignore[method-assign]
            _ORIGINAL_INVOKE = None


# ---------------------------------------------------------------------------------------------------------------------
# Powertools' request state, per thread
# ---------------------------------------------------------------------------------------------------------------------
def isolate_requests(app: Any) -> None:
    """Give Powertools' API resolver `app` per-thread request state, so concurrent requests cannot see each other's.

    A Lambda execution environment handles one request at a time, and Powertools relies on it: `resolve()` keeps the
    current event and Lambda context in class attributes (`BaseRouter.current_event`) and the matched route and its
    arguments in the resolver's `context` dict, which it clears when a request ends. The local stack serves requests
    on concurrent threads in one process (as API Gateway in front of many environments would), so one request could
    read another's route arguments or find its route cleared (a rare `KeyError: '_route'`, or an answer about another
    thread). Serialising the handler would also serialise the concurrency the e2e race tests exercise, so instead the
    resolver's class is swapped for a subclass whose `current_event`, `lambda_context` and `context` are per thread.
    Routers read them through the resolver (`router.current_event` is `app.current_event`). Idempotent.
    """
    if getattr(type(app), 'om_per_thread_state', False):
        return
    state = threading.local()
    initial_context = dict(app.context)

    def thread_context() -> dict[str, Any]:
        if not hasattr(state, 'context'):
            state.context = dict(initial_context)
        return state.context  # type: ignore[no-any-return]

    def set_context(_: Any, value: dict[str, Any]) -> None:
        state.context = value

    base = type(app)
    resolver_class = type(
        f'PerThread{base.__name__}',
        (base,),
        {
            'om_per_thread_state': True,
            'current_event': property(lambda _: getattr(state, 'event', None), lambda _, v: setattr(state, 'event', v)),
            'lambda_context': property(
                lambda _: getattr(state, 'lambda_context', None), lambda _, v: setattr(state, 'lambda_context', v)
            ),
            'context': property(lambda _: thread_context(), set_context),
            'resolve': _per_thread_resolve(state, base),
        },
    )
    app.__class__ = resolver_class


def _per_thread_resolve(state: threading.local, base: type[Any]) -> Callable[..., Any]:
    def resolve(self: Any, event: dict[str, Any], context: Any) -> Any:
        # What the base class stores in BaseRouter's class attributes, this thread keeps for itself (the base class
        # still writes them; nothing reads them through this resolver).
        state.event = self._to_proxy_event(event)
        state.lambda_context = context
        try:
            return base.resolve(self, event, context)
        finally:
            state.event = state.lambda_context = None

    return resolve


def _reflection_task(event: dict[str, Any]) -> Any:
    return invoke_handler('reflection', event, timeout_s=900.0)


# ---------------------------------------------------------------------------------------------------------------------
# API Gateway (REST API, Lambda proxy integration)
# ---------------------------------------------------------------------------------------------------------------------
def api_gateway_event(
    method: str, raw_path: str, headers: Mapping[str, list[str]], body: bytes, *, source_ip: str = '127.0.0.1'
) -> dict[str, Any]:
    """A REST API proxy event for one HTTP request, as API Gateway sends it to the function."""
    split = urlsplit(raw_path)
    path = unquote(split.path) or '/'
    query = parse_qs(split.query, keep_blank_values=True)
    try:
        text, is_base64 = body.decode('utf-8'), False
    except UnicodeDecodeError:
        text, is_base64 = base64.b64encode(body).decode('ascii'), True
    now = datetime.now(UTC)
    return {
        'resource': '/{proxy+}',
        'path': path,
        'httpMethod': method,
        'headers': {name: values[-1] for name, values in headers.items()},
        'multiValueHeaders': dict(headers),
        'queryStringParameters': {k: v[-1] for k, v in query.items()} or None,
        'multiValueQueryStringParameters': query or None,
        'pathParameters': {'proxy': path.lstrip('/')} if path != '/' else None,
        'stageVariables': None,
        'requestContext': {
            'accountId': '123456789012',
            'apiId': 'local',
            'resourceId': 'local',
            'resourcePath': '/{proxy+}',
            'httpMethod': method,
            'path': f'/local{path}',
            'stage': 'local',
            'protocol': 'HTTP/1.1',
            'requestId': str(uuid.uuid4()),
            'requestTime': now.strftime('%d/%b/%Y:%H:%M:%S +0000'),
            'requestTimeEpoch': int(now.timestamp() * 1000),
            'identity': {
                'sourceIp': source_ip,
                'userAgent': (headers.get('User-Agent') or headers.get('user-agent') or [''])[-1],
                'accountId': None,
                'caller': None,
                'user': None,
                'userArn': None,
                'cognitoIdentityId': None,
                'cognitoIdentityPoolId': None,
                'cognitoAuthenticationType': None,
                'cognitoAuthenticationProvider': None,
                'accessKey': None,
                'apiKey': None,
                'apiKeyId': None,
            },
        },
        'body': text if body else None,
        'isBase64Encoded': is_base64,
    }


# How long a client may take to send what it sends, in total, before the server gives up on it (a slow client cannot
# hold a worker thread): the request line and headers (idle time of a kept-alive connection included), and the body.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
# The largest body of a refused request the server reads and drops so that its client can read the refusal; past it,
# the connection is closed at once (the client may see a reset instead of the answer).
DISCARD_MAX_BYTES = 64 * 1024 * 1024


class _Watchdog:
    """Closes connections whose deadline passed: one thread for the whole server, however many connections wait.

    A socket timeout bounds each read, not a request: a client sending a byte every few seconds never trips it. A
    connection's deadline is armed while its request line and headers are read; past it the socket is shut down,
    which ends the blocked read in its handler thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._next = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name='om-http-watchdog', daemon=True)
        self._thread.start()

    def arm(self, sock: socket.socket, deadline: float) -> int:
        with self._lock:
            self._next += 1
            self._armed[self._next] = (deadline, sock)
            self._lock.notify()
            return self._next

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()

    def _run(self) -> None:
        with self._lock:
            while not self._stopping:
                now = time.monotonic()
                for token, (deadline, sock) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        with suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                wake = min((d for d, _ in self._armed.values()), default=now + 60) - now
                self._lock.wait(max(0.05, wake))


class _RequestRefused(Exception):
    """A request answered by the server itself, in the error shape, before the function sees it."""

    def __init__(self, answer: dict[str, Any], unread: int | None = None) -> None:
        super().__init__(answer.get('body'))
        self.answer = answer  # a proxy result, as the function would return it
        self.unread = unread  # the declared length of a body not read, which the server discards after answering


def _refusal(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> _RequestRefused:
    from functions.api.errors import proxy_error

    answer = proxy_error(status, code, message)
    answer['headers'].update(headers or {})
    return _RequestRefused(answer)


def _http_handler_class(stack: LocalStack) -> type[BaseHTTPRequestHandler]:
    running = stack._watchdog  # noqa: SLF001 - the stack's own server parts
    assert running is not None
    watchdog: _Watchdog = running  # the handler class's methods see this name narrowed

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        # Every read and write on the socket gives up after this long (a stuck client); streamed frames go out at
        # once (no Nagle delay on small writes).
        timeout = HEADER_TIMEOUT_S
        disable_nagle_algorithm = True

        def handle_one_request(self) -> None:
            self._header_watch = watchdog.arm(self.connection, time.monotonic() + HEADER_TIMEOUT_S)
            try:
                super().handle_one_request()
            except (ConnectionError, TimeoutError, OSError):
                self.close_connection = True  # the client went away, or was too slow: nothing to answer
            finally:
                watchdog.disarm(self._header_watch)

        def _dispatch(self) -> None:
            watchdog.disarm(self._header_watch)  # the request line and headers are in
            started = time.monotonic()
            try:
                self._check_host()
                body = self._read_body()
            except _RequestRefused as refused:
                self.close_connection = True  # the body (if any) was not read: the connection cannot be reused
                self._answer_itself(refused.answer)
                if refused.unread:
                    self._discard(refused.unread)
                logger.info('%s %s %s (refused)', self.command, self.path, refused.answer['statusCode'])
                return
            event = api_gateway_event(
                self.command, self.path, self._request_headers(), body, source_ip=self.client_address[0]
            )
            context = LocalLambdaContext('api', timeout_s=29.0)
            pending = None
            try:
                with local_logs.invocation(context), streaming_transport() as take:
                    result = stack.api_handler(event, context)
                    pending = take()
                status, out_headers, payload = _proxy_result(result)
            except Exception:  # noqa: BLE001 - API Gateway turns a function failure into a 502
                logger.exception('the api handler failed')
                self._answer_itself(_refusal(502, 'internal_error', 'the function failed; see the server log').answer)
                logger.info('%s %s 502 %d ms', self.command, self.path, (time.monotonic() - started) * 1000)
                return
            if pending is not None:
                self._stream(status, out_headers, pending)
            else:
                self._send(status, out_headers, payload)
            logger.info('%s %s %s %d ms', self.command, self.path, status, (time.monotonic() - started) * 1000)

        def _request_headers(self) -> dict[str, list[str]]:
            """The request's headers, each name with its values in order (none before the headers were read)."""
            headers: dict[str, list[str]] = {}
            for name, value in (getattr(self, 'headers', None) or {}).items():
                headers.setdefault(name, []).append(value)
            return headers

        def _answer_itself(self, answer: dict[str, Any]) -> None:
            """Send an answer this server makes itself (a proxy result) with the headers the API function adds to
            each of its answers (`edge.finish`: nosniff, and an allowed origin's CORS headers)."""
            from functions.api import edge

            headers = self._request_headers()
            event = {'headers': {name: values[-1] for name, values in headers.items()}, 'multiValueHeaders': headers}
            status, out_headers, payload = _proxy_result(edge.finish(event, answer))
            self._send(status, out_headers, payload)

        def _check_host(self) -> None:
            """DNS rebinding: a page on another site that resolves its name to this machine still sends its own name
            as Host. Only the names this server was reached by (or was told of) are served."""
            host = (self.headers.get('Host') or '').strip().lower()
            if host not in stack.allowed_hosts():
                refused = _refusal(421, 'host_not_allowed', stack.host_refusal(host))
                with suppress(_RequestRefused):
                    refused.unread = self._content_length()
                raise refused

        def _content_length(self) -> int | None:
            """The body's declared length (None: no body); the refusal of a chunked body or a malformed length."""
            if self.headers.get('Transfer-Encoding'):
                raise _refusal(
                    411, 'length_required', 'send the body with a Content-Length header (chunked bodies are not taken)'
                )
            lengths = self.headers.get_all('Content-Length') or []
            if not lengths:
                return None
            if len(set(lengths)) != 1 or not lengths[0].strip().isdigit() or not lengths[0].strip().isascii():
                shown = ', '.join(lengths)[:40]
                raise _refusal(
                    400, 'invalid_content_length', f'Content-Length must be one number of bytes, not {shown!r}'
                )
            return int(lengths[0])

        def handle_expect_100(self) -> bool:
            # A client that asks before sending its body (`Expect: 100-continue`, as curl does for large ones) is not
            # asked for a body that will be refused: it gets the refusal instead of `100 Continue`.
            from functions.api.limits import MAX_BODY_BYTES

            with suppress(_RequestRefused):
                length = self._content_length()
                host = (self.headers.get('Host') or '').strip().lower()
                if (length or 0) > MAX_BODY_BYTES or host not in stack.allowed_hosts():
                    return True
            return super().handle_expect_100()

        def _discard(self, length: int) -> None:
            """Read and drop the body of a refused request (at most DISCARD_MAX_BYTES, within BODY_TIMEOUT_S). Most
            clients send the whole body before reading the answer; closing with their data unread resets the
            connection, which can lose the answer on its way (they would see a broken pipe instead of the 413)."""
            if length > DISCARD_MAX_BYTES:
                return
            deadline = time.monotonic() + BODY_TIMEOUT_S
            with suppress(OSError):
                while length > 0 and (remaining := deadline - time.monotonic()) > 0:
                    self.connection.settimeout(remaining)
                    chunk = self.rfile.read1(min(length, 1 << 16))
                    if not chunk:
                        break
                    length -= len(chunk)
            with suppress(OSError):
                self.connection.settimeout(self.timeout)

        def _read_body(self) -> bytes:
            """The body, read within BODY_TIMEOUT_S; refusals for a length that is not a number or too large."""
            from functions.api.edge import too_large_body
            from functions.api.limits import MAX_BODY_BYTES

            length = self._content_length()
            if not length:
                return b''
            if length > MAX_BODY_BYTES:
                # The function would refuse it (edge.py checks the body first): the same answer, before it is read.
                raise _RequestRefused(too_large_body(), unread=length)
            deadline = time.monotonic() + BODY_TIMEOUT_S
            chunks: list[bytes] = []
            left = length
            try:
                while left:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    self.connection.settimeout(remaining)
                    chunk = self.rfile.read1(min(left, 1 << 16))
                    if not chunk:
                        raise ConnectionError('the client closed the connection in the middle of the body')
                    chunks.append(chunk)
                    left -= len(chunk)
            except TimeoutError as exc:
                raise _refusal(
                    408, 'request_timeout', f'the request body did not arrive within {BODY_TIMEOUT_S:g} s'
                ) from exc
            finally:
                self.connection.settimeout(self.timeout)
            return b''.join(chunks)

        def _send(self, status: int, headers: Mapping[str, str], payload: bytes) -> None:
            try:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ('content-length', 'connection', 'transfer-encoding'):
                        self.send_header(name, value)
                self.send_header('Content-Length', str(len(payload)))
                self.end_headers()
                if self.command != 'HEAD':
                    self.wfile.write(payload)
            except OSError:
                self.close_connection = True  # the client went away before the answer did

        def _stream(self, status: int, headers: Mapping[str, str], stream: ChatStream) -> None:
            """A streamed answer: chunked, one write per frame as the turn makes it. A client that goes away stops
            the writing, not the turn (it finishes and is saved on its own thread)."""
            try:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ('content-length', 'connection', 'transfer-encoding'):
                        self.send_header(name, value)
                self.send_header('Transfer-Encoding', 'chunked')
                self.end_headers()
                for data in stream.frames():
                    self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
                self.wfile.write(b'0\r\n\r\n')
            except OSError:
                self.close_connection = True
                logger.info('%s %s: the client went away mid-stream; the turn goes on', self.command, self.path)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _dispatch  # noqa: N815

        def _refuse_method(self) -> None:
            # An `ANY` method forwards only these; API Gateway refuses the rest (TRACE, QUERY...) itself.
            watchdog.disarm(self._header_watch)
            self.close_connection = True  # the body is not read: the connection cannot be reused
            message = f'{self.command} is not supported; use {", ".join(_FORWARDED_METHODS)}'
            allow = {'Allow': ', '.join(_FORWARDED_METHODS)}
            self._answer_itself(_refusal(405, 'method_not_allowed', message, allow).answer)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            # http.server's own refusals (a malformed request line, headers too long): the error shape, not HTML.
            self.close_connection = True
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = 'Bad Request'
            name = 'bad_request' if code == 400 else re.sub(r'\W+', '_', phrase.lower()).strip('_')
            self._answer_itself(_refusal(code, name, message or phrase).answer)

        def __getattr__(self, name: str) -> Any:
            # http.server answers an HTML 501 for a method without a `do_` handler; ours is the contract's shape.
            if name.startswith('do_'):
                return self._refuse_method
            raise AttributeError(name)

        def log_request(self, code: int | str = '-', size: int | str = '-') -> None:
            pass  # _dispatch logs each request once, with its time

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by http.server
            logger.debug('%s %s', self.address_string(), format % args)

    return _Handler


@contextmanager
def streaming_transport() -> Iterator[Callable[[], ChatStream | None]]:
    """While the block runs, a streamed answer (the chat stream) is left to this server, which sends it as it comes;
    the block's value takes it (None when the answer was not streamed)."""
    from functions.api import streaming

    with streaming.accepting_streams():
        yield streaming.take_pending


_FORWARDED_METHODS = ('DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'POST', 'PUT')


_LOCAL_HEADERS = {'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff'}


def _local_only(event: Mapping[str, Any], why: str) -> dict[str, Any] | None:
    """The refusal (a proxy result) for a caller of a local-stack route that is not on loopback, or that the API would
    not take (in `OM_AUTH_MODE=none`, anyone on loopback); None when the caller may have the answer."""
    from functions import _wiring
    from functions.api import auth
    from functions.api.errors import ApiError, proxy_error

    source = str(((event.get('requestContext') or {}).get('identity') or {}).get('sourceIp') or '')
    if not _is_loopback(source):
        return {**proxy_error(403, 'forbidden', why), 'headers': _LOCAL_HEADERS}
    settings = _wiring.settings()
    try:
        auth.identify(event, settings.OM_AUTH_MODE, settings.OM_AUTH_CLAIM)
    except ApiError as exc:
        return {**proxy_error(exc.status, exc.code, exc.message), 'headers': _LOCAL_HEADERS}
    return None


def _events_after_refusal(after: str) -> dict[str, Any]:
    """422 `validation_error` for a `GET EVENTS_PATH?after=` that is not a count of events, as the API refuses a query
    parameter it cannot use (the detail names the parameter)."""
    from functions.api.errors import proxy_error

    must = 'must be a whole number >= 0: the `next` of an earlier answer (how many events were read)'
    detail = {'location': 'query', 'field': 'after', 'type': 'invalid', 'message': must}
    return proxy_error(422, 'validation_error', f'the request is invalid (after: {must}; got {after[:40]!r})', [detail])


def _is_loopback(address: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address.removeprefix('::ffff:')).is_loopback
    except ValueError:
        return False


def _proxy_result(result: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    status = int(result.get('statusCode', 200))
    headers: dict[str, str] = {str(k): str(v) for k, v in (result.get('headers') or {}).items()}
    for name, values in (result.get('multiValueHeaders') or {}).items():
        if values:
            headers[str(name)] = ', '.join(str(v) for v in values)
    body = result.get('body') or ''
    payload = base64.b64decode(body) if result.get('isBase64Encoded') else str(body).encode()
    return status, headers, payload


class _HttpServer(ThreadingHTTPServer):
    # A listen backlog of 5 (socketserver's default) resets connections under a burst of clients; API Gateway has none.
    request_queue_size = 128
    daemon_threads = True


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6  # an IPv6 address (`--host ::1`, `--host ::`: every address, IPv4 too)


# Addresses that name every interface rather than a host: a server bound to one is reached by any of the machine's.
WILDCARD_HOSTS = frozenset({'', '0.0.0.0', '::'})  # noqa: S104 - names, not a bind
# The default port of each scheme: a Host without a port means one of them.
_DEFAULT_PORTS = ('80', '443')


def _host_for_clients(bound: str) -> str:
    """The host part of a URL for a server bound to `bound`: a wildcard's loopback address, an IPv6 one bracketed."""
    if bound in WILDCARD_HOSTS:
        return '[::1]' if bound == '::' else '127.0.0.1'
    return f'[{bound}]' if ':' in bound else bound


def split_host(host: str) -> tuple[str, str | None]:
    """A Host header value (or an `--allowed-host`) as (name, port or None): `devbox:8787`, `[::1]:80`, `devbox`."""
    if host.startswith('['):
        name, _, rest = host.partition(']')
        port = rest[1:] if rest.startswith(':') else ''
        return f'{name}]', port if port.isdigit() and port.isascii() else None
    name, colon, port = host.rpartition(':')
    if colon and port.isdigit() and port.isascii() and ':' not in name:
        return name, port
    return host, None


def served_hosts(bound: str, port: int, extra_hosts: Sequence[str]) -> frozenset[str]:
    """The Host header values a server bound to `bound` on `port` answers for.

    The loopback names and the bound address, with the port (and bare on port 80, which a Host may leave out). A
    name given with `--allowed-host` without a port is served with the port and bare too (behind a reverse proxy the
    Host is the proxy's, often without a port): the DNS-rebinding defence is about names the user did not name. A name
    given with port 80 or 443 is served bare too (the scheme's default port, left out of the Host).
    """
    names = {'127.0.0.1', 'localhost', '[::1]'}
    if bound not in WILDCARD_HOSTS:
        names.add(_host_for_clients(bound.lower()))
    allowed = {f'{name}:{port}' for name in names}
    if str(port) == '80':
        allowed |= names
    for extra in extra_hosts:
        name, extra_port = split_host(extra.strip().lower())
        if extra_port is None:
            allowed |= {f'{name}:{port}', name}
        else:
            allowed.add(f'{name}:{extra_port}')
            if extra_port in _DEFAULT_PORTS:
                allowed.add(name)
    return frozenset(allowed)


def host_to_allow(host: str, port: int) -> str:
    """The `--allowed-host` value that makes a server on `port` answer for the Host header `host`: its name alone
    when it names no port or this one (that serves both), else the name with its port."""
    name, host_port = split_host(host)
    return name if host_port in (None, str(port)) else f'{name}:{host_port}'


# ---------------------------------------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------------------------------------
class LocalStack:
    """AWS (embedded moto or an endpoint), the background workers and the HTTP API, in this process.

    Use as a context manager, or call `start()` / `stop()`. Environment variables it sets are restored by `stop()`.
    """

    def __init__(
        self,
        *,
        host: str = '127.0.0.1',
        port: int | None = 8787,
        config_file: str | None = None,
        config: Mapping[str, Any] | None = None,
        http: bool = True,
        workers: bool = True,
        sweep_interval_s: float | None = 60.0,
        poll_wait_s: int = 1,
        visibility_timeout_s: int = 30,
        worker_timeout_s: float = BUFFER_WORKER_TIMEOUT_S,
        api_handler: ApiHandler | None = None,
        names: StackNames | None = None,
        env: Mapping[str, str] | None = None,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        """Configure (nothing starts yet).

        Args:
            host: Interface of the HTTP API.
            port: Port of the HTTP API (0 or None: a free one).
            config_file: The OM configuration file (`--config`), passed to the functions as OM_CONFIG_FILE.
            config: Or the configuration document itself (OM_CONFIG).
            http: Serve the HTTP API.
            workers: Run the queue poller and the sweeper timer.
            sweep_interval_s: Seconds between sweeper runs (None: never).
            poll_wait_s: Long-poll wait of the queue poller (stop() takes up to this long).
            visibility_timeout_s: The work queue's visibility timeout: how long a failed job waits for redelivery.
            worker_timeout_s: The buffer worker's invocation timeout (its jobs get what is left of it, as deployed).
            api_handler: The API function (default: `functions.api.handler.lambda_handler`).
            names: Resource names.
            env: Extra environment for the functions (e.g. OM_REQUEST_TIME_BUDGET_S).
            allowed_hosts: Names besides the bound address (127.0.0.1, localhost, [::1]) that the HTTP API answers
                for in the Host header (`name` or `name:port`); any other Host is refused (DNS rebinding).
        """
        self.host = host
        self.port = port or 0
        self.config_file = config_file
        self.config = dict(config) if config is not None else None
        self.http = http
        self.workers = workers
        self.sweep_interval_s = sweep_interval_s
        self.poll_wait_s = poll_wait_s
        self.visibility_timeout_s = visibility_timeout_s
        self.worker_timeout_s = worker_timeout_s
        self._api_handler = api_handler
        self.names = names or StackNames.from_env()
        self.extra_env = dict(env or {})
        self.extra_hosts = tuple(h.strip().lower() for h in allowed_hosts if h.strip())
        self._watchdog: _Watchdog | None = None
        self.embedded = False
        self.endpoint: str | None = None
        self.queue_url = ''
        self.queue_arn = ''
        self.dlq_url = ''
        self.uploads_queue_url = ''
        self.uploads_queue_arn = ''
        self.events_queue_url = ''
        self._event_log: list[dict[str, Any]] = []
        self._event_lock = threading.Lock()
        self.state_machine_arn: str | None = None
        self.region = 'us-east-1'
        self._saved_env: dict[str, str | None] = {}
        self._saved_moto_config: Any = None
        self._moto: Any = None
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self.poller_errors: list[BaseException] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """`http://host:port` of the HTTP API, as a client on this machine reaches it (bound to every address, by
        the loopback address: a wildcard address names no host to connect to)."""
        if self._httpd is None:
            raise RuntimeError('the HTTP API is not running')
        port = int(self._httpd.server_address[1])
        return f'http://{_host_for_clients(self.host)}:{port}'

    @property
    def listens_everywhere(self) -> bool:
        """Bound to a wildcard address (`0.0.0.0`, `::`): reachable from other machines too."""
        return self.host in WILDCARD_HOSTS

    def allowed_hosts(self) -> frozenset[str]:
        """The Host header values the HTTP API answers for (`served_hosts`); none before it runs."""
        if self._httpd is None:
            return frozenset()
        return served_hosts(self.host, int(self._httpd.server_address[1]), self.extra_hosts)

    def host_refusal(self, host: str) -> str:
        """Why a request naming `host` (lower case, as sent) is refused, and what would serve it: a URL this server
        answers at, and the `--allowed-host` that would serve that name (`host_to_allow`)."""
        if not host:
            return f'the request names no Host; send `Host: {self.url[7:]}` (what a client of {self.url} sends)'
        suggestion = host_to_allow(host, int(self._httpd.server_address[1]) if self._httpd else 0)
        return (
            f'this server does not answer for Host {host[:100]!r}; use {self.url}, or start it with '
            f'`om serve --allowed-host {shlex.quote(suggestion[:100])}` to serve that name too'
        )

    @property
    def api_handler(self) -> ApiHandler:
        """The API function's handler, with the local stack's own route (`GET DESCRIBE_PATH`) in front of it."""
        if self._api_handler is None:
            module = importlib.import_module('functions.api.handler')
            isolate_requests(module.app)  # requests run on concurrent threads here; Lambda runs one at a time
            self._api_handler = handler_for('api')  # through handler_for, like every function (metering wraps it)
        api = self._api_handler

        def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
            if event.get('httpMethod') == 'GET' and event.get('path') == DESCRIBE_PATH:
                return self.describe_answer(event)
            if event.get('httpMethod') == 'GET' and event.get('path') == EVENTS_PATH:
                return self.events_answer(event)
            return api(event, context)

        return handle

    def describe_answer(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """`GET DESCRIBE_PATH` as a proxy result: the stack's description, for `om invoke --stack` on this machine.

        It names the emulator's endpoint, which takes any request without the API's checks, so it is answered only to
        a loopback caller, and only to one the API itself would take (in `OM_AUTH_MODE=none`, anyone on loopback).
        """
        refusal = _local_only(event, 'the local stack describes itself to programs on its own machine')
        if refusal is not None:
            return refusal
        return {
            'statusCode': 200,
            'headers': _LOCAL_HEADERS,
            'body': json.dumps(self.describe()),
            'isBase64Encoded': False,
        }

    def events_answer(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """`GET EVENTS_PATH[?after=N]` as a proxy result: the lifecycle events published so far, oldest first (`after`:
        skip the first N). They hold conversations' observations, so, like the stack's description, they are
        answered only to a loopback caller the API itself would take."""
        refusal = _local_only(event, "the local stack's lifecycle events are read by programs on its own machine")
        if refusal is not None:
            return refusal
        after = (event.get('queryStringParameters') or {}).get('after')
        if after is not None and not (after.isdigit() and after.isascii()):
            return {**_events_after_refusal(after), 'headers': _LOCAL_HEADERS}
        events = self.lifecycle_events()
        body = {'events': events[int(after or 0) :], 'next': len(events)}
        return {'statusCode': 200, 'headers': _LOCAL_HEADERS, 'body': json.dumps(body), 'isBase64Encoded': False}

    def lifecycle_events(self) -> list[dict[str, Any]]:
        """Every lifecycle event the functions published so far, oldest first, as EventBridge delivered it
        (`{id, time, source, detailType, detail}`): what a rule's target receives in AWS."""
        with self._event_lock:
            if self.events_queue_url:
                sqs = self.client('sqs')
                while True:
                    got = sqs.receive_message(
                        QueueUrl=self.events_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
                    ).get('Messages', [])
                    if not got:
                        break
                    for message in got:
                        delivered = json.loads(message['Body'])
                        self._event_log.append(
                            {
                                'id': delivered.get('id'),
                                'time': delivered.get('time'),
                                'source': delivered.get('source'),
                                'detailType': delivered.get('detail-type'),
                                'detail': delivered.get('detail'),
                            }
                        )
                    sqs.delete_message_batch(
                        QueueUrl=self.events_queue_url,
                        Entries=[{'Id': str(i), 'ReceiptHandle': m['ReceiptHandle']} for i, m in enumerate(got)],
                    )
            return list(self._event_log)

    def start(self) -> LocalStack:
        """Start AWS (or connect), create resources, set the functions' environment, then workers and HTTP."""
        try:
            self._start_aws()
            self._create_resources()
            self._set_function_env()
            from functions import _wiring

            _wiring.reset()
            _wiring.init()  # fail now on a bad config; load the tokenizer before the first request
            if self.workers:
                self._spawn('om-queue-poller', self._poll_queue)
                self._spawn('om-uploads-poller', self._poll_uploads)
                if self.sweep_interval_s:
                    self._spawn('om-sweeper', self._sweep_forever)
            if self.http:
                _ = self.api_handler  # import errors show at start, not on the first request
                self._watchdog = _Watchdog()
                server = _HttpServer6 if ':' in self.host else _HttpServer
                self._httpd = server((self.host, self.port), _http_handler_class(self))
                self._spawn('om-http', self._httpd.serve_forever)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop HTTP and workers, the embedded AWS, and restore the environment and moto's global config."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        for thread in self._threads:
            thread.join(timeout=self.poll_wait_s + 30)
        self._threads.clear()
        if self.embedded:
            unregister_in_process_function(self.names.reflection_function)
            with suppress(Exception):
                self._moto_api('/moto-api/reset', {})
            if self._moto is not None:
                self._moto.stop()
                self._moto = None
            if self._saved_moto_config is not None:
                from moto.core.config import default_user_config

                default_user_config.clear()  # type: ignore[attr-defined]
                default_user_config.update(self._saved_moto_config)
                self._saved_moto_config = None
            self.embedded = False
        for name, value in self._saved_env.items():
            _put_env(name, value)
        self._saved_env.clear()
        self._clients.clear()
        with suppress(Exception):
            from functions import _wiring

            _wiring.reset()

    def _setenv(self, name: str, value: str | None) -> None:
        if name not in self._saved_env:
            self._saved_env[name] = os.environ.get(name)
        _put_env(name, value)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- AWS ---------------------------------------------------------------------------------------------------------
    def _start_aws(self) -> None:
        self.region = os.environ.get('AWS_DEFAULT_REGION') or os.environ.get('AWS_REGION') or 'us-east-1'
        self._setenv('AWS_DEFAULT_REGION', self.region)
        # botocore ≥1.37 would put the account id in the host name, which emulators do not route.
        self._setenv('AWS_ACCOUNT_ID_ENDPOINT_MODE', 'disabled')
        self._setenv('POWERTOOLS_TRACE_DISABLED', os.environ.get('POWERTOOLS_TRACE_DISABLED', '1'))
        external = os.environ.get('AWS_ENDPOINT_URL')
        if external:
            self.endpoint = external
            for name, value in FAKE_CREDENTIALS.items():
                if not os.environ.get(name) and not os.environ.get('AWS_PROFILE'):
                    self._setenv(name, value)
            return
        from moto.core.config import default_user_config

        # The embedded server is always fake: never send real credentials (or a profile's) to it.
        for name, value in FAKE_CREDENTIALS.items():
            self._setenv(name, value)
        self._setenv('AWS_PROFILE', None)
        # Per-service endpoints (e.g. AWS_ENDPOINT_URL_DYNAMODB=dynalite) still win over the embedded server
        # (CONTRACT §3): boto3 reads them for every client, ours and the functions'.
        if logging.getLogger('werkzeug').level == logging.NOTSET:  # `om serve --verbose` sets it
            logging.getLogger('werkzeug').setLevel(logging.WARNING)
        self._saved_moto_config = copy.deepcopy(default_user_config)
        self._moto = linearizable_moto_server()
        self._moto.start()
        self.embedded = True
        host, port = self._moto.get_host_and_port()
        self.endpoint = f'http://{host}:{port}'
        self._setenv('AWS_ENDPOINT_URL', self.endpoint)
        # moto's Step Functions interpreter calls Lambda at http://localhost:$MOTO_PORT.
        self._setenv('MOTO_PORT', str(port))
        self._moto_api(
            '/moto-api/config',
            {'stepfunctions': {'execute_state_machine': True}, 'lambda': {'use_docker': False}},
        )
        register_in_process_function(self.names.reflection_function, _reflection_task)

    def _moto_api(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f'{self.endpoint}{path}', data=json.dumps(body).encode(), method='POST', headers={'Content-Type': 'json'}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own loopback server
            response.read()

    def describe(self) -> dict[str, Any]:
        """What `om invoke --stack URL` needs to run a function against this stack: its AWS endpoint and the
        functions' environment (names, queue, state machine, configuration)."""
        keep: tuple[str, ...] = ('OM_TABLE_NAME', 'OM_BUCKET_NAME', 'OM_WORK_QUEUE_URL')
        keep += ('OM_REFLECTION_STATE_MACHINE_ARN', 'OM_EVENT_BUS_NAME')
        keep += ('OM_AUTH_MODE', 'OM_OFFLINE_FALLBACK', 'OM_CONFIG_FILE', 'OM_CONFIG', 'OM_REQUEST_TIME_BUDGET_S')
        return {
            'endpoint': self.endpoint,
            'region': self.region,
            'embedded': self.embedded,
            'env': {name: os.environ[name] for name in keep if os.environ.get(name)},
        }

    def client(self, service: str) -> Any:
        """A boto3 client for the stack's endpoint (cached)."""
        if service not in self._clients:
            import boto3

            env_name = 'AWS_ENDPOINT_URL_' + {'stepfunctions': 'SFN'}.get(service, service.upper().replace('-', '_'))
            endpoint = os.environ.get(env_name) or self.endpoint
            self._clients[service] = boto3.client(service, region_name=self.region, endpoint_url=endpoint)  # type: ignore[call-overload]
        return self._clients[service]

    def _create_resources(self) -> None:
        from om_lib.adapters.aws.dynamodb.schema import ensure_table

        names = self.names
        ensure_table(self.client('dynamodb'), names.table)
        s3 = self.client('s3')
        try:
            s3.head_bucket(Bucket=names.bucket)
        except s3.exceptions.ClientError:
            if self.region == 'us-east-1':
                s3.create_bucket(Bucket=names.bucket)
            else:
                s3.create_bucket(Bucket=names.bucket, CreateBucketConfiguration={'LocationConstraint': self.region})
        sqs = self.client('sqs')
        fifo = {'FifoQueue': 'true'}
        self.dlq_url = sqs.create_queue(QueueName=names.dead_letter_queue, Attributes=fifo)['QueueUrl']
        dlq_arn = sqs.get_queue_attributes(QueueUrl=self.dlq_url, AttributeNames=['QueueArn'])['Attributes']['QueueArn']
        redrive = json.dumps({'deadLetterTargetArn': dlq_arn, 'maxReceiveCount': 3})
        attributes = {**fifo, 'RedrivePolicy': redrive, 'VisibilityTimeout': str(self.visibility_timeout_s)}
        try:
            self.queue_url = sqs.create_queue(QueueName=names.queue, Attributes=attributes)['QueueUrl']
        except sqs.exceptions.QueueNameExists:
            self.queue_url = sqs.get_queue_url(QueueName=names.queue)['QueueUrl']
            sqs.set_queue_attributes(
                QueueUrl=self.queue_url,
                Attributes={'RedrivePolicy': redrive, 'VisibilityTimeout': attributes['VisibilityTimeout']},
            )
        self.queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=['QueueArn'])['Attributes'][
            'QueueArn'
        ]
        self._create_upload_events(sqs)
        self._create_lifecycle_events(sqs)
        if self.embedded:
            self.state_machine_arn = self._create_state_machine()

    def _create_upload_events(self, sqs: Any) -> None:
        """S3 → EventBridge → the uploads queue, with the rule the CDK app deploys (`functions/orphan_uploads`): every
        new attachment object reaches the orphan-upload function, as in AWS."""
        from functions.orphan_uploads.events import object_created_pattern

        names = self.names
        dlq_url = sqs.create_queue(QueueName=names.uploads_dead_letter_queue)['QueueUrl']
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=['QueueArn'])['Attributes']['QueueArn']
        redrive = json.dumps({'deadLetterTargetArn': dlq_arn, 'maxReceiveCount': 3})
        attributes = {'RedrivePolicy': redrive, 'VisibilityTimeout': str(self.visibility_timeout_s)}
        self.uploads_queue_url = sqs.create_queue(QueueName=names.uploads_queue, Attributes=attributes)['QueueUrl']
        sqs.set_queue_attributes(QueueUrl=self.uploads_queue_url, Attributes=attributes)
        self.uploads_queue_arn = sqs.get_queue_attributes(QueueUrl=self.uploads_queue_url, AttributeNames=['QueueArn'])[
            'Attributes'
        ]['QueueArn']
        self.client('s3').put_bucket_notification_configuration(
            Bucket=names.bucket, NotificationConfiguration={'EventBridgeConfiguration': {}}
        )
        events = self.client('events')
        events.put_rule(
            Name=names.uploads_rule, EventPattern=json.dumps(object_created_pattern(names.bucket)), State='ENABLED'
        )
        events.put_targets(Rule=names.uploads_rule, Targets=[{'Id': 'uploads-queue', 'Arn': self.uploads_queue_arn}])

    def _create_lifecycle_events(self, sqs: Any) -> None:
        """The lifecycle events' bus, and a rule with the CDK app's pattern that puts every event on a queue, which
        `GET /_om/events` reads back."""
        from om_lib.events import lifecycle_event_pattern

        names = self.names
        events = self.client('events')
        with suppress(events.exceptions.ResourceAlreadyExistsException):
            events.create_event_bus(Name=names.event_bus)
        self.events_queue_url = sqs.create_queue(QueueName=names.events_queue)['QueueUrl']
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.events_queue_url, AttributeNames=['QueueArn'])['Attributes'][
            'QueueArn'
        ]
        events.put_rule(
            Name=names.events_rule,
            EventBusName=names.event_bus,
            EventPattern=json.dumps(lifecycle_event_pattern()),
            State='ENABLED',
        )
        events.put_targets(
            Rule=names.events_rule, EventBusName=names.event_bus, Targets=[{'Id': 'events-queue', 'Arn': queue_arn}]
        )

    def _create_state_machine(self) -> str:
        account = '123456789012'
        role_name = self.names.reflection_function
        lam = self.client('lambda')
        try:
            function_arn = lam.get_function(FunctionName=self.names.reflection_function)['Configuration']['FunctionArn']
        except lam.exceptions.ResourceNotFoundException:
            # The code is never run (the in-process patch answers), but Lambda wants a zip.
            iam = self.client('iam')
            trust = {
                'Version': '2012-10-17',
                'Statement': [
                    {'Effect': 'Allow', 'Principal': {'Service': 'lambda.amazonaws.com'}, 'Action': 'sts:AssumeRole'}
                ],
            }
            try:
                role_arn = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))['Role'][
                    'Arn'
                ]
            except iam.exceptions.EntityAlreadyExistsException:
                role_arn = iam.get_role(RoleName=role_name)['Role']['Arn']
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, 'w') as archive:
                archive.writestr('handler.py', 'def lambda_handler(event, context):\n    return event\n')
            function_arn = lam.create_function(
                FunctionName=self.names.reflection_function,
                Runtime='python3.12',
                Role=role_arn,
                Handler='functions.reflection.handler.lambda_handler',
                Code={'ZipFile': buffer.getvalue()},
                Timeout=900,
            )['FunctionArn']
        definition = ASL_PATH.read_text(encoding='utf-8').replace('${ReflectionFunctionArn}', function_arn)
        sfn = self.client('stepfunctions')
        role = f'arn:aws:iam::{account}:role/{self.names.state_machine}-workflow'
        for machine in sfn.list_state_machines()['stateMachines']:
            if machine['name'] == self.names.state_machine:
                sfn.update_state_machine(stateMachineArn=machine['stateMachineArn'], definition=definition)
                return str(machine['stateMachineArn'])
        created = sfn.create_state_machine(name=self.names.state_machine, definition=definition, roleArn=role)
        return str(created['stateMachineArn'])

    def _set_function_env(self) -> None:
        env = {
            'OM_TABLE_NAME': self.names.table,
            'OM_BUCKET_NAME': self.names.bucket,
            'OM_WORK_QUEUE_URL': self.queue_url,
            'OM_REFLECTION_STATE_MACHINE_ARN': self.state_machine_arn,
            'OM_EVENT_BUS_NAME': self.names.event_bus,
            # Local runs have no authorizer in front of them; deployed stacks default to IAM.
            'OM_AUTH_MODE': 'none',
            'OM_OFFLINE_FALLBACK': '1',
            # The memory inspector at GET /inspector (a deployed stack serves it only when asked to).
            'OM_INSPECTOR': '1',
            # What GET …/memory says about the sweeper: it runs here every `sweep_interval_s` (unset: never).
            'OM_SWEEP_INTERVAL_S': str(self.sweep_interval_s) if self.workers and self.sweep_interval_s else None,
        }
        if self.config_file:
            env['OM_CONFIG_FILE'] = str(Path(self.config_file).resolve())
        elif self.config is not None:
            env['OM_CONFIG'] = json.dumps(self.config)
            env['OM_CONFIG_FILE'] = None  # OM_CONFIG_FILE would win over OM_CONFIG
        env.update(self.extra_env)
        for name, value in env.items():
            self._setenv(name, value)

    # -- SQS → buffer worker -----------------------------------------------------------------------------------------
    def _poll_queue(self) -> None:
        self._poll_forever(self.poll_once)

    def _poll_uploads(self) -> None:
        self._poll_forever(self.poll_uploads_once)

    def _poll_forever(self, poll: Callable[[Any], int]) -> None:
        sqs = self.client('sqs')
        while not self._stopping.is_set():
            try:
                poll(sqs)
            except Exception as exc:  # noqa: BLE001 - the poller must survive a hiccup, as Lambda's poller does
                self.poller_errors.append(exc)
                logger.exception('queue poller error')
                self._stopping.wait(1.0)

    def poll_once(self, sqs: Any = None) -> int:
        """Receive one batch and run the buffer worker on it, as Lambda's SQS event source does. Returns its size."""
        return self._deliver(sqs, self.queue_url, self.queue_arn, 'buffer_worker', self.worker_timeout_s)

    def poll_uploads_once(self, sqs: Any = None) -> int:
        """Receive one batch of upload events and run the orphan-upload function on it. Returns its size."""
        return self._deliver(sqs, self.uploads_queue_url, self.uploads_queue_arn, 'orphan_uploads', 60.0)

    def _deliver(self, sqs: Any, queue_url: str, queue_arn: str, function: str, timeout_s: float) -> int:
        sqs = sqs or self.client('sqs')
        response = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=self.poll_wait_s,
            AttributeNames=['All'],
            MessageAttributeNames=['All'],
        )
        messages = response.get('Messages') or []
        if not messages:
            return 0
        with self._busy_lock:
            self._busy += 1
        try:
            event = {'Records': [self._sqs_record(m, queue_arn) for m in messages]}
            try:
                result = invoke_handler(function, event, timeout_s=timeout_s)
                failed = {item['itemIdentifier'] for item in (result or {}).get('batchItemFailures') or []}
            except Exception as exc:  # noqa: BLE001 - a failed invocation: the whole batch is redelivered
                logger.warning('%s failed the whole batch (%s): %s', function, type(exc).__name__, exc)
                failed = {m['MessageId'] for m in messages}
            done = [m for m in messages if m['MessageId'] not in failed]
            if done:
                sqs.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[{'Id': str(i), 'ReceiptHandle': m['ReceiptHandle']} for i, m in enumerate(done)],
                )
        finally:
            with self._busy_lock:
                self._busy -= 1
        return len(messages)

    def _sqs_record(self, message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
        attributes = {
            name: {k[0].lower() + k[1:]: v for k, v in value.items()}
            for name, value in (message.get('MessageAttributes') or {}).items()
        }
        return {
            'messageId': message['MessageId'],
            'receiptHandle': message['ReceiptHandle'],
            'body': message['Body'],
            'attributes': message.get('Attributes') or {},
            'messageAttributes': attributes,
            'md5OfBody': message.get('MD5OfBody', ''),
            'eventSource': 'aws:sqs',
            'eventSourceARN': queue_arn,
            'awsRegion': self.region,
        }

    # -- the schedule → sweeper ---------------------------------------------------------------------------------------
    def sweep_once(self) -> Any:
        """Run the sweeper handler once with a scheduled event."""
        now = datetime.now(UTC)
        event = {
            'version': '0',
            'id': str(uuid.uuid4()),
            'detail-type': 'Scheduled Event',
            'source': 'aws.events',
            'account': '123456789012',
            'time': now.strftime('%Y-%m-%dT%H:%M:%SZ'),
            'region': self.region,
            'resources': [f'arn:aws:events:{self.region}:123456789012:rule/om-sweeper'],
            'detail': {},
        }
        return invoke_handler('sweeper', event, timeout_s=300)

    def _sweep_forever(self) -> None:
        assert self.sweep_interval_s
        while not self._stopping.wait(self.sweep_interval_s):
            try:
                self.sweep_once()
            except AttributeError as exc:
                logger.warning('sweeper disabled: %s', exc)  # MemoryEngine.sweep not available in this build
                return
            except Exception:  # noqa: BLE001 - a failed run is retried at the next tick, as the schedule would
                logger.exception('sweeper run failed')

    # -- waiting -----------------------------------------------------------------------------------------------------
    def queue_depth(self, queue_url: str | None = None) -> int:
        """Messages in the queue: visible, in flight and delayed."""
        attrs = self.client('sqs').get_queue_attributes(
            QueueUrl=queue_url or self.queue_url,
            AttributeNames=[
                'ApproximateNumberOfMessages',
                'ApproximateNumberOfMessagesNotVisible',
                'ApproximateNumberOfMessagesDelayed',
            ],
        )['Attributes']
        return sum(int(v) for v in attrs.values())

    def executions(self, status: str | None = None) -> list[dict[str, Any]]:
        """Executions of the reflection workflow (newest first), optionally only those in `status`."""
        if not self.state_machine_arn:
            return []
        sfn = self.client('stepfunctions')
        pages = sfn.get_paginator('list_executions').paginate(
            stateMachineArn=self.state_machine_arn, **({'statusFilter': status} if status else {})
        )
        return [execution for page in pages for execution in page['executions']]

    def idle(self) -> bool:
        """No job queued or in flight and no reflection running."""
        with self._busy_lock:
            busy = self._busy
        queues = self.queue_depth() + (self.queue_depth(self.uploads_queue_url) if self.uploads_queue_url else 0)
        return busy == 0 and queues == 0 and not self.executions('RUNNING')

    def drain(self, timeout: float = 60.0, *, interval: float = 0.1) -> None:
        """Wait until background work has settled (checked twice in a row); TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while quiet < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f'background work did not settle within {timeout} s (queue depth {self.queue_depth()}, '
                    f'running executions {len(self.executions("RUNNING"))})'
                )
            quiet = quiet + 1 if self.idle() else 0
            time.sleep(interval)


@contextmanager
def attached(description: Mapping[str, Any]) -> Iterator[None]:
    """The functions' environment of the running stack `description` tells of (`LocalStack.describe`, which
    `om serve` answers at DESCRIBE_PATH), for this process, while the block runs."""
    from functions import _wiring

    env: dict[str, str | None] = {
        'OM_CONFIG_FILE': None,  # the stack's own configuration, not one from this shell
        'OM_CONFIG': None,
        **FAKE_CREDENTIALS,
        **dict(description.get('env') or {}),
        **local_logs.QUIET_FUNCTIONS,
        'AWS_ENDPOINT_URL': str(description['endpoint']),
        'AWS_DEFAULT_REGION': str(description.get('region') or 'us-east-1'),
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
    }
    saved = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        _put_env(name, value)
    _wiring.reset()  # the functions build their clients, settings and engine again, from this environment
    try:
        yield
    finally:
        for name, value in saved.items():
            _put_env(name, value)
        _wiring.reset()


def _put_env(name: str, value: str | None) -> None:
    """Set `name` in this process's environment, or unset it for None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextmanager
def running_stack(**options: Any) -> Iterator[LocalStack]:
    """A started LocalStack for the duration of the block."""
    stack = LocalStack(**options)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
